"""Vampire2 and ProtoNet are first-class algorithms of the experiments (issue 51).

Each trains, tests and draws its figures from the command line as a user runs it (a fresh
process on two XLA:CPU devices, the tasks sharded over them), is scored by every
evaluator the others are (accuracy, NLL, ECE/MCE, selective prediction, open-set AUROC),
and loads with `vj.load_run` in a fresh process on another device count (one), where it
predicts, as `Run.predictive` does, and as the loading test process does. Vampire2 runs the regression comparison too; ProtoNet is refused
there in one line.
"""

import dataclasses
import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import compare, omniglot
from tests.conftest import OMNIGLOT_DIR, REPO, TINY_REGRESSION, needs_omniglot, user_env

TINY = [
  "--preset", "quick", "--num-filters", "4", "--tasks-per-step", "2", "--num-meta-steps", "2",
  "--num-val-tasks", "4", "--num-test-tasks", "4", "--eval-batch-tasks", "2",
  "--eval-every", "2", "--checkpoint-every", "2", "--log-every", "2", "--no-progress",
  "--no-compilation-cache",
]  # fmt: skip


FLAGS = {
  "protonet": ["--train-ways", "7", "--protonet-distance", "euclidean"],
  "vampire2": ["--num-inner-steps", "1", "--num-mc-test", "3"],
}


LOAD_AND_PREDICT = """
import sys, jax, numpy as np
import vampire_jax as vj
run = vj.load_run(sys.argv[1])
x = np.random.default_rng(0).random((12, 28, 28, 1), dtype=np.float32)
key = jax.random.key(3)
probs = run.predict(x[:5], np.arange(5), x[5:], key)
dist = run.predictive(x[:5], np.arange(5), x[5:], key)
np.savez(sys.argv[2], probs=probs, dist_probs=dist.probs,
         draws=run.predict_draws(x[:5], np.arange(5), x[5:], key), devices=len(jax.devices()))
"""


