"""A value is checked against what it means, not only its shape.

Each row of `ROWS` is one `InputError` naming the function and the argument, not a
silent wrong answer or a traceback, a tracer's repr, a flax scope error or the wrong
argument blamed. Values under `jit` cannot be checked without a cost: those rows
check the documented alternative (a NaN that `metrics["finite"]` flags).
"""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from tests.helpers import NLL, REGRESSION_MLP
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax.data import sine_line

BAD_LABELS = jnp.array([0, 1, 2, 3, 5])  # label 5 of a 5-way task

MODEL = vj.MLP((4,), 1)


APPLY = vj.pure_apply(MODEL)


LOSS = vj.loss_from_apply(APPLY, NLL)


X = jnp.zeros((3, 1))


Y = jnp.zeros((3, 1))


def _params():
  return vj.init_params(MODEL, jax.random.key(0), (1, 1))


def _equinox_module():
  eqx = pytest.importorskip("equinox")
  return eqx.nn.Linear(1, 1, key=jax.random.key(0))


# Every public function that takes a switch: its name -> (its switches, call(**switch)).
FACTORIES = {
  "vampire": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.vampire(APPLY, NLL, **f),
  ),
  "vampire2": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.vampire2(APPLY, NLL, **f),
  ),
  "maml": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.maml(APPLY, NLL, **f),
  ),
  "platipus": (("first_order", "unroll_steps"), lambda **f: vj.baselines.platipus(APPLY, NLL, **f)),
  "bmaml": (("first_order", "unroll_steps"), lambda **f: vj.baselines.bmaml(APPLY, NLL, **f)),
  "abml": (("first_order", "unroll_steps"), lambda **f: vj.baselines.abml(APPLY, NLL, **f)),
  "simpa": (
    ("first_order", "unroll_steps"),
    lambda **f: vj.baselines.simpa(APPLY, NLL, tasks_per_step=2, **f),
  ),
  "adapt": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.adapt(
      vj.gaussian_from_params(_params(), jax.random.key(1)),
      X,
      Y,
      jax.random.key(2),
      loss_fn=LOSS,
      num_steps=1,
      inner_lr=0.01,
      **f,
    ),
  ),
  "maml_adapt": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.maml_adapt(_params(), X, Y, loss_fn=LOSS, num_steps=1, inner_lr=0.01, **f),
  ),
  "shifted_mean": (
    ("first_order",),
    lambda **f: vj.baselines.shifted_mean(
      _params(), jax.tree.map(jnp.ones_like, _params()), X, Y, loss_fn=LOSS, **f
    ),
  ),
  "svgd_adapt": (
    ("first_order", "unroll_steps"),
    lambda **f: vj.baselines.svgd_adapt(
      vj.baselines.init_particles(_params(), jax.random.key(1), 2),
      X,
      Y,
      loss_fn=LOSS,
      num_steps=1,
      inner_lr=0.01,
      **f,
    ),
  ),
  "meta_optimizer": (
    ("clip_separately",),
    lambda **f: vj.meta_optimizer(tasks_per_step=2, clip_norm=1.0, **f),
  ),
  "from_equinox": (("per_example",), lambda **f: vj.from_equinox(_equinox_module(), **f)),
}


CASES = [(where, name) for where, (names, _) in FACTORIES.items() for name in names]


NOT_BOOLS = [("False", "a str"), (0, "an int"), (1.0, "a float"), (None, "None")]


def _regression_setup():
  apply_fn = vj.pure_apply(REGRESSION_MLP)
  params = vj.init_params(REGRESSION_MLP, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


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


def _meta_step_on(change_tasks, vampire_draws_in_a_loop=False):
  """One jitted MAML meta-step on two sine/line tasks altered by `change_tasks`; or
  VAMPIRE's, its query draws in a loop (`remat_map`, the CPU's; `batching.map_mean`)."""
  apply_fn, params, _ = _regression_setup()
  if vampire_draws_in_a_loop:
    nll = vj.gaussian_nll(0.3)
    learner = vj.vampire(apply_fn, nll, num_mc_query=3, sample_batching="remat_map")
  else:
    learner = vj.maml(apply_fn, vj.gaussian_nll(0.3))
  optimizer = optax.adam(1e-3)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))
  tasks = change_tasks(sine_line.tasks_from_keys(jax.random.split(jax.random.key(1), 2)))
  jax.jit(vj.make_meta_step(learner, optimizer))(state, tasks, jax.random.key(2))


