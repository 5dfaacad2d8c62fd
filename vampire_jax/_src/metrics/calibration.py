"""Calibration metrics, computed on the host from arrays pulled off the device.

Classification: reliability bins, expected and maximum calibration error
(ECE, MCE; Guo et al. 2017), as in the paper's Fig. 3 and Table 4; and
selective prediction, the risk-coverage curve (Geifman & El-Yaniv 2017):
how accurate the predictions are that a confidence threshold keeps.
Regression's quantile and PIT calibration are in `quantile_calibration`
(re-exported here). Also the mean +- 95% confidence interval that few-shot
papers report, and each result as a JSON record and back.

Everything here is numpy; pass `np.asarray(jax_array)` or the jax array itself.
"""

import math
import statistics
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from vampire_jax._src import deprecations
from vampire_jax._src.metrics.quantile_calibration import (
  QuantileCalibration as QuantileCalibration,
)
from vampire_jax._src.metrics.quantile_calibration import (
  mixture_cdf as mixture_cdf,
)
from vampire_jax._src.metrics.quantile_calibration import (
  mixture_quantile as mixture_quantile,
)
from vampire_jax._src.metrics.quantile_calibration import (
  paper_quantile_calibration as paper_quantile_calibration,
)
from vampire_jax._src.metrics.quantile_calibration import (
  regression_quantile_calibration as regression_quantile_calibration,
)

# -- Classification ------------------------------------------------------------


# A bin holding fewer predictions than this has an accuracy too noisy to read
# (its standard error can reach 0.5 / sqrt(30) = 0.09): the reliability diagram
# greys it out and `ReliabilityBins.mce_min_count` leaves it out.
MIN_BIN_COUNT = 30


class ReliabilityBins(NamedTuple):
  """Confidence histogram of a classifier and its calibration errors.

  `mce` is the paper's (Guo et al.'s) MCE, over every non-empty bin, and
  stays the headline number. A bin of a handful of predictions can set it
  alone; `mce_bin` says which bin does, and `mce_min_count`, an extra, is
  the MCE over the bins holding at least `min_count` predictions.
  """

  edges: np.ndarray  # [num_bins + 1], equal-width on [0, 1]
  confidence: np.ndarray  # [num_bins], mean max-probability per bin; NaN if empty
  accuracy: np.ndarray  # [num_bins], fraction correct per bin; NaN if empty
  count: np.ndarray  # [num_bins] int, predictions per bin
  ece: float  # sum_b (n_b / N) |accuracy_b - confidence_b|
  mce: float  # max over non-empty b of |accuracy_b - confidence_b|
  min_count: int = MIN_BIN_COUNT  # bins below it: greyed out, left out of mce_min_count

  @property
  def gap(self) -> np.ndarray:
    """`[num_bins]`, `|accuracy_b - confidence_b|`; NaN for an empty bin."""
    return np.abs(
      np.asarray(self.accuracy, dtype=np.float64) - np.asarray(self.confidence, dtype=np.float64)
    )

  @property
  def mce_bin(self) -> int:
    """Index of the bin that sets `mce` (the first, on a tie)."""
    return int(np.nanargmax(self.gap))

  @property
  def mce_min_count(self) -> float:
    """`max |accuracy_b - confidence_b|` over bins with count_b >= min_count; NaN if none.

    An extra beside the paper's `mce`, not a replacement for it.
    """
    enough = np.asarray(self.count) >= self.min_count
    return float(np.max(self.gap[enough])) if np.any(enough) else math.nan


def _checked_predictions(probabilities: np.ndarray, labels: np.ndarray):
  """`(probabilities [N, C], labels [N])`, flattened, or ValueError naming what is wrong.

  Shared by every metric of class probabilities, so that none scores labels outside the
  classes or logits passed for probabilities.
  """
  if probabilities.ndim < 2:
    raise ValueError(
      f"probabilities must be [N, C] or [tasks, query, C], got shape {probabilities.shape}"
    )
  if labels.shape != probabilities.shape[:-1]:
    raise ValueError(
      f"labels must have shape {probabilities.shape[:-1]} to match probabilities "
      f"{probabilities.shape}, got {labels.shape}"
    )
  num_classes = probabilities.shape[-1]
  probabilities = probabilities.reshape(-1, num_classes)
  labels = labels.reshape(-1)
  if probabilities.shape[0] == 0 or num_classes == 0:
    raise ValueError(f"need at least one prediction and one class, got shape {probabilities.shape}")
  if not np.issubdtype(labels.dtype, np.integer):
    if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
      raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
  if labels.min() < 0 or labels.max() >= num_classes:
    raise ValueError(
      f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]"
    )
  # A small slack for float32 softmax; logits passed by mistake fail here.
  if (
    not np.all(np.isfinite(probabilities))
    or probabilities.min() < -1e-6
    or probabilities.max() > 1 + 1e-6
  ):
    raise ValueError("probabilities must lie in [0, 1] (pass softmax outputs, not logits)")

  return probabilities, labels


