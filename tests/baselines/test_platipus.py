import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import (
  _check_gradient_by_finite_differences,
  _max_abs_difference,
  _tiny_hidden_mlp,
)
from vampire_jax import baselines


def _sine_tasks(key, num_tasks, shots=5, query=10, dtype=jnp.float32):
  k_amp, k_phase, k_x = jax.random.split(key, 3)
  amp = jax.random.uniform(k_amp, (num_tasks, 1, 1), dtype, minval=0.5, maxval=3.0)
  phase = jax.random.uniform(k_phase, (num_tasks, 1, 1), dtype, maxval=jnp.pi)
  x = jax.random.uniform(k_x, (num_tasks, shots + query, 1), dtype, minval=-5.0, maxval=5.0)
  y = amp * jnp.sin(x + phase)
  return vj.Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


def _one_task(key, dtype=jnp.float32):
  return jax.tree_util.tree_map(lambda a: a[0], _sine_tasks(key, 1, dtype=dtype))


def _random_like(tree, key, low, high):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return jax.tree_util.tree_unflatten(
    treedef,
    [jax.random.uniform(k, leaf.shape, leaf.dtype, low, high) for k, leaf in zip(keys, leaves)],
  )


def _platipus_params(params, log_std, step_p, step_q):
  full = lambda value: jax.tree_util.tree_map(lambda p: jnp.full_like(p, value), params)  # noqa: E731
  return baselines.PlatipusParams(
    params, full(log_std), full(log_std), full(jnp.log(step_p)), full(jnp.log(step_q))
  )


def test_platipus_with_zero_variance_adapts_as_maml():
  params, apply_fn, nll, loss_fn = _tiny_hidden_mlp()
  task = _one_task(jax.random.key(1))
  learner = baselines.platipus(apply_fn, nll, num_inner_steps=3, inner_lr=0.05, num_mc_query=3)

  @jax.jit
  def adapted(params):
    maml = lambda n: vj.maml_adapt(
      params,
      task.support_x,
      task.support_y,
      loss_fn=loss_fn,  # noqa: E731
      num_steps=n,
      inner_lr=0.05,
    )
    adapt = lambda meta: learner.adapt(  # noqa: E731
      meta, task.support_x, task.support_y, jax.random.key(2)
    )
    # γ_p = 0: θ = μ_θ then MAML's 3 steps; γ_p = α: the prior's mean step is one more MAML step.
    return (
      adapt(_platipus_params(params, -30.0, 0.0, 1.0)),
      maml(3),
      adapt(_platipus_params(params, -30.0, 0.05, 1.0)),
      maml(4),
    )

  no_step, maml3, alpha_step, maml4 = adapted(params)
  for draw in range(3):
    chex.assert_trees_all_close(
      jax.tree_util.tree_map(lambda p, d=draw: p[d], no_step), maml3, atol=1e-6
    )
    chex.assert_trees_all_close(
      jax.tree_util.tree_map(lambda p, d=draw: p[d], alpha_step), maml4, atol=1e-6
    )
  assert _max_abs_difference(maml3, maml4) > 1e-4
  outputs = learner.predict(alpha_step, task.query_x, jax.random.key(3))
  chex.assert_shape(outputs, (3, task.query_x.shape[0], 1))
  np.testing.assert_allclose(outputs[2], apply_fn(maml4, task.query_x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("inference_data", ["support_and_query", "query"])
def test_platipus_meta_loss_follows_algorithm_1(inference_data):
  params, apply_fn, nll, loss_fn = _tiny_hidden_mlp()
  task = _one_task(jax.random.key(1))
  key = jax.random.key(5)
  meta = baselines.PlatipusParams(
    params,
    _random_like(params, jax.random.key(2), -3.0, -2.0),
    _random_like(params, jax.random.key(3), -3.0, -2.0),
    _random_like(params, jax.random.key(4), -4.0, -2.0),
    _random_like(params, jax.random.key(6), -4.0, -2.0),
  )
  learner = baselines.platipus(
    apply_fn,
    nll,
    num_inner_steps=2,
    inner_lr=0.05,
    kl_weight=0.3,
    num_mc_train=2,
    inference_data=inference_data,
  )

  def step(mean, log_steps, x, y):  # μ − γ ⊙ ∇L(μ)
    grads = jax.grad(loss_fn)(mean, x, y)
    return jax.tree_util.tree_map(lambda m, g, s: m - jnp.exp(s) * g, mean, grads, log_steps)

  @jax.jit
  def losses(meta):
    if inference_data == "query":
      q_x, q_y = task.query_x, task.query_y
    else:
      q_x, q_y = (
        jnp.concatenate([task.support_x, task.query_x]),
        jnp.concatenate([task.support_y, task.query_y]),
      )
    q = vj.Gaussian(step(meta.mean, meta.log_step_q, q_x, q_y), meta.log_std_q)
    p = vj.Gaussian(step(meta.mean, meta.log_step_p, task.support_x, task.support_y), meta.log_std)
    draws = vj.sample(q, key, 2)
    phis = [
      vj.maml_adapt(
        jax.tree_util.tree_map(lambda w, d=d: w[d], draws),
        task.support_x,
        task.support_y,
        loss_fn=loss_fn,
        num_steps=2,
        inner_lr=0.05,
      )
      for d in range(2)
    ]
    query_nll = jnp.mean(jnp.stack([loss_fn(phi, task.query_x, task.query_y) for phi in phis]))
    expected_outputs = jnp.stack([apply_fn(phi, task.query_x) for phi in phis])
    kl = vj.kl_divergence(q, p)
    return learner.meta_loss(meta, task, key), (query_nll + 0.3 * kl, expected_outputs), kl

  (loss, outputs), (expected_loss, expected_outputs), kl = losses(meta)
  assert float(kl) > 1.0
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  np.testing.assert_allclose(outputs, expected_outputs, rtol=1e-5, atol=1e-6)


def test_platipus_meta_gradient_matches_finite_differences():
  with jax.enable_x64(True):
    params, apply_fn, nll, _ = _tiny_hidden_mlp(jnp.float64)
    task = _one_task(jax.random.key(1), jnp.float64)
    meta = baselines.PlatipusParams(
      params,
      _random_like(params, jax.random.key(2), -2.0, -1.0),
      _random_like(params, jax.random.key(3), -2.0, -1.0),
      _random_like(params, jax.random.key(4), -4.0, -2.0),
      _random_like(params, jax.random.key(6), -4.0, -2.0),
    )
    learner = baselines.platipus(apply_fn, nll, num_inner_steps=2, inner_lr=0.05, num_mc_train=2)
    _check_gradient_by_finite_differences(
      lambda m: learner.meta_loss(m, task, jax.random.key(7))[0], meta
    )