def _meta_step_flat_query_y():
  _meta_step_on(lambda tasks: tasks._replace(query_y=tasks.query_y[..., 0]))


def _vampire_meta_step_flat_query_y():
  _meta_step_on(lambda tasks: tasks._replace(query_y=tasks.query_y[..., 0]), True)


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
  "VAMPIRE meta-step, draws in a loop, [K] query_y": (
    _vampire_meta_step_flat_query_y,
    r"^query_y does not fit the network's outputs on query_x: ",
  ),
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


WAYS = 5


CLASSIFIER = vj.MLP((8,), WAYS)


CLASSIFIER_PARAMS = vj.init_params(CLASSIFIER, jax.random.key(0), (1, 3))


CLASSIFIER_LOSS = vj.loss_from_apply(vj.pure_apply(CLASSIFIER), vj.categorical_nll)


X_FEATURES = jax.random.normal(jax.random.key(2), (WAYS, 3))


LABELS = jnp.arange(WAYS)


REGRESSOR = vj.MLP((8,), 1)


REGRESSOR_PARAMS = vj.init_params(REGRESSOR, jax.random.key(0), (1, 1))


REGRESSOR_LOSS = vj.loss_from_apply(vj.pure_apply(REGRESSOR), vj.gaussian_nll(0.3))


CONV4 = vj.Conv4(WAYS, num_filters=4)


CONV4_PARAMS = vj.init_params(CONV4, jax.random.key(0), (1, 28, 28, 1))


CONV4_LOSS = vj.loss_from_apply(vj.pure_apply(CONV4), vj.categorical_nll)


def _prior(params=CLASSIFIER_PARAMS):
  return vj.gaussian_from_params(params, jax.random.key(1))


def _adapt(prior=None, x=X_FEATURES, y=LABELS, key=None, loss_fn=CLASSIFIER_LOSS, **settings):
  settings = {"num_steps": 2, "inner_lr": 0.1, **settings}
  return vj.adapt(
    _prior() if prior is None else prior,
    x,
    y,
    jax.random.key(3) if key is None else key,
    loss_fn=loss_fn,
    **settings,
  )


def _conv4_adapt(x):
  return _adapt(_prior(CONV4_PARAMS), x=x, loss_fn=CONV4_LOSS, num_steps=1)


def _settings_with(**changes):
  learner = vj.vampire(vj.pure_apply(REGRESSOR), vj.gaussian_nll(1.0))
  return learner._replace(settings=learner.settings._replace(**changes))


def _check_inner_loop_with_negative_kl():
  learner = _settings_with(kl_weight=-1.0)
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  vj.check_inner_loop(learner, learner.init(REGRESSOR_PARAMS, jax.random.key(1)), task, None)


def _train_step(tasks_per_step):
  learner = vj.maml(vj.pure_apply(REGRESSOR), vj.gaussian_nll(0.3))
  vj.make_train_step(learner, optax.adam(1e-3), lambda d, k: None, tasks_per_step=tasks_per_step)


