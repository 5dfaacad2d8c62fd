"""No silent answers: a number means what its name says, or is refused.

Each case below is a value that would look meaningful and not be: it is computed right, or
refused naming why.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from vampire_jax.runs import kinds
from vampire_jax.runs import run_config as config_lib
from vampire_jax._src.core.errors import ConfigError, InputError

# -- KL of leaves that do not match ----------------------------------------------------------


def _gaussian(shape, log_std=-1.0):
  return vj.Gaussian({"w": jnp.zeros(shape)}, {"w": jnp.full(shape, log_std)})


@pytest.mark.parametrize("q_shape, p_shape", [((8,), (1,)), ((3, 1), (1, 3))])
def test_kl_of_leaves_of_other_shapes_is_refused_not_broadcast(q_shape, p_shape):
  """Leaves of other shapes ([8] against [1], [3, 1] against [1, 3]) are refused naming the
  leaf, not broadcast; equal shapes give the closed form."""
  with pytest.raises(InputError, match=r"kl_divergence: the leaf \['w'\] has shapes"):
    vj.kl_divergence(_gaussian(q_shape), _gaussian(p_shape, -2.0))
  # Equal shapes still give the closed form: sum of log(s_p/s_q) + (s_q^2)/(2 s_p^2) - 1/2.
  kl = vj.kl_divergence(_gaussian((3,)), _gaussian((3,), -2.0))
  expected = 3 * (-2.0 + 1.0 + 0.5 * math.exp(2.0) - 0.5)
  np.testing.assert_allclose(float(kl), expected, rtol=1e-6)


def test_kl_of_trees_of_other_keys_is_one_line():
  """Trees of other keys are refused in one line saying "another tree structure"."""
  q = _gaussian((3,))
  p = vj.Gaussian({"v": jnp.zeros(3)}, {"v": jnp.zeros(3)})
  with pytest.raises(InputError) as raised:
    vj.kl_divergence(q, p)
  assert "another tree structure" in str(raised.value)
  assert len(str(raised.value).splitlines()) == 1


# -- A range that is not a range -----------------------------------------------------------


@pytest.mark.parametrize("bad", [(-math.inf, -3.0), (-4.0, math.nan), (-3.0, -4.0)])
def test_gaussian_from_params_refuses_a_non_finite_or_reversed_range(bad):
  """A log_std_range with -inf or NaN, or reversed, is refused: it must be finite."""
  with pytest.raises(InputError, match="log_std_range must be finite"):
    vj.gaussian_from_params({"w": jnp.zeros(4)}, jax.random.key(0), bad)


# -- Metrics of class probabilities ----------------------------------------------------------


def test_risk_coverage_refuses_labels_outside_the_classes_and_logits():
  """Label 7 of 3 classes is refused naming [0, 3), and logits as not probabilities; what it
  accepts, it scores (AURC = mean risk)."""
  probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
    vj.risk_coverage(probs, np.array([0, 7]))
  with pytest.raises(ValueError, match="not logits"):
    vj.risk_coverage(np.array([[3.0, -1.0, 0.5], [0.2, 2.5, -3.0]]), np.array([0, 1]))
  # What it accepts, it scores: the confident right answer first, AURC = mean risk.
  curve = vj.risk_coverage(probs, np.array([0, 2]))
  np.testing.assert_allclose(curve.accuracy, [0.0, 0.5])  # 0.8 (wrong) is the most confident
  assert curve.aurc == pytest.approx(np.mean([1.0, 0.5]))


# -- Intervals of one task -------------------------------------------------------------------


def test_one_task_gives_no_interval_not_plus_minus_zero():
  """One task gives a NaN half-width (no interval), not +- 0: in mean_confidence_interval and
  in summarise's accuracy_ci95 and nll_ci95."""
  mean, half = vj.mean_confidence_interval([0.24])
  assert mean == pytest.approx(0.24) and math.isnan(half)
  mean, half = vj.mean_confidence_interval([0.2, 0.4])
  assert half == pytest.approx(1.959964 * 0.1 / math.sqrt(2), rel=1e-5)
  # One task of 5 queries, uniform over 5 classes: argmax is class 0, right once (accuracy
  # 0.2), and the NLL is -log 0.2 (summarise checks both against the probabilities).
  per_task = {
    "accuracy": np.array([0.2]),
    "nll": np.array([-math.log(0.2)]),
    "probabilities": np.full((1, 5, 5), 0.2),
    "targets": np.arange(5, dtype=np.int32)[None],
  }
  summary = vj.summarise("classification", per_task)
  assert math.isnan(summary.metrics["accuracy_ci95"]) and math.isnan(summary.metrics["nll_ci95"])


