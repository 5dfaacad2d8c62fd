"""The library refuses what it cannot do right: one row per case, as a table.

Every bad input raises an `InputError` (a ValueError) naming the function and
the argument; defaults stay finite for the likelihoods the library ships;
non-finite training is flagged; the inner-loop check knows the likelihood.
"""

import re

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.metrics.evaluation import evaluate_split
from conftest import needs_omniglot, tiny_regression_config
from experiments import regression, train
from vampire_jax._src.core import diagnostics
from vampire_jax.runs import loop as training
from vampire_jax.data import sine_line
from vampire_jax._src.core.errors import InputError

REGRESSION_MLP = vj.MLP((100, 100, 100), 1)  # the paper's regression network


def _regression_setup():
  apply_fn = vj.pure_apply(REGRESSION_MLP)
  params = vj.init_params(REGRESSION_MLP, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


def _sample_tasks(data, task_keys):
  """The library's convention: `sample_tasks(data, task_keys [n]) -> Task [n, ...]`."""
  del data
  return sine_line.tasks_from_keys(task_keys)


# -- Shapes and dtypes where data enters ------------------------------------------------


def _gaussian_nll_flat_targets():
  vj.gaussian_nll(0.3)(jnp.zeros((5, 1)), jnp.zeros(5))


def _adapt_flat_support_y():
  apply_fn, params, task = _regression_setup()
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  vj.adapt(
    vj.gaussian_from_params(params, jax.random.key(1)),
    task.support_x,
    task.support_y[:, 0],
    jax.random.key(2),
    loss_fn=loss_fn,
    num_steps=1,
    inner_lr=1e-3,
  )


def _maml_adapt_flat_support_y():
  apply_fn, params, task = _regression_setup()
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  vj.maml_adapt(
    params, task.support_x, task.support_y[:, 0], loss_fn=loss_fn, num_steps=1, inner_lr=1e-3
  )


def _learner_adapt_wide_support_y():
  apply_fn, params, task = _regression_setup()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3))
  learner.adapt(
    learner.init(params, jax.random.key(1)),
    task.support_x,
    jnp.tile(task.support_y, (1, 3)),
    jax.random.key(2),
  )


def _categorical_float_labels():
  vj.categorical_nll(jnp.zeros((4, 3)), jnp.zeros(4))


def _categorical_wrong_label_shape():
  vj.categorical_nll(jnp.zeros((4, 3)), jnp.zeros((4, 1), jnp.int32))


def _meta_step_on(change_tasks):
  """One jitted MAML meta-step on two sine/line tasks altered by `change_tasks`."""
  apply_fn, params, _ = _regression_setup()
  learner = vj.maml(apply_fn, vj.gaussian_nll(0.3))
  optimizer = optax.adam(1e-3)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))
  tasks = change_tasks(sine_line.tasks_from_keys(jax.random.split(jax.random.key(1), 2)))
  jax.jit(vj.make_meta_step(learner, optimizer))(state, tasks, jax.random.key(2))


def _meta_step_flat_query_y():
  _meta_step_on(lambda tasks: tasks._replace(query_y=tasks.query_y[..., 0]))


def _meta_step_empty_query():
  _meta_step_on(
    lambda tasks: tasks._replace(query_x=tasks.query_x[:, :0], query_y=tasks.query_y[:, :0])
  )


def _predict_empty_query():
  apply_fn, params, _ = _regression_setup()
  vj.predict(
    vj.gaussian_from_params(params, jax.random.key(1)),
    jnp.zeros((0, 1)),
    jax.random.key(2),
    apply_fn=apply_fn,
    num_mc_samples=2,
  )


def _conv4_uint8_images():
  model = vj.conv4_omniglot(5)
  params = vj.init_params(model, jax.random.key(0), (1, 28, 28, 1))
  vj.pure_apply(model)(params, jnp.zeros((2, 28, 28, 1), jnp.uint8))


