"""Other JAX code uses a trained run: `vj.load_run` in two lines, public preprocessing,
scores independent of the evaluation batch."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import distrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import omniglot, regression
from experiments.presets import OmniglotConfig
from tests.conftest import needs_omniglot, tiny_regression_config
from tests.helpers import NOISE, _checkpoint_params, _leaves_equal, _truncate_data
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.metrics.evaluation import evaluate_split
from vampire_jax.data import sine_line
from vampire_jax.runs import programs


def _regression_learner(algorithm="vampire"):
  model = vj.MLP((16, 16), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  nll = vj.gaussian_nll(NOISE)
  if algorithm == "maml":
    learner = vj.maml(vj.pure_apply(model), nll, num_inner_steps=2)
  else:
    learner = vj.vampire(
      vj.pure_apply(model), nll, num_inner_steps=2, num_mc_query=6, log_std_init=(-2.0, -1.5)
    )
  return learner, learner.init(params, jax.random.key(1))


def _copy(run_dir: Path, tmp_path: Path) -> Path:
  copy = tmp_path / "run"
  shutil.copytree(run_dir, copy)
  return copy


DAMAGE = {  # what is damaged -> what load_run must still do
  "run.json truncated": lambda w: (w / "run.json").write_text('{"for'),
  "run.json deleted": lambda w: (w / "run.json").unlink(),
  "train_time.json empty": lambda w: (w / "train_time.json").write_text(""),
  "best_score.json truncated": lambda w: (w / "best_score.json").write_text('{"st'),
  "best/ truncated": lambda w: _truncate_data(w / "best"),
}


@pytest.fixture(scope="module")
def tiny_regression_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("tiny_regression_run")
  config = tiny_regression_config("vampire", num_meta_steps=2, num_mc_test=2)
  regression.run_experiment(config, workdir, progress=False, print_fn=lambda m: None)
  return vj.load_run(workdir)


@pytest.fixture(scope="module")
def tiny_regression_folder(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("values_run")
  config = tiny_regression_config(num_meta_steps=2, num_mc_test=2)
  regression.run_experiment(config, workdir, progress=False, print_fn=lambda m: None)
  return workdir


def _task():
  return jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(0), 1))


def test_a_trained_runs_interval_covers_what_its_pit_calibration_says():
  """On a trained learner, the 90 % interval's coverage of held-out targets is the one the
  PIT calibration reports (F(0.95) - F(0.05)): the interval is the predictive's own. How
  close that is to 90 % is the model's calibration (measured in BUILD_NOTES), not this
  function's."""
  learner, _ = _regression_learner()
  model = vj.MLP((16, 16), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=8)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = jax.jit(
    vj.make_train_step(
      learner, optimizer, lambda data, keys: sine_line.tasks_from_keys(keys), steps_per_call=100
    )
  )
  mean_losses = []
  for call in range(3):
    state, metrics = train_step(state, None, jax.random.key(10 + call))
    mean_losses.append(float(jnp.mean(metrics["loss"])))
  assert mean_losses[-1] < mean_losses[0]  # it learned something
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(3), 100))
  keys = jax.random.split(jax.random.key(4), 100)

  def coverage(task, key):
    dist = vj.predictive(
      learner, state.meta_params, task.support_x, task.support_y, task.query_x, key
    )
    lower, upper = vj.predictive_interval(dist, 0.9)
    return (task.query_y >= lower) & (task.query_y <= upper)

  inside = float(jnp.mean(jax.jit(jax.vmap(coverage))(tasks, keys)))
  per_task = vj.make_regression_evaluator(learner, NOISE)(state.meta_params, tasks, keys)
  pit = vj.regression_quantile_calibration(
    per_task.predictions, tasks.query_y, NOISE, levels=np.array([0.05, 0.95])
  )
  assert abs(inside - (pit.observed[1] - pit.observed[0])) < 2e-3  # 1000 targets
  assert 0.3 < inside < 1.0


