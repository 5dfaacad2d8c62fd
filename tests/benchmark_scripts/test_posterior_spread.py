"""benchmarks.posterior_spread: the prior's log-std and the posterior's move, by hand."""

import math

import numpy as np
import pytest

import vampire_jax as vj
from benchmarks import posterior_spread


def test_spread_summary_measures_the_posteriors_move_in_units_of_the_prior():
  prior = vj.Gaussian(
    {"w": np.zeros((2, 2)), "b": np.ones(2)},
    {"w": np.full((2, 2), -3.0), "b": np.full(2, -1.0)},
  )
  # Two tasks: the first widens every std by 10 % and moves no mean; the second keeps the
  # stds and moves each mean by two of the prior's stds.
  log_std = {k: np.stack([v + math.log(1.1), v]) for k, v in prior.log_std.items()}
  step = {k: 2 * np.exp(v) for k, v in prior.log_std.items()}
  mean = {k: np.stack([prior.mean[k], prior.mean[k] + step[k]]) for k in prior.mean}
  summary = posterior_spread.spread_summary(prior, vj.Gaussian(mean, log_std), 2)
  assert summary["prior_log_std_mean"] == pytest.approx((4 * -3.0 + 2 * -1.0) / 6)
  assert summary["prior_log_std_p10_p50_p90"][1] == pytest.approx(-3.0)
  assert summary["posterior_std_relative_change_mean"] == pytest.approx(0.05)
  assert summary["posterior_std_relative_change_max"] == pytest.approx(0.1)
  # the median of six zeros and six twos
  assert summary["posterior_mean_shift_in_prior_stds_median"] == pytest.approx(1.0)


def test_predictive_summary_sets_the_draws_spread_beside_the_mean_error():
  # [tasks 1, draws 2, query 2, 1]: draws ±1 about means 0 and 2; targets 3 and 2.
  predictions = np.array([[[-1.0, 1.0], [1.0, 3.0]]])[..., None]
  targets = np.array([[3.0, 2.0]])[..., None]
  summary = posterior_spread.predictive_summary(
    {"predictions": predictions, "targets": targets}, 0.3
  )
  assert summary["epistemic_std"] == pytest.approx(1.0)
  assert summary["rmse_predictive_mean"] == pytest.approx(math.sqrt((9 + 0) / 2))
  assert summary["draws"] == 2 and summary["noise_std"] == 0.3