def _train_step_with_key_count_sampler():
  apply_fn, params, _ = _regression_setup()
  learner = vj.maml(apply_fn, vj.gaussian_nll(0.3))
  optimizer = optax.adam(1e-3)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))
  step = vj.make_train_step(learner, optimizer, sine_line.sample_tasks, tasks_per_step=2)
  jax.jit(step)(state, None, jax.random.key(1))


LIBRARY_ROWS = {
  "gaussian_nll [K,1] outputs, [K] targets": (
    _gaussian_nll_flat_targets,
    r"gaussian_nll: targets must be shaped like",
  ),
  "adapt, [K] support_y": (_adapt_flat_support_y, r"adapt: support_y does not fit"),
  "maml_adapt, [K] support_y": (_maml_adapt_flat_support_y, r"maml_adapt: support_y does not fit"),
  "learner.adapt, [K, 3] support_y": (
    _learner_adapt_wide_support_y,
    r"adapt: support_y does not fit",
  ),
  "categorical_nll, float labels": (_categorical_float_labels, r"labels must be integer"),
  "categorical_nll, [K, 1] labels": (
    _categorical_wrong_label_shape,
    r"labels must be shaped \[4\]",
  ),
  "meta-step, [K] query_y": (_meta_step_flat_query_y, r"query_y does not fit"),
  "meta-step, empty query set": (
    _meta_step_empty_query,
    r"tasks.query_x must be at least one example",
  ),
  "predict, empty x": (_predict_empty_query, r"predict: x must be an array of at least one"),
  "Conv4, uint8 images": (_conv4_uint8_images, r"Conv4: x must be floating point, preprocessed"),
  "make_train_step, sampler(key, n)": (
    _train_step_with_key_count_sampler,
    r"sample_tasks\(data, task_keys\)",
  ),
}


@pytest.mark.parametrize("row", list(LIBRARY_ROWS))
def test_library_entry_points_refuse_bad_input_naming_the_argument(row):
  call, message = LIBRARY_ROWS[row]
  with pytest.raises(InputError, match=message):
    call()


def test_checks_run_at_trace_time_only():
  """The checks cost nothing in the compiled program: one trace for many calls."""
  apply_fn, params, task = _regression_setup()
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))

  @jax.jit
  @chex.assert_max_traces(n=1)
  def adapt(params, x, y):
    return vj.maml_adapt(params, x, y, loss_fn=loss_fn, num_steps=2, inner_lr=1e-3)

  for shift in (0.0, 1.0, 2.0):
    adapt(params, task.support_x + shift, task.support_y)


# -- Run.predict: shapes, dtypes, values -----------------------------------------------


@pytest.fixture(scope="module")
def tiny_regression_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("tiny_regression_run")
  config = tiny_regression_config("vampire", num_meta_steps=2, num_mc_test=2)
  regression.run_experiment(config, workdir, progress=False, print_fn=lambda m: None)
  return vj.load_run(workdir)


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


# -- Defaults that hold, the inner-loop check, the finite flag ---------------------------


@pytest.mark.parametrize("noise_std", [0.1, 0.3, 1.0])
@pytest.mark.parametrize("factory", ["vampire", "maml", "abml", "platipus"])
def test_factory_defaults_stay_finite_and_learn_for_gaussian_likelihoods(factory, noise_std):
  apply_fn, params, task = _regression_setup()
  make = getattr(vj, factory, None) or getattr(vj.baselines, factory)
  learner = make(apply_fn, vj.gaussian_nll(noise_std))
  report = vj.check_inner_loop(
    learner, learner.init(params, jax.random.key(1)), task, jax.random.key(2)
  )
  assert report.ok, report
  assert report.loss_after < 0.5 * report.loss_before  # the inner loop learns, not just survives


