"""A meta-step and what it trains agree, or the step is refused in one line.

The learner's tasks per step and the step's are one number, whichever way the step gets its
T (SImPa's hyper-prior term counts M = T); the state is the learner's own kind (a VAMPIRE
Gaussian in a MAML step, weights in a VAMPIRE step); SImPa's optimizer, `vj.kl_step_factor`
and SImPa's own functions refuse what is not theirs by name; a bool is not a rate.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from tests.helpers import (
  MLP_8,
  REGRESSION_MLP,
  _sample,
  _sampler,
  _setup,
  _small_regression,
  _vampire_regression_learner,
)
from vampire_jax._src.core import meta_step
from vampire_jax._src.core.batching import batched_map
from vampire_jax._src.core.errors import InputError
from vampire_jax.data import sine_line


def _sine_tasks(key, num_tasks, shots=5, query=10):
  k_amp, k_phase, k_x = jax.random.split(key, 3)
  amp = jax.random.uniform(k_amp, (num_tasks, 1, 1), minval=0.5, maxval=3.0)
  phase = jax.random.uniform(k_phase, (num_tasks, 1, 1), maxval=jnp.pi)
  x = jax.random.uniform(k_x, (num_tasks, shots + query, 1), minval=-5.0, maxval=5.0)
  y = amp * jnp.sin(x + phase)
  return vj.Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


def _regression_learner(algorithm, hidden=(40, 40), **kw):
  model = vj.MLP(hidden, 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  apply_fn = vj.pure_apply(model)
  nll = vj.gaussian_nll(0.3)
  if algorithm == "maml":
    learner = vj.maml(apply_fn, nll, num_inner_steps=3, inner_lr=0.005, **kw)
  else:
    # kl_weight 0.1 keeps inner_lr * kl_weight / sigma_p^2 < 2 at the paper's
    # log-std init [-4, -3] (see vj.kl_step_factor).
    learner = vj.vampire(
      apply_fn,
      nll,
      num_inner_steps=3,
      inner_lr=0.005,
      kl_weight=0.1,
      num_mc_train=4,
      num_mc_query=4,
      **kw,
    )
  return learner, params


INNER_LR, KL_WEIGHT, NOISE_STD, STEPS, DRAWS = 0.005, 0.1, 0.3, 2, 2  # as in _setup


def _hand_nll(outputs, y):
  """Mean Gaussian NLL, noise std 0.3: what `vj.gaussian_nll(0.3)` should be."""
  return jnp.mean(
    jnp.sum(
      0.5 * ((outputs - y) / NOISE_STD) ** 2 + math.log(NOISE_STD) + 0.5 * math.log(2 * math.pi),
      axis=-1,
    )
  )


def _hand_kl(q, p):
  """KL(q || p) of diagonal Gaussians, summed: log s_p - log s_q + (s_q^2 + (m_q - m_p)^2) / 2 s_p^2 - 1/2."""
  terms = jax.tree_util.tree_map(
    lambda mq, sq, mp, sp: jnp.sum(
      sp - sq + (jnp.exp(2 * sq) + (mq - mp) ** 2) / (2 * jnp.exp(2 * sp)) - 0.5
    ),
    q.mean,
    q.log_std,
    p.mean,
    p.log_std,
  )
  return sum(jax.tree_util.tree_leaves(terms))


def _hand_query_loss(algorithm, apply_fn, meta_params, task, key):
  """Alg. 1 for one task, written out: S plain gradient steps on the support set
  (VAMPIRE: on the VFE, with fresh draws of the weight noise at every step, key
  path as documented in `query_loss` and `adapt`), then the mean NLL on the query set."""

  def mean_nll(weights, x, y):  # weights: a tree with a leading [draws] axis
    return jnp.mean(
      jnp.stack(
        [
          _hand_nll(apply_fn(jax.tree_util.tree_map(lambda w, i=i: w[i], weights), x), y)
          for i in range(DRAWS)
        ]
      )
    )

  def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - INNER_LR * g, params, grads)

  if algorithm == "maml":
    params = meta_params
    for _ in range(STEPS):
      params = sgd(
        params, jax.grad(lambda p: _hand_nll(apply_fn(p, task.support_x), task.support_y))(params)
      )
    return _hand_nll(apply_fn(params, task.query_x), task.query_y)
  adapt_key, query_key = jax.random.split(key)

  def free_energy(q, step_key):
    weights = vj.sample(q, step_key, DRAWS)  # mean + eps * exp(log_std)
    return mean_nll(weights, task.support_x, task.support_y) + KL_WEIGHT * _hand_kl(q, meta_params)

  q = meta_params
  for step_key in jax.random.split(adapt_key, STEPS):
    q = sgd(q, jax.grad(free_energy)(q, step_key))
  return mean_nll(vj.sample(q, query_key, DRAWS), task.query_x, task.query_y)


def _adam_by_hand(params, mu, nu, grads, t):
  """Adam's step t (from 1): lr 1e-3, b1 0.9, b2 0.999, eps 1e-8; mu, nu None before step 1."""
  tree_map = jax.tree_util.tree_map
  mu = (
    tree_map(lambda g: 0.1 * g, grads)
    if mu is None
    else tree_map(lambda g, m: 0.1 * g + 0.9 * m, grads, mu)
  )
  nu = (
    tree_map(lambda g: 0.001 * g**2, grads)
    if nu is None
    else tree_map(lambda g, v: 0.001 * g**2 + 0.999 * v, grads, nu)
  )
  mu_scale, nu_scale = 1 / (1 - 0.9**t), 1 / (1 - 0.999**t)  # bias correction
  params = tree_map(
    lambda p, m, v: p - 1e-3 * (m * mu_scale) / (jnp.sqrt(v * nu_scale) + 1e-8), params, mu, nu
  )
  return params, mu, nu