def test_an_omniglot_runs_predictive_scores_what_its_test_scores(tiny_omniglot_run):
  """Run.predictive on a trained Omniglot run: log_prob is the evaluator's NLL of the task
  (same key), probs is Run.predict's, entropy is vj.uncertainty's total."""
  run = vj.load_run(tiny_omniglot_run[0])
  rng = np.random.default_rng(0)
  support_x = rng.uniform(0, 1, (5,) + run.input_shape).astype(np.float32)
  query_x = rng.uniform(0, 1, (10,) + run.input_shape).astype(np.float32)
  support_y, query_y = np.arange(5), np.arange(10) % 5
  key = jax.random.key(8)
  dist = run.predictive(support_x, support_y, query_x, key)
  assert isinstance(dist, distrax.Categorical) and dist.batch_shape == (10,)
  task = vj.Task(support_x[None], support_y[None], query_x[None], query_y[None])
  evaluate = vj.make_classification_evaluator(run.learner)
  reported = evaluate(run.meta_params, task, key[None])
  np.testing.assert_allclose(-jnp.mean(dist.log_prob(query_y)), reported.nll[0], atol=1e-5)
  np.testing.assert_allclose(dist.probs, run.predict(support_x, support_y, query_x, key), atol=1e-6)
  draws = run.predict_draws(support_x, support_y, query_x, key)
  np.testing.assert_allclose(dist.entropy(), vj.uncertainty(draws).total, atol=1e-5)


@needs_omniglot
def test_predict_draws_are_what_predict_averages(tiny_omniglot_run):
  workdir, config, _ = tiny_omniglot_run
  run = vj.load_run(workdir)
  rng = np.random.default_rng(0)
  support_x = rng.random((5, 28, 28, 1), dtype=np.float32)
  query_x = rng.random((7, 28, 28, 1), dtype=np.float32)
  support_y = np.arange(5)
  key = jax.random.key(1)
  draws = run.predict_draws(support_x, support_y, query_x, key)
  assert draws.shape == (config.algorithm.num_mc_test, 7, 5)
  np.testing.assert_allclose(np.sum(draws, axis=-1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(
    run.predict(support_x, support_y, query_x, key), jnp.mean(draws, axis=0)
  )
  u = vj.uncertainty(draws)
  assert np.all(np.asarray(u.epistemic) > 0)  # VAMPIRE's draws disagree
  with pytest.raises(vj.InputError, match="Run.predict_draws: support_y"):
    run.predict_draws(support_x, support_y[:4], query_x, key)


@needs_omniglot
def test_load_run_and_predict_in_a_fresh_process_without_tensorflow(tiny_omniglot_run):
  workdir = tiny_omniglot_run[0]
  script = textwrap.dedent(f"""
      import json, sys
      import jax, numpy as np
      import vampire_jax as vj
      run = vj.load_run({str(workdir)!r})
      x = np.random.default_rng(0).random((10, 28, 28, 1), dtype=np.float32)
      probs = run.predict(x[:5], np.arange(5), x, jax.random.key(0))
      print(json.dumps({{"shape": list(probs.shape), "sums": np.asarray(probs.sum(1)).tolist(),
                        "config": type(run.config).__name__, "ways": run.config.ways,
                        "log_std_init": str(type(run.config.algorithm.log_std_init)),
                        "tensorflow": "tensorflow" in sys.modules}}))
  """)
  out = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
  )
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["shape"] == [10, 5] and np.allclose(result["sums"], 1.0, atol=1e-5)
  assert result["config"] == "OmniglotConfig" and result["ways"] == 5
  assert result["log_std_init"] == "<class 'tuple'>" and not result["tensorflow"]


@needs_omniglot
def test_predict_matches_the_runs_own_test_evaluation(tiny_omniglot_run, omniglot_cache):
  workdir, config, results = tiny_omniglot_run
  run = vj.load_run(workdir)
  assert isinstance(run.config, OmniglotConfig) and run.config == config
  # Test task 4 as the run scored it: its sampling and prediction keys come
  # from the test key and the index alone.
  problem = omniglot.make_problem(config, print_fn=lambda message: None)
  test_key = jax.random.split(jax.random.key(config.seed), 4)[3]
  sample_keys, predict_keys = evaluation.index_keys(test_key, jnp.arange(6, dtype=jnp.uint32))
  task = jax.tree_util.tree_map(
    lambda x: x[4], problem.sample_tasks(problem.splits["test"], sample_keys)
  )
  probs = run.predict(task.support_x, task.support_y, task.query_x, predict_keys[4])
  saved = np.load(workdir / "test_per_task.npz")
  np.testing.assert_allclose(probs, saved["probabilities"][4], atol=2e-5)
  np.testing.assert_array_equal(saved["targets"][4], task.query_y)
  # Bad input is refused with the shape the run expects.
  with pytest.raises(ValueError, match=r"\[n, 28, 28, 1\]"):
    run.predict(task.support_x[..., 0], task.support_y, task.query_x, predict_keys[4])
  with pytest.raises(ValueError, match=r"covering every class 0..4"):
    run.predict(task.support_x, task.support_y + 5, task.query_x, predict_keys[4])


def test_load_run_of_a_folder_without_a_run_says_so(tmp_path):
  with pytest.raises(FileNotFoundError, match="run.json"):
    vj.load_run(tmp_path)


def test_scores_do_not_depend_on_the_evaluation_batch():
  model = vj.MLP((8,), 1)
  learner = vj.vampire(
    vj.pure_apply(model), vj.gaussian_nll(0.3), num_inner_steps=2, num_mc_train=2, num_mc_query=3
  )
  meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)), jax.random.key(1))
  from experiments import regression

  problem = regression.make_problem(regression.get_config("quick"))
  evaluate = jax.jit(vj.make_regression_evaluator(learner, 0.3))
  split = programs.split_evaluator(problem, evaluate, "test")
  key = jax.random.key(5)
  results = [evaluate_split(split, meta_params, key, 10, batch) for batch in (3, 4, 10)]
  for other in results[1:]:
    for name in ("mse", "nll", "predictions", "truth"):
      np.testing.assert_allclose(other[name], results[0][name], rtol=1e-5, atol=1e-6)
  # Another evaluation key scores other tasks.
  assert not np.allclose(
    evaluate_split(split, meta_params, jax.random.key(6), 10, 10)["mse"], results[0]["mse"]
  )