def test_the_default_inner_lr_follows_the_likelihoods_curvature():
  assert vj.gaussian_nll(0.1).default_inner_lr == pytest.approx(5e-5)
  assert vj.gaussian_nll(10.0).default_inner_lr == 0.1
  apply_fn, _, _ = _regression_setup()
  assert vj.vampire(apply_fn, vj.categorical_nll).settings.inner_lr == 0.01
  assert vj.maml(apply_fn, vj.categorical_nll).settings.inner_lr == 0.1
  assert vj.maml(apply_fn, vj.gaussian_nll(0.3)).settings.inner_lr == pytest.approx(4.5e-4)
  assert vj.maml(apply_fn, vj.gaussian_nll(0.3), inner_lr=0.2).settings.inner_lr == 0.2


def test_check_inner_loop_finds_a_diverging_step_and_its_advice_works():
  apply_fn, params, task = _regression_setup()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.1), inner_lr=0.01)
  prior = learner.init(params, jax.random.key(1))
  report = vj.check_inner_loop(learner, prior, task, jax.random.key(2))
  assert not report.ok and not np.isfinite(report.loss_after)
  # The curvature is the Hessian's top eigenvalue: compare with a dense Hessian of the last layer.
  assert 1e3 < report.curvature < 1e5
  assert "use inner_lr" in report.advice and "(now 0.01)" in report.advice
  advised = float(report.advice.split("use inner_lr ")[1].split()[0])
  assert advised < report.stable_inner_lr
  fixed = vj.vampire(apply_fn, vj.gaussian_nll(0.1), inner_lr=advised)
  assert vj.check_inner_loop(fixed, prior, task, jax.random.key(2)).ok


def test_largest_curvature_is_the_top_hessian_eigenvalue():
  """Against a dense Hessian of a small quadratic-plus-softplus loss."""

  def loss_fn(w, x, y):
    return jnp.mean(jnp.square(x @ w["a"] - y)) + jnp.sum(jax.nn.softplus(w["b"]) ** 2)

  x = jax.random.normal(jax.random.key(0), (20, 4))
  y = jax.random.normal(jax.random.key(1), (20,))
  w = {"a": jnp.arange(4.0) / 4, "b": jnp.array([0.3, -0.2])}
  flat, unravel = jax.flatten_util.ravel_pytree(w)
  dense = jax.hessian(lambda f: loss_fn(unravel(f), x, y))(flat)
  top = float(np.max(np.linalg.eigvalsh(np.asarray(dense))))
  got = float(
    diagnostics.largest_curvature(loss_fn, w, x, y, jax.random.key(2), num_iterations=100)
  )
  np.testing.assert_allclose(got, top, rtol=1e-3)


def test_check_inner_loop_names_the_kl_factor():
  apply_fn, params, task = _regression_setup()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(1.0), inner_lr=1e-3, kl_weight=50.0)
  report = vj.check_inner_loop(
    learner, learner.init(params, jax.random.key(1)), task, jax.random.key(2)
  )
  assert report.kl_factor > 2 and "KL term's step factor" in report.advice


def test_train_step_metrics_flag_non_finite_steps():
  apply_fn, params, _ = _regression_setup()
  optimizer = optax.adam(1e-3)
  flags = {}
  for inner_lr in (1e-4, 1.0):
    learner = vj.maml(apply_fn, vj.gaussian_nll(0.1), inner_lr=inner_lr)
    state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))
    step = jax.jit(
      vj.make_train_step(learner, optimizer, _sample_tasks, tasks_per_step=2, steps_per_call=2)
    )
    _, metrics = step(state, None, jax.random.key(1))
    flags[inner_lr] = np.asarray(metrics["finite"])
    assert flags[inner_lr].shape == (2,)
    assert np.array_equal(
      flags[inner_lr], np.isfinite(metrics["loss"]) & np.isfinite(metrics["grad_norm"])
    )
  assert flags[1e-4].all() and not flags[1.0].any()