NOISE_STD = 0.3


MODEL = vj.MLP((6,), 1)


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _params():
  return vj.init_params(MODEL, jax.random.key(0), (1, 1))


def _simpa(tasks_per_step=2, **settings):
  options = dict(num_inner_steps=1, inner_lr=0.01, num_kl_samples=16)
  return vj.baselines.simpa(
    vj.pure_apply(MODEL),
    vj.gaussian_nll(NOISE_STD),
    tasks_per_step=tasks_per_step,
    **{**options, **settings},
  )


def _simpa_shapes(learner):
  """The shapes of SImPa's meta-parameters, in their `SimpaParams` (its init, traced only)."""
  return jax.eval_shape(learner.init, _params(), jax.random.key(1))


def _sample_tasks(data, task_keys):
  del data
  return sine_line.tasks_from_keys(task_keys)


def _regression_setup():
  apply_fn = vj.pure_apply(REGRESSION_MLP)
  params = vj.init_params(REGRESSION_MLP, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


def _sine_line_tasks(data, task_keys):
  """The library's convention: `sample_tasks(data, task_keys [n]) -> Task [n, ...]`."""
  del data
  return sine_line.tasks_from_keys(task_keys)


def test_meta_step_gradient_is_the_mean_of_task_gradients():
  learner, params = _regression_learner("maml")
  tasks = _sine_tasks(jax.random.key(2), 3)
  keys = jax.random.split(jax.random.key(3), 3)
  grads, metrics = vj.make_meta_gradient(learner)(params, tasks, keys)
  per_task = [
    jax.grad(
      lambda p, i=i: vj.query_loss(
        learner, p, jax.tree_util.tree_map(lambda x: x[i], tasks), keys[i]
      )[0]
    )(params)
    for i in range(3)
  ]
  chex.assert_trees_all_close(
    grads, jax.tree_util.tree_map(lambda *g: sum(g) / 3, *per_task), rtol=1e-5, atol=1e-6
  )
  losses = [
    vj.query_loss(learner, params, jax.tree_util.tree_map(lambda x: x[i], tasks), keys[i])[0]
    for i in range(3)
  ]
  np.testing.assert_allclose(metrics["loss"], np.mean(losses), rtol=1e-6)


def test_bad_task_batches_are_rejected():
  learner, params = _regression_learner("maml")
  step = vj.make_meta_step(learner, vj.meta_optimizer(tasks_per_step=2))
  state = vj.init_meta_state(
    learner, vj.meta_optimizer(tasks_per_step=2), params, jax.random.key(0)
  )
  tasks = _sine_tasks(jax.random.key(1), 2)
  with pytest.raises(ValueError, match=r"tasks.query_y must be 2 tasks, as tasks.support_x"):
    step(state, tasks._replace(query_y=tasks.query_y[:1]), jax.random.key(0))
  with pytest.raises(ValueError, match=r"tasks.support_y must be \[tasks, 5, ...\], one entry"):
    step(state, tasks._replace(support_y=tasks.support_y[:, :2]), jax.random.key(0))
  with pytest.raises(ValueError, match="chunk_size"):
    batched_map(lambda x: x, jnp.zeros((3, 2)), strategy="chunked_unroll", chunk_size=2)
  with pytest.raises(ValueError, match="unknown batching"):
    batched_map(lambda x: x, jnp.zeros((3, 2)), strategy="threads")


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_meta_training_on_sine_regression_learns(algorithm):
  learner, params = _regression_learner(algorithm)
  opt = vj.meta_optimizer(3e-3, tasks_per_step=8)
  state = vj.init_meta_state(learner, opt, params, jax.random.key(1))
  step = jax.jit(vj.make_meta_step(learner, opt))
  evaluate = jax.jit(vj.make_regression_evaluator(learner, 0.3))
  test_tasks = _sine_tasks(jax.random.key(123), 200)
  before = float(jnp.mean(evaluate(state.meta_params, test_tasks, jax.random.key(0)).mse))
  key = jax.random.key(2)
  for _ in range(300):
    key, task_key, step_key = jax.random.split(key, 3)
    state, metrics = step(state, _sine_tasks(task_key, 8), step_key)
  after = float(jnp.mean(evaluate(state.meta_params, test_tasks, jax.random.key(0)).mse))
  assert np.isfinite(after)
  if algorithm == "vampire":
    assert float(vj.kl_step_factor(state.meta_params, 0.005, 0.1)) < 2.0
  # Stated margin: 300 meta-steps must cut the adapted query MSE by 60 %.
  assert after < 0.4 * before, (before, after)


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_train_step_is_the_meta_step_on_the_tasks_it_draws(algorithm):
  """Two steps of `make_train_step` against the algorithm written out by hand: each
  step draws its tasks and keys by `step_keys`, averages `jax.grad` of each task's
  query loss, and takes an Adam step (b1 0.9, b2 0.999, eps 1e-8, lr 1e-3)."""
  learner, optimizer, state = _setup(algorithm)
  apply_fn = vj.pure_apply(vj.MLP((16,), 1))
  key = jax.random.key(7)
  step = jax.jit(vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4))

  params, mu, nu = state.meta_params, None, None
  loss_and_grad = jax.jit(
    jax.value_and_grad(
      lambda params, task, task_key: _hand_query_loss(algorithm, apply_fn, params, task, task_key)
    )
  )
  for t in range(1, 3):
    state, metrics = step(state, None, key)
    task_keys, adapt_keys = meta_step.step_keys(key, t - 1, 4)
    tasks = _sampler(None, task_keys)
    per_task = [
      loss_and_grad(params, jax.tree_util.tree_map(lambda a, i=i: a[i], tasks), adapt_keys[i])
      for i in range(4)
    ]
    loss = sum(l for l, _ in per_task) / 4
    grads = jax.tree_util.tree_map(lambda *g: sum(g) / 4, *(g for _, g in per_task))
    params, mu, nu = _adam_by_hand(params, mu, nu, grads, t)
    grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))

    assert int(state.step) == t
    chex.assert_trees_all_close(metrics["loss"][0], loss, rtol=1e-5)
    chex.assert_trees_all_close(metrics["grad_norm"][0], grad_norm, rtol=1e-4)
    adam_state = state.opt_state[0]
    chex.assert_trees_all_close(adam_state.mu, mu, rtol=1e-4, atol=1e-9)
    chex.assert_trees_all_close(adam_state.nu, nu, rtol=1e-4, atol=1e-12)
    chex.assert_trees_all_close(state.meta_params, params, rtol=1e-5, atol=1e-7)


