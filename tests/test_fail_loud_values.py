"""A value is checked against what it means, not only its shape.

Each row of `ROWS` is one `InputError` naming the function and the argument, not a
silent wrong answer or a traceback, a tracer's repr, a flax scope error or the wrong
argument blamed. Values under `jit` cannot be checked without a cost: those rows
check the documented alternative (a NaN that `metrics["finite"]` flags).
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from conftest import tiny_regression_config
from experiments import regression
from vampire_jax._src.core import input_checks as checks
from vampire_jax.data import sine_line
from vampire_jax._src.core.errors import InputError

WAYS = 5
CLASSIFIER = vj.MLP((8,), WAYS)
CLASSIFIER_PARAMS = vj.init_params(CLASSIFIER, jax.random.key(0), (1, 3))
CLASSIFIER_LOSS = vj.loss_from_apply(vj.pure_apply(CLASSIFIER), vj.categorical_nll)
X = jax.random.normal(jax.random.key(2), (WAYS, 3))
LABELS = jnp.arange(WAYS)
BAD_LABELS = jnp.array([0, 1, 2, 3, 5])  # label 5 of a 5-way task
REGRESSOR = vj.MLP((8,), 1)
REGRESSOR_PARAMS = vj.init_params(REGRESSOR, jax.random.key(0), (1, 1))
REGRESSOR_LOSS = vj.loss_from_apply(vj.pure_apply(REGRESSOR), vj.gaussian_nll(0.3))
CONV4 = vj.Conv4(WAYS, num_filters=4)
CONV4_PARAMS = vj.init_params(CONV4, jax.random.key(0), (1, 28, 28, 1))
CONV4_LOSS = vj.loss_from_apply(vj.pure_apply(CONV4), vj.categorical_nll)


def _prior(params=CLASSIFIER_PARAMS):
  return vj.gaussian_from_params(params, jax.random.key(1))


def _adapt(prior=None, x=X, y=LABELS, key=None, loss_fn=CLASSIFIER_LOSS, **settings):
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
      X,
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
    lambda: _adapt(x=X.tolist(), y=LABELS.tolist()),
    r"adapt: support_x must be an array \(wrap a list in jnp.asarray\), got list",
  ),
  "adapt, an int key": (
    lambda: _adapt(key=3),
    r"adapt: key must be a PRNG key, jax.random.key\(seed\), got int",
  ),
  "adapt, None key": (
    lambda: vj.adapt(_prior(), X, LABELS, None, loss_fn=CLASSIFIER_LOSS, num_steps=1, inner_lr=0.1),
    r"adapt: key must be a PRNG key, jax.random.key\(seed\), got None",
  ),
  "predict, an int key": (
    lambda: vj.predict(_prior(), X, 0, apply_fn=vj.pure_apply(CLASSIFIER), num_mc_samples=2),
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
  eager, jitted = _adapt(), jax.jit(lambda x, y: _adapt(x=x, y=y))(X, LABELS)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5), eager, jitted)
  probabilities = jax.nn.softmax(jax.random.normal(jax.random.key(1), (3, 4, WAYS)))
  assert np.all(np.asarray(vj.uncertainty(probabilities).total) > 0)


# -- Under jit: the labels are tracers; the documented check is a NaN that `finite` flags --


def test_traced_out_of_range_labels_give_nan_and_the_finite_flag_catches_them():
  for labels in (jnp.array([-1, 0]), jnp.array([WAYS, 0])):
    assert np.isnan(jax.jit(vj.categorical_nll)(jnp.zeros((2, WAYS)), labels))
  posterior = jax.jit(lambda y: _adapt(y=y))(BAD_LABELS)
  assert np.all(np.isnan(np.asarray(posterior.mean["Dense_0"]["kernel"])))

  learner = vj.maml(vj.pure_apply(CLASSIFIER), vj.categorical_nll, num_inner_steps=1)
  optimizer = optax.adam(1e-3)
  state = vj.init_meta_state(learner, optimizer, CLASSIFIER_PARAMS, jax.random.key(0))

  def sample_tasks(labels, task_keys):
    n = len(task_keys)
    xs = jax.vmap(lambda k: jax.random.normal(k, (WAYS, 3)))(task_keys)
    ys = jnp.broadcast_to(labels, (n, WAYS))
    return vj.Task(xs, ys, xs, ys)

  step = jax.jit(vj.make_train_step(learner, optimizer, sample_tasks, tasks_per_step=2))
  _, good = step(state, LABELS, jax.random.key(1))
  _, bad = step(state, BAD_LABELS, jax.random.key(1))
  assert bool(good["finite"][0]) and not bool(bad["finite"][0])


# -- Run.predict: lists, keys, bfloat16, a sharded query ------------------------------------


@pytest.fixture(scope="module")
def tiny_regression_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("values_run")
  config = tiny_regression_config(num_meta_steps=2, num_mc_test=2)
  regression.run_experiment(config, workdir, progress=False, print_fn=lambda m: None)
  return workdir


def _task():
  return jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(0), 1))


def test_run_predict_takes_lists_refuses_bad_keys_and_checks_bfloat16(tiny_regression_run):
  run = vj.load_run(tiny_regression_run)
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


def test_check_finite_sees_bfloat16():
  with pytest.raises(InputError, match=r"f: x must be finite, got 1 NaN"):
    checks.check_finite("f", {"x": jnp.array([1.0, jnp.nan], jnp.bfloat16)})


def test_run_predict_takes_a_query_sharded_over_devices(tiny_regression_run):
  """On two (host) devices, a query sharded over both gives the same prediction."""
  script = textwrap.dedent(
    f"""
    import jax, numpy as np
    import vampire_jax as vj
    from vampire_jax.data import sine_line
    from jax.sharding import NamedSharding, PartitionSpec
    assert jax.device_count() == 2
    run = vj.load_run({str(tiny_regression_run)!r})
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