def classification_calibration(
  probabilities: ArrayLike, labels: ArrayLike, num_bins: int = 15, min_count: int = MIN_BIN_COUNT
) -> ReliabilityBins:
  """Reliability bins, ECE and MCE of predicted class probabilities.

  Confidence is the largest predicted probability, a prediction is correct
  when its argmax equals the label. Bins are equal-width on [0, 1], each
  half-open `(lo, hi]`, except the first which also holds 0 (so a confidence
  of exactly 1.0 lands in the last bin). All predictions are pooled, so with
  a leading task axis the tasks are weighted by their number of queries.

  Args:
    probabilities: `[N, C]` or `[tasks, query, C]` (any leading axes), e.g.
      `ClassificationEval.probabilities`, the softmax averaged over draws.
    labels: integer labels, the leading shape of `probabilities`: `[N]` or
      `[tasks, query]`.
    num_bins: number of equal-width bins (Guo et al. and the paper use 15).
    min_count: bins holding fewer predictions are greyed out in the
      reliability diagram and left out of `mce_min_count` (not of `mce`).

  Returns:
    A `ReliabilityBins`.

  Raises:
    ValueError: on mismatched shapes, non-integer or out-of-range labels,
      probabilities outside [0, 1], no predictions, `num_bins < 1` or
      `min_count < 1`.
  """
  probabilities = np.asarray(probabilities, dtype=np.float64)
  labels = np.asarray(labels)
  if int(num_bins) != num_bins or num_bins < 1:
    raise ValueError(f"num_bins must be a positive integer, got {num_bins}")
  num_bins = int(num_bins)
  if int(min_count) != min_count or min_count < 1:
    raise ValueError(f"min_count must be a positive integer, got {min_count}")
  probabilities, labels = _checked_predictions(probabilities, labels)

  confidence = np.clip(probabilities.max(axis=-1), 0.0, 1.0)  # [N]
  correct = (probabilities.argmax(axis=-1) == labels).astype(np.float64)  # [N]
  edges = np.linspace(0.0, 1.0, num_bins + 1)
  # searchsorted 'left' gives i with edges[i-1] < c <= edges[i]: bin (lo, hi].
  bin_index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, num_bins - 1)

  count = np.bincount(bin_index, minlength=num_bins)
  nonempty = count > 0
  with np.errstate(invalid="ignore", divide="ignore"):
    mean_confidence = np.bincount(bin_index, weights=confidence, minlength=num_bins) / count
    accuracy = np.bincount(bin_index, weights=correct, minlength=num_bins) / count
  mean_confidence[~nonempty] = np.nan
  accuracy[~nonempty] = np.nan

  gap = np.abs(accuracy[nonempty] - mean_confidence[nonempty])
  ece = float(np.sum(count[nonempty] / confidence.size * gap))
  mce = float(np.max(gap))
  return ReliabilityBins(edges, mean_confidence, accuracy, count, ece, mce, int(min_count))


class RiskCoverage(NamedTuple):
  """Selective prediction: accuracy of the most confident predictions.

  Predictions are sorted by confidence, most confident first; keeping the
  first k of N covers k / N of them. The risk is the error rate of those
  kept; a random ordering keeps the overall `error_rate` at every coverage,
  and `oracle_risk` is the best any ordering can do.
  """

  coverage: np.ndarray  # [N], k / N for k = 1..N
  accuracy: np.ndarray  # [N], accuracy of the k most confident predictions
  aurc: float  # area under the risk (1 - accuracy) vs coverage curve, mean over k

  @property
  def risk(self) -> np.ndarray:
    """`[N]` the error rate of the k most confident predictions: 1 - accuracy."""
    return 1.0 - np.asarray(self.accuracy, dtype=np.float64)

  @property
  def error_rate(self) -> float:
    """Error rate of all predictions, at coverage 1; a random ordering's risk at any coverage."""
    return float(self.risk[-1])

  @property
  def oracle_risk(self) -> np.ndarray:
    """`[N]` the risk of the best possible ordering (every error last), at `coverage`.

    With error rate e, the first (1 - e) of the predictions are all correct;
    past that, keeping a fraction c leaves c - (1 - e) errors among c:
    risk(c) = max(0, 1 - (1 - e) / c).
    """
    return oracle_risk(self.coverage, self.error_rate)

  @property
  def oracle_aurc(self) -> float:
    """The area under `oracle_risk`, the lowest AURC this error rate allows.

    The integral of max(0, 1 - (1 - e) / c) over c in [0, 1]:
    e + (1 - e) log(1 - e) (Geifman et al. 2019), the limit of the
    mean over k for many predictions.
    """
    e = self.error_rate
    return e if e >= 1.0 else e + (1.0 - e) * math.log1p(-e)

  def accuracy_at(self, coverage: float) -> float:
    """Accuracy of the ceil(coverage * N) most confident predictions."""
    if not 0.0 < coverage <= 1.0:
      raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    kept = max(1, math.ceil(coverage * len(self.coverage) - 1e-9))
    return float(self.accuracy[kept - 1])