def test_a_simpa_learner_of_another_task_count_than_its_step_is_refused():
  """`simpa(tasks_per_step=2)` in a step of 4 tasks (its hyper-prior term would count M = 2)
  is refused, whether T comes from the optimizer, the step or the tasks, naming both counts
  and the fix; one T for both is taken, and other learners count no T."""
  learner = _simpa(tasks_per_step=2)
  fix = (
    "but the learner was built for tasks_per_step=2",  # the other count
    "its meta-loss counts 2 tasks a step, as SImPa's hyper-prior term does",  # why it matters
    "give both the same T, e.g. vj.baselines.simpa(..., tasks_per_step=4)",  # the fix
  )
  with pytest.raises(vj.InputError) as raised:  # T from the optimizer
    vj.make_train_step(learner, vj.baselines.simpa_optimizer(tasks_per_step=4), _sample)
  message = _one_line(raised)
  assert message.startswith("make_train_step: tasks_per_step=4 ")
  assert "(the optimizer's, vj.meta_optimizer's or vj.baselines.simpa_optimizer's)" in message
  assert all(fact in message for fact in fix), message
  with pytest.raises(vj.InputError) as raised:  # T given to the step
    vj.make_train_step(learner, optax.adam(1e-3), _sample, tasks_per_step=4)
  message = _one_line(raised)
  assert message.startswith("make_train_step: tasks_per_step=4, ")
  assert all(fact in message for fact in fix), message
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 4))
  meta_step = vj.make_meta_step(learner, optax.adam(1e-3))
  with pytest.raises(vj.InputError) as raised:  # T from the tasks given (at trace time)
    jax.eval_shape(meta_step, None, tasks, jax.random.key(3))
  message = _one_line(raised)
  assert message.startswith("make_meta_step: the step was given 4 tasks (tasks' leading axis)")
  assert all(fact in message for fact in fix), message
  # One T for both is taken, and other learners count no T.
  vj.make_train_step(_simpa(4), vj.baselines.simpa_optimizer(tasks_per_step=4), _sample)
  maml = vj.maml(vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD))
  assert maml.tasks_per_step is None and learner.tasks_per_step == 2
  vj.make_train_step(maml, optax.adam(1e-3), _sample, tasks_per_step=4)


