"""Regression calibration, computed on the host (numpy).

The paper's quantile calibration (Sec. 4.1, after Song et al. 2019, as the
authors' code computes it: quantiles of the L_v network outputs scored
against the noiseless truth under the known noise), and, as an extra, the
PIT calibration (Kuleshov et al. 2018) of the Monte-Carlo predictive, the
equal-weight mixture of N(mean_l, noise_std^2) over weight draws l.
"""

import math
import statistics
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from vampire_jax._src.metrics.normal_cdf import normal_cdf

# -- Regression ----------------------------------------------------------------


class QuantileCalibration(NamedTuple):
  """Observed coverage of the predicted quantiles of a regressor."""

  levels: np.ndarray  # [num_levels], expected quantile levels p
  observed: np.ndarray  # [num_levels], fraction of targets <= predicted p-quantile
  ece: float  # mean_p |observed_p - p|
  mce: float  # max_p |observed_p - p|


def _check_noise_std(noise_std) -> float:
  noise_std = float(noise_std)
  if not noise_std > 0.0 or not math.isfinite(noise_std):
    raise ValueError(f"noise_std must be a finite number > 0, got {noise_std}")
  return noise_std


def mixture_cdf(y: ArrayLike, means: ArrayLike, noise_std: float) -> np.ndarray:
  """CDF of the equal-weight Gaussian mixture predictive.

  F(y) = (1 / L) sum_l Phi((y - mean_l) / noise_std).

  Args:
    y: points, `[...]`, broadcastable against `means.shape[1:]`.
    means: `[num_samples, ...]`, one mixture component mean per draw.
    noise_std: the likelihood's standard deviation, shared by all components.

  Returns:
    F(y), shape `broadcast(y, means[0]).shape`.
  """
  means = np.asarray(means, dtype=np.float64)
  noise_std = _check_noise_std(noise_std)
  if means.ndim < 1 or means.shape[0] == 0:
    raise ValueError(f"means must be [num_samples, ...] with num_samples >= 1, got {means.shape}")
  y = np.asarray(y, dtype=np.float64)
  return np.mean(normal_cdf((y[None] - means) / noise_std), axis=0)


def mixture_quantile(
  levels: ArrayLike, means: ArrayLike, noise_std: float, tol: float = 1e-6
) -> np.ndarray:
  """Quantiles of the equal-weight Gaussian mixture, by vectorised bisection.

  Solves F(q) = p for each level p and each point. The root lies between the
  smallest and the largest component p-quantile, mean_l + noise_std * z_p
  (each component CDF is <= p at the left end, >= p at the right end), so
  bisection on that bracket halves the error each step; a single component
  (MAML) gives the exact Gaussian quantile without iterating.

  Args:
    levels: a scalar p or `[num_levels]`, each in (0, 1).
    means: `[num_samples, ...]`, component means per point.
    noise_std: the likelihood's standard deviation.
    tol: absolute tolerance on the quantile.

  Returns:
    `levels.shape + means.shape[1:]` quantiles.
  """
  means = np.asarray(means, dtype=np.float64)
  noise_std = _check_noise_std(noise_std)
  levels = np.asarray(levels, dtype=np.float64)
  if means.ndim < 1 or means.shape[0] == 0:
    raise ValueError(f"means must be [num_samples, ...] with num_samples >= 1, got {means.shape}")
  if levels.ndim > 1 or np.any(~(levels > 0.0)) or np.any(~(levels < 1.0)):
    raise ValueError(f"levels must be a scalar or 1-D, each in (0, 1), got {levels}")
  if not tol > 0:
    raise ValueError(f"tol must be > 0, got {tol}")
  lowest, highest = means.min(axis=0), means.max(axis=0)
  width = float(np.max(highest - lowest)) if lowest.size else 0.0
  # Bisection halves the bracket; stop once half of it is below tol.
  num_steps = max(0, math.ceil(math.log2(width / tol))) if width > tol else 0

  quantiles = []
  for p in levels.reshape(-1):  # a few levels; each step is vectorised over points
    z = statistics.NormalDist().inv_cdf(float(p))
    lo, hi = lowest + noise_std * z, highest + noise_std * z
    for _ in range(num_steps):
      mid = 0.5 * (lo + hi)
      below = mixture_cdf(mid, means, noise_std) < p
      lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    quantiles.append(0.5 * (lo + hi))
  return np.stack(quantiles).reshape(levels.shape + means.shape[1:])


