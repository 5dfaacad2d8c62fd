import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.metrics import predictive_distributions
from vampire_jax._src.metrics import quantile_map as qm


def _predictive(num_query=4, num_draws=16):
  rng = np.random.default_rng(3)
  nll = vj.gaussian_nll(0.3)
  nll.quantile_map = qm.fit(rng.beta(0.5, 0.5, 2000), 20)
  outputs = jnp.asarray(rng.normal(0.0, 1.0, (num_draws, num_query, 1)), jnp.float32)
  return vj.predictive_distribution(outputs, nll), outputs, nll


def test_the_recalibrated_density_cdf_quantiles_and_moments_agree():
  dist, outputs, nll = _predictive()
  assert isinstance(dist, predictive_distributions.RecalibratedPredictive)
  with pytest.raises(vj.InputError, match=r"value must be shaped \[4, 1\]"):
    dist.log_prob(jnp.zeros(4))
  y = jnp.linspace(-6.0, 6.0, 6001)[:, None, None] * jnp.ones((1, 4, 1))
  levels = jnp.array([[0.01], [0.3], [0.5], [0.99]])

  @jax.jit  # one program: each of these alone, eagerly, compiles its own loops
  def everything(outputs):
    dist = vj.predictive_distribution(outputs, nll)
    lower, upper = vj.predictive_interval(dist)
    samples = dist.sample(seed=jax.random.key(0), sample_shape=2000)
    return dict(
      density=jnp.exp(jax.vmap(dist.log_prob)(y)),
      cdf=jax.vmap(dist.cdf)(y)[..., 0],
      mean=dist.mean()[:, 0],
      variance=dist.variance()[:, 0],
      inverted=dist.cdf(dist.quantile(levels)),
      mass=dist.cdf(upper) - dist.cdf(lower),
      below=jnp.mean(samples <= upper, 0),
    )

  got = {name: np.asarray(value, np.float64) for name, value in everything(outputs).items()}
  grid, density = np.asarray(y[:, 0, 0], np.float64), got["density"]  # [grid, query]
  # The CDF is the density's integral, and that integral is one.
  steps = 0.5 * (density[1:] + density[:-1]) * np.diff(grid)[:, None]
  integral = np.concatenate([np.zeros((1, 4)), np.cumsum(steps, axis=0)])
  np.testing.assert_allclose(integral, got["cdf"] - got["cdf"][0], atol=1e-3)
  np.testing.assert_allclose(integral[-1], 1.0, atol=1e-3)
  mean = np.trapezoid(density * grid[:, None], grid, axis=0)
  variance = np.trapezoid(density * (grid[:, None] - mean) ** 2, grid, axis=0)
  np.testing.assert_allclose(got["mean"], mean, atol=2e-3)
  np.testing.assert_allclose(got["variance"], variance, rtol=5e-3)
  # The quantiles invert the CDF; the central 90 % interval holds 90 % of the mass, and of
  # the samples.
  np.testing.assert_allclose(got["inverted"], levels, atol=1e-5)
  np.testing.assert_allclose(got["mass"], 0.9, atol=1e-5)
  np.testing.assert_allclose(got["below"], 0.95, atol=0.025)


def test_the_recalibrated_predictive_jits_and_vmaps_over_tasks():
  _, outputs, nll = _predictive()
  tasks = jnp.stack([outputs, outputs + 1.0])  # [tasks, draws, query, 1]
  targets = jnp.zeros((2, 4, 1))

  def score(task_outputs, task_targets):
    dist = vj.predictive_distribution(task_outputs, nll)
    return dist.log_prob(task_targets), vj.predictive_interval(dist)[0]

  batched = jax.jit(jax.vmap(score))(tasks, targets)
  for i in range(2):
    one = score(tasks[i], targets[i])
    for got, wanted in zip(batched, one):
      np.testing.assert_allclose(got[i], wanted, rtol=1e-5, atol=1e-5)
