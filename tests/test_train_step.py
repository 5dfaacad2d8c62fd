"""Steps that sample their own tasks: equal to the plain meta-step, whatever the speed knobs."""

import math

import chex
import jax
import jax.numpy as jnp
import pytest

import vampire_jax as vj
from vampire_jax._src.core import meta_step
from vampire_jax._src.core.host_chunked import make_host_chunked_train_step
from vampire_jax.data import sine_line


def _sampler(data, task_keys):
  del data  # generated tasks
  return sine_line.tasks_from_keys(task_keys, num_support=5, num_query=5)


def _setup(algorithm, num_tasks=4):
  model = vj.MLP((16,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  apply_fn, nll = vj.pure_apply(model), vj.gaussian_nll(0.3)
  if algorithm == "maml":
    learner = vj.maml(apply_fn, nll, num_inner_steps=2, inner_lr=0.005)
  else:
    learner = vj.vampire(
      apply_fn,
      nll,
      num_inner_steps=2,
      inner_lr=0.005,
      kl_weight=0.1,
      num_mc_train=2,
      num_mc_query=2,
    )
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=num_tasks)
  return learner, optimizer, vj.init_meta_state(learner, optimizer, params, jax.random.key(1))


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


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_steps_per_call_and_host_chunking_do_not_change_the_run(algorithm):
  learner, optimizer, state = _setup(algorithm)
  key = jax.random.key(3)
  one = jax.jit(vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4))
  three = jax.jit(
    vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4, steps_per_call=3)
  )
  chunked = make_host_chunked_train_step(
    learner, optimizer, _sampler, tasks_per_step=4, chunk_size=2
  )
  single, chunk_state, losses = state, state, []
  for _ in range(3):
    single, metrics = one(single, None, key)
    chunk_state, _ = chunked(chunk_state, None, key)
    losses.append(metrics["loss"][0])
  scanned, scanned_metrics = three(state, None, key)
  assert int(scanned.step) == int(single.step) == 3
  chex.assert_trees_all_close(scanned, single, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(chunk_state, single, rtol=1e-4, atol=1e-6)
  chex.assert_trees_all_close(scanned_metrics["loss"], jnp.stack(losses), rtol=1e-5)
  # Each step draws other tasks: the three losses differ.
  assert len({round(float(v), 6) for v in losses}) == 3