def _pool_regression(predicted_means, targets):
  """[S, N] & [N], [T, S, Q] & [T, Q] or [T, S, Q, 1] & [T, Q, 1] -> [S, M] & [M]."""
  predicted_means = np.asarray(predicted_means, dtype=np.float64)
  targets = np.asarray(targets, dtype=np.float64)
  if (
    predicted_means.ndim == 4
    and predicted_means.shape[-1] == 1
    and targets.ndim == 3
    and targets.shape[-1] == 1
  ):
    predicted_means, targets = predicted_means[..., 0], targets[..., 0]
  if predicted_means.ndim == 2 and targets.ndim == 1:
    expected = (targets.shape[0],)
    got = predicted_means.shape[1:]
  elif predicted_means.ndim == 3 and targets.ndim == 2:
    expected = targets.shape
    got = (predicted_means.shape[0], predicted_means.shape[2])
  else:
    raise ValueError(
      "predicted_means/targets must be [num_samples, N]/[N], "
      "[tasks, num_samples, query]/[tasks, query] or "
      "[tasks, num_samples, query, 1]/[tasks, query, 1]; got shapes "
      f"{predicted_means.shape} and {targets.shape}"
    )
  if got != expected:
    raise ValueError(
      f"predicted_means {predicted_means.shape} does not match targets {targets.shape}"
    )
  if predicted_means.ndim == 3:
    # [T, S, Q] -> [S, T * Q]: pool the tasks' query points.
    predicted_means = np.moveaxis(predicted_means, 1, 0).reshape(predicted_means.shape[1], -1)
    targets = targets.reshape(-1)
  if predicted_means.size == 0:
    raise ValueError(f"need at least one point and one sample, got shape {predicted_means.shape}")
  return predicted_means, targets


def regression_quantile_calibration(
  predicted_means: ArrayLike,
  targets: ArrayLike,
  noise_std: float,
  levels: ArrayLike = np.linspace(0.1, 0.9, 9),
) -> QuantileCalibration:
  """Quantile calibration of the Monte-Carlo Gaussian-mixture predictive.

  For each point the predictive is p(y) = (1 / L) sum_l N(y; mean_l, noise_std^2)
  with CDF F. For each level p, observed_p is the fraction of targets at or
  below the predicted p-quantile q_p = F^{-1}(p); a calibrated regressor has
  observed_p = p (the diagonal of the paper's Fig. 2). All points of all
  tasks are pooled.

  F is continuous and strictly increasing, so y <= q_p exactly when
  F(y) <= p (Kuleshov et al. 2018 define it this way). That is what is
  computed: one CDF evaluation per point serves every level, where bisecting
  for each q_p (`mixture_quantile`) costs ~20 per point and level; the two
  differ only for targets within the bisection tolerance of a quantile.

  Args:
    predicted_means: network outputs per weight draw, `[num_samples, N]`
      (num_samples = 1 for MAML), or with a leading task axis
      `[tasks, num_samples, query]`, or `RegressionEval.predictions`,
      `[tasks, num_samples, query, 1]`.
    targets: `[N]`, `[tasks, query]` or `[tasks, query, 1]` to match.
    noise_std: the likelihood's standard deviation (0.3 in the paper).
    levels: `[num_levels]` quantile levels in (0, 1).

  Returns:
    A `QuantileCalibration` with ECE = `mean_p |observed_p - p|` and
    MCE = `max_p |observed_p - p|`.

  Raises:
    ValueError: on shapes other than the above, `noise_std <= 0`, or levels
      outside (0, 1).
  """
  predicted_means, targets = _pool_regression(predicted_means, targets)
  levels = np.array(levels, dtype=np.float64)  # a copy: the default is shared
  if levels.ndim != 1 or levels.size == 0 or np.any(~(levels > 0.0)) or np.any(~(levels < 1.0)):
    raise ValueError(f"levels must be a non-empty 1-D array of values in (0, 1), got {levels}")
  pit = mixture_cdf(targets, predicted_means, noise_std)  # [M], F(y) per point
  observed = np.mean(pit[None, :] <= levels[:, None], axis=1)  # [P]
  gap = np.abs(observed - levels)
  return QuantileCalibration(levels, observed, float(np.mean(gap)), float(np.max(gap)))


PAPER_QUANTILE_LEVELS = np.linspace(0.0, 1.0, 11)