# -- Seeds and one-way tasks -----------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**32, 2**63 - 1, 2**64, 1.5, True])
def test_a_seed_jax_would_cut_to_32_bits_is_refused(seed):
  """A seed outside [0, 2**32 - 1] (which `jax.random.key` would cut to 32 bits, repeating a
  smaller seed: 2**32 as 0, -1 as 2**32 - 1) or not an integer is refused, naming the field,
  the range and the value; the command line says it by its flag; 2**32 - 1 is accepted."""
  from experiments import cli

  config = vj.RunConfig().replace(seed=seed)
  with pytest.raises(
    ConfigError, match=r"^seed must be an integer in \[0, 2\*\*32 - 1\]"
  ) as raised:
    config.validate()
  assert f"got {seed!r}" in str(raised.value) and raised.value.fields == ("seed",)
  assert str(cli.as_flags(raised.value)).startswith("--seed must be an integer in [0, 2**32 - 1]")
  vj.RunConfig().replace(seed=config_lib.MAX_SEED).validate()


def test_the_largest_seed_is_a_key_of_its_own():
  keys = {
    seed: tuple(np.asarray(jax.random.key_data(jax.random.key(seed))).tolist())
    for seed in (0, 1, config_lib.MAX_SEED)
  }
  assert len(set(keys.values())) == 3


def test_one_way_tasks_are_refused():
  """One-way tasks (every prediction right: accuracy 100 %, NLL and ECE 0, saying nothing)
  are refused, naming the field, the value and the fix; the command line says it by its
  flag; two ways are accepted."""
  from experiments import cli
  from vampire_jax.runs.experiment_configs import check_episodes

  with pytest.raises(ConfigError, match="^ways 1: a task needs at least 2 classes") as raised:
    check_episodes(1, 1, 15, 20, {"train": 100, "val": 10, "test": 50}, what="Omniglot's")
  assert "use ways 2 or more" in str(raised.value)
  assert str(cli.as_flags(raised.value)).startswith("--ways 1: a task needs at least 2 classes")
  check_episodes(2, 1, 15, 20, {"train": 100, "val": 10, "test": 50}, what="Omniglot's")


# -- An edited run.json ------------------------------------------------------------------------


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


# -- Low precision and integer leaves ---------------------------------------------------------


def _adapt(prior, task, loss_fn, **settings):
  """`vj.adapt` on `task`'s support set with key 2."""
  return vj.adapt(
    prior, task.support_x, task.support_y, jax.random.key(2), loss_fn=loss_fn, **settings
  )


SMALL_MLP = vj.MLP((16,), 1)


