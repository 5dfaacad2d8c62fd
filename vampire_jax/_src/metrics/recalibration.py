"""Post-hoc recalibration: one monotone map of a predictive, fitted by NLL on held-out tasks.

A meta-learner's predictive can be over- or under-confident on new tasks. The standard
remedy fits one parameter on tasks it never trained on (the validation split) and applies
it to every later prediction:

- classification, temperature scaling (Guo et al. 2017) of the predictive: the mean over
  weight draws of their softmax, p(x) = mean_l softmax(f_l(x)), becomes
  p_T(x) = softmax(log p(x) / T). It keeps each query's arg max (accuracy is unchanged);
  T > 1 softens an overconfident predictive, T = 1 leaves it as it was.
- regression, a variance scale s of the predictive mixture
  p(y | x) = mean_l N(y; f_l(x), sigma^2): its spread about its mean m(x) = mean_l f_l(x)
  is stretched by sqrt(s), noise included:
      p_s(y | x) = mean_l N(y; m(x) + sqrt(s) (f_l(x) - m(x)), s sigma^2),
  so its mean stays m(x) and its variance becomes s (Var_l f_l(x) + sigma^2). A point
  estimate (MAML: one draw, a predictive of the noise alone) is rescaled too.
- regression, quantile recalibration (Kuleshov et al. 2018): the variance scale s first,
  then a piecewise-linear monotone map R of the scaled predictive's CDF F_s, fitted on the
  same tasks' PIT values F_s(y) (`quantile_map` has the maths): the recalibrated CDF is
  R(F_s(y)), its density R'(F_s(y)) f_s(y), its p-quantile F_s^-1(R^-1(p)). The scale
  sets the tails' width, where held-out targets are too few to fit R; R corrects the
  shape (R alone, on the raw F, left the NLL of the zoo's cells 1.6 to 3.9 nats worse:
  docs/zoo.md and docs/fidelity.md). The regressor's default where the tasks hold at
  least `quantile_map.MIN_PER_BIN` * 2 query targets, else the variance scale alone.

Both act on the network's outputs under each weight draw, so the predictive, its samples
and every score of it follow from the outputs as for a run that was never recalibrated
(`calibrate_outputs`): a regressor's draws become m + sqrt(s) (f_l - m) and its noise
sqrt(s) sigma (a quantile map applies R on top of them, in the predictive's CDF and
density: `quantile_map`); a classifier's draws become distributions whose mean is p_T (see
`calibrate_outputs` for how). The fit is on the host, in float64: a grid over log T or
log s, then a golden-section search about the best grid point; the NLL of either family
is smooth and (in practice) unimodal in its parameter.

`recalibrated_per_task` applies a map to an evaluator's per-task results without running
the network again; `runs.recalibration` scores them, and `vj.recalibrate` fits a map on a
run's predictive of given tasks and returns the run that applies it (`vj.fit_recalibration`
on a learner's, and `vj.recalibrated_learner` applies it: `learner_recalibration`).
"""

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core.errors import InputError
from vampire_jax._src.metrics import quantile_calibration, quantile_map, summary_inputs
from vampire_jax._src.metrics.quantile_map import QuantileMap

TEMPERATURE = "temperature"
VARIANCE_SCALE = "variance_scale"
QUANTILE = "quantile"
# The methods of each kind; `fit` picks the first that the tasks can fit (`default_method`).
METHODS = {"classification": (TEMPERATURE,), "regression": (QUANTILE, VARIANCE_SCALE)}

# The range searched, wide enough for any predictive worth recalibrating: a fit at its edge
# is refused (the data do not pin the parameter down, or the predictive is degenerate).
SEARCH_RANGE = {TEMPERATURE: (1e-2, 1e2), VARIANCE_SCALE: (1e-4, 1e4)}  # QUANTILE: s's
# Why the NLL of these tasks has no minimum inside the range: at its low edge, at its high.
_EDGE_REASONS = {
  TEMPERATURE: (
    "the predictive has (nearly) every query of these tasks right, so sharpening it always "
    "lowers their NLL",
    "the predictive does no better than chance on these tasks",
  ),
  VARIANCE_SCALE: (
    "the targets of these tasks lie on the predictive's draws",
    "the targets of these tasks lie far outside the predictive",
  ),
}
MIN_TASKS = 2  # one task's queries share one adaptation: a fit on them fits that task
INTERVAL_LEVEL = 0.9  # the central interval whose coverage the summaries report