@needs_omniglot
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_load_run_survives_a_damaged_file(damage, tiny_omniglot_run, tmp_path):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  intact = vj.load_run(workdir).meta_params
  DAMAGE[damage](workdir)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = vj.load_run(workdir)
  said = " ".join(str(w.message) for w in caught)
  assert run.config == tiny_omniglot_run[1]
  if damage == "best/ truncated":  # the latest checkpoint instead, with a warning
    assert f"{workdir / 'best'} does not restore" in said and "latest checkpoint" in said
    assert _leaves_equal(run.meta_params._asdict(), _checkpoint_params(workdir, 6))
  else:
    assert _leaves_equal(run.meta_params, intact)
  if damage.startswith("run.json"):
    assert "using the run record its checkpoints carry" in said


@needs_omniglot
def test_load_run_with_nothing_restorable_is_one_error_naming_the_folder(
  tiny_omniglot_run, tmp_path
):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  for folder in [workdir / "best", *(workdir / "checkpoints").iterdir()]:
    _truncate_data(folder)
  with (
    pytest.warns(UserWarning),
    pytest.raises(
      vj.RunFolderError,
      match=f"no checkpoint in {workdir}/checkpoints restores \\(tried steps 6, 3\\)",
    ),
  ):
    vj.load_run(workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["3", "6"]  # untouched


def test_run_predict_refuses_regression_targets_of_the_wrong_shape(tiny_regression_run):
  run = tiny_regression_run
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(0), 1))
  out = run.predict(task.support_x, task.support_y, task.query_x, jax.random.key(1))
  assert out.shape == (2, 10, 1) and np.all(np.isfinite(out))
  for bad in (task.support_y[:, 0], jnp.tile(task.support_y, (1, 3))):
    with pytest.raises(InputError, match=r"Run.predict: support_y must be \[5, 1\] targets"):
      run.predict(task.support_x, bad, task.query_x, jax.random.key(1))
  for name, value in (
    ("support_x", task.support_x.at[2, 0].set(jnp.nan)),
    ("query_x", task.query_x.at[0, 0].set(jnp.inf)),
  ):
    inputs = {"support_x": task.support_x, "query_x": task.query_x, name: value}
    with pytest.raises(InputError, match=f"Run.predict: {name} must be finite, got 1 NaN"):
      run.predict(inputs["support_x"], task.support_y, inputs["query_x"], jax.random.key(1))
  with pytest.raises(InputError, match=r"query_x must be \[n, 1\] with n >= 1"):
    run.predict(task.support_x, task.support_y, task.query_x[:0], jax.random.key(1))


@needs_omniglot
def test_run_predict_refuses_bad_images_and_partial_labels(tiny_omniglot_run):
  run = vj.load_run(tiny_omniglot_run[0])
  x = np.random.default_rng(0).random((10, 28, 28, 1), dtype=np.float32)
  labels = np.arange(5)
  assert np.allclose(run.predict(x[:5], labels, x, jax.random.key(0)).sum(1), 1.0, atol=1e-5)
  rows = {
    "uint8 images": (
      (255 * x[:5]).astype(np.uint8),
      labels,
      x,
      r"support_x must be floating point, preprocessed as in training",
    ),
    "NaN in support_x": (
      np.where(x[:5] > 0.99, np.nan, x[:5]),
      labels,
      x,
      r"support_x must be finite",
    ),
    "inf in query_x": (x[:5], labels, np.where(x > 0.99, np.inf, x), r"query_x must be finite"),
    "empty query set": (x[:5], labels, x[:0], r"query_x must be \[n, 28, 28, 1\] with n >= 1"),
    "labels {0, 1, 2} of 5 ways": (
      x[:5],
      np.array([0, 1, 2, 0, 1]),
      x,
      r"support_y must be labels covering every class 0..4",
    ),
    "float labels": (x[:5], labels.astype(np.float32), x, r"support_y must be \[5\] integer"),
  }
  for name, (support_x, support_y, query_x, message) in rows.items():
    with pytest.raises(InputError, match=message):
      run.predict(support_x, support_y, query_x, jax.random.key(0))


