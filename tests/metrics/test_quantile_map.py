import json

import numpy as np
import pytest

from vampire_jax._src.metrics import quantile_map as qm


def test_the_map_is_the_empirical_cdf_at_its_knots_and_its_slope_a_density():
  pit = np.random.default_rng(0).beta(0.4, 0.4, 1000)  # an overconfident predictive's PIT values
  fitted = qm.fit(pit, qm.num_bins(pit.size))
  assert fitted.num_bins == 20 and fitted.pit[0] == 0.0 and fitted.pit[-1] == 1.0
  for u, level in zip(fitted.pit[1:-1], fitted.level[1:-1]):
    assert np.mean(pit <= u) == pytest.approx(level, abs=1.5e-3)  # the empirical CDF there
  u = np.linspace(0.0, 1.0, 200_001)
  assert np.all(np.diff(fitted(u)) >= 0)
  # R' integrates to R(1) - R(0) = 1, and R^-1 undoes R.
  assert np.trapezoid(np.exp(fitted.log_slope(u)), u) == pytest.approx(1.0, abs=1e-3)
  np.testing.assert_allclose(fitted.inverse(fitted(u)), u, atol=1e-12)
  # Ties (targets far outside the predictive, PIT values that round to 1) stay apart.
  tied = qm.fit(np.r_[np.full(900, 1.0), np.linspace(0, 1, 100)], 20)
  assert np.all(np.diff(tied.pit) > 0) and np.all(np.isfinite(tied.log_slope(u)))
  assert qm.from_record(json.loads(json.dumps(qm.to_record(fitted)))) == fitted
  with pytest.raises(ValueError, match="increase strictly"):
    qm.from_record({"pit": [0.0, 0.7, 0.5, 1.0], "level": [0.0, 0.3, 0.6, 1.0]})
