"""Baselines (first-order MAML, PLATIPUS, BMAML, ABML): reductions, hand computations, gradients, learning."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

import vampire_jax as vj
from tests.helpers import _max_abs_difference, _tiny_hidden_mlp
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


def test_median_bandwidth_equals_a_hand_computation():
  bandwidth = jax.jit(lambda p: baselines.median_bandwidth(baselines.pairwise_squared_distances(p)))
  # 1-D particles 0, 1, 3: squared distances {0 x3, 1 x2, 4 x2, 9 x2}, median 1.
  np.testing.assert_allclose(
    bandwidth({"w": jnp.array([[0.0], [1.0], [3.0]])}), 1.0 / math.log(3), rtol=1e-6
  )
  # 0, 1, 3, 7: sorted 16 entries 0,0,0,0,1,1,4,4 | 9,9,16,16,36,36,49,49: median (4 + 9) / 2.
  np.testing.assert_allclose(
    bandwidth({"w": jnp.array([[0.0], [1.0], [3.0], [7.0]])}), 6.5 / math.log(4), rtol=1e-6
  )
  # Squared distances sum over every leaf.
  two_leaves = {"a": jnp.array([[0.0], [3.0]]), "b": jnp.array([[0.0, 0.0], [4.0, 0.0]])}
  np.testing.assert_allclose(
    baselines.pairwise_squared_distances(two_leaves), [[0.0, 25.0], [25.0, 0.0]]
  )
  np.testing.assert_allclose(baselines.median_bandwidth(jnp.zeros((1, 1))), 1.0)


def test_kernel_and_its_gradient_on_three_particles_by_hand():
  # 1-D particles 0, 1, 3: D = [[0, 1, 9], [1, 0, 4], [9, 4, 0]], median 1, so h = 1 / log 3
  # and k_ij = exp(-D_ij log 3) = 3^(-D_ij).
  particles = {"w": jnp.array([[0.0], [1.0], [3.0]])}
  kernel, bandwidth = jax.jit(baselines.rbf_kernel)(particles)
  np.testing.assert_allclose(bandwidth, 1 / math.log(3), rtol=1e-6)
  np.testing.assert_allclose(
    kernel, [[1, 1 / 3, 3.0**-9], [1 / 3, 1, 1 / 81], [3.0**-9, 1 / 81, 1]], rtol=1e-5
  )
  # Σ_j ∇_{θ_j} k(θ_j, θ_i) = (2 / h) Σ_j k_ij (θ_i − θ_j) = 2 log 3 · Σ_j 3^(-D_ij) (θ_i − θ_j):
  # θ_0: (1/3)(0 − 1) + 3^-9 (0 − 3); θ_1: (1/3)(1 − 0) + (1/81)(1 − 3); θ_2: 3^-9 · 3 + (1/81) · 2.
  expected = (
    2 * math.log(3) * np.array([-1 / 3 - 3 * 3.0**-9, 1 / 3 - 2 / 81, 3 * 3.0**-9 + 2 / 81])
  )
  gradient = jax.jit(baselines.kernel_gradient)(particles, kernel, bandwidth)
  np.testing.assert_allclose(gradient["w"][:, 0], expected, rtol=1e-5)


def test_svgd_direction_of_two_particles_by_hand():
  # θ_1 = (0, 0) and θ_2 = (3, 4), one coordinate per leaf: D_12 = 25, the median of
  # {0, 0, 25, 25} is 12.5, h = 12.5 / log 2, so k_12 = exp(-25 log 2 / 12.5) = 1/4 and
  # 2 / h = 4 log 2 / 25. With ∇ log p(θ_1) = (1, 0) and ∇ log p(θ_2) = (0, 2):
  #   φ(θ_1) = ½ [(1, 0) + ¼ (0, 2) + ¼ (4 log 2 / 25) (θ_1 − θ_2)]
  #          = (½ − 1.5 log 2 / 25, ¼ − 2 log 2 / 25)
  #   φ(θ_2) = ½ [¼ (1, 0) + (0, 2) + ¼ (4 log 2 / 25) (θ_2 − θ_1)]
  #          = (⅛ + 1.5 log 2 / 25, 1 + 2 log 2 / 25)
  particles = {"a": jnp.array([[0.0], [3.0]]), "b": jnp.array([[0.0], [4.0]])}
  log_prob_grads = {"a": jnp.array([[1.0], [0.0]]), "b": jnp.array([[0.0], [2.0]])}
  direction = jax.jit(baselines.svgd_direction)(particles, log_prob_grads)
  c = math.log(2) / 25
  np.testing.assert_allclose(direction["a"][:, 0], [0.5 - 1.5 * c, 0.125 + 1.5 * c], rtol=1e-5)
  np.testing.assert_allclose(direction["b"][:, 0], [0.25 - 2 * c, 1 + 2 * c], rtol=1e-5)


def test_svgd_with_one_particle_is_gradient_descent():
  params, _, _, loss_fn = _tiny_hidden_mlp()
  task = _one_task(jax.random.key(1))

  @jax.jit
  def adapted(params):
    particles = jax.tree_util.tree_map(lambda p: p[None], params)
    svgd = baselines.svgd_adapt(
      particles, task.support_x, task.support_y, loss_fn=loss_fn, num_steps=3, inner_lr=0.05
    )
    maml = vj.maml_adapt(
      params, task.support_x, task.support_y, loss_fn=loss_fn, num_steps=3, inner_lr=0.05
    )
    return jax.tree_util.tree_map(lambda p: p[0], svgd), maml

  svgd, maml = adapted(params)
  chex.assert_trees_all_close(svgd, maml, atol=1e-6)
  assert _max_abs_difference(maml, params) > 1e-3


def test_bmaml_with_one_particle_has_maml_meta_gradient():
  with jax.enable_x64(True):
    params, apply_fn, nll, _ = _tiny_hidden_mlp(jnp.float64)
    task = _one_task(jax.random.key(2), jnp.float64)
    bmaml = baselines.bmaml(apply_fn, nll, num_particles=1, num_inner_steps=2, inner_lr=0.1)
    maml = vj.maml(apply_fn, nll, num_inner_steps=2, inner_lr=0.1)

    @jax.jit
    def losses_and_gradients(params):
      particles = jax.tree_util.tree_map(lambda p: p[None], params)
      bmaml_result = jax.value_and_grad(
        lambda p: vj.query_loss(bmaml, p, task, jax.random.key(0))[0]
      )(particles)
      return bmaml_result, jax.value_and_grad(
        lambda p: vj.query_loss(maml, p, task, jax.random.key(0))[0]
      )(params)

    (loss, grads), (expected_loss, expected_grads) = losses_and_gradients(params)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-12)
    chex.assert_trees_all_close(
      jax.tree_util.tree_map(lambda g: g[0], grads), expected_grads, atol=1e-10
    )


def test_svgd_particles_spread_to_a_gaussian_target():
  # Target N(2, 1.5^2) in 1-D. With the kernel gradient halved (kernel and
  # gradient on different distances) the particles' std settles near 1.0.
  with jax.enable_x64(True):
    loss_fn = lambda p, x, y: 0.5 * jnp.sum(jnp.square((p["w"] - 2.0) / 1.5))  # noqa: E731
    particles = {"w": 0.5 * jax.random.normal(jax.random.key(0), (50, 1))}
    moved = jax.jit(
      lambda p: baselines.svgd_adapt(
        p, jnp.zeros((1, 1)), jnp.zeros((1, 1)), loss_fn=loss_fn, num_steps=2000, inner_lr=0.2
      )
    )(particles)
    np.testing.assert_allclose(jnp.mean(moved["w"]), 2.0, atol=0.02)
    np.testing.assert_allclose(jnp.std(moved["w"]), 1.5, atol=0.1)


def test_bfa_loss_is_the_log_mean_task_likelihood():
  nll = vj.gaussian_nll(0.5)
  outputs = jnp.array([[[0.1], [0.4], [-0.2]], [[0.3], [0.0], [0.5]]])  # [M=2, N=3, 1]
  y = jnp.array([[0.0], [0.5], [0.1]])
  task_likelihoods = [
    np.prod(scipy.stats.norm.pdf(y[:, 0], outputs[m, :, 0], 0.5)) for m in range(2)
  ]
  expected = -np.log(np.mean(task_likelihoods)) / 3
  loss = jax.jit(
    lambda o: (
      baselines.ensemble_nll(nll, o, y),
      baselines.ensemble_nll(nll, o[:1], y),
      nll(o[0], y),
    )
  )
  bfa, one_member, member_nll = loss(outputs)
  np.testing.assert_allclose(bfa, expected, rtol=1e-5)
  np.testing.assert_allclose(one_member, member_nll, rtol=1e-6)


def test_bfa_loss_of_literal_member_nlls():
  # A likelihood whose mean NLL is the mean of the outputs: members with mean NLL 1 and 2
  # on N = 2 examples give −½ log[(e^{−2·1} + e^{−2·2}) / 2] = 1 − ½ log((1 + e^{−2}) / 2),
  # between the best member's NLL (1) and the members' mean (1.5).
  nll = lambda outputs, y: jnp.mean(outputs)  # noqa: E731
  outputs = jnp.array([[0.5, 1.5], [2.0, 2.0]])  # [M=2, N=2]
  loss = jax.jit(lambda o: baselines.ensemble_nll(nll, o, jnp.zeros(2)))(outputs)
  np.testing.assert_allclose(loss, 1 - 0.5 * math.log((1 + math.exp(-2)) / 2), rtol=1e-6)


def test_init_particles_permutes_every_leaf():
  params, _, _, _ = _tiny_hidden_mlp()
  particles = jax.jit(lambda p: baselines.init_particles(p, jax.random.key(0), 4))(params)
  for leaf, stacked in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(particles)):
    assert stacked.shape == (4,) + leaf.shape
    for member in stacked:
      np.testing.assert_array_equal(np.sort(member.ravel()), np.sort(leaf.ravel()))
  kernel = particles["Dense_0"]["kernel"]
  assert not np.allclose(kernel[0], kernel[1])


def test_chaser_loss_is_the_distance_to_the_stopped_leader():
  params, apply_fn, nll, loss_fn = _tiny_hidden_mlp()
  task = _one_task(jax.random.key(3))
  learner = baselines.bmaml(
    apply_fn,
    nll,
    num_particles=3,
    num_inner_steps=2,
    inner_lr=0.05,
    meta_objective="chaser",
    num_leader_steps=2,
  )
  particles = learner.init(params, jax.random.key(0))

  def svgd(particles, x, y, num_steps):
    return baselines.svgd_adapt(
      particles, x, y, loss_fn=loss_fn, num_steps=num_steps, inner_lr=0.05
    )

  def distance(a, b):
    return sum(
      jnp.sum((f - l) ** 2)
      for f, l in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )

  @jax.jit
  def losses_and_gradients(particles):
    result = jax.value_and_grad(lambda p: learner.meta_loss(p, task, jax.random.key(1))[0])(
      particles
    )
    follower = svgd(particles, task.support_x, task.support_y, 2)
    leader = svgd(
      follower,
      jnp.concatenate([task.support_x, task.query_x]),
      jnp.concatenate([task.support_y, task.query_y]),
      2,
    )
    # The leader is a target: the gradient is that of the follower's distance to it, held fixed.
    expected = jax.value_and_grad(
      lambda p: distance(svgd(p, task.support_x, task.support_y, 2), leader)
    )(particles)
    return result, expected

  (loss, grads), (expected_loss, expected_grads) = losses_and_gradients(particles)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  chex.assert_trees_all_close(grads, expected_grads, rtol=1e-4, atol=1e-6)