def test_run_predict_takes_lists_refuses_bad_keys_and_checks_bfloat16(tiny_regression_folder):
  run = vj.load_run(tiny_regression_folder)
  task = _task()
  expected = run.predict(task.support_x, task.support_y, task.query_x, jax.random.key(1))
  as_lists = run.predict(
    task.support_x.tolist(), task.support_y.tolist(), task.query_x.tolist(), jax.random.key(1)
  )
  np.testing.assert_allclose(as_lists, expected, rtol=1e-6)  # documented: array-likes are taken
  for key, got in ((3, "int"), (None, "None")):
    with pytest.raises(InputError, match=rf"Run.predict: key must be a PRNG key.*got {got}"):
      run.predict(task.support_x, task.support_y, task.query_x, key)
  query = task.query_x.astype(jnp.bfloat16).at[0, 0].set(jnp.nan)
  with pytest.raises(InputError, match=r"Run.predict: query_x must be finite, got 1 NaN"):
    run.predict(task.support_x, task.support_y, query, jax.random.key(1))


def test_run_predict_takes_a_query_sharded_over_devices(tiny_regression_folder):
  """On two (host) devices, a query sharded over both gives the same prediction."""
  script = textwrap.dedent(
    f"""
    import jax, numpy as np
    import vampire_jax as vj
    from vampire_jax.data import sine_line
    from jax.sharding import NamedSharding, PartitionSpec
    assert jax.device_count() == 2
    run = vj.load_run({str(tiny_regression_folder)!r})
    task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(0), 1))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("q",))
    query = jax.device_put(task.query_x, NamedSharding(mesh, PartitionSpec("q")))
    sharded = run.predict(task.support_x, task.support_y, query, jax.random.key(1))
    plain = run.predict(task.support_x, task.support_y, task.query_x, jax.random.key(1))
    np.testing.assert_allclose(sharded, plain, rtol=1e-6)
    print("same")
    """
  )
  env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}  # conftest's one device
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
  done = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
  )
  assert done.returncode == 0 and "same" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(
  "field, value", [("kl_weight", 0.0), ("num_inner_steps", 0), ("inner_lr", 10.0)]
)
def test_an_edited_run_record_is_refused_not_used(tiny_omniglot_run, tmp_path, field, value):
  """A trained setting of the algorithm edited in run.json (which would change the
  predictions) is refused by `vj.load_run`, naming the field; an edited schedule is not an
  edit of what was trained; without run.json, the checkpoints' own record is used."""
  import json
  import shutil

  from vampire_jax._src.core.errors import RunFolderError

  workdir = tmp_path / "run"
  shutil.copytree(tiny_omniglot_run[0], workdir)
  record = json.loads((workdir / "run.json").read_text())
  record["config"]["algorithm"][field] = value
  (workdir / "run.json").write_text(json.dumps(record))
  with pytest.raises(RunFolderError) as raised:
    vj.load_run(workdir)
  message = str(raised.value)
  assert f"config.{field}" in message and "edited after training" in message
  # A setting a resumed run may change (the schedule) is no edit of what was trained.
  record["config"]["algorithm"][field] = tiny_omniglot_run[2]["config"]["algorithm"][field]
  record["config"]["schedule"]["num_meta_steps"] = 12
  (workdir / "run.json").write_text(json.dumps(record))
  assert vj.load_run(workdir).config.schedule.num_meta_steps == 12
  # Deleted, the checkpoints' own record is used.
  (workdir / "run.json").unlink()
  with pytest.warns(UserWarning, match="missing; using the run record its checkpoints carry"):
    assert vj.load_run(workdir).config == tiny_omniglot_run[1]


