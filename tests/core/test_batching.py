import chex
import jax
import jax.numpy as jnp
import pytest

import vampire_jax as vj
from vampire_jax._src.core.batching import BATCHING_STRATEGIES
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
