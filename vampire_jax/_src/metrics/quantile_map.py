"""Quantile recalibration (Kuleshov et al. 2018): one monotone map R of a predictive's CDF.

A regressor's predictive F is calibrated when the PIT values u = F(y) of new targets are
uniform on [0, 1]: then a fraction p of them lies below its p-quantile, and its central
90 % interval holds 90 % of them. Kuleshov et al. fit R by isotonic regression of the
empirical CDF of held-out PIT values on those values; the recalibrated predictive is
F_R(y) = R(F(y)). That regression's fit is the empirical CDF itself (it is already
non-decreasing), a step function, which has no density and so no NLL. Here R is the
piecewise-linear interpolation of that empirical CDF at K + 1 knots,

    (0, 0), (u_(1/K), 1/K), (u_(2/K), 2/K), ..., (u_((K-1)/K), (K-1)/K), (1, 1),

u_(p) the p-quantile of the held-out PIT values: monotone (isotonic) and continuous, equal
to the empirical CDF at every knot, and its slope is constant on each of the K bins,

    R'(u) = (1/K) / (u_(j+1) - u_j)    for u_j < u < u_(j+1),

the equal-mass histogram density of the PIT values (each bin holds 1/K of them). So the
recalibrated predictive has

    CDF       F_R(y)      = R(F(y))
    density   f_R(y)      = R'(F(y)) f(y)              (the chain rule)
    NLL       -log f_R(y) = -log f(y) - log R'(F(y))
    quantile  F_R^-1(p)   = F^-1(R^-1(p))              (R^-1: the knots swapped)

and its central 90 % interval is [F^-1(R^-1(0.05)), F^-1(R^-1(0.95))]. K is `num_bins`:
as many as leave at least `MIN_PER_BIN` PIT values in each bin, at most `MAX_BINS`
(measured on the zoo's regression cells: docs/zoo.md and docs/fidelity.md).

`QuantileMap` holds the knots as tuples of floats, so it is hashable and static under
`jax.jit`; its methods take numpy or JAX arrays (`xp`, numpy by default).
"""

import math
from typing import NamedTuple

import numpy as np

MAX_BINS = 20  # 0.05, 0.95 (the 90 % interval's ends) are knots when K = 20
MIN_PER_BIN = 50  # PIT values per bin: the slope of a bin of n is known to ~1/sqrt(n)
# The knots' PIT values are kept this far apart, so that no bin's slope is infinite.
MIN_GAP = 1e-9


class QuantileMap(NamedTuple):
  """A piecewise-linear monotone map R of [0, 1] onto itself, through its knots.

  Attributes:
    pit: `(0, u_1, ..., u_(K-1), 1)`, increasing: the PIT values of the knots.
    level: `(0, 1/K, ..., 1)`, increasing: R at each of them.
  """

  pit: tuple
  level: tuple

  @property
  def num_bins(self) -> int:
    return len(self.pit) - 1

  def __call__(self, u, xp=np):
    """R(u), for PIT values u in [0, 1]."""
    return xp.interp(u, xp.asarray(self.pit), xp.asarray(self.level))

  def inverse(self, p, xp=np):
    """R^-1(p): the PIT value that R maps to p (the knots swapped)."""
    return xp.interp(p, xp.asarray(self.level), xp.asarray(self.pit))

  def log_slope(self, u, xp=np):
    """log R'(u): the log of the bin's slope, (level_(j+1) - level_j) / (pit_(j+1) - pit_j)."""
    pit, level = np.asarray(self.pit, np.float64), np.asarray(self.level, np.float64)
    log_slopes = xp.asarray(np.log(np.diff(level)) - np.log(np.diff(pit)))
    bins = xp.searchsorted(xp.asarray(pit[1:-1]), u, side="right")  # 0 .. K-1
    return log_slopes[bins]


def num_bins(num_values: int) -> int:
  """K for `num_values` held-out PIT values: `MIN_PER_BIN` or more in each bin, at most
  `MAX_BINS` (0 or 1: too few to fit a map)."""
  return min(MAX_BINS, num_values // MIN_PER_BIN)


def fit(pit: np.ndarray, bins: int) -> QuantileMap:
  """The map through the empirical `j / bins` quantiles of the held-out PIT values `pit`.

  Args:
    pit: `[N]` PIT values F(y) of held-out targets, in [0, 1].
    bins: K >= 1 (`num_bins`).
  """
  pit = np.sort(np.clip(np.asarray(pit, np.float64).reshape(-1), 0.0, 1.0))
  levels = np.arange(bins + 1) / bins
  knots = np.quantile(pit, levels[1:-1])
  # Strictly increasing, inside (0, 1): ties (targets far outside the predictive, whose PIT
  # values round to 0 or 1) are pulled apart by MIN_GAP.
  for j in range(len(knots)):
    knots[j] = max(knots[j], (j + 1) * MIN_GAP if j == 0 else knots[j - 1] + MIN_GAP)
  for j in reversed(range(len(knots))):
    upper = 1.0 - MIN_GAP if j == len(knots) - 1 else knots[j + 1] - MIN_GAP
    knots[j] = min(knots[j], upper)
  pits = (0.0, *map(float, knots), 1.0)
  return QuantileMap(pits, tuple(float(level) for level in levels))


def from_record(record) -> QuantileMap:
  """The map of `to_record`'s `{"pit": [...], "level": [...]}`; ValueError if it is not one."""
  pit = tuple(float(u) for u in record["pit"])
  level = tuple(float(p) for p in record["level"])
  ok = len(pit) == len(level) >= 2 and all(map(math.isfinite, pit + level))
  ok = ok and pit[0] == level[0] == 0.0 and pit[-1] == level[-1] == 1.0
  ok = (
    ok and all(b > a for a, b in zip(pit, pit[1:])) and all(b > a for a, b in zip(level, level[1:]))
  )
  if not ok:
    raise ValueError("a quantile map's knots must increase strictly from (0, 0) to (1, 1)")
  return QuantileMap(pit, level)


def to_record(quantile_map: QuantileMap) -> dict:
  return {"pit": list(quantile_map.pit), "level": list(quantile_map.level)}
