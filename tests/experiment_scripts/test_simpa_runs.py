"""SImPa is a first-class algorithm of the experiments (issue 51, items 3 and 4).

It trains, tests and draws its figures from the Omniglot command line as a user runs it (a
fresh process on two XLA:CPU devices), is scored by the evaluators the others are, and
loads with `vj.load_run` in a fresh process on one device, where it predicts, as
`Run.predictive` does and as the loading test process does. It runs the regression
comparison too, and loads from there.
"""

import json

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import compare
from tests.conftest import OMNIGLOT_DIR, TINY_REGRESSION, needs_omniglot
from tests.experiment_scripts.test_vampire2_protonet_runs import LOAD_AND_PREDICT, TINY, _run

SIMPA_FLAGS = ["--num-inner-steps", "1", "--num-mc-test", "3", "--simpa-kl-samples", "16"]


@pytest.fixture(scope="module")
def simpa_run(omniglot_cache, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("simpa")
  command = ["-m", "experiments.omniglot", "--algorithm", "simpa", *TINY, *SIMPA_FLAGS]
  command += ["--data-dir", str(OMNIGLOT_DIR), "--cache-dir", str(omniglot_cache)]
  done = _run([*command, "--workdir", str(workdir)], devices=2)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "test accuracy" in done.stdout and "note:" not in done.stderr  # no flag dropped
  return workdir


@pytest.mark.slow  # SImPa's command line, then a fresh process
@needs_omniglot
def test_the_omniglot_command_trains_tests_draws_and_loads_on_one_device(simpa_run, tmp_path):
  results = json.loads((simpa_run / "results.json").read_text())
  test, config = results["test"], results["config"]
  spec = config["algorithm"]
  assert spec["name"] == "simpa" and test["num_tasks"] == 4
  # Its own defaults (first order) and the flags' values (--simpa-kl-samples: num_kl_samples).
  assert (spec["first_order"], spec["num_kl_samples"]) == (True, 16)
  assert (spec["num_inner_steps"], spec["num_mc_test"]) == (1, 3)
  assert "kl_weight" not in spec  # its KL terms are the PAC-Bayes bound's: no KL weight
  for metric in ("accuracy", "nll", "ece", "mce", "aurc", "accuracy_at_50_coverage"):
    assert np.isfinite(test[metric]), metric
  assert 0.0 <= test["open_set"]["auroc"]["max_prob"] <= 1.0
  for name in ("reliability.png", "risk_coverage.png", "training_curves.png", "run.json"):
    assert (simpa_run / name).stat().st_size > 0, name

  out = tmp_path / "loaded.npz"
  done = _run(["-c", LOAD_AND_PREDICT, str(simpa_run), str(out)], devices=1)
  assert done.returncode == 0, done.stderr[-3000:]
  loaded = np.load(out)
  assert int(loaded["devices"]) == 1
  probs = loaded["probs"]
  assert probs.shape == (7, 5) and np.allclose(probs.sum(1), 1.0, atol=1e-5)
  np.testing.assert_allclose(loaded["dist_probs"], probs, atol=1e-6)  # run.predictive
  assert loaded["draws"].shape == (3, 7, 5)  # --num-mc-test generated networks
  run = vj.load_run(simpa_run)  # here, in the test process
  assert type(run.meta_params).__name__ == "SimpaParams"
  x = np.random.default_rng(0).random((12, 28, 28, 1), dtype=np.float32)
  here = run.predict(x[:5], np.arange(5), x[5:], jax.random.key(3))
  np.testing.assert_allclose(here, probs, atol=1e-5)


@pytest.mark.slow  # SImPa's regression run
def test_regression_runs_simpa_and_loads(tmp_path):
  overrides = dict(TINY_REGRESSION, num_kl_samples=16)
  assert compare.parse_algorithms("vampire2,simpa") == ["vampire2", "simpa"]
  results = compare.run("regression", ("simpa",), "quick", tmp_path, overrides, progress=False)
  method = results["methods"]["simpa"]
  spec = method["config"]["algorithm"]
  assert np.isfinite(method["ece"]) and (spec["epsilon"], spec["num_kl_samples"]) == (0.1, 16)
  run = vj.load_run(tmp_path / "simpa")
  x = np.linspace(-4, 4, 5, dtype=np.float32)[:, None]
  samples = run.predict(x, np.sin(x), x, jax.random.key(0))
  assert samples.shape == (3, 5, 1) and np.all(np.isfinite(samples))
  assert np.all(np.abs(samples) < 10)  # tanh-bounded weights of an 8-8 MLP