def _small_regression():
  from vampire_jax.data import sine_line

  apply_fn = vj.pure_apply(SMALL_MLP)
  params = vj.init_params(SMALL_MLP, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_params_give_a_posterior_whose_log_stds_move(dtype):
  """From bfloat16/float16 params the prior is float32, and 5 inner steps move its log-stds
  by more than 1e-4 (float32 moves them by 0.0013)."""
  apply_fn, params, task = _small_regression()
  low = jax.tree_util.tree_map(lambda p: p.astype(dtype), params)
  prior = vj.gaussian_from_params(low, jax.random.key(1))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(prior))
  loss_fn = vj.loss_from_apply(vj.mixed_precision(apply_fn, dtype), vj.gaussian_nll(0.3))
  posterior = _adapt(prior, task, loss_fn, num_steps=5, inner_lr=1e-3, kl_weight=0.01)
  moved = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(
      jax.tree_util.tree_leaves(posterior.log_std), jax.tree_util.tree_leaves(prior.log_std)
    )
  )
  assert moved > 1e-4


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_low_precision_distribution_is_refused_by_adapt_naming_the_leaf(dtype):
  apply_fn, params, task = _small_regression()
  prior = vj.gaussian_from_params(params, jax.random.key(1))
  low = jax.tree_util.tree_map(lambda p: p.astype(dtype), prior)
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  with pytest.raises(InputError, match=r"adapt: mean\['Dense_0'\]\['bias'\] is (bfloat16|float16)"):
    _adapt(low, task, loss_fn, num_steps=1, inner_lr=1e-3)


def test_low_precision_meta_training_moves_the_priors_log_stds():
  """20 meta-steps of make_train_step from bfloat16 params move the prior's log-stds by more
  than 1e-3."""
  from vampire_jax.data import sine_line

  apply_fn, params, _ = _small_regression()
  learner = vj.vampire(
    vj.mixed_precision(apply_fn),
    vj.gaussian_nll(0.3),
    num_inner_steps=2,
    inner_lr=1e-3,
    kl_weight=0.01,
  )
  low = jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=4)
  state = vj.init_meta_state(learner, optimizer, low, jax.random.key(1))
  prior = state.meta_params
  step = jax.jit(
    vj.make_train_step(
      learner, optimizer, lambda data, keys: sine_line.tasks_from_keys(keys), tasks_per_step=4
    )
  )
  start = jax.tree_util.tree_leaves(prior.log_std)
  key = jax.random.key(3)
  for _ in range(20):
    key, step_key = jax.random.split(key)
    state, _ = step(state, None, step_key)
  moved = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree_util.tree_leaves(state.meta_params.log_std), start)
  )
  assert moved > 1e-3


def test_integer_leaves_are_named_by_gaussian_from_params_adapt_and_maml_adapt():
  """An int32 leaf is refused naming its path, by gaussian_from_params, adapt and maml_adapt."""
  apply_fn, params, task = _small_regression()
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  ints = {**params, "Dense_1": {**params["Dense_1"], "bias": jnp.zeros(1, jnp.int32)}}
  with pytest.raises(
    InputError, match=r"gaussian_from_params: params\['Dense_1'\]\['bias'\] is int32"
  ):
    vj.gaussian_from_params(ints, jax.random.key(0))
  prior = vj.gaussian_from_params(params, jax.random.key(0))
  bad_prior = vj.Gaussian(ints, prior.log_std)
  with pytest.raises(InputError, match=r"adapt: mean\['Dense_1'\]\['bias'\] is int32"):
    _adapt(bad_prior, task, loss_fn, num_steps=1, inner_lr=1e-3)
  with pytest.raises(InputError, match=r"maml_adapt: params\['Dense_1'\]\['bias'\] is int32"):
    vj.maml_adapt(ints, task.support_x, task.support_y, loss_fn=loss_fn, num_steps=1, inner_lr=1e-3)


# -- A prior too narrow for KL steps ----------------------------------------------------------


@pytest.mark.parametrize("narrow", ["point_mass", "log_std_-100"])
def test_adapt_from_a_very_narrow_prior_refuses_instead_of_returning_nan(narrow):
  """From a point mass or log-stds of -100, adapt refuses a non-finite posterior naming the KL
  term's step factor; with kl_weight 0 a point mass adapts as MAML, finite."""
  apply_fn, params, task = _small_regression()
  prior = (
    vj.point_mass(params)
    if narrow == "point_mass"
    else vj.Gaussian(params, jax.tree_util.tree_map(lambda p: jnp.full_like(p, -100.0), params))
  )
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  with pytest.raises(
    InputError,
    match="adapt: the posterior is not finite after 5 steps from "
    "a finite prior; the KL term's step factor",
  ):
    _adapt(prior, task, loss_fn, num_steps=5, inner_lr=1e-3, kl_weight=0.1)
  # With kl_weight 0 a point mass is MAML: finite, nothing refused.
  posterior = _adapt(prior, task, loss_fn, num_steps=5, inner_lr=1e-3, kl_weight=0.0)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(posterior))


