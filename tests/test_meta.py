"""Meta-step and evaluation: strategies agree, the schedule, evaluation numbers, learning."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core.batching import BATCHING_STRATEGIES
from vampire_jax._src.core.batching import batched_map
from vampire_jax._src.core.host_chunked import make_host_chunked_meta_step


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


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_all_task_batching_strategies_give_the_same_step(algorithm):
  learner, params = _regression_learner(algorithm, hidden=(16,))
  opt = vj.meta_optimizer(1e-3, tasks_per_step=4)
  state = vj.init_meta_state(learner, opt, params, jax.random.key(1))
  tasks = _sine_tasks(jax.random.key(2), 4)
  results = {}
  for strategy in BATCHING_STRATEGIES:
    step = jax.jit(vj.make_meta_step(learner, opt, task_batching=strategy, chunk_size=2))
    results[strategy] = step(state, tasks, jax.random.key(3))
  results["host_chunked"] = make_host_chunked_meta_step(learner, opt, chunk_size=2)(
    state, tasks, jax.random.key(3)
  )
  reference = results.pop("vmap")
  for name, result in results.items():
    chex.assert_trees_all_close(result, reference, atol=1e-5, rtol=1e-4, custom_message=name)


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


def test_meta_learning_rate_decays_by_099_every_10000_tasks():
  schedule = vj.meta_lr_schedule(1e-3, tasks_per_step=32)
  # 10 000 / 32 = 312.5 steps per decay: tasks 0..9999 at 1e-3, then x0.99.
  np.testing.assert_allclose(schedule(0), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(312), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(313), 0.99e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(625), 0.99**2 * 1e-3, rtol=1e-6)
  # And the optimiser uses it: Adam's first update is -lr * sign(g).
  opt = vj.meta_optimizer(1e-3, tasks_per_step=32)
  updates, _ = opt.update({"w": jnp.array(5.0)}, opt.init({"w": jnp.array(0.0)}))
  np.testing.assert_allclose(updates["w"], -1e-3, rtol=1e-4)


def test_classification_evaluator_numbers():
  # A fixed "network" whose logits ignore the weights: check accuracy/NLL/probs.
  logits = jnp.log(jnp.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
  learner = vj.MetaLearner(
    init=lambda p, k: p,
    adapt=lambda p, x, y, k: p,
    predict=lambda p, x, k: jnp.broadcast_to(logits, (2,) + logits.shape),
    nll=vj.categorical_nll,
  )
  tasks = vj.Task(
    jnp.zeros((1, 2, 1)), jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2, 1)), jnp.array([[0, 1]])
  )
  result = vj.make_classification_evaluator(learner)({}, tasks, jax.random.key(0))
  np.testing.assert_allclose(result.accuracy, [0.5])
  np.testing.assert_allclose(result.nll, [-(np.log(0.7) + np.log(0.3)) / 2], rtol=1e-5)
  np.testing.assert_allclose(result.probabilities[0], jnp.exp(logits), rtol=1e-5)


def test_regression_evaluator_mixture_nll_is_exact_for_one_sample():
  learner = vj.MetaLearner(
    init=lambda p, k: p,
    adapt=lambda p, x, y, k: p,
    predict=lambda p, x, k: x[None],
    nll=vj.gaussian_nll(0.5),
  )
  x = jnp.array([[[1.0], [2.0]]])
  y = jnp.array([[[1.5], [2.0]]])  # noqa: E702
  result = vj.make_regression_evaluator(learner, 0.5)({}, vj.Task(x, y, x, y), jax.random.key(0))
  np.testing.assert_allclose(result.mse, [0.125])
  np.testing.assert_allclose(result.predictive_mean_mse, [0.125])  # one draw: the same
  expected_nll = np.mean([0.5 * (0.5 / 0.5) ** 2, 0.0]) + np.log(0.5) + 0.5 * np.log(2 * np.pi)
  np.testing.assert_allclose(result.nll, [expected_nll], rtol=1e-5)


def test_regression_evaluator_mse_definitions_by_hand():
  # Two draws, 0 and 2, around a target of 1. The paper's MSE averages the
  # squared error over the draws: (1 + 1) / 2 = 1. The predictive mean (1) is
  # exact: its MSE is 0; the spread is in the NLL.
  draws = jnp.array([0.0, 2.0])[:, None, None]
  learner = vj.MetaLearner(
    init=lambda p, k: p,
    adapt=lambda p, x, y, k: p,
    predict=lambda p, x, k: draws + 0 * x[None],
    nll=vj.gaussian_nll(1.0),
  )
  x = jnp.zeros((1, 1, 1))
  y = jnp.ones((1, 1, 1))  # noqa: E702
  result = vj.make_regression_evaluator(learner, 1.0)({}, vj.Task(x, y, x, y), jax.random.key(0))
  np.testing.assert_allclose(result.mse, [1.0])
  np.testing.assert_allclose(result.predictive_mean_mse, [0.0])
  # NLL of the two-component mixture at distance 1 from each: 0.5 + log sqrt(2 pi).
  np.testing.assert_allclose(result.nll, [0.5 + 0.5 * np.log(2 * np.pi)], rtol=1e-5)


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


def test_every_draw_batching_gives_the_same_vampire_meta_gradient():
  """VAMPIRE's L draws on a convolutional network (`loop_safe`, max-pool, second order):
  `lax.map`, `remat_map` (the CPU default) and `vmap` give one meta-gradient. `remat_map`
  recomputes each draw's forward pass in the backward pass; a recomputation that dropped
  or reordered a draw's noise would differ. (With max-pool as a max over a reshaped
  window, XLA:CPU miscompiled these meta-gradients: `models.max_pool_2x2`.)"""
  model = vj.Conv4(num_classes=3, num_filters=4, max_pool=True, conv_impl="loop_safe")
  params = vj.init_params(model, jax.random.key(0), (1, 16, 16, 1))
  kx, kq = jax.random.split(jax.random.key(1))
  task = vj.Task(
    jax.random.uniform(kx, (3, 16, 16, 1)),
    jnp.arange(3),
    jax.random.uniform(kq, (6, 16, 16, 1)),
    jnp.arange(6) % 3,
  )
  tasks = jax.tree_util.tree_map(lambda x: x[None], task)
  keys = jax.random.split(jax.random.key(2), 1)
  gradients = {}
  for draws in ("vmap", "map", "remat_map"):
    learner = vj.vampire(
      vj.pure_apply(model),
      vj.categorical_nll,
      num_inner_steps=1,
      inner_lr=0.01,
      kl_weight=0.1,
      num_mc_train=3,
      num_mc_query=3,
      sample_batching=draws,
    )
    meta_params = learner.init(params, jax.random.key(3))
    gradient = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))
    gradients[draws] = gradient(meta_params, tasks, keys)[0]
  reference = gradients.pop("vmap")
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(reference)) > 1e-3
  for draws, grads in gradients.items():
    chex.assert_trees_all_close(grads, reference, atol=1e-5, rtol=1e-4, custom_message=draws)