class Calibration(NamedTuple):
  """A fitted recalibration map (`vj.fit_recalibration`, `vj.recalibrate`, `Run.calibration`).

  Attributes:
    method: 'temperature' (classification), 'quantile' or 'variance_scale' (regression).
    value: the temperature T, or the variance scale s (of a quantile map too: the scale
      it maps).
    num_tasks: how many tasks it was fitted on.
    nll_before: the mean NLL of those tasks' queries under the raw predictive.
    nll_after: under the recalibrated one (for T or s never above `nll_before`, T = 1 or
      s = 1 being in the search range).
    quantile_map: a quantile map's knots (`quantile_map.QuantileMap`), else None.
  """

  method: str
  value: float
  num_tasks: int
  nll_before: float
  nll_after: float
  quantile_map: Optional[QuantileMap] = None


def describe(calibration: Calibration) -> str:
  """'temperature 1.42', 'variance scale 3.05' or 'quantile map (20 bins) of variance
  scale 3.05', with the tasks it was fitted on."""
  fitted = f"(fitted on {calibration.num_tasks} tasks)"
  if calibration.method == QUANTILE:
    bins = calibration.quantile_map.num_bins
    return f"quantile map ({bins} bins) of variance scale {calibration.value:.4g} {fitted}"
  return f"{calibration.method.replace('_', ' ')} {calibration.value:.4g} {fitted}"


def to_record(calibration: Calibration) -> dict:
  """JSON-ready fields; `from_record` reads them back."""
  record = {
    "method": calibration.method,
    "value": float(calibration.value),
    "num_tasks": int(calibration.num_tasks),
    "nll_before": float(calibration.nll_before),
    "nll_after": float(calibration.nll_after),
  }
  if calibration.quantile_map is not None:
    record["quantile_map"] = quantile_map.to_record(calibration.quantile_map)
  return record


def from_record(record: dict, where: str) -> Calibration:
  """The `Calibration` of `to_record`; InputError naming `where` for a record that is not one."""
  try:
    calibration = Calibration(
      str(record["method"]),
      float(record["value"]),
      int(record["num_tasks"]),
      float(record["nll_before"]),
      float(record["nll_after"]),
      None
      if record.get("quantile_map") is None
      else quantile_map.from_record(record["quantile_map"]),
    )
  except (KeyError, TypeError, ValueError) as error:
    raise InputError(f"{where}: not a calibration record ({type(error).__name__}: {error})")
  known = calibration.method in (TEMPERATURE, VARIANCE_SCALE, QUANTILE)
  if not known or not (math.isfinite(calibration.value) and calibration.value > 0):
    raise InputError(
      f"{where}: a calibration must be a temperature, a variance scale or a quantile map "
      f"with a finite value > 0, got {calibration.method!r} {calibration.value!r}"
    )
  if (calibration.method == QUANTILE) != (calibration.quantile_map is not None):
    raise InputError(f"{where}: a quantile map, and only it, holds its knots ('quantile_map')")
  return calibration


# -- Fitting ------------------------------------------------------------------------------