@pytest.mark.parametrize(
  "case", ["point_mass", "log_std_-100", "inner_lr_1e308", "kl_weight_1e308"]
)
def test_check_inner_loop_diagnoses_what_it_exists_for_without_crashing(case):
  """A point mass, log-stds of -100, inner_lr or kl_weight 1e308: check_inner_loop reports
  not ok in one line of advice, naming the KL step factor or the narrow prior where they are
  the cause, and never advising a larger inner_lr."""
  apply_fn, params, task = _small_regression()
  inner_lr, kl_weight = 1e-3, 0.1
  prior = vj.gaussian_from_params(params, jax.random.key(1))
  if case == "point_mass":
    prior = vj.point_mass(params)
  elif case == "log_std_-100":
    prior = vj.Gaussian(params, jax.tree_util.tree_map(lambda p: jnp.full_like(p, -100.0), params))
  elif case == "inner_lr_1e308":
    inner_lr = 1e308
  else:
    kl_weight = 1e308
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), inner_lr=inner_lr, kl_weight=kl_weight)
  report = vj.check_inner_loop(learner, prior, task, jax.random.key(4))
  assert not report.ok
  assert len(report.advice.splitlines()) == 1
  if case != "inner_lr_1e308":
    assert "KL term's step factor" in report.advice
  if case in ("point_mass", "log_std_-100"):
    assert "too narrow for KL steps" in report.advice
  if "use inner_lr" in report.advice:  # never advice to raise the step that failed
    advised = float(report.advice.split("use inner_lr ")[1].split(" ")[0])
    assert advised < inner_lr


def test_check_inner_loop_measures_curvature_under_x64():
  """Under x64 check_inner_loop measures a positive curvature (the power iteration's carry
  keeps its dtype)."""
  import subprocess
  import sys

  code = (
    "import jax, jax.numpy as jnp, vampire_jax as vj\n"
    "from vampire_jax.data import sine_line\n"
    "net = vj.MLP((16,), 1); apply_fn = vj.pure_apply(net)\n"
    "params = vj.init_params(net, jax.random.key(0), (1, 1))\n"
    "task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))\n"
    "learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), inner_lr=10.0, kl_weight=0.01)\n"
    "r = vj.check_inner_loop(learner, vj.gaussian_from_params(params, jax.random.key(1)), task,"
    " jax.random.key(4))\n"
    "assert r.curvature is not None and r.curvature > 0, r\n"
    "print('curvature', r.curvature)\n"
  )
  env = {**__import__("os").environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]


def test_kl_step_factor_of_an_empty_tree_is_one_line():
  """kl_step_factor of an empty tree is refused saying the prior has no weights."""
  with pytest.raises(InputError, match="kl_step_factor: the prior has no weights"):
    vj.kl_step_factor(vj.Gaussian({}, {}), 0.01, 0.1)


# -- Per-query predictions --------------------------------------------------------------------


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
  from conftest import tiny_regression_config
  from experiments import regression
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


# -- One line where a run cannot start ---------------------------------------------------------


