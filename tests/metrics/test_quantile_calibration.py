import statistics

import numpy as np
import pytest

from tests.helpers import LEVELS, _two_component_problem
from vampire_jax._src.metrics import calibration as cal


def test_targets_from_the_predictive_lie_on_the_diagonal():
  means, targets = _two_component_problem(np.random.default_rng(4), 100_000, true_std=0.3)
  result = cal.regression_quantile_calibration(means, targets, noise_std=0.3)
  np.testing.assert_allclose(result.levels, LEVELS)
  np.testing.assert_allclose(result.observed, LEVELS, atol=0.01)
  assert result.ece < 0.005 and result.mce < 0.01


def test_observed_equals_counting_targets_below_bisected_quantiles():
  means, targets = _two_component_problem(np.random.default_rng(5), 20_000, true_std=0.5)
  result = cal.regression_quantile_calibration(means, targets, noise_std=0.3)
  quantiles = cal.mixture_quantile(LEVELS, means, 0.3)  # [9, N]
  # Targets within the bisection tolerance of a quantile may flip: allow 1 in N.
  np.testing.assert_allclose(
    result.observed, np.mean(targets <= quantiles, axis=1), atol=1.5 / 20_000
  )


def test_too_narrow_predictive_is_overconfident():
  rng = np.random.default_rng(6)
  n, noise_std, true_std = 100_000, 0.3, 0.6
  means = rng.normal(size=(1, n))
  targets = means[0] + true_std * rng.normal(size=n)
  result = cal.regression_quantile_calibration(means, targets, noise_std)
  low, high = LEVELS < 0.5, LEVELS > 0.5
  assert np.all(result.observed[high] < LEVELS[high])
  assert np.all(result.observed[low] > LEVELS[low])
  # Closed form: P(y <= m + s z_p) = Phi(s z_p / true_std).
  expected = [
    statistics.NormalDist().cdf(noise_std / true_std * statistics.NormalDist().inv_cdf(p))
    for p in LEVELS
  ]
  np.testing.assert_allclose(result.observed, expected, atol=0.01)


def test_single_sample_matches_gaussian_closed_form():
  rng = np.random.default_rng(7)
  means = rng.normal(size=(1, 2000))
  targets = means[0] + 0.4 * rng.normal(size=2000)
  result = cal.regression_quantile_calibration(means, targets, noise_std=0.3)
  gauss = statistics.NormalDist()
  pit = np.array([gauss.cdf((y - m) / 0.3) for y, m in zip(targets, means[0])])
  expected = [np.mean(pit <= p) for p in LEVELS]
  np.testing.assert_array_equal(result.observed, expected)
  gap = np.abs(np.array(expected) - LEVELS)
  assert result.ece == pytest.approx(gap.mean()) and result.mce == pytest.approx(gap.max())


def test_task_axis_is_pooled():
  rng = np.random.default_rng(8)
  means = rng.normal(size=(6, 3, 10))  # [tasks, samples, query]
  targets = rng.normal(size=(6, 10))  # [tasks, query]
  pooled = cal.regression_quantile_calibration(
    np.moveaxis(means, 1, 0).reshape(3, 60), targets.reshape(60), 0.3
  )
  by_task = cal.regression_quantile_calibration(means, targets, 0.3)
  evaluator_shaped = cal.regression_quantile_calibration(means[..., None], targets[..., None], 0.3)
  for result in (by_task, evaluator_shaped):
    np.testing.assert_array_equal(result.observed, pooled.observed)
    assert result.ece == pooled.ece and result.mce == pooled.mce


@pytest.mark.parametrize(
  "means_shape, targets_shape",
  [
    ((5,), (5,)),  # no sample axis
    ((2, 5), (4,)),  # points differ
    ((2, 3, 5), (2, 4)),  # query differs
    ((2, 3, 5), (3, 5)),  # tasks differ
    ((2, 3, 5, 2), (2, 5, 2)),
    ((0, 5), (5,)),  # no samples
  ],
)
def test_regression_shape_errors(means_shape, targets_shape):
  with pytest.raises(ValueError):
    cal.regression_quantile_calibration(np.zeros(means_shape), np.zeros(targets_shape), 0.3)


def test_regression_value_errors():
  means, targets = np.zeros((1, 4)), np.zeros(4)
  with pytest.raises(ValueError, match="noise_std"):
    cal.regression_quantile_calibration(means, targets, 0.0)
  with pytest.raises(ValueError, match="levels"):
    cal.regression_quantile_calibration(means, targets, 0.3, levels=[0.0, 0.5])
  with pytest.raises(ValueError, match="levels"):
    cal.mixture_quantile(1.0, means, 0.3)


def test_paper_quantile_calibration_by_hand():
  # Two draws at -1 and +1 around a truth of 0 with noise std 1: the outputs'
  # quantiles at levels 0, 0.5, 1 are -1, 0, 1, and the true N(0, 1) puts
  # Phi(-1), 1/2, Phi(1) of the observations below them.
  result = cal.paper_quantile_calibration(
    np.array([[-1.0], [1.0]]), np.array([0.0]), 1.0, levels=[0.0, 0.5, 1.0]
  )
  phi = statistics.NormalDist().cdf
  np.testing.assert_allclose(result.observed, [phi(-1), 0.5, phi(1)], atol=1e-12)
  gaps = [phi(-1), 0.0, 1 - phi(1)]
  np.testing.assert_allclose(result.ece, np.mean(gaps), atol=1e-12)
  np.testing.assert_allclose(result.mce, max(gaps), atol=1e-12)
  # A point estimate (one draw) has one observed value at all 11 default levels.
  single = cal.paper_quantile_calibration(np.array([[0.3]]), np.array([0.0]), 0.3)
  np.testing.assert_allclose(single.observed, phi(1.0) * np.ones(11), atol=1e-12)
  assert len(single.levels) == 11 and single.levels[0] == 0 and single.levels[-1] == 1


def test_paper_quantile_calibration_is_perfect_when_the_outputs_are_the_noise():
  # Outputs drawn from the true distribution N(y0, sigma^2): on the diagonal.
  rng = np.random.default_rng(3)
  truth = rng.normal(size=400)
  outputs = truth[None] + 0.3 * rng.normal(size=(4000, 400))
  result = cal.paper_quantile_calibration(outputs, truth, 0.3)
  np.testing.assert_allclose(result.observed, result.levels, atol=0.01)
  assert result.ece < 0.005