def test_debug_nonfinite_names_the_operation():
  apply_fn, params, task = _regression_setup()
  learner = vj.maml(apply_fn, vj.gaussian_nll(0.1), inner_lr=10.0)
  adapt = vj.debug_nonfinite(lambda p: learner.adapt(p, task.support_x, task.support_y, None))
  with pytest.raises(FloatingPointError, match="nan generated by primitive"):
    adapt(params)
  fine = vj.debug_nonfinite(
    lambda p: vj.maml(apply_fn, vj.gaussian_nll(0.1)).adapt(p, task.support_x, task.support_y, None)
  )
  chex.assert_tree_all_finite(fine(params))


def test_distribution_nll_takes_any_distrax_distribution():
  outputs = jax.random.normal(jax.random.key(0), (6, 1))
  targets = jax.random.normal(jax.random.key(1), (6, 1))
  normal = vj.distribution_nll(lambda out: distrax.Normal(out, 0.3))
  np.testing.assert_allclose(
    normal(outputs, targets), vj.gaussian_nll(0.3)(outputs, targets), rtol=1e-6
  )
  laplace = vj.distribution_nll(lambda out: distrax.Laplace(out, 0.3))
  expected = np.mean(np.abs(targets - outputs) / 0.3 + np.log(2 * 0.3))
  np.testing.assert_allclose(laplace(outputs, targets), expected, rtol=1e-5)
  with pytest.raises(InputError, match="distribution_nll: targets must be shaped like"):
    laplace(outputs, targets[:, 0])


def _tiny_regression_config(**changes):
  return tiny_regression_config("maml", **{"num_meta_steps": 2, **changes})


def test_training_refuses_an_inner_loop_that_diverges_at_initialisation(tmp_path):
  config = _tiny_regression_config(inner_lr=50.0)
  with pytest.raises(vj.ConfigError, match=r"maml's inner loop at initialisation.*use inner_lr"):
    regression.run_experiment(config, tmp_path, progress=False, print_fn=lambda m: None)
  # Nothing was trained, so no record is left to refuse the advised settings in this folder.
  assert not (tmp_path / "run.json").exists()
  fixed = config.replace(inner_lr=1e-4)
  results = regression.run_experiment(fixed, tmp_path, progress=False, print_fn=lambda m: None)
  assert results["meta_steps"] == 2 and np.isfinite(results["test"]["mse"])


def test_training_with_debug_nans_names_the_first_nan(tmp_path):
  # Stable at initialisation (the check passes), NaN within the first meta-step's outer update.
  config = _tiny_regression_config(
    inner_lr=1e-3,
    meta_lr=1e30,
    num_meta_steps=4,
    log_every=1,
    eval_every=4,
    checkpoint_every=4,
    debug_nans=True,
  )
  with pytest.raises(FloatingPointError, match="generated by primitive"):
    regression.run_experiment(config, tmp_path, progress=False, print_fn=lambda m: None)