def test_a_damaged_png_inside_the_zip_is_one_line_naming_it(tmp_path):
  """A damaged PNG inside the zip is refused in one line naming the file and its zip."""
  import io
  import zipfile

  from PIL import Image

  from vampire_jax.data import omniglot
  from vampire_jax._src.core.errors import DataError

  good = io.BytesIO()
  Image.new("L", (105, 105), 255).save(good, format="PNG")
  for set_name in ("images_background", "images_evaluation"):
    with zipfile.ZipFile(tmp_path / f"{set_name}.zip", "w") as archive:
      archive.writestr(f"{set_name}/Latin/character01/0101_01.png", good.getvalue())
      if set_name == "images_evaluation":
        archive.writestr(f"{set_name}/Latin/character01/0101_02.png", b"\x89PNG not an image")
  with pytest.raises(DataError) as raised:
    omniglot._load_zips(tmp_path)
  message = str(raised.value)
  assert "images_evaluation/Latin/character01/0101_02.png" in message
  assert f"0101_02.png in {tmp_path / 'images_evaluation.zip'} is not" in message
  assert "not a readable image" in message and len(message.splitlines()) == 1


@pytest.mark.parametrize(
  "variable, value",
  [
    ("JAX_NUM_CPU_DEVICES", "0"),
    ("JAX_NUM_CPU_DEVICES", "abc"),
    ("JAX_NUM_CPU_DEVICES", "1.5"),
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=abc"),
  ],
)
def test_a_bad_device_count_in_the_environment_is_one_line(variable, value):
  """A bad JAX_NUM_CPU_DEVICES or XLA_FLAGS device count is one line of error with the value,
  and exit 2."""
  import os
  import subprocess
  import sys

  from conftest import REPO

  env = {**os.environ, variable: value}
  env.pop("JAX_NUM_CPU_DEVICES", None) if variable != "JAX_NUM_CPU_DEVICES" else None
  done = subprocess.run(
    [sys.executable, "-m", "experiments.regression", "--help"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2
  assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
  assert value in done.stderr


def test_zero_hidden_units_is_a_config_error():
  """A layer of zero units or filters is refused as a ConfigError in one line, naming the
  field and the values (the command line: by its flag), not a ZeroDivisionError later."""
  from experiments import cli, presets

  config = presets.get_config("regression", "quick", "vampire")
  config.hidden_sizes = (0, 0, 0)
  with pytest.raises(ConfigError, match=r"^hidden_sizes must be whole numbers >= 1") as raised:
    config.validate()
  assert "got [0, 0, 0]" in str(raised.value)
  assert str(cli.as_flags(raised.value)).startswith("--hidden-sizes must be whole numbers >= 1")
  config = presets.get_config("omniglot", "quick", "vampire")
  config.num_filters = 0
  with pytest.raises(ConfigError, match=r"^num_filters must be whole numbers >= 1") as raised:
    config.validate()
  assert str(cli.as_flags(raised.value)).startswith("--num-filters must be whole numbers >= 1")


def test_an_unwritable_compilation_cache_is_a_note_not_a_refusal(tmp_path):
  """An unwritable VAMPIRE_JAX_CACHE gives one note naming --no-compilation-cache, and the
  run completes."""
  import os
  import subprocess
  import sys

  from conftest import REPO

  (tmp_path / "file").write_text("")
  env = {**os.environ, "VAMPIRE_JAX_CACHE": str(tmp_path / "file" / "cache")}
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.regression",
      "--preset",
      "quick",
      "--algorithms",
      "maml",
      "--num-meta-steps",
      "2",
      "--log-every",
      "1",
      "--eval-every",
      "2",
      "--checkpoint-every",
      "2",
      "--num-val-tasks",
      "2",
      "--num-test-tasks",
      "2",
      "--hidden-sizes",
      "8",
      "8",
      "8",
      "--no-progress",
      "--workdir",
      str(tmp_path / "run"),
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  notes = [line for line in done.stderr.splitlines() if "compilation cache" in line]
  assert len(notes) == 1 and "--no-compilation-cache" in notes[0]


def test_a_method_named_twice_is_refused():
  """compare --algorithms naming vampire twice is refused; distinct methods are parsed."""
  from experiments import compare

  with pytest.raises(ConfigError, match="--algorithms names vampire twice"):
    compare.parse_algorithms("vampire,maml,vampire")
  assert compare.parse_algorithms("vampire,maml") == ["vampire", "maml"]


# -- NNX and Equinox networks with state -------------------------------------------------------


def test_from_nnx_names_a_layer_in_training_mode_and_wrong_inputs():
  """from_nnx names a BatchNorm or Dropout in training mode and model.eval(); after eval,
  inputs of the wrong width are named as not fitting the module."""
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(1, 8, rngs=rngs)
      self.norm = nnx.BatchNorm(8, rngs=rngs)
      self.drop = nnx.Dropout(0.5, rngs=rngs)
      self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
      return self.out(self.drop(self.norm(self.dense(x))))

  model = Net(nnx.Rngs(0))
  with pytest.raises(
    InputError,
    match=r"from_nnx: (norm|drop) is an nnx.(BatchNorm|Dropout) in training mode.*model.eval\(\)",
  ):
    vj.from_nnx(model)
  model.drop.deterministic = True  # dropout off, batch norm still training: named as well
  with pytest.raises(InputError, match=r"from_nnx: norm is an nnx.BatchNorm in training mode"):
    vj.from_nnx(model)
  model.eval()
  params, apply_fn = vj.from_nnx(model)
  assert apply_fn(params, jnp.ones((3, 1))).shape == (3, 1)
  with pytest.raises(InputError, match=r"x float32\[3, 2\] does not fit the module"):
    apply_fn(params, jnp.ones((3, 2)))


def test_from_equinox_names_stateful_layers_and_weights_of_another_width():
  """from_equinox names a BatchNorm and a Dropout in training mode (and inference_mode);
  weights of another width are refused in one line naming both shapes."""
  eqx = pytest.importorskip("equinox")

  class Net(eqx.Module):
    dense: eqx.nn.Linear
    norm: eqx.nn.BatchNorm

    def __init__(self, key):
      self.dense = eqx.nn.Linear(1, 8, key=key)
      self.norm = eqx.nn.BatchNorm(8, axis_name="batch", mode="batch")

    def __call__(self, x, state=None):
      return self.norm(self.dense(x), state)[0]

  with pytest.raises(InputError, match=r"from_equinox: \.norm is an eqx.nn.BatchNorm"):
    vj.from_equinox(Net(jax.random.key(0)))
  with_dropout = eqx.nn.Sequential(
    [eqx.nn.Linear(1, 4, key=jax.random.key(0)), eqx.nn.Dropout(0.2)]
  )
  with pytest.raises(InputError, match=r"Dropout in training mode.*inference_mode"):
    vj.from_equinox(with_dropout)
  vj.from_equinox(eqx.nn.inference_mode(with_dropout))
  params, apply_fn = vj.from_equinox(eqx.nn.MLP(1, 1, 8, 2, key=jax.random.key(0)))
  wider, _ = vj.from_equinox(eqx.nn.MLP(1, 1, 16, 2, key=jax.random.key(0)))
  with pytest.raises(InputError) as raised:
    apply_fn(wider, jnp.ones((3, 1)))
  assert "has shape (16, 1), the module's has (8, 1)" in str(raised.value)
  assert len(str(raised.value).splitlines()) == 1


def test_an_int_key_and_one_task_without_its_axis_are_one_line_each():
  """An int key is refused by the evaluator and the train step as not a PRNG key; one task
  without its task axis is refused saying to add one."""
  from vampire_jax.data import sine_line

  apply_fn, params, _ = _small_regression()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), num_inner_steps=1)
  meta_params = learner.init(params, jax.random.key(1))
  tasks = sine_line.sample_tasks(jax.random.key(5), 3)
  evaluate = vj.make_regression_evaluator(learner, 0.3)
  with pytest.raises(InputError, match="evaluate: keys must be a PRNG key"):
    evaluate(meta_params, tasks, 3)
  one_task = jax.tree_util.tree_map(lambda v: v[0], tasks)
  with pytest.raises(InputError, match=r"one task without its leading task axis\? add one"):
    evaluate(meta_params, one_task, jax.random.key(2))
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = vj.make_train_step(
    learner, optimizer, lambda data, keys: sine_line.tasks_from_keys(keys), tasks_per_step=2
  )
  with pytest.raises(InputError, match="train_step: key must be a PRNG key"):
    train_step(state, None, 3)