def test_a_state_of_another_learner_is_refused_by_name():
  """A VAMPIRE state in a MAML step, and a MAML state in a VAMPIRE step, are refused naming
  what state.meta_params is, what the learner's init makes, and vj.init_meta_state."""
  apply_fn, nll = vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD)
  vampire = vj.vampire(apply_fn, nll, num_inner_steps=1)
  maml = vj.maml(apply_fn, nll, num_inner_steps=1)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  fix = (
    "(a MAML learner takes weights, VAMPIRE a vj.Gaussian)",  # why
    "build the state for the learner the step trains",  # the fix
    "vj.init_meta_state(learner, optimizer, params, key)",
  )
  for built_for, trained, made, wanted in (
    (vampire, maml, "vj.Gaussian", "weight tree"),
    (maml, vampire, "weight tree", "vj.Gaussian"),
  ):
    state = vj.init_meta_state(built_for, optimizer, _params(), jax.random.key(1))
    step = vj.make_train_step(trained, optimizer, _sample)
    with pytest.raises(vj.InputError) as raised:
      jax.eval_shape(step, state, None, jax.random.key(2))
    message = _one_line(raised)
    assert message.startswith(f"train_step: state.meta_params is a {made}, ")  # the value
    assert f"but this learner's init makes a {wanted}" in message  # what it must be
    assert all(fact in message for fact in fix), message


