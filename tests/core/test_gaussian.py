"""Gaussian pytrees: closed-form KL, sampling moments, reparameterised gradients."""

import math
import os
import subprocess
import sys

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import vampire_jax as vj
from tests.helpers import _small_regression
from vampire_jax._src.core import gaussian
from vampire_jax._src.core.errors import InputError
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


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert "ArrayImpl" not in message, message
  return message


def _gaussian(shape, log_std=-1.0):
  return vj.Gaussian({"w": jnp.zeros(shape)}, {"w": jnp.full(shape, log_std)})


def _adapt(prior, task, loss_fn, **settings):
  """`vj.adapt` on `task`'s support set with key 2."""
  return vj.adapt(
    prior, task.support_x, task.support_y, jax.random.key(2), loss_fn=loss_fn, **settings
  )


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


def test_kl_to_the_standard_normal_is_its_closed_form():
  mean = {"w": jnp.array([[0.5, -1.0], [2.0, 0.0]]), "b": jnp.array([0.3])}
  log_std = {"w": jnp.array([[-1.0, 0.0], [0.5, -3.0]]), "b": jnp.array([0.2])}
  q = vj.Gaussian(mean, log_std)
  target = gaussian.standard_normal_like(q)
  assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree_util.tree_leaves(target))
  leaves = zip(jax.tree_util.tree_leaves(mean), jax.tree_util.tree_leaves(log_std))
  # KL(N(m, s^2) || N(0, 1)) = (m^2 + s^2 - 1) / 2 - log s, summed over the 5 weights.
  expected = sum(float(np.sum((np.square(m) + np.exp(2 * s) - 1) / 2 - s)) for m, s in leaves)
  np.testing.assert_allclose(float(vj.kl_divergence(q, target)), expected, rtol=1e-6)


def test_gaussian_to_distrax_and_back_with_the_same_kl_and_density():
  params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
  q = vj.gaussian_from_params(params, jax.random.key(0), log_std_range=(-2.0, -1.0))
  p = vj.gaussian_from_params(
    jax.tree.map(lambda x: x + 0.3, params), jax.random.key(1), log_std_range=(-1.5, -0.5)
  )
  q_tree, p_tree = vj.to_distrax(q), vj.to_distrax(p)
  assert isinstance(q_tree["dense"]["kernel"], distrax.Normal)
  back = vj.gaussian_from_distrax(q_tree)
  for ours, theirs in zip(jax.tree.leaves(q), jax.tree.leaves(back)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)

  def is_normal(x):
    return isinstance(x, distrax.Normal)

  per_leaf = jax.tree.map(
    lambda a, b: jnp.sum(a.kl_divergence(b)), q_tree, p_tree, is_leaf=is_normal
  )
  np.testing.assert_allclose(vj.kl_divergence(q, p), sum(jax.tree.leaves(per_leaf)), rtol=1e-5)
  # vj.sample's draws are mean + eps * std: distrax's density of a draw is N(eps; 0, 1) / std.
  draws = vj.sample(q, jax.random.key(2), num_samples=4)
  for dist, mean, log_std, w in zip(
    jax.tree.leaves(q_tree, is_leaf=is_normal),
    jax.tree.leaves(q.mean),
    jax.tree.leaves(q.log_std),
    jax.tree.leaves(draws),
  ):
    eps = (w - mean) * jnp.exp(-log_std)
    ours = -0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(dist.log_prob(w), ours, rtol=1e-5, atol=1e-5)
  with pytest.raises(InputError, match="distrax.Normal leaves only"):
    vj.gaussian_from_distrax({"a": distrax.Laplace(0.0, 1.0)})


@pytest.mark.parametrize("scale", [0.0, -0.5, math.nan, math.inf])
def test_gaussian_from_distrax_refuses_a_scale_whose_log_is_not_finite(scale):
  """A scale of 0, -0.5, NaN or inf (log-std -inf or NaN) is refused naming the leaf."""
  tree = {"w": distrax.Normal(jnp.zeros(3), jnp.array([1.0, scale, 1.0]))}
  with pytest.raises(
    InputError, match=r"gaussian_from_distrax: tree\['w'\].scale must be finite and > 0"
  ) as raised:
    vj.gaussian_from_distrax(tree)
  _one_line(raised)


