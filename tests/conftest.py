"""Shared test set-up: the XLA compilation cache, the Omniglot data, one tiny trained run."""

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest

# Quieter TensorFlow if a data test imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One CPU device in the test processes and the commands they start, as before the
# experiments' one-device-per-core default (`vj.use_all_cpu_cores`, which leaves a count
# set here alone); the tests of that default set their own count.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "1")

# XLA's persistent compilation cache, shared by the test processes, their
# subprocesses (the 8-device child, notebook kernels) and later runs: the many
# tests that build the same step (a run and its resumed twin) compile it once.
# Entries are keyed by the program, so a changed program is compiled afresh.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vampire_jax_test_xla_cache")
)

OMNIGLOT_DIR = Path(
  os.environ.get("OMNIGLOT_DIR") or Path(__file__).resolve().parents[2] / "shared/data/omniglot"
)
HAS_OMNIGLOT = (OMNIGLOT_DIR / "images_background.zip").exists()
needs_omniglot = pytest.mark.skipif(
  not HAS_OMNIGLOT, reason=f"Omniglot zips not found in {OMNIGLOT_DIR} (set OMNIGLOT_DIR)"
)


def pytest_configure(config):
  config.addinivalue_line(
    "markers", "slow: long-running; excluded from CI, run with `pytest -m slow`"
  )


@pytest.fixture(scope="session")
def omniglot_cache(tmp_path_factory):
  """A 28x28 cache built once from the zips, so experiments load it in milliseconds."""
  if not HAS_OMNIGLOT:
    pytest.skip(f"Omniglot zips not found in {OMNIGLOT_DIR}")
  from vampire_jax.data import load_omniglot

  cache = tmp_path_factory.mktemp("omniglot_cache")
  load_omniglot(OMNIGLOT_DIR, cache_dir=cache, source="zip", print_fn=lambda message: None)
  return cache


def tiny_regression_config(algorithm: str = "vampire", **changes):
  """Sine/line regression at the smallest size that trains, validates, checkpoints and tests."""
  from experiments import regression

  settings = dict(
    tasks_per_step=2,
    hidden_sizes=(8, 8),
    num_val_tasks=2,
    num_test_tasks=2,
    eval_every=2,
    checkpoint_every=2,
    log_every=2,
    eval_batch_tasks=2,
  )
  return dataclasses.replace(regression.get_config("quick", algorithm), **{**settings, **changes})


def tiny_omniglot_config(cache_dir, num_meta_steps: int = 6, **changes):
  """VAMPIRE on Omniglot at the smallest size that still exercises everything."""
  from experiments import omniglot

  settings = dict(
    num_filters=8,
    num_inner_steps=1,
    tasks_per_step=2,
    num_meta_steps=num_meta_steps,
    num_val_tasks=4,
    num_test_tasks=6,
    eval_batch_tasks=3,
    eval_every=3,
    checkpoint_every=3,
    log_every=3,
    num_mc_test=2,
    data_dir=str(OMNIGLOT_DIR),
    cache_dir=str(cache_dir),
  )
  return dataclasses.replace(omniglot.get_config("quick", "vampire"), **{**settings, **changes})


@pytest.fixture(scope="session")
def tiny_omniglot_run(omniglot_cache, tmp_path_factory):
  """`(workdir, config, results)` of one tiny trained VAMPIRE run, shared by the tests."""
  from experiments import omniglot

  workdir = tmp_path_factory.mktemp("tiny_run")
  config = tiny_omniglot_config(omniglot_cache)
  results = omniglot.train_and_evaluate(
    config, workdir, progress=False, print_fn=lambda message: None
  )
  return workdir, config, results