def _run(args, devices, timeout=900):
  return subprocess.run(
    [sys.executable, *args],
    env=user_env(JAX_NUM_CPU_DEVICES=str(devices)),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.fixture(scope="module")
def omniglot_runs(omniglot_cache, tmp_path_factory):
  """`{algorithm: workdir}`: each trained by the command line on two devices."""
  runs = {}
  for algorithm, flags in FLAGS.items():
    workdir = tmp_path_factory.mktemp(algorithm)
    command = ["-m", "experiments.omniglot", "--algorithm", algorithm, *TINY, *flags]
    command += ["--data-dir", str(OMNIGLOT_DIR), "--cache-dir", str(omniglot_cache)]
    done = _run([*command, "--workdir", str(workdir)], devices=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "test accuracy" in done.stdout and "note:" not in done.stderr  # no flag dropped
    runs[algorithm] = workdir
  return runs


@pytest.mark.slow  # each method's Omniglot command line on two devices
@needs_omniglot
@pytest.mark.parametrize("algorithm", list(FLAGS))
def test_the_omniglot_command_trains_tests_and_draws(omniglot_runs, algorithm):
  workdir = omniglot_runs[algorithm]
  results = json.loads((workdir / "results.json").read_text())
  test = results["test"]
  spec = results["config"]["algorithm"]
  assert spec["name"] == algorithm and test["num_tasks"] == 4
  for metric in ("accuracy", "nll", "ece", "mce", "aurc", "accuracy_at_50_coverage"):
    assert np.isfinite(test[metric]), metric
  open_set = test["open_set"]["auroc"]
  assert 0.0 <= open_set["max_prob"] <= 1.0
  if algorithm == "protonet":  # deterministic: no epistemic part, as MAML's
    assert open_set["mutual_information"] is None
    assert (spec["train_num_classes"], spec["distance"]) == (7, "euclidean")  # the flags'
    assert "mutual_information" in test["open_set"]["not_applicable"]  # not 0.5 (issue 59)
    assert not {"num_mc_test", "kl_weight"} & set(spec)  # no draws, no KL: no such settings
  else:  # the authors' defaults, and the flags'
    assert (spec["kl_weight"], spec["first_order"]) == (1e-6, True)
    assert (spec["num_inner_steps"], spec["num_mc_test"]) == (1, 3)
  for name in ("reliability.png", "risk_coverage.png", "training_curves.png", "run.json"):
    assert (workdir / name).stat().st_size > 0, name
  record = json.loads((workdir / "run.json").read_text())
  assert record["model"]["fields"]["num_classes"] == (None if algorithm == "protonet" else 5)


@pytest.mark.slow  # each method's Omniglot command line, then a fresh process
@needs_omniglot
@pytest.mark.parametrize("algorithm", list(FLAGS))
def test_a_run_trained_on_two_devices_loads_on_one_and_predicts(omniglot_runs, algorithm, tmp_path):
  out = tmp_path / "loaded.npz"
  done = _run(["-c", LOAD_AND_PREDICT, str(omniglot_runs[algorithm]), str(out)], devices=1)
  assert done.returncode == 0, done.stderr[-3000:]
  loaded = np.load(out)
  assert int(loaded["devices"]) == 1
  probs = loaded["probs"]
  assert probs.shape == (7, 5) and np.allclose(probs.sum(1), 1.0, atol=1e-5)
  np.testing.assert_allclose(loaded["dist_probs"], probs, atol=1e-6)  # run.predictive
  draws = {"protonet": 1, "vampire2": 3}[algorithm]
  assert loaded["draws"].shape == (draws, 7, 5)
  run = vj.load_run(omniglot_runs[algorithm])  # here, in the test process
  x = np.random.default_rng(0).random((12, 28, 28, 1), dtype=np.float32)
  here = run.predict(x[:5], np.arange(5), x[5:], jax.random.key(3))
  np.testing.assert_allclose(here, probs, atol=1e-5)


@needs_omniglot
def test_protonet_trains_on_train_num_classes_and_tests_on_ways(omniglot_cache):
  config = omniglot.get_config("quick", "protonet").replace(
    train_num_classes=9,
    num_filters=4,
    data_dir=str(OMNIGLOT_DIR),
    cache_dir=str(omniglot_cache),
  )
  problem = omniglot.make_problem(config, print_fn=lambda message: None)
  assert problem.model.num_classes is None  # the embedding
  for split, ways in (("train", 9), ("val", 5), ("test", 5)):
    tasks = vj.draw_tasks(problem, split, jax.random.key(0), 2)
    assert tasks.support_y.shape == (2, ways * config.shots), split
    assert tasks.query_y.shape == (2, ways * config.query), split
  plain = omniglot.make_problem(
    config.replace(train_num_classes=None), print_fn=lambda message: None
  )
  assert plain.sample_train_tasks is None


def test_regression_runs_vampire2_and_refuses_protonet(tmp_path):
  overrides = TINY_REGRESSION
  assert compare.parse_algorithms("vampire2,protonet") == ["vampire2", "protonet"]
  results = compare.run("regression", ("vampire2",), "quick", tmp_path, overrides, progress=False)
  method = results["methods"]["vampire2"]
  assert np.isfinite(method["ece"]) and method["config"]["algorithm"]["kl_weight"] == 1e-6
  run = vj.load_run(tmp_path / "vampire2")
  x = np.linspace(-4, 4, 5, dtype=np.float32)[:, None]
  samples = run.predict(x, np.sin(x), x, jax.random.key(0))
  assert samples.shape == (3, 5, 1) and np.all(np.isfinite(samples))
  with pytest.raises(
    vj.ConfigError, match=r"algorithm protonet classifies .*num_classes"
  ) as raised:
    compare.run("regression", ("protonet",), "quick", tmp_path / "p", overrides, progress=False)
  assert len(str(raised.value).splitlines()) == 1


def test_the_benchmark_suite_builds_both_as_the_registry_does():
  from benchmarks import suite

  setting = dataclasses.replace(suite.SETTINGS["omniglot_5w1s"], num_filters=4, tasks=2)
  apply_fn, params, nll = suite.network(setting, "protonet")
  assert "head" not in params  # the embedding
  options = dict(unroll_steps=False, remat=False)
  protonet = suite.make_learner(setting, "protonet", apply_fn, nll, **options)
  vampire2 = suite.make_learner(setting, "vampire2", *suite.network(setting)[::2], **options)
  assert protonet.settings.num_inner_steps == 0
  assert vampire2.settings.kl_target == "standard_normal" and vampire2.meta_loss is not None
  assert vampire2.settings.kl_weight == vj.specs.Vampire2().kl_weight
  tasks = suite.random_tasks(setting, jax.random.key(0), 2)
  _, metrics = jax.jit(vj.make_meta_gradient(protonet))(
    params, tasks, jax.random.split(jax.random.key(1), 2)
  )
  assert np.isfinite(float(metrics["loss"]))
  with pytest.raises(ValueError, match="protonet classifies"):
    suite.network(suite.SETTINGS["regression"], "protonet")