def test_gaussian_from_distrax_refuses_a_nan_mean():
  """A NaN loc is refused naming the leaf's loc and the count of non-finite values."""
  tree = {"w": distrax.Normal(jnp.array([0.0, jnp.nan]), jnp.ones(2))}
  with pytest.raises(
    InputError, match=r"tree\['w'\].loc must be finite, got 1 NaN or inf"
  ) as raised:
    vj.gaussian_from_distrax(tree)
  _one_line(raised)


def test_gaussian_from_distrax_keeps_float64_under_x64():
  """Under JAX_ENABLE_X64, to_distrax -> gaussian_from_distrax keeps float64 and round-trips
  the log-stds to 1e-14: the two are inverses, as the docs say."""
  code = (
    "import jax.numpy as jnp, numpy as np, vampire_jax as vj\n"
    "g = vj.Gaussian({'w': jnp.full(3, 0.1, jnp.float64)}, {'w': jnp.full(3, -1.1, jnp.float64)})\n"
    "back = vj.gaussian_from_distrax(vj.to_distrax(g))\n"
    "print(back.mean['w'].dtype, back.log_std['w'].dtype,\n"
    "      float(np.max(np.abs(np.asarray(back.log_std['w']) + 1.1))))\n"
  )
  env = dict(os.environ, JAX_ENABLE_X64="1")
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
  )
  mean_dtype, log_std_dtype, error = out.stdout.split()
  assert (mean_dtype, log_std_dtype) == ("float64", "float64")
  assert float(error) < 1e-14  # float64's round trip through exp and log


@pytest.mark.parametrize("q_shape, p_shape", [((8,), (1,)), ((3, 1), (1, 3))])
def test_kl_of_leaves_of_other_shapes_is_refused_not_broadcast(q_shape, p_shape):
  """Leaves of other shapes ([8] against [1], [3, 1] against [1, 3]) are refused naming the
  leaf, not broadcast; equal shapes give the closed form."""
  with pytest.raises(InputError, match=r"kl_divergence: the leaf \['w'\] has shapes"):
    vj.kl_divergence(_gaussian(q_shape), _gaussian(p_shape, -2.0))
  # Equal shapes still give the closed form: sum of log(s_p/s_q) + (s_q^2)/(2 s_p^2) - 1/2.
  kl = vj.kl_divergence(_gaussian((3,)), _gaussian((3,), -2.0))
  expected = 3 * (-2.0 + 1.0 + 0.5 * math.exp(2.0) - 0.5)
  np.testing.assert_allclose(float(kl), expected, rtol=1e-6)


def test_kl_of_trees_of_other_keys_is_one_line():
  """Trees of other keys are refused in one line saying "another tree structure"."""
  q = _gaussian((3,))
  p = vj.Gaussian({"v": jnp.zeros(3)}, {"v": jnp.zeros(3)})
  with pytest.raises(InputError) as raised:
    vj.kl_divergence(q, p)
  assert "another tree structure" in str(raised.value)
  assert len(str(raised.value).splitlines()) == 1


@pytest.mark.parametrize("bad", [(-math.inf, -3.0), (-4.0, math.nan), (-3.0, -4.0)])
def test_gaussian_from_params_refuses_a_non_finite_or_reversed_range(bad):
  """A log_std_range with -inf or NaN, or reversed, is refused: it must be finite."""
  with pytest.raises(InputError, match="log_std_range must be finite"):
    vj.gaussian_from_params({"w": jnp.zeros(4)}, jax.random.key(0), bad)


def test_integer_leaves_are_named_by_gaussian_from_params_adapt_and_maml_adapt():
  """An int32 leaf is refused naming its path, by gaussian_from_params, adapt and maml_adapt."""
  apply_fn, params, task = _small_regression()
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  ints = {**params, "Dense_1": {**params["Dense_1"], "bias": jnp.zeros(1, jnp.int32)}}
  with pytest.raises(
    InputError, match=r"gaussian_from_params: params\['Dense_1'\]\['bias'\] is int32"
  ):
    vj.gaussian_from_params(ints, jax.random.key(0))
  prior = vj.gaussian_from_params(params, jax.random.key(0))
  bad_prior = vj.Gaussian(ints, prior.log_std)
  with pytest.raises(InputError, match=r"adapt: mean\['Dense_1'\]\['bias'\] is int32"):
    _adapt(bad_prior, task, loss_fn, num_steps=1, inner_lr=1e-3)
  with pytest.raises(InputError, match=r"maml_adapt: params\['Dense_1'\]\['bias'\] is int32"):
    vj.maml_adapt(ints, task.support_x, task.support_y, loss_fn=loss_fn, num_steps=1, inner_lr=1e-3)