def test_simpa_optimizer_and_kl_step_factor_refuse_another_learners_parameters():
  """simpa_optimizer.init refuses a Gaussian, and kl_step_factor SImPa's parameters, naming
  the parameters each takes and what it got."""
  gaussian = vj.vampire(vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD)).init(
    _params(), jax.random.key(1)
  )
  with pytest.raises(vj.InputError) as raised:
    vj.baselines.simpa_optimizer(tasks_per_step=2).init(gaussian)
  message = _one_line(raised)
  assert message.startswith("simpa_optimizer.init: params ")  # the function and the argument
  assert "must be SImPa's meta-parameters (vj.baselines.SimpaParams" in message
  assert "from vj.baselines.simpa(...).init" in message and "got a Gaussian" in message
  assert "another learner's take vj.meta_optimizer" in message  # the way out
  simpa_params = _simpa_shapes(_simpa())  # the kind is what is refused: shapes are enough
  with pytest.raises(vj.InputError) as raised:
    vj.kl_step_factor(simpa_params, 1e-3, 1.0)
  message = _one_line(raised)
  assert message.startswith("kl_step_factor: prior ")  # the function and the argument
  assert "must be a vj.Gaussian (VAMPIRE's, ABML's or Vampire2's meta-parameters)" in message
  assert "got a SimpaParams" in message
  assert "only those learners take KL steps in their inner loop" in message  # why


@pytest.mark.parametrize(
  "build, name",
  [
    (lambda: _simpa(epsilon=True), "simpa: epsilon"),
    (
      lambda: vj.vampire(
        vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD), kl_target="standard_normal",
        outer_kl_weight=True,
      ),
      "vampire: outer_kl_weight",
    ),
  ],
)  # fmt: skip
def test_a_bool_is_not_taken_as_a_rate(build, name):
  """`epsilon=True` and `outer_kl_weight=True` are refused as a bool, not taken as 1.0."""
  with pytest.raises(vj.InputError) as raised:
    build()
  message = _one_line(raised)
  assert message.startswith(f"{name} ")  # the function and the argument
  assert "must be a number, not a bool" in message and "got True" in message


def test_simpa_names_the_query_of_one_target_and_a_network_that_does_not_fit():
  """One query target is refused by simpa's meta-loss (the function called), naming the 2
  it needs; inputs of another feature count are refused by simpa.adapt and simpa.predict,
  naming the shapes."""
  learner = _simpa()
  meta_params = _simpa_shapes(learner)  # refused where traced: shapes are enough
  task = jax.tree_util.tree_map(
    lambda field: field[0], sine_line.tasks_from_keys(jax.random.split(jax.random.key(7), 1))
  )
  one_query = task._replace(query_x=task.query_x[:1], query_y=task.query_y[:1])
  with pytest.raises(vj.InputError) as raised:
    jax.eval_shape(learner.meta_loss, meta_params, one_query, jax.random.key(0))
  message = _one_line(raised)
  assert message.startswith("simpa's meta-loss: task.query_y has 1 target")  # field, value
  assert "SImPa's bound term divides by 2 (n - 1)" in message  # the cause
  assert "give at least 2" in message  # the fix
  wide = jnp.ones((task.support_x.shape[0], 3))  # 3 features for a network of 1
  with pytest.raises(vj.InputError) as raised:
    jax.eval_shape(learner.adapt, meta_params, wide, task.support_y, jax.random.key(0))
  assert _one_line(raised).startswith(
    "simpa.adapt: the generator's weights and support_x float32[5, 3] do not fit together "
    "(another network's parameters, or inputs of another shape"
  )
  with pytest.raises(vj.InputError) as raised:
    jax.eval_shape(learner.predict, meta_params, wide, jax.random.key(0))
  assert _one_line(raised).startswith(
    "simpa.predict: the generator's weights and x float32[5, 3] do not fit together"
  )