def test_predict_per_query_does_not_depend_on_the_other_queries(tiny_omniglot_run):
  """With transductive=False a query's prediction is the same alone or among others; the
  transductive default differs, and a query alone is the transductive batch of one."""
  workdir = tiny_omniglot_run[0]
  run = vj.load_run(workdir)
  rng = np.random.default_rng(0)
  support_x = rng.uniform(0, 1, (5,) + run.input_shape).astype(np.float32)
  query_x = rng.uniform(0, 1, (12,) + run.input_shape).astype(np.float32)
  support_y, key = np.arange(5), jax.random.key(3)
  together = run.predict(support_x, support_y, query_x, key)
  alone = run.predict(support_x, support_y, query_x[:1], key)
  # The paper's (transductive) default: batch norm normalises the queries together.
  assert not np.allclose(together[0], alone[0], atol=1e-4)
  # transductive=False: each query's answer is the same alone or among others.
  per_query = run.predict(support_x, support_y, query_x, key, transductive=False)
  per_query_alone = run.predict(support_x, support_y, query_x[:1], key, transductive=False)
  np.testing.assert_allclose(per_query[0], per_query_alone[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(per_query.sum(axis=-1), 1.0, rtol=1e-5)
  # A query passed alone is the transductive answer of a batch of one.
  np.testing.assert_allclose(alone[0], per_query_alone[0], rtol=1e-5, atol=1e-6)
  draws = run.predict_draws(support_x, support_y, query_x, key, transductive=False)
  np.testing.assert_allclose(draws.mean(axis=0), per_query, rtol=1e-5, atol=1e-6)


def test_run_predict_under_jit_points_to_the_learner(tiny_omniglot_run):
  """run.predict under jax.jit is refused naming jit, vmap or grad and run.learner."""
  run = vj.load_run(tiny_omniglot_run[0])
  x = np.zeros((5,) + run.input_shape, np.float32)
  with pytest.raises(InputError, match="not under jax.jit, vmap or grad.*run.learner"):
    jax.jit(lambda q: run.predict(x, np.arange(5), q, jax.random.key(0)))(x)


def test_regression_predict_samples_the_predictive_with_its_noise(tmp_path):
  """A regressor's samples are function draws plus N(0, noise_std^2), for VAMPIRE and MAML:
  the residuals' spread is noise_std and the variance is epistemic plus aleatoric."""
  from experiments import regression
  from tests.conftest import tiny_regression_config
  from vampire_jax.data import sine_line

  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(0), 1))
  for algorithm in ("vampire", "maml"):
    draws = {"num_mc_test": 4} if algorithm == "vampire" else {}
    config = tiny_regression_config(algorithm, num_meta_steps=2, **draws)
    regression.run_experiment(config, tmp_path / algorithm, progress=False, print_fn=lambda m: None)
    run = vj.load_run(tmp_path / algorithm)
    key = jax.random.key(1)
    functions = run.predict_function_draws(task.support_x, task.support_y, task.query_x, key)
    samples = run.predict(task.support_x, task.support_y, task.query_x, key, num_samples=4000)
    assert samples.shape == (4000,) + task.query_x.shape[:1] + (1,)
    # Each sample is a function draw plus N(0, noise_std^2): the residuals' spread is noise_std.
    which = np.arange(4000) % functions.shape[0]
    residuals = np.asarray(samples) - np.asarray(functions)[which]
    np.testing.assert_allclose(residuals.std(), run.noise_std, rtol=0.03)
    # The predictive's variance is the functions' (epistemic) plus the noise's (aleatoric).
    total = np.asarray(samples).var(axis=0).mean()
    expected = np.asarray(functions).var(axis=0).mean() + run.noise_std**2
    np.testing.assert_allclose(total, expected, rtol=0.1)
    default = run.predict(task.support_x, task.support_y, task.query_x, key)
    assert default.shape[0] == functions.shape[0] == (4 if algorithm == "vampire" else 1)
    np.testing.assert_array_equal(
      default, run.predict_draws(task.support_x, task.support_y, task.query_x, key)
    )


def test_the_support_sets_order_does_not_change_a_prediction(tiny_omniglot_run):
  """The samplers group the support set by class; the README says any order works."""
  run = vj.load_run(tiny_omniglot_run[0])
  rng = np.random.default_rng(1)
  support_x = rng.uniform(0, 1, (5,) + run.input_shape).astype(np.float32)
  query_x = rng.uniform(0, 1, (7,) + run.input_shape).astype(np.float32)
  key, order = jax.random.key(4), np.array([3, 0, 4, 1, 2])
  grouped = run.predict(support_x, np.arange(5), query_x, key)
  shuffled = run.predict(support_x[order], np.arange(5)[order], query_x, key)
  np.testing.assert_allclose(shuffled, grouped, rtol=1e-4, atol=1e-5)
