import math
import statistics

import numpy as np
import pytest

from tests.helpers import LEVELS
from vampire_jax._src.metrics import calibration as cal


def test_normal_cdf_matches_erfc():
  x = np.linspace(-30, 30, 6001)
  reference = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
  got = cal.mixture_cdf(x, np.zeros((1, 1)), 1.0)
  np.testing.assert_allclose(got, reference, rtol=1e-12, atol=1e-300)


def test_mixture_cdf_is_the_average_of_component_cdfs():
  means = np.array([[-1.0, 0.0], [2.0, 0.5], [0.3, 4.0]])  # [3 samples, 2 points]
  y = np.array([0.7, 1.1])
  expected = [
    np.mean([statistics.NormalDist(m, 0.4).cdf(v) for m in means[:, i]]) for i, v in enumerate(y)
  ]
  np.testing.assert_allclose(cal.mixture_cdf(y, means, 0.4), expected, rtol=1e-12)


def test_single_gaussian_quantile_matches_normal_dist():
  means = np.array([[-2.0, 0.0, 3.5]])
  got = cal.mixture_quantile(LEVELS, means, 0.3)  # [9, 3]
  expected = [[statistics.NormalDist(m, 0.3).inv_cdf(p) for m in means[0]] for p in LEVELS]
  np.testing.assert_allclose(got, expected, atol=1e-9)


def test_bisection_quantile_of_a_mixture():
  rng = np.random.default_rng(3)
  means = rng.normal(size=(4, 50)) * 2  # [4 components, 50 points]
  q = cal.mixture_quantile(LEVELS, means, 0.3)
  # F(q) = p to within tol times the largest density, checked with NormalDist.
  for i in (0, 17, 49):
    for p, qp in zip(LEVELS, q[:, i]):
      f = np.mean([statistics.NormalDist(m, 0.3).cdf(qp) for m in means[:, i]])
      assert f == pytest.approx(p, abs=2e-6)
  # A symmetric two-component mixture has its median at the centre.
  centre = cal.mixture_quantile(0.5, np.array([[-1.0], [3.0]]), 0.5)
  assert centre.shape == (1,) and centre[0] == pytest.approx(1.0, abs=1e-6)
  # Quantiles increase with the level.
  assert np.all(np.diff(q, axis=0) > 0)