def oracle_risk(coverage: ArrayLike, error_rate: float) -> np.ndarray:
  """max(0, 1 - (1 - e) / c): the lowest risk at coverage c of any ordering with error rate e."""
  coverage = np.asarray(coverage, dtype=np.float64)
  if np.any(~(coverage > 0.0)) or np.any(coverage > 1.0):
    raise ValueError(f"coverage must lie in (0, 1], got range [{coverage.min()}, {coverage.max()}]")
  return np.maximum(0.0, 1.0 - (1.0 - float(error_rate)) / coverage)


def risk_coverage(probabilities: ArrayLike, labels: ArrayLike) -> RiskCoverage:
  """The risk-coverage curve of predicted class probabilities, pooled over tasks.

  Confidence is the largest probability; ties keep their input order.
  AURC = (1/N) sum_k (1 - accuracy of the k most confident): 0 for a
  perfect classifier whose confidence ranks every error last.

  Args:
    probabilities: `[N, C]` or `[tasks, query, C]`.
    labels: `[N]` or `[tasks, query]` integers.

  Returns:
    A `RiskCoverage`.

  Raises:
    ValueError: as `classification_calibration`: mismatched shapes, labels outside
      the classes, probabilities outside [0, 1] (logits).
  """
  probabilities, labels = _checked_predictions(
    np.asarray(probabilities, dtype=np.float64), np.asarray(labels)
  )
  correct = probabilities.argmax(axis=-1) == labels
  order = np.argsort(-probabilities.max(axis=-1), kind="stable")
  kept = np.arange(1, correct.size + 1)
  accuracy = np.cumsum(correct[order]) / kept
  return RiskCoverage(kept / correct.size, accuracy, float(np.mean(1.0 - accuracy)))


def mean_confidence_interval(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
  """Mean and half-width of a normal-approximation confidence interval.

  half_width = z * std(values) / sqrt(n), z = Phi^{-1}((1 + confidence) / 2)
  (1.959964 for 95%). As in the few-shot literature (MAML's and VAMPIRE's
  code report `1.96 * np.std(acc) / np.sqrt(n)`), `std` is the population
  standard deviation (ddof=0), not the unbiased sample one (ddof=1).

  Args:
    values: per-task scores, any shape (flattened), e.g. `ClassificationEval.accuracy`.
    confidence: coverage of the interval, in (0, 1).

  Returns:
    `(mean, half_width)` as floats; report `mean +- half_width`. With one value
    the half-width is NaN: one task gives no interval (never +- 0).

  Raises:
    ValueError: if `values` is empty or `confidence` is not in (0, 1).
  """
  values = np.asarray(values, dtype=np.float64).reshape(-1)
  if values.size == 0:
    raise ValueError("values must not be empty")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  if values.size < 2:  # one score says nothing of its spread: no interval, not +- 0
    return float(np.mean(values)), math.nan
  z = statistics.NormalDist().inv_cdf(0.5 * (1.0 + confidence))
  half_width = z * np.std(values) / math.sqrt(values.size)
  return float(np.mean(values)), float(half_width)


# -- Records: results as JSON, and back ----------------------------------------

_RECORD_KINDS = {
  "ReliabilityBins": ReliabilityBins,
  "QuantileCalibration": QuantileCalibration,
  "RiskCoverage": RiskCoverage,
}
_RECORD_POINTS = 101  # a risk-coverage curve is kept at this many coverages


def to_record(result) -> dict:
  """A calibration result as JSON-ready lists; `from_record` turns it back.

  Figures that compare several runs are drawn from their results.json. A
  risk-coverage curve is kept at 101 evenly spaced coverages.
  """
  if isinstance(result, RiskCoverage) and len(result.coverage) > _RECORD_POINTS:
    picks = np.unique(
      np.ceil(np.linspace(0.01, 1.0, _RECORD_POINTS) * len(result.coverage) - 1e-9).astype(int) - 1
    )
    result = RiskCoverage(result.coverage[picks], result.accuracy[picks], result.aurc)
  fields = {
    k: (
      np.asarray(v).tolist()
      if np.ndim(v)
      else int(v)
      if isinstance(v, (int, np.integer))
      else float(v)
    )
    for k, v in result._asdict().items()
  }
  return {"kind": type(result).__name__, **fields}


def from_record(record: dict):
  """The `ReliabilityBins`, `QuantileCalibration` or `RiskCoverage` of `to_record`.

  A field with a default that an older record lacks (`min_count`) takes the default.
  """
  kind = _RECORD_KINDS[record["kind"]]
  return kind(
    **{
      f: (np.asarray(record[f], dtype=float) if isinstance(record[f], list) else record[f])
      for f in kind._fields
      if f in record
    }
  )


# Names an earlier version kept here (`deprecations.MOVED_OUT_OF_MODULES`): warn, then work.
__getattr__ = deprecations.module_getattr(__name__)