def _minimise(nll, method: str, where: str) -> float:
  """The parameter in `SEARCH_RANGE[method]` minimising `nll(parameter)`, to ~1e-7 relative.

  A grid of 241 points over the log of the range, then golden-section search between the
  best point's neighbours. A minimum at the range's edge is refused.
  """
  low, high = SEARCH_RANGE[method]
  grid = np.linspace(math.log(low), math.log(high), 241)
  values = np.array([nll(math.exp(g)) for g in grid])
  if not np.any(np.isfinite(values)):
    raise InputError(f"{where}: the NLL is not finite at any {method.replace('_', ' ')}")
  best = int(np.nanargmin(np.where(np.isfinite(values), values, np.inf)))
  if best in (0, len(grid) - 1):
    why = _EDGE_REASONS[method][best > 0]
    raise InputError(
      f"{where}: the NLL keeps falling towards a {method.replace('_', ' ')} of "
      f"{math.exp(grid[best]):g}, the edge of the range searched ({low:g} to {high:g}): "
      f"{why}; no map is fitted (fit on more tasks)"
    )
  a, b = grid[best - 1], grid[best + 1]
  ratio = (math.sqrt(5.0) - 1.0) / 2.0
  c, d = b - ratio * (b - a), a + ratio * (b - a)
  fc, fd = nll(math.exp(c)), nll(math.exp(d))
  while b - a > 1e-7:
    if fc < fd:
      b, d, fd = d, c, fc
      c = b - ratio * (b - a)
      fc = nll(math.exp(c))
    else:
      a, c, fc = c, d, fd
      d = a + ratio * (b - a)
      fd = nll(math.exp(d))
  return math.exp(0.5 * (a + b))


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
  top = np.max(x, axis=axis, keepdims=True)
  return np.squeeze(top, axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def temperature_nll(log_probabilities: np.ndarray, labels: np.ndarray, temperature: float):
  """Mean -log softmax(log p / T)[y] over `[N, C]` log-probabilities and `[N]` labels."""
  scaled = log_probabilities / temperature
  picked = np.take_along_axis(scaled, labels[:, None], axis=1)[:, 0]
  return float(np.mean(_logsumexp(scaled, axis=1) - picked))


def fit_temperature(probabilities, labels, where: str = "fit_temperature") -> Calibration:
  """The temperature T minimising the NLL of softmax(log p / T) (Guo et al. 2017).

  Args:
    probabilities: `[tasks, num_query, classes]`, each query's predictive (the mean over
      weight draws of their softmax, `ClassificationEval.probabilities`).
    labels: `[tasks, num_query]` integer labels.
    where: the caller's name, for the messages.

  Returns:
    A `Calibration` of method 'temperature'.
  """
  probabilities = np.asarray(probabilities, np.float64)
  labels = np.asarray(labels)
  shapes_fit = probabilities.ndim == 3 and labels.shape == probabilities.shape[:-1]
  num_tasks = _check_fit_inputs(where, probabilities, labels, shapes_fit)
  # log of the mean's probabilities: the logits of the predictive, up to a constant per query.
  log_p = np.log(np.maximum(probabilities, 1e-300)).reshape(-1, probabilities.shape[-1])
  labels = labels.reshape(-1).astype(np.int64)
  nll = lambda t: temperature_nll(log_p, labels, t)
  temperature = _minimise(nll, TEMPERATURE, where)
  return Calibration(TEMPERATURE, temperature, num_tasks, nll(1.0), nll(temperature))


def variance_scale_nll(draws: np.ndarray, targets: np.ndarray, noise_std: float, scale: float):
  """Mean -log p_s(y) of the scaled mixture, over `[N, draws]` outputs and `[N]` targets.

  log p_s(y) = logsumexp_l [-(r - sqrt(s) d_l)^2 / (2 s sigma^2)] - log L
               - log(sqrt(2 pi s) sigma),  with d_l = f_l - m, r = y - m.
  """
  mean = np.mean(draws, axis=1, keepdims=True)
  offsets, residual = draws - mean, targets[:, None] - mean
  variance = scale * noise_std**2
  exponent = -np.square(residual - math.sqrt(scale) * offsets) / (2.0 * variance)
  log_density = _logsumexp(exponent, axis=1) - math.log(draws.shape[1])
  return float(-np.mean(log_density - 0.5 * math.log(2.0 * math.pi * variance)))


def fit_variance_scale(
  predictions, targets, noise_std: float, where: str = "fit_variance_scale"
) -> Calibration:
  """The variance scale s minimising the NLL of the scaled predictive mixture.

  Args:
    predictions: `[tasks, draws, num_query, 1]`, the network's outputs under each weight
      draw (`RegressionEval.predictions`).
    targets: `[tasks, num_query, 1]`.
    noise_std: the likelihood's noise.
    where: the caller's name, for the messages.

  Returns:
    A `Calibration` of method 'variance_scale'.
  """
  predictions = np.asarray(predictions, np.float64)
  targets = np.asarray(targets, np.float64)
  shapes_fit = predictions.ndim == 4 and predictions.shape[-1] == 1 and targets.ndim == 3
  shapes_fit = shapes_fit and (predictions.shape[0], *predictions.shape[2:]) == targets.shape
  num_tasks = _check_fit_inputs(where, predictions, targets, shapes_fit)
  draws = np.moveaxis(predictions[..., 0], 1, -1).reshape(-1, predictions.shape[1])  # [N, L]
  targets = targets.reshape(-1)
  nll = lambda s: variance_scale_nll(draws, targets, noise_std, s)
  scale = _minimise(nll, VARIANCE_SCALE, where)
  return Calibration(VARIANCE_SCALE, scale, num_tasks, nll(1.0), nll(scale))


def _pooled(predictions: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """`[tasks, draws, query, 1]` and `[tasks, query, 1]` as `[N, draws]` and `[N]` (float64)."""
  predictions = np.asarray(predictions, np.float64)
  draws = np.moveaxis(predictions[..., 0], 1, -1).reshape(-1, predictions.shape[1])
  return draws, np.asarray(targets, np.float64).reshape(-1)


def _log_density(draws: np.ndarray, targets: np.ndarray, noise_std: float) -> np.ndarray:
  """`[N]`: log mean_l N(y; f_l, noise_std^2) of `[N, draws]` outputs and `[N]` targets."""
  log_pdf = -0.5 * np.square((targets[:, None] - draws) / noise_std)
  log_pdf -= math.log(noise_std) + 0.5 * math.log(2.0 * math.pi)
  return _logsumexp(log_pdf, axis=1) - math.log(draws.shape[1])


def fit_quantile(
  predictions, targets, noise_std: float, where: str = "fit_quantile"
) -> Calibration:
  """Quantile recalibration (Kuleshov et al. 2018) of the variance-scaled predictive.

  The variance scale s first (`fit_variance_scale`), then the piecewise-linear map R of
  the scaled predictive's PIT values F_s(y) on the same tasks (`quantile_map.fit`, with
  `quantile_map.num_bins` bins). Arguments as `fit_variance_scale`.

  Returns:
    A `Calibration` of method 'quantile': `value` s, `quantile_map` R, `nll_after` the
    mean of -log f_s(y) - log R'(F_s(y)) over the tasks' queries.

  Raises:
    InputError: as `fit_variance_scale`, or fewer than 2 * `quantile_map.MIN_PER_BIN`
      query targets (too few for two bins).
  """
  scale = fit_variance_scale(predictions, targets, noise_std, where)
  draws, targets = _pooled(predictions, targets)
  draws = _scaled(draws, scale.value, axis=1)
  noise = calibrated_noise_std(scale, noise_std)
  pit = quantile_calibration.mixture_cdf(targets, draws.T, noise)
  bins = quantile_map.num_bins(pit.size)
  if bins < 2:
    raise InputError(
      f"{where}: {pit.size} query targets are too few for a quantile map (at least "
      f"{2 * quantile_map.MIN_PER_BIN}, {quantile_map.MIN_PER_BIN} a bin): fit on more "
      "tasks, or method='variance_scale'"
    )
  fitted = quantile_map.fit(pit, bins)
  nll = -float(np.mean(_log_density(draws, targets, noise) + fitted.log_slope(pit)))
  return Calibration(QUANTILE, scale.value, scale.num_tasks, scale.nll_before, nll, fitted)


def _scaled(draws, scale: float, axis: int):
  """Draws stretched about their mean by sqrt(scale): m + sqrt(s) (f_l - m)."""
  mean = np.mean(draws, axis=axis, keepdims=True)
  return mean + math.sqrt(scale) * (draws - mean)


def _check_fit_inputs(where: str, values: np.ndarray, targets: np.ndarray, shapes_fit) -> int:
  if not shapes_fit:
    raise InputError(
      f"{where}: the predictive and the targets must have a leading task axis and match "
      f"(classification [tasks, query, classes] and [tasks, query]; regression "
      f"[tasks, draws, query, 1] and [tasks, query, 1]), got {values.shape} and {targets.shape}"
    )
  num_tasks = int(values.shape[0])
  if num_tasks < MIN_TASKS:
    raise InputError(
      f"{where}: {num_tasks} task is too few to fit a map (at least {MIN_TASKS}: one task's "
      "queries share one adaptation, so a fit on them fits that task); pass more tasks, "
      "e.g. the run's validation tasks"
    )
  if not (np.all(np.isfinite(values)) and np.all(np.isfinite(targets))):
    raise InputError(f"{where}: the predictive or the targets of these tasks are not finite")
  return num_tasks


def default_method(kind: str, num_targets: int) -> str:
  """A classifier's temperature; a regressor's quantile map where `num_targets` query
  targets fill two bins or more (`quantile_map.num_bins`), else its variance scale."""
  if kind == "classification":
    return TEMPERATURE
  return QUANTILE if quantile_map.num_bins(num_targets) >= 2 else VARIANCE_SCALE


def check_method(where: str, kind: str, method: Optional[str]) -> None:
  """InputError unless `method` is None or one of `kind`'s `METHODS`."""
  if method is not None and method not in METHODS[kind]:
    choices = " or ".join(map(repr, METHODS[kind]))
    raise InputError(
      f"{where}: method must be {choices} for a {kind} predictive (or None: the "
      f"default), got {method!r}"
    )


def fit(
  kind: str, per_task: dict, noise_std: Optional[float], where: str, method: Optional[str] = None
) -> Calibration:
  """The map of a `kind` problem fitted on an evaluator's per-task results (with 'targets').

  `method` None: `default_method`'s.
  """
  check_method(where, kind, method)
  if method is None:
    method = default_method(kind, int(np.size(per_task["targets"])))
  if method == TEMPERATURE:
    return fit_temperature(per_task["probabilities"], per_task["targets"], where)
  fit_one = fit_quantile if method == QUANTILE else fit_variance_scale
  return fit_one(per_task["predictions"], per_task["targets"], noise_std, where)


# -- Applying ------------------------------------------------------------------------------


def calibrated_noise_std(calibration: Optional[Calibration], noise_std):
  """The predictive's noise under `calibration`: sqrt(s) sigma (the same if none)."""
  if calibration is None or calibration.method == TEMPERATURE or noise_std is None:
    return noise_std
  return float(noise_std) * math.sqrt(calibration.value)


def calibrate_outputs(calibration: Optional[Calibration], outputs: jax.Array) -> jax.Array:
  """One task's network outputs under each weight draw, `[draws, num_query, ...]`, recalibrated.

  Regression (variance scale s, and a quantile map's s): f_l -> m + sqrt(s) (f_l - m),
  m = mean_l f_l, to go with the noise sqrt(s) sigma (`calibrated_noise_std`). A quantile
  map's R is applied in the predictive's CDF and density, not here (`calibrated_learner`).

  Classification (temperature T), on logits: each draw's distribution p_l = softmax(f_l)
  keeps its offset from their mean p, moved to the tempered mean p_T = softmax(log p / T):
  q_l = p_T + lam (p_l - p), with lam = 1 unless an offset would leave the simplex, where
  lam (per query) is the largest in [0, 1] that keeps every q_l >= 0. So mean_l q_l = p_T
  exactly, each q_l is a distribution, and T = 1 gives q_l = p_l. Returned as logits,
  log q_l (softmax of them gives q_l back).

  Jittable; None returns `outputs` as they are.
  """
  if calibration is None:
    return outputs
  if calibration.method in (VARIANCE_SCALE, QUANTILE):
    mean = jnp.mean(outputs, axis=0, keepdims=True)
    return mean + math.sqrt(calibration.value) * (outputs - mean)
  draws = jax.nn.softmax(outputs, axis=-1)  # [draws, query, classes]
  mean = jnp.mean(draws, axis=0)
  tempered = jax.nn.softmax(jnp.log(mean) / calibration.value, axis=-1)
  offsets = draws - mean
  # The largest lam with tempered + lam * offset >= 0 wherever the offset is negative.
  room = jnp.where(offsets < 0, tempered / jnp.where(offsets < 0, -offsets, 1.0), jnp.inf)
  lam = jnp.minimum(1.0, jnp.min(room, axis=(0, 2), keepdims=True))
  recalibrated = jnp.maximum(tempered + lam * offsets, 0.0)
  return jnp.log(jnp.maximum(recalibrated, jnp.finfo(recalibrated.dtype).tiny))


def recalibrated_per_task(
  calibration: Calibration, per_task: dict, noise_std: Optional[float]
) -> dict:
  """An evaluator's per-task results as the recalibrated predictive scores them (numpy).

  Classification: `probabilities` tempered (p_T), `nll` of p_T, `accuracy` as it was.
  Regression: `predictions` m + sqrt(s) (f_l - m), and `mse`, `predictive_mean_mse` and
  `nll` recomputed from them under the noise sqrt(s) sigma; under a quantile map R, the
  NLL is that of its density R'(F_s(y)) f_s(y). Other fields (targets, truth) are kept. The same numbers as the recalibrated run's evaluator gives, up to float32
  rounding.
  """
  per_task = dict(per_task)
  if calibration.method == TEMPERATURE:
    probabilities = np.asarray(per_task["probabilities"], np.float64)
    tempered = np.log(np.maximum(probabilities, 1e-300)) / calibration.value
    tempered = np.exp(tempered - _logsumexp(tempered, axis=-1)[..., None])
    labels = np.asarray(per_task["targets"]).astype(np.int64)
    picked = np.take_along_axis(tempered, labels[..., None], axis=-1)[..., 0]
    per_task["probabilities"] = tempered
    per_task["nll"] = -np.mean(np.log(np.maximum(picked, 1e-300)), axis=-1)
    return per_task
  predictions = _scaled(np.asarray(per_task["predictions"], np.float64), calibration.value, 1)
  noise = calibrated_noise_std(calibration, noise_std)
  scores = summary_inputs.regression_scores(predictions, per_task["targets"], noise)
  if calibration.method == QUANTILE:
    pit = predictive_pit(predictions, per_task["targets"], noise)  # [tasks, query]
    scores["nll"] = scores["nll"] - np.mean(calibration.quantile_map.log_slope(pit), axis=1)
  return {**per_task, **scores, "predictions": predictions}


def predictive_pit(predictions, targets, noise_std: float, qmap: Optional[QuantileMap] = None):
  """`[tasks, num_query]`: each target's PIT value F(y) under the mixture (R(F(y)) with `qmap`).

  Args:
    predictions: `[tasks, draws, num_query, 1]` component means; `targets` `[tasks, num_query, 1]`.
  """
  predictions = np.asarray(predictions, np.float64)[..., 0]  # [tasks, draws, query]
  pit = quantile_calibration.mixture_cdf(
    np.asarray(targets, np.float64)[..., 0], np.moveaxis(predictions, 1, 0), noise_std
  )
  return pit if qmap is None else qmap(pit)


def interval_coverage(
  predictions,
  targets,
  noise_std: float,
  level: float = INTERVAL_LEVEL,
  qmap: Optional[QuantileMap] = None,
) -> np.ndarray:
  """`[tasks, num_query]`: whether each target lies in the predictive's central `level` interval.

  The mixture's CDF F (and R(F) under a quantile map R) is continuous and increasing, so y
  lies between its (1 - level) / 2 and (1 + level) / 2 quantiles exactly when its PIT value
  does: one CDF per target, no bisection.

  Args:
    predictions: `[tasks, draws, num_query, 1]` component means.
    targets: `[tasks, num_query, 1]`.
    noise_std: the components' noise.
    level: in (0, 1).
    qmap: a quantile map's R (`Calibration.quantile_map`), or None.
  """
  pit = predictive_pit(predictions, targets, noise_std, qmap)
  return (pit >= 0.5 * (1.0 - level)) & (pit <= 0.5 * (1.0 + level))


def interval_metrics(per_task: dict, noise_std: float, qmap: Optional[QuantileMap] = None) -> dict:
  """`interval_90_coverage` (the fraction of targets in the central 90 % interval) and
  `interval_90_width` (the interval's mean width, by bisection) of a regressor's results
  (under the quantile map `qmap`, if given: the ends F^-1(R^-1(0.05)), F^-1(R^-1(0.95)))."""
  covered = interval_coverage(per_task["predictions"], per_task["targets"], noise_std, qmap=qmap)
  predictions = np.asarray(per_task["predictions"], np.float64)[..., 0]
  ends = np.array([0.5 * (1 - INTERVAL_LEVEL), 0.5 * (1 + INTERVAL_LEVEL)])
  low, high = quantile_calibration.mixture_quantile(
    ends if qmap is None else qmap.inverse(ends),
    np.moveaxis(predictions, 1, 0),
    noise_std,
    tol=1e-4,
  )
  return {
    "interval_90_coverage": float(np.mean(covered)),
    "interval_90_width": float(np.mean(high - low)),
  }