def test_the_train_step_and_the_evaluator_trace_once_over_calls():
  chex.clear_trace_counter()
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_inner_steps=1)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = vj.make_train_step(learner, optimizer, _sample_tasks, steps_per_call=2)
  train_step = jax.jit(chex.assert_max_traces(train_step, n=1))
  for call in range(3):  # each call's state is the last one's output
    state, metrics = train_step(state, None, jax.random.key(10 + call))
  assert int(state.step) == 6 and bool(metrics["finite"].all())

  evaluate = jax.jit(chex.assert_max_traces(vj.make_regression_evaluator(learner, 0.3), n=1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 3))
  for call in range(3):  # new keys, new meta-parameters of the same shapes
    per_task = evaluate(state.meta_params, tasks, jax.random.key(20 + call))
    state, _ = train_step(state, None, jax.random.key(30 + call))
  assert per_task.nll.shape == (3,)


def test_the_classification_evaluator_traces_once_over_calls():
  chex.clear_trace_counter()
  model = vj.MLP((8,), 3)
  learner = vj.vampire(vj.pure_apply(model), vj.categorical_nll, num_inner_steps=1)
  meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 2)), jax.random.key(1))
  evaluate = jax.jit(chex.assert_max_traces(vj.make_classification_evaluator(learner), n=1))
  labels = jnp.tile(jnp.arange(3), (2, 2))  # [2 tasks, 6]
  for call in range(3):
    points = jax.random.normal(jax.random.key(call), (2, 6, 2)) + labels[..., None]
    result = evaluate(meta_params, vj.Task(points, labels, points, labels), jax.random.key(call))
  assert result.accuracy.shape == (2,)


def test_train_step_metrics_flag_non_finite_steps():
  apply_fn, params, _ = _regression_setup()
  optimizer = optax.adam(1e-3)
  flags = {}
  for inner_lr in (1e-4, 1.0):
    learner = vj.maml(apply_fn, vj.gaussian_nll(0.1), inner_lr=inner_lr)
    state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))
    step = jax.jit(
      vj.make_train_step(learner, optimizer, _sine_line_tasks, tasks_per_step=2, steps_per_call=2)
    )
    _, metrics = step(state, None, jax.random.key(1))
    flags[inner_lr] = np.asarray(metrics["finite"])
    assert flags[inner_lr].shape == (2,)
    assert np.array_equal(
      flags[inner_lr], np.isfinite(metrics["loss"]) & np.isfinite(metrics["grad_norm"])
    )
  assert flags[1e-4].all() and not flags[1.0].any()


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


@pytest.mark.parametrize("algorithm", ["vampire", "maml"])
def test_a_donated_train_step_leaves_the_params_given_to_init_meta_state_usable(algorithm):
  """A step jitted with donate_argnums=0, as make_train_step's docstring recommends, leaves
  the params given to vj.init_meta_state undeleted and unchanged (the state holds a copy:
  state.meta_params.mean for VAMPIRE, state.meta_params for MAML)."""
  params = vj.init_params(MLP_8, jax.random.key(0), (1, 1))
  make = vj.vampire if algorithm == "vampire" else vj.maml
  learner = make(vj.pure_apply(MLP_8), vj.gaussian_nll(0.3), num_inner_steps=1)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  # Copies: a numpy view of a buffer (np.asarray on a CPU) would keep it from being donated.
  before = jax.tree_util.tree_map(lambda leaf: np.array(leaf, copy=True), params)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  step = jax.jit(vj.make_train_step(learner, optimizer, _sample), donate_argnums=0)
  state, _ = step(state, None, jax.random.key(2))
  assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(params))
  for leaf, saved in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(before)):
    np.testing.assert_array_equal(np.asarray(leaf + 0), saved)  # usable, and unchanged
  # The state starts from the same values as before the copy.
  fresh = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  central = getattr(fresh.meta_params, "mean", fresh.meta_params)
  for leaf, saved in zip(jax.tree_util.tree_leaves(central), jax.tree_util.tree_leaves(before)):
    np.testing.assert_array_equal(np.asarray(leaf), saved)


