"""Gaussian pytrees: closed-form KL, sampling moments, reparameterised gradients."""

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import vampire_jax as vj
from vampire_jax._src.core.gaussian import check_gaussian


def _random_gaussian(key, scale=1.0):
  k = jax.random.split(key, 4)
  mean = {
    "dense": {"kernel": jax.random.normal(k[0], (3, 4)), "bias": jax.random.normal(k[1], (4,))}
  }
  log_std = {
    "dense": {
      "kernel": scale * jax.random.normal(k[2], (3, 4)),
      "bias": scale * jax.random.normal(k[3], (4,)),
    }
  }
  return vj.Gaussian(mean, log_std)


class GaussianMathsTest(chex.TestCase):
  """The closed-form KL and the sampler, each with and without `jax.jit` (chex.variants)."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_matches_distrax_summed_over_leaves(self):
    q = _random_gaussian(jax.random.key(0), 0.5)
    p = _random_gaussian(jax.random.key(1), 0.5)
    expected = sum(
      jnp.sum(distrax.Normal(mq, jnp.exp(sq)).kl_divergence(distrax.Normal(mp, jnp.exp(sp))))
      for mq, sq, mp, sp in zip(
        *(jax.tree_util.tree_leaves(t) for t in (q.mean, q.log_std, p.mean, p.log_std))
      )
    )
    np.testing.assert_allclose(self.variant(vj.kl_divergence)(q, p), expected, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_of_itself_is_zero_and_kl_is_nonnegative(self):
    kl = self.variant(vj.kl_divergence)
    q = _random_gaussian(jax.random.key(2))
    assert abs(float(kl(q, q))) < 1e-5
    for seed in range(5):
      p = _random_gaussian(jax.random.key(10 + seed))
      assert float(kl(q, p)) > 0.0

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_is_stable_for_very_narrow_distributions(self):
    q = vj.point_mass({"w": jnp.ones(3)})
    p = vj.Gaussian({"w": jnp.ones(3)}, {"w": jnp.full(3, -30.0)})
    assert abs(float(self.variant(vj.kl_divergence)(q, p))) < 1e-6

  @chex.variants(with_jit=True, without_jit=True)
  def test_sample_moments(self):
    dist = vj.Gaussian(
      {"a": jnp.array([1.0, -2.0]), "b": jnp.array(3.0)},
      {"a": jnp.log(jnp.array([0.5, 2.0])), "b": jnp.array(0.0)},
    )
    draws = self.variant(vj.sample, static_argnums=2)(dist, jax.random.key(0), 200_000)
    chex.assert_shape(draws["a"], (200_000, 2))
    chex.assert_shape(draws["b"], (200_000,))
    np.testing.assert_allclose(jnp.mean(draws["a"], 0), [1.0, -2.0], atol=0.02)
    np.testing.assert_allclose(jnp.std(draws["a"], 0), [0.5, 2.0], rtol=0.01)
    np.testing.assert_allclose(jnp.mean(draws["b"]), 3.0, atol=0.01)
    np.testing.assert_allclose(jnp.std(draws["b"]), 1.0, rtol=0.01)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sample_is_deterministic_per_key_and_differs_across_keys(self):
    dist = _random_gaussian(jax.random.key(0))
    sample = self.variant(vj.sample, static_argnums=2)
    a = sample(dist, jax.random.key(5), 3)
    chex.assert_trees_all_close(a, sample(dist, jax.random.key(5), 3), rtol=0, atol=0)
    assert not np.allclose(
      a["dense"]["kernel"], sample(dist, jax.random.key(6), 3)["dense"]["kernel"]
    )


def test_reparameterisation_gradients_match_finite_differences():
  with jax.enable_x64(True):
    mean = {"w": jnp.array([0.3, -0.2], jnp.float64)}
    log_std = {"w": jnp.array([-0.5, 0.1], jnp.float64)}
    key = jax.random.key(3)

    def objective(mean, log_std):
      draws = vj.sample(vj.Gaussian(mean, log_std), key, 4)
      return jnp.sum(jnp.sin(draws["w"]) ** 2)

    check_grads(objective, (mean, log_std), order=2, modes=["rev"], eps=1e-4)


def test_reparameterisation_gradient_of_expected_square_is_exact():
  # E[w^2] = m^2 + s^2; with common random numbers its gradient estimate
  # converges to (2m, 2 s^2) w.r.t. (mean, log_std).
  def expected_square(mean, log_std):
    draws = vj.sample(vj.Gaussian({"w": mean}, {"w": log_std}), jax.random.key(0), 400_000)
    return jnp.mean(draws["w"] ** 2)

  g_mean, g_log_std = jax.grad(expected_square, argnums=(0, 1))(
    jnp.array(0.7), jnp.log(jnp.array(0.4))
  )
  np.testing.assert_allclose(g_mean, 1.4, rtol=0.01)
  np.testing.assert_allclose(g_log_std, 2 * 0.4**2, rtol=0.01)


def test_gaussian_from_params_draws_log_std_in_range():
  params = {"a": jnp.zeros((50, 20)), "b": jnp.zeros(7)}
  dist = vj.gaussian_from_params(params, jax.random.key(0))
  chex.assert_trees_all_equal(dist.mean, params)
  leaves = jnp.concatenate([x.ravel() for x in jax.tree_util.tree_leaves(dist.log_std)])
  assert float(leaves.min()) >= -4.0 and float(leaves.max()) < -3.0
  assert 0.2 < float(jnp.std(leaves)) < 0.35  # uniform on a unit interval: 0.289


def test_gaussian_with_mismatched_trees_is_rejected():
  with pytest.raises(ValueError, match="same tree structure"):
    check_gaussian(vj.Gaussian({"a": jnp.zeros(2)}, {"b": jnp.zeros(2)}))
  with pytest.raises(ValueError, match="shape"):
    check_gaussian(vj.Gaussian({"a": jnp.zeros(2)}, {"a": jnp.zeros(3)}))
  with pytest.raises(ValueError, match="num_samples"):
    vj.sample(vj.point_mass({"a": jnp.zeros(2)}), jax.random.key(0), 0)


def test_every_weight_draw_is_fresh_noise():
  """No value of the noise repeats: fails if `_normal_like` drew its two halves with one key."""
  dist = vj.Gaussian(
    {"a": jnp.zeros(3), "b": jnp.zeros((2, 2))}, {"a": jnp.zeros(3), "b": jnp.zeros((2, 2))}
  )  # mean 0, std 1: draws are noise
  for num_samples in (1, 2, 1001):  # totals of 7, 14 and 7007 numbers (odd and even)
    draws = vj.sample(dist, jax.random.key(0), num_samples)
    noise = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree_util.tree_leaves(draws)])
    repeated = noise.size - np.unique(noise).size
    assert repeated <= noise.size // 1000, (num_samples, repeated, noise.size)


def test_adapt_draws_new_noise_at_every_inner_step():
  """Fails if `adapt` used one key for every inner step.

  With loss = w (one weight, no KL) and a tiny learning rate, each step moves
  log_std by -lr * eps_s * sigma, eps_s the step's noise: after S steps the move
  over lr is about -(eps_1 + ... + eps_S), of variance S if the steps draw
  independent noise and S^2 if they share it.
  """
  num_steps, lr = 4, 1e-4
  prior = vj.Gaussian({"w": jnp.zeros(())}, {"w": jnp.zeros(())})

  def moved(key):
    posterior = vj.adapt(
      prior,
      jnp.zeros((1, 1)),
      jnp.zeros((1, 1)),
      key,
      loss_fn=lambda params, x, y: params["w"],
      num_steps=num_steps,
      inner_lr=lr,
      num_mc_samples=1,
      kl_weight=0.0,
    )
    return posterior.log_std["w"] / lr

  moves = jax.jit(jax.vmap(moved))(jax.random.split(jax.random.key(0), 4000))
  variance = float(jnp.var(moves))
  assert 0.85 * num_steps < variance < 1.15 * num_steps, variance  # shared noise: 16