@pytest.mark.parametrize(
  "algorithm, guarded", [("maml", False), ("maml", True), ("platipus", False)]
)
def test_divergence_points_to_the_inner_loop_guard_where_it_exists(tmp_path, algorithm, guarded):
  # The meta-step overflows at once: the run stops with the divergence, and names the
  # spec's backtracking only for an algorithm that has it (PLATIPUS has none), and only
  # while it is off.
  changes = dict(meta_lr=1e30, num_meta_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  if "backtracking" in vj.specs.get(algorithm).field_names():
    changes["backtracking"] = guarded
  config = tiny_regression_config(algorithm, **changes)
  with pytest.raises(FloatingPointError, match="meta-training diverged at step") as raised:
    regression.run_experiment(config, tmp_path, progress=False, print_fn=lambda m: None)
  named = f"the {algorithm} spec's backtracking=True" in str(raised.value)
  assert named == (algorithm == "maml" and not guarded), str(raised.value)


def test_training_refuses_a_split_with_nan_before_making_the_folder(tmp_path):
  config = _tiny_regression_config()
  problem = regression.make_problem(config)
  splits = dict(problem.splits, train={"images": np.array([[0.0, np.nan]], np.float32)})
  with pytest.raises(InputError, match=r"problem.splits\['train'\]\['images'\] must be finite"):
    vj.train_and_evaluate(
      problem._replace(splits=splits),
      config,
      tmp_path / "run",
      progress=False,
      print_fn=lambda m: None,
    )
  assert not (tmp_path / "run").exists()


def test_validation_with_a_non_finite_task_is_never_the_best_and_training_goes_on(
  tmp_path, monkeypatch
):
  # One validation task's result overflows at the first validation (as one adapted
  # weight draw of PLATIPUS did at the cpu preset): the loop names it, does not keep
  # those meta-parameters, trains on and tests the best of the later validations.
  evaluate_split, calls = training.evaluation.evaluate_split, []

  def first_validation_overflows(*args, refuse_non_finite=True, **kwargs):
    results = evaluate_split(*args, refuse_non_finite=refuse_non_finite, **kwargs)
    if not refuse_non_finite:  # the loop's validation
      calls.append(len(calls))
      if len(calls) == 1:
        results["mse"][1] = np.nan  # a mean of NaN would never be beaten
    return results

  monkeypatch.setattr(training.evaluation, "evaluate_split", first_validation_overflows)
  config = _tiny_regression_config(num_meta_steps=4, log_every=2, eval_every=2, checkpoint_every=2)
  lines = []
  results = regression.run_experiment(config, tmp_path, progress=False, print_fn=lines.append)
  assert len(calls) == 3  # the validations at steps 2 and 4, then the recalibration's fit
  assert any(
    "step 2: validation: 1 of" in line and "tasks [1]" in line and "not kept" in line
    for line in lines
  ), lines
  assert results["best_validation"]["step"] == 4
  assert np.isfinite(results["test"]["mse"])


def test_evaluate_split_refuses_non_finite_results_naming_the_tasks():
  def evaluate_indices(meta_params, key, indices):
    values = jnp.where(indices == 3, jnp.nan, 1.0)
    return {"nll": values, "labels": jnp.zeros_like(indices)}

  with pytest.raises(
    FloatingPointError, match=r"1 of 5 tasks gave non-finite results \(tasks \[3\]"
  ):
    evaluate_split(evaluate_indices, None, jax.random.key(0), num_tasks=5, batch_tasks=2)
  ok = evaluate_split(lambda p, k, i: {"nll": jnp.ones(len(i))}, None, jax.random.key(0), 5, 2)
  assert ok["nll"].shape == (5,)
  kept = evaluate_split(evaluate_indices, None, jax.random.key(0), 5, 2, refuse_non_finite=False)
  assert np.isnan(kept["nll"][3]) and evaluation.non_finite_tasks(kept).tolist() == [3]


def test_the_papers_kl_step_warning_is_explained_where_it_prints(tmp_path):
  """The regression preset's VAMPIRE warns of its KL step factor (up to 2.98, stable below
  2); a note just before the warning says why and which --kl-weight keeps it below 2."""
  lines = []
  config = tiny_regression_config("vampire", num_meta_steps=2, num_mc_test=2)
  regression.run_experiment(config, tmp_path, progress=False, print_fn=lines.append)
  (note,) = [i for i, line in enumerate(lines) if line.startswith("note: --inner-lr 0.001")]
  (warning,) = [i for i, line in enumerate(lines) if line.startswith("warning: vampire's inner")]
  assert note < warning and "of up to 2.98 at the prior's narrowest" in lines[note]
  factor = re.search(r"sigma_p\^2 is (\d+\.\d+) \(stable below 2\)", lines[warning])
  assert 2 <= float(factor[1]) <= 2.98  # the drawn prior's narrowest log-std is about -4
  assert "--kl-weight 0.64 or less keeps it below 2" in lines[note]
  # MAML has no KL step: no note.
  assert train.kl_step_note(tiny_regression_config("maml")) == ""