# -- From one's own code (issue 41) ------------------------------------------------------------


def test_summarise_in_one_call_equals_the_dict_form_and_wants_targets_once():
  from vampire_jax.data import sine_line

  apply_fn, params, _ = _small_regression()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), num_inner_steps=1, num_mc_query=2)
  meta_params = learner.init(params, jax.random.key(1))
  tasks = sine_line.sample_tasks(jax.random.key(5), 4)
  per_task = vj.make_regression_evaluator(learner, 0.3)(meta_params, tasks, jax.random.key(2))
  one_call = vj.summarise("regression", per_task, tasks.query_y, noise_std=0.3)
  as_dict = vj.summarise(
    "regression", dict(per_task._asdict(), targets=tasks.query_y), noise_std=0.3
  )
  assert one_call.metrics == as_dict.metrics
  with pytest.raises(InputError, match="summarise: targets must be given once"):
    vj.summarise("regression", dict(per_task._asdict(), targets=tasks.query_y), tasks.query_y)
  with pytest.raises(InputError, match="summarise: targets must be the tasks' query labels"):
    vj.summarise("regression", per_task, noise_std=0.3)


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


def test_the_printed_mce_names_the_size_of_the_bin_that_sets_it():
  """The printed MCE names the size of the bin that sets it: here one prediction, "MCE 0.5500
  (bin of 1)"."""
  # 3 tasks x 4 queries of 2 classes. 11 predictions at 0.9, 10 right (gap 0.009); one at
  # 0.55 and wrong (gap 0.55): the MCE is that single prediction's.
  probabilities = np.full((3, 4, 2), 0.1)
  probabilities[..., 0] = 0.9
  probabilities[2, 3] = [0.55, 0.45]
  targets = np.zeros((3, 4), int)
  targets[0, 0] = 1
  targets[2, 3] = 1
  picked = np.take_along_axis(probabilities, targets[..., None], axis=-1)[..., 0]
  per_task = dict(
    accuracy=np.array([0.75, 1.0, 0.75]),
    nll=-np.mean(np.log(picked), axis=1),  # as the evaluator's, which summarise checks
    probabilities=probabilities,
  )
  metrics = vj.summarise("classification", per_task, targets, num_bins=10).metrics
  assert metrics["mce"] == pytest.approx(0.55) and metrics["mce_bin_count"] == 1
  assert "MCE 0.5500 (bin of 1)" in kinds.CLASSIFICATION.summary_line(metrics)


