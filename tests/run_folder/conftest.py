"""One tiny trained regression run for the run-folder tests that read or copy it, and the
helpers that train, copy, load and query such a run."""

import shutil
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from tests.conftest import tiny_regression_config
from tests.helpers import QUERY_X, SUPPORT_X

SUPPORT_Y = np.sin(SUPPORT_X)


def train_regression(config, workdir: Path, model=None) -> dict:
  """`vj.train_and_evaluate` of the regression problem of `config` (its network `model`,
  given), quietly."""
  problem = regression.make_problem(config)
  if model is not None:
    problem = problem._replace(model=model)
  return vj.train_and_evaluate(
    problem, config, workdir, progress=False, print_fn=lambda message: None
  )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """`(workdir, config, results)`: 4 steps, checkpoints 2 and 4, `best/` and results.json."""
  workdir = tmp_path_factory.mktemp("edges") / "run"
  config = tiny_regression_config(num_meta_steps=4)
  return workdir, config, train_regression(config, workdir)


def copy_trained(trained, tmp_path: Path, *, best: bool = True) -> Path:
  """A copy of the trained run; without `best/`, `load_run` reads `checkpoints/`."""
  workdir = tmp_path / "run"
  shutil.copytree(trained[0], workdir)
  if not best:
    shutil.rmtree(workdir / "best")
  return workdir


def load_with_warnings(workdir: Path, **kwargs):
  """`vj.load_run(workdir)` and the messages of the warnings it gave."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = vj.load_run(workdir, **kwargs)
  return run, [str(w.message) for w in caught]


def predict(run):
  """The run's predictions on the fixed sine support and queries."""
  return np.asarray(run.predict(SUPPORT_X, SUPPORT_Y, QUERY_X, jax.random.key(3)))