ROWS = {
  # Labels outside [0, ways): -1 wrapped to the last class, `ways` gave NaN, adapt a finite posterior.
  "categorical_nll, label -1": (
    lambda: vj.categorical_nll(jnp.zeros((2, WAYS)), jnp.array([-1, 0])),
    r"categorical_nll: labels must be class indices in \[0, 5\) for 5 outputs, got 1 outside "
    r"it: \[-1\]",
  ),
  "categorical_nll, label ways": (
    lambda: vj.categorical_nll(jnp.zeros((2, WAYS)), jnp.array([WAYS, 0])),
    r"labels must be class indices in \[0, 5\).*\[5\]",
  ),
  "adapt, label 5 of 5 ways": (
    lambda: _adapt(y=BAD_LABELS),
    r"adapt: support_y cannot be scored: categorical_nll: labels must be class indices in \[0, 5\)",
  ),
  "maml_adapt, label -1": (
    lambda: vj.maml_adapt(
      CLASSIFIER_PARAMS,
      X_FEATURES,
      LABELS.at[0].set(-1),
      loss_fn=CLASSIFIER_LOSS,
      num_steps=1,
      inner_lr=0.1,
    ),
    r"maml_adapt: support_y cannot be scored: .*\[-1\]",
  ),
  # Step sizes and weights.
  "adapt, inner_lr NaN": (
    lambda: _adapt(inner_lr=float("nan")),
    r"adapt: inner_lr must be a finite number > 0, got nan",
  ),
  "adapt, inner_lr negative": (
    lambda: _adapt(inner_lr=-0.1),
    r"adapt: inner_lr must be a finite number > 0, got -0.1",
  ),
  "adapt, kl_weight negative": (
    lambda: _adapt(kl_weight=-1.0),
    r"adapt: kl_weight must be a finite number >= 0, got -1.0",
  ),
  "vampire, inner_lr NaN": (
    lambda: vj.vampire(vj.pure_apply(CLASSIFIER), vj.categorical_nll, inner_lr=float("nan")),
    r"vampire: inner_lr must be a finite number > 0, got nan",
  ),
  "vampire, kl_weight negative": (
    lambda: vj.vampire(vj.pure_apply(CLASSIFIER), vj.categorical_nll, kl_weight=-0.1),
    r"vampire: kl_weight must be a finite number >= 0, got -0.1",
  ),
  "abml, kl_weight negative": (
    lambda: vj.baselines.abml(vj.pure_apply(CLASSIFIER), vj.categorical_nll, kl_weight=-0.1),
    r"abml: kl_weight must be a finite number >= 0",
  ),
  "abml, inner_lr negative": (
    lambda: vj.baselines.abml(vj.pure_apply(CLASSIFIER), vj.categorical_nll, inner_lr=-0.01),
    r"abml: inner_lr must be a finite number > 0",
  ),
  "maml, inner_lr NaN": (
    lambda: vj.maml(vj.pure_apply(CLASSIFIER), vj.categorical_nll, inner_lr=float("nan")),
    r"maml: inner_lr must be a finite number > 0",
  ),
  "check_inner_loop, negative KL weight": (
    _check_inner_loop_with_negative_kl,
    r"check_inner_loop: learner.settings: kl_weight must be a finite number >= 0, got -1.0",
  ),
  "make_train_step, tasks_per_step 0": (
    lambda: _train_step(0),
    r"make_train_step: tasks_per_step must be an integer >= 1, got 0",
  ),
  "make_train_step, tasks_per_step 2.5": (
    lambda: _train_step(2.5),
    r"make_train_step: tasks_per_step must be an integer >= 1, got 2.5",
  ),
  # What vj.uncertainty accepts: probabilities.
  "uncertainty, logits": (
    lambda: vj.uncertainty(jnp.array([[[3.0, -1.0]]])),
    r"vj.uncertainty: draws must be probabilities \(from Run.predict_draws of a classifier, or "
    r"jax.nn.softmax of vj.predict's logits.*got negative values",
  ),
  "uncertainty, regression draws": (
    lambda: vj.uncertainty(jnp.full((4, 3, 1), 0.4)),
    r"draws must be probabilities summing to 1 over the last axis .*vj.regression_uncertainty",
  ),
  # A task axis given to a one-task function.
  "adapt on an MLP, [2, 5, 1]": (
    lambda: _adapt(
      _prior(REGRESSOR_PARAMS),
      x=jnp.zeros((2, 5, 1)),
      y=jnp.zeros((2, 5, 1)),
      loss_fn=REGRESSOR_LOSS,
      inner_lr=1e-3,
    ),
    r"adapt: support_x float32\[2, 5, 1\] does not fit the network: MLP: x must be "
    r"\[batch, features\] \(one task; vmap over a task axis\)",
  ),
  # Lists, keys.
  "adapt, Python lists": (
    lambda: _adapt(x=X_FEATURES.tolist(), y=LABELS.tolist()),
    r"adapt: support_x must be an array \(wrap a list in jnp.asarray\), got list",
  ),
  "adapt, an int key": (
    lambda: _adapt(key=3),
    r"adapt: key must be a PRNG key, jax.random.key\(seed\), got int",
  ),
  "adapt, None key": (
    lambda: vj.adapt(
      _prior(), X_FEATURES, LABELS, None, loss_fn=CLASSIFIER_LOSS, num_steps=1, inner_lr=0.1
    ),
    r"adapt: key must be a PRNG key, jax.random.key\(seed\), got None",
  ),
  "predict, an int key": (
    lambda: vj.predict(
      _prior(), X_FEATURES, 0, apply_fn=vj.pure_apply(CLASSIFIER), num_mc_samples=2
    ),
    r"predict: key must be a PRNG key",
  ),
  # Parameters and inputs that do not fit together.
  "adapt, another network's parameters": (
    lambda: _adapt(_prior(CLASSIFIER_PARAMS), x=jnp.zeros((WAYS, 28, 28, 1)), loss_fn=CONV4_LOSS),
    r"adapt: prior does not hold this network's parameters \(Could not find parameter named "
    r"\"kernel\" in scope \"/conv0\"\)",
  ),
  "predict, another network's parameters": (
    lambda: vj.predict(
      _prior(CLASSIFIER_PARAMS),
      jnp.zeros((WAYS, 28, 28, 1)),
      jax.random.key(0),
      apply_fn=vj.pure_apply(CONV4),
      num_mc_samples=2,
    ),
    r"predict: posterior does not hold this network's parameters",
  ),
  "Conv4, 3-D images": (
    lambda: _conv4_adapt(jnp.zeros((WAYS, 28, 28))),
    r"adapt: support_x float32\[5, 28, 28\] does not fit the network: Conv4: x must be "
    r"\[batch, height, width, channels\]",
  ),
  "Conv4, channels first": (
    lambda: _conv4_adapt(jnp.zeros((WAYS, 1, 28, 28))),
    r"adapt: prior and support_x float32\[5, 1, 28, 28\] do not fit together .*channels last",
  ),
  "Conv4, 84x84 into a 28x28 network": (
    lambda: _conv4_adapt(jnp.zeros((WAYS, 84, 84, 1))),
    r"adapt: prior and support_x float32\[5, 84, 84, 1\] do not fit together .*the training "
    r"image size",
  ),
  # Step counts.
  "adapt, num_steps 3.0": (
    lambda: _adapt(num_steps=3.0),
    r"adapt: num_steps must be an integer >= 0, got 3.0",
  ),
  "adapt, num_steps traced under jit": (
    lambda: jax.jit(lambda n: _adapt(num_steps=n))(3),
    r"adapt: num_steps must be a static integer >= 0 \(it sets a loop's length: under jit, "
    r"close over it or mark it static\), got a traced int32\[\]",
  ),
}