def test_tasks_per_step_is_stated_once_to_meta_optimizer():
  """`make_train_step` reads `tasks_per_step` from `meta_optimizer`: stated again it must agree,
  and it is required only with an optimizer not built by it."""
  from vampire_jax.data import sine_line

  apply_fn, params, _ = _small_regression()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), num_inner_steps=1, num_mc_query=2)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=4)
  assert isinstance(optimizer, optax.GradientTransformation) and optimizer.tasks_per_step == 4
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))

  def sample(data, task_keys):
    return sine_line.tasks_from_keys(task_keys)

  once = vj.make_train_step(learner, optimizer, sample)
  twice = vj.make_train_step(learner, optimizer, sample, tasks_per_step=4)
  (_, m_once), (_, m_twice) = (f(state, None, jax.random.key(3)) for f in (once, twice))
  assert float(m_once["loss"][0]) == float(m_twice["loss"][0])
  with pytest.raises(InputError, match="tasks_per_step=8 differs from the 4 tasks per step"):
    vj.make_train_step(learner, optimizer, sample, tasks_per_step=8)
  with pytest.raises(InputError, match="tasks_per_step is required with an optimizer not built"):
    vj.make_train_step(learner, optax.adam(1e-3), sample)
  assert vj.make_train_step(learner, optax.adam(1e-3), sample, tasks_per_step=4)