def paper_quantile_calibration(
  predictions: ArrayLike,
  truth: ArrayLike,
  noise_std: float,
  levels: ArrayLike = PAPER_QUANTILE_LEVELS,
) -> QuantileCalibration:
  """The paper's regression calibration (Fig. 2c-d), as the authors' code computes it.

  For each level p and point x, q_p(x) is the p-quantile of the L network
  outputs f_1(x) .. f_L(x) themselves (`np.quantile`, linear interpolation;
  no observation noise). Under the true data distribution N(y0(x),
  noise_std^2), a fraction Phi((q_p(x) - y0(x)) / noise_std) of the
  observations falls below it; `observed_p` is that fraction averaged over
  all points. ECE = `mean_p |observed_p - p|`, MCE = `max_p`, over the 11
  levels 0, 0.1, .., 1.

  A point estimate (one output, MAML) has the same quantile at every level,
  so its observed fraction is one number at every level; the paper draws it
  as the single point (0.5, observed) joined to (0, 0) and (1, 1).

  Args:
    predictions: `[num_samples, N]` or `[tasks, num_samples, points]` outputs.
    truth: `[N]` or `[tasks, points]` noiseless targets y0 (no noise added).
    noise_std: the data's noise standard deviation (0.3 in the paper).
    levels: the quantile levels, each in [0, 1].

  Returns:
    A `QuantileCalibration` over `levels`.
  """
  predictions, truth = _pool_regression(predictions, truth)
  noise_std = _check_noise_std(noise_std)
  levels = np.array(levels, dtype=np.float64)
  if levels.ndim != 1 or levels.size == 0 or levels.min() < 0.0 or levels.max() > 1.0:
    raise ValueError(f"levels must be a non-empty 1-D array of values in [0, 1], got {levels}")
  quantiles = np.quantile(predictions, levels, axis=0)  # [levels, N]
  observed = np.mean(normal_cdf((quantiles - truth[None]) / noise_std), axis=1)
  gap = np.abs(observed - levels)
  return QuantileCalibration(levels, observed, float(np.mean(gap)), float(np.max(gap)))


def pit_calibration(
  pit: ArrayLike, levels: ArrayLike = np.linspace(0.1, 0.9, 9)
) -> QuantileCalibration:
  """`regression_quantile_calibration` of PIT values given (e.g. R(F(y)) under a quantile map).

  observed_p is the fraction of PIT values at or below p; ECE and MCE as there.
  """
  pit = np.asarray(pit, np.float64).reshape(-1)
  levels = np.array(levels, dtype=np.float64)
  observed = np.mean(pit[None, :] <= levels[:, None], axis=1)
  gap = np.abs(observed - levels)
  return QuantileCalibration(levels, observed, float(np.mean(gap)), float(np.max(gap)))


def predictive_quantile_calibration(
  predictions: ArrayLike,
  truth: ArrayLike,
  noise_std: float,
  data_noise_std: float,
  inverse_map=None,
  levels: ArrayLike = PAPER_QUANTILE_LEVELS,
) -> QuantileCalibration:
  """The paper's quantile calibration of a whole predictive's quantiles, noise included.

  As `paper_quantile_calibration`, observed_p = mean_x Phi((q_p(x) - y0(x)) / sigma_data),
  but q_p(x) is the p-quantile of the predictive mixture mean_l N(f_l(x), noise_std^2)
  itself (under a quantile map R, given as `inverse_map` = R^-1, the quantile
  F^-1(R^-1(p)) of the recalibrated CDF R(F)), not that of the network's outputs alone.
  A recalibrated predictive is scored this way: its quantiles are no longer its draws'.
  The levels 0 and 1 have the quantiles -inf and +inf, observed 0 and 1 exactly.

  Args:
    predictions: `[tasks, draws, points]` component means (or `[draws, N]`).
    truth: `[tasks, points]` (or `[N]`) noiseless targets y0.
    noise_std: the predictive's noise (the components' standard deviation).
    data_noise_std: the data's noise sigma, as the paper's metric assumes it.
    inverse_map: None, or R^-1 (`QuantileMap.inverse`).
    levels: the quantile levels, each in [0, 1].
  """
  predictions, truth = _pool_regression(predictions, truth)
  data_noise_std = _check_noise_std(data_noise_std)
  levels = np.array(levels, dtype=np.float64)
  inner = (levels > 0.0) & (levels < 1.0)
  observed = np.where(levels >= 1.0, 1.0, 0.0)
  if inner.any():
    mapped = levels[inner] if inverse_map is None else np.asarray(inverse_map(levels[inner]))
    quantiles = mixture_quantile(np.clip(mapped, 1e-12, 1 - 1e-12), predictions, noise_std, 1e-4)
    observed[inner] = np.mean(normal_cdf((quantiles - truth[None]) / data_noise_std), axis=1)
  gap = np.abs(observed - levels)
  return QuantileCalibration(levels, observed, float(np.mean(gap)), float(np.max(gap)))