@pytest.mark.parametrize("value, kind", NOT_BOOLS, ids=lambda v: repr(v))
@pytest.mark.parametrize("where, name", CASES, ids=[f"{w}-{n}" for w, n in CASES])
def test_a_switch_refuses_anything_but_a_bool(where, name, value, kind):
  """Each factory refuses a string, a number or None for a switch, naming itself, the
  argument, the value and its kind, and what it takes (True or False)."""
  with pytest.raises(InputError) as raised:
    FACTORIES[where][1](**{name: value})
  message = str(raised.value)
  assert "\n" not in message
  assert re.search(rf"\b{where}\b", message), message
  assert name in message and "True or False" in message, message
  assert repr(value) in message and kind in message, message


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)], ids=repr)
def test_a_switch_takes_python_and_numpy_bools(value):
  """`checks.flag` takes True and False, and numpy's bools."""
  checks.flag("f", "first_order", value)
  vj.vampire(APPLY, NLL, first_order=value, unroll_steps=value, remat=value, backtracking=value)


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


@pytest.mark.parametrize("row", list(ROWS))
def test_values_are_checked_against_what_they_mean(row):
  call, message = ROWS[row]
  with pytest.raises(InputError, match=message):
    call()


def test_good_values_still_pass_and_give_the_same_numbers():
  """The checks change nothing for valid input: the loss and the posterior are as before."""
  logits = jax.random.normal(jax.random.key(0), (4, WAYS))
  labels = jnp.array([0, 4, 2, 1])
  expected = -np.mean(np.asarray(jax.nn.log_softmax(logits))[np.arange(4), np.asarray(labels)])
  np.testing.assert_allclose(vj.categorical_nll(logits, labels), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(vj.categorical_nll)(logits, labels), expected, rtol=1e-6)
  eager, jitted = _adapt(), jax.jit(lambda x, y: _adapt(x=x, y=y))(X_FEATURES, LABELS)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5), eager, jitted)
  probabilities = jax.nn.softmax(jax.random.normal(jax.random.key(1), (3, 4, WAYS)))
  assert np.all(np.asarray(vj.uncertainty(probabilities).total) > 0)


def test_check_finite_sees_bfloat16():
  with pytest.raises(InputError, match=r"f: x must be finite, got 1 NaN"):
    checks.check_finite("f", {"x": jnp.array([1.0, jnp.nan], jnp.bfloat16)})
