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

Both act on the network's outputs under each weight draw, so the predictive, its samples
and every score of it follow from the outputs as for a run that was never recalibrated
(`calibrate_outputs`): a regressor's draws become m + sqrt(s) (f_l - m) and its noise
sqrt(s) sigma; a classifier's draws become distributions whose mean is p_T (see
`calibrate_outputs` for how). The fit is on the host, in float64: a grid over log T or
log s, then a golden-section search about the best grid point; the NLL of either family
is smooth and (in practice) unimodal in its parameter.

`recalibrated_per_task` applies a map to an evaluator's per-task results without running
the network again; `runs.recalibration` scores them, and `vj.recalibrate` fits a map on a
run's predictive of given tasks and returns the run that applies it.
"""

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core.errors import InputError
from vampire_jax._src.metrics import quantile_calibration, summary_inputs

TEMPERATURE = "temperature"
VARIANCE_SCALE = "variance_scale"
METHODS = {"classification": TEMPERATURE, "regression": VARIANCE_SCALE}

# The range searched, wide enough for any predictive worth recalibrating: a fit at its edge
# is refused (the data do not pin the parameter down, or the predictive is degenerate).
SEARCH_RANGE = {TEMPERATURE: (1e-2, 1e2), VARIANCE_SCALE: (1e-4, 1e4)}
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
  """A fitted recalibration map (`vj.recalibrate`, `Run.calibration`).

  Attributes:
    method: 'temperature' (classification) or 'variance_scale' (regression).
    value: the temperature T, or the variance scale s.
    num_tasks: how many tasks it was fitted on.
    nll_before: the mean NLL of those tasks' queries under the raw predictive.
    nll_after: under the recalibrated one (never above `nll_before`, T = 1 or s = 1
      being in the search range).
  """

  method: str
  value: float
  num_tasks: int
  nll_before: float
  nll_after: float


def describe(calibration: Calibration) -> str:
  """'temperature 1.42' or 'variance scale 3.05', with the tasks it was fitted on."""
  name = calibration.method.replace("_", " ")
  return f"{name} {calibration.value:.4g} (fitted on {calibration.num_tasks} tasks)"


def to_record(calibration: Calibration) -> dict:
  """JSON-ready fields; `from_record` reads them back."""
  return {
    "method": calibration.method,
    "value": float(calibration.value),
    "num_tasks": int(calibration.num_tasks),
    "nll_before": float(calibration.nll_before),
    "nll_after": float(calibration.nll_after),
  }


def from_record(record: dict, where: str) -> Calibration:
  """The `Calibration` of `to_record`; InputError naming `where` for a record that is not one."""
  try:
    calibration = Calibration(
      str(record["method"]),
      float(record["value"]),
      int(record["num_tasks"]),
      float(record["nll_before"]),
      float(record["nll_after"]),
    )
  except (KeyError, TypeError, ValueError) as error:
    raise InputError(f"{where}: not a calibration record ({type(error).__name__}: {error})")
  if calibration.method not in SEARCH_RANGE or not (
    math.isfinite(calibration.value) and calibration.value > 0
  ):
    raise InputError(
      f"{where}: a calibration must be a temperature or a variance scale, a finite number "
      f"> 0, got {calibration.method!r} {calibration.value!r}"
    )
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


def fit(kind: str, per_task: dict, noise_std: Optional[float], where: str) -> Calibration:
  """The map of a `kind` problem fitted on an evaluator's per-task results (with 'targets')."""
  if kind == "classification":
    return fit_temperature(per_task["probabilities"], per_task["targets"], where)
  return fit_variance_scale(per_task["predictions"], per_task["targets"], noise_std, where)


# -- Applying ------------------------------------------------------------------------------


def calibrated_noise_std(calibration: Optional[Calibration], noise_std):
  """The predictive's noise under `calibration`: sqrt(s) sigma (the same if none)."""
  if calibration is None or calibration.method != VARIANCE_SCALE or noise_std is None:
    return noise_std
  return float(noise_std) * math.sqrt(calibration.value)


def calibrate_outputs(calibration: Optional[Calibration], outputs: jax.Array) -> jax.Array:
  """One task's network outputs under each weight draw, `[draws, num_query, ...]`, recalibrated.

  Regression (variance scale s): f_l -> m + sqrt(s) (f_l - m), m = mean_l f_l, to go with
  the noise sqrt(s) sigma (`calibrated_noise_std`).

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
  if calibration.method == VARIANCE_SCALE:
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
  `nll` recomputed from them under the noise sqrt(s) sigma. Other fields (targets, truth)
  are kept. The same numbers as the recalibrated run's evaluator gives, up to float32
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
  predictions = np.asarray(per_task["predictions"], np.float64)
  mean = np.mean(predictions, axis=1, keepdims=True)
  predictions = mean + math.sqrt(calibration.value) * (predictions - mean)
  scores = summary_inputs.regression_scores(
    predictions, per_task["targets"], calibrated_noise_std(calibration, noise_std)
  )
  return {**per_task, **scores, "predictions": predictions}


def interval_coverage(
  predictions, targets, noise_std: float, level: float = INTERVAL_LEVEL
) -> np.ndarray:
  """`[tasks, num_query]`: whether each target lies in the predictive's central `level` interval.

  The mixture's CDF F is continuous and increasing, so y lies between its (1 - level) / 2
  and (1 + level) / 2 quantiles exactly when F(y) does: one CDF per target, no bisection.

  Args:
    predictions: `[tasks, draws, num_query, 1]` component means.
    targets: `[tasks, num_query, 1]`.
    noise_std: the components' noise.
    level: in (0, 1).
  """
  predictions = np.asarray(predictions, np.float64)[..., 0]  # [tasks, draws, query]
  pit = quantile_calibration.mixture_cdf(
    np.asarray(targets, np.float64)[..., 0], np.moveaxis(predictions, 1, 0), noise_std
  )
  return (pit >= 0.5 * (1.0 - level)) & (pit <= 0.5 * (1.0 + level))


def interval_metrics(per_task: dict, noise_std: float) -> dict:
  """`interval_90_coverage` (the fraction of targets in the central 90 % interval) and
  `interval_90_width` (the interval's mean width, by bisection) of a regressor's results."""
  covered = interval_coverage(per_task["predictions"], per_task["targets"], noise_std)
  predictions = np.asarray(per_task["predictions"], np.float64)[..., 0]
  low, high = quantile_calibration.mixture_quantile(
    [0.5 * (1 - INTERVAL_LEVEL), 0.5 * (1 + INTERVAL_LEVEL)],
    np.moveaxis(predictions, 1, 0),
    noise_std,
    tol=1e-4,
  )
  return {
    "interval_90_coverage": float(np.mean(covered)),
    "interval_90_width": float(np.mean(high - low)),
  }