@pytest.mark.parametrize(
  "keys, got",
  [
    (lambda: jax.random.key(3), "key<fry>[]"),  # one key for the batch
    (lambda: jax.random.split(jax.random.key(3), 2), "key<fry>[2]"),  # too few
    (lambda: jnp.zeros((3, 4), jnp.uint32), "uint32[3, 4]"),
  ],
)
def test_make_meta_gradient_wants_one_key_per_task(keys, got):
  # One key, two keys for three tasks, or raw key data of another shape are refused naming
  # task_keys, the count and jax.random.split; three keys, typed or raw, give one gradient.
  learner, params = _vampire_regression_learner()
  meta_params = learner.init(params, jax.random.key(1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 3))
  meta_gradient = vj.make_meta_gradient(learner)
  with pytest.raises(InputError) as raised:
    meta_gradient(meta_params, tasks, keys())
  message = _one_line(raised)
  assert message.startswith("meta_gradient: task_keys ")  # the function and the argument
  assert "must be 3 PRNG keys, one per task" in message and f"got {got}" in message
  assert "jax.random.split(key, 3)" in message  # the fix
  grads, _ = meta_gradient(meta_params, tasks, jax.random.split(jax.random.key(3), 3))
  raw = jax.random.key_data(jax.random.split(jax.random.key(3), 3))  # uint32[3, 2] works too
  same = jax.tree.map(np.array_equal, grads, meta_gradient(meta_params, tasks, raw)[0])
  assert all(jax.tree.leaves(same))


def test_tasks_drawn_inside_the_loop_are_the_batchs_and_held_one_at_a_time():
  """`draw_per_task=True` with tasks in `lax.map`: `vj.data`'s image sampler (turns
  included), called for one task at a time inside the loop, gives the states of drawing
  the batch first, bit for bit; and the compiled step no longer holds the batch's float
  images (its temporaries shrink by at least the 7 other tasks' 75 query images)."""
  images = jax.random.randint(jax.random.key(0), (12, 20, 28, 28), 0, 256).astype(jnp.uint8)

  def sample(data, task_keys):
    return vj.data.tasks_from_keys(task_keys, data, ways=5, shots=1, query=15, rotate=True)

  model = vj.Conv4(num_classes=5, num_filters=4, conv_impl="loop_safe")
  params = vj.init_params(model, jax.random.key(1), (1, 28, 28, 1))
  learner = vj.vampire(
    vj.pure_apply(model), vj.categorical_nll, num_inner_steps=1, inner_lr=0.1, kl_weight=1e-3
  )
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=8)
  results = {}
  for draw_per_task in (False, True):
    step = jax.jit(
      vj.make_train_step(
        learner, optimizer, sample, task_batching="map", draw_per_task=draw_per_task
      )
    )
    state = vj.init_meta_state(learner, optimizer, params, jax.random.key(2))
    compiled = step.lower(state, images, jax.random.key(3)).compile()
    for _ in range(2):
      state, metrics = compiled(state, images, jax.random.key(3))
    results[draw_per_task] = (state, metrics, compiled.memory_analysis().temp_size_in_bytes)

  (batch_state, batch_metrics, batch_temp), (loop_state, loop_metrics, loop_temp) = (
    results[False],
    results[True],
  )
  chex.assert_trees_all_equal(loop_state, batch_state)
  chex.assert_trees_all_equal(loop_metrics, batch_metrics)
  assert np.ptp(np.asarray(loop_state.meta_params.mean["head"]["kernel"])) > 0
  other_tasks_query_bytes = 7 * 75 * 28 * 28 * 4
  assert batch_temp - loop_temp >= other_tasks_query_bytes, (batch_temp, loop_temp)


def test_draw_per_task_takes_true_or_false_only():
  learner, optimizer, _ = _setup("maml")
  with pytest.raises(InputError, match=r"draw_per_task must be True or False, got 'no' \(a str\)"):
    vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4, draw_per_task="no")
