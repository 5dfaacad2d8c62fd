"""What `vj.summarise` accepts: one evaluator's per-task results and the targets it scored.

A summary mixes numbers of two kinds: those the evaluator computed (accuracy,
MSE, NLL) and those computed here from its predictions and the targets
(ECE, AURC, quantile calibration). Both must come from the same tasks, so
where the per-task results hold what is needed, the evaluator's numbers are
recomputed from the predictions and the targets given, and a mismatch is
refused: targets of other tasks, or in another order, or another noise_std
than the evaluator's.

`with_targets` gathers the per-task results and the targets into one dict;
each kind's `check_summary` (`check_classification`, `check_regression`)
returns them as numpy arrays, targets (and truth) `[tasks, queries, 1]` for
regression, or raises `InputError` in one line naming the argument.
"""

import math
from collections.abc import Mapping
from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError

WHERE = "summarise"

# The fields each kind's evaluator returns, and the name of its result.
FIELDS = {
  "classification": ("accuracy", "nll", "probabilities"),
  "regression": ("mse", "predictive_mean_mse", "nll", "predictions"),
}
RESULT = {"classification": "vj.ClassificationEval", "regression": "vj.RegressionEval"}


def with_targets(per_task: Any, targets: Any, truth: Any) -> dict:
  """`per_task` as a dict, with `targets` (and `truth`) added, each given once."""
  fields = _as_dict(per_task)
  for name, value in (("targets", targets), ("truth", truth)):
    if value is not None:
      if name in fields:
        raise checks.fail(WHERE, name, f"given once (per_task holds '{name}' already)", "both")
      fields[name] = value
  if "targets" not in fields:
    raise checks.fail(
      WHERE,
      "targets",
      "the tasks' query labels or targets: vj.summarise(kind, per_task, tasks.query_y)",
      "none",
    )
  return fields


def check_classification(fields: dict, noise_std: Optional[float]) -> dict:
  """A classifier's results and labels as numpy arrays, checked against each other."""
  del noise_std  # a classifier has none
  _check_kind("classification", fields)
  if "truth" in fields:
    raise checks.fail(WHERE, "truth", "None for a classifier (regression only)", "truth")
  arrays = {name: np.asarray(value) for name, value in fields.items()}
  _check_classification(arrays, _check_task_axis("classification", arrays))
  return arrays


def check_regression(fields: dict, noise_std: Optional[float]) -> dict:
  """A regressor's results, targets `[tasks, queries, 1]` (and truth), checked against each other."""
  _check_kind("regression", fields)
  _check_noise_std(noise_std)
  arrays = {name: np.asarray(value) for name, value in fields.items()}
  _check_regression(arrays, _check_task_axis("regression", arrays), float(noise_std))
  return arrays


def _as_dict(per_task: Any) -> dict:
  if hasattr(per_task, "_asdict"):
    return dict(per_task._asdict())
  if isinstance(per_task, Mapping):
    return dict(per_task)
  raise checks.fail(
    WHERE,
    "per_task",
    "an evaluator's result (vj.ClassificationEval, vj.RegressionEval) or a dict of its fields",
    f"a {type(per_task).__name__}",
  )


def _check_kind(kind: str, fields: dict) -> None:
  wanted = FIELDS[kind]
  missing = [name for name in wanted if name not in fields]
  if not missing:
    return
  for other, other_fields in FIELDS.items():
    if other != kind and all(name in fields for name in other_fields):
      raise checks.fail(
        WHERE,
        "per_task",
        f"a {kind} evaluator's result ({RESULT[kind]})",
        f"a {other} evaluator's ({RESULT[other]}): summarise it as vj.summarise({other!r}, ...)",
      )
  raise InputError(
    f"{WHERE}: per_task must hold {RESULT[kind]}'s fields {', '.join(wanted)}, got none "
    f"named {', '.join(repr(name) for name in missing)}"
  )


def _check_task_axis(kind: str, arrays: dict) -> int:
  if arrays["nll"].ndim != 1:
    raise checks.fail(
      WHERE, "per_task['nll']", "[tasks], one per task", checks.describe(arrays["nll"])
    )
  num_tasks = arrays["nll"].shape[0]
  if num_tasks == 0:
    raise checks.fail(WHERE, "per_task", "the results of at least one task", "zero tasks")
  for name in FIELDS[kind] + ("targets",) + (("truth",) if "truth" in arrays else ()):
    value = arrays[name]
    label = name if name in ("targets", "truth") else f"per_task[{name!r}]"
    if value.ndim < 1 or value.shape[0] != num_tasks:
      raise checks.fail(
        WHERE, label, f"[{num_tasks}, ...], one entry per task of per_task", checks.describe(value)
      )
    if name == "targets":
      continue  # labels are integers; regression targets are checked as a column
    if not _is_float(value):
      raise checks.fail(WHERE, label, "floating point", checks.describe(value))
    _refuse_non_finite(label, value, num_tasks)
  return num_tasks


def _refuse_non_finite(label: str, value: np.ndarray, num_tasks: int) -> None:
  bad = ~np.isfinite(value.astype(np.float64).reshape(num_tasks, -1)).all(axis=1)
  if bad.any():
    raise checks.fail(
      WHERE,
      label,
      "finite",
      f"NaN or infinite values in {int(bad.sum())} of {num_tasks} tasks (tasks "
      f"{np.flatnonzero(bad)[:5].tolist()}): the evaluation diverged there",
    )


def _is_float(value: np.ndarray) -> bool:
  # bfloat16 is not a numpy floating type: ask jax's dtype rules.
  return bool(jnp.issubdtype(value.dtype, jnp.floating))


def _tolerance(*arrays: np.ndarray) -> float:
  """Relative tolerance of a recomputation: float32's rounding, or 16-bit's."""
  bits = min(np.dtype(a.dtype).itemsize * 8 for a in arrays)
  return 1e-4 if bits >= 32 else 3e-2


def _check_classification(arrays: dict, num_tasks: int) -> None:
  probabilities, labels = arrays["probabilities"], arrays["targets"]
  if probabilities.ndim != 3:
    raise checks.fail(
      WHERE,
      "per_task['probabilities']",
      "[tasks, queries, classes]",
      checks.describe(probabilities),
    )
  _, num_query, classes = probabilities.shape
  if num_query == 0:
    raise checks.fail(WHERE, "per_task['probabilities']", "at least one query", "zero queries")
  rtol = _tolerance(probabilities, arrays["nll"])
  checks.probabilities(
    WHERE, "per_task['probabilities']", probabilities, "softmax outputs", atol=10 * rtol
  )
  wanted = f"[{num_tasks}, {num_query}] integer class indices (of one-hot labels y, argmax(y, -1))"
  if labels.shape != (num_tasks, num_query) or labels.dtype.kind not in "iu":
    raise checks.fail(WHERE, "targets", wanted, checks.describe(labels))
  checks.labels_in_range(WHERE, "targets", labels, classes)
  probabilities = probabilities.astype(np.float64)
  accuracy = np.mean(np.argmax(probabilities, axis=-1) == labels, axis=1)
  given = arrays["accuracy"].astype(np.float64)
  if given.shape != (num_tasks,):
    raise checks.fail(WHERE, "per_task['accuracy']", f"[{num_tasks}]", checks.describe(given))
  # A near tie of the two largest probabilities may break either way in the evaluator's own
  # rounding (another device, another fusion): such a query may count either way.
  top_two = np.sort(probabilities, axis=-1)[..., -2:]  # one class: always a "tie"
  ties = np.sum(top_two[..., -1] - top_two[..., 0] <= rtol, axis=1)
  _refuse_other_targets("accuracy", given, accuracy, rtol=0.0, atol=1e-5 + ties / num_query)
  picked = np.take_along_axis(probabilities, labels[..., None], axis=-1)[..., 0]
  scorable = np.all(picked > 1e-30, axis=1)  # an underflow to 0 leaves a task unchecked
  given = arrays["nll"].astype(np.float64)
  nll = -np.mean(np.log(np.where(picked > 1e-30, picked, 1.0)), axis=1)
  _refuse_other_targets("nll", given, np.where(scorable, nll, given), rtol=rtol, atol=rtol)


def _as_column(name: str, value: np.ndarray, num_tasks: int, num_query: int) -> np.ndarray:
  wanted = f"[{num_tasks}, {num_query}] or [{num_tasks}, {num_query}, 1] floats"
  if value.shape == (num_tasks, num_query):
    value = value[..., None]
  if value.shape != (num_tasks, num_query, 1) or not _is_float(value):
    raise checks.fail(WHERE, name, wanted, checks.describe(value))
  return value


def _check_noise_std(noise_std: Any) -> None:
  wanted = "the likelihood's noise standard deviation, a number > 0 (noise_std=0.3)"
  if isinstance(noise_std, (bool, np.bool_)) or not isinstance(
    noise_std, (int, float, np.integer, np.floating)
  ):
    raise checks.fail(WHERE, "noise_std", wanted, checks.describe(noise_std))
  if not (math.isfinite(noise_std) and noise_std > 0):
    raise checks.fail(WHERE, "noise_std", wanted, repr(float(noise_std)))


def _check_regression(arrays: dict, num_tasks: int, noise_std: float) -> None:
  predictions = arrays["predictions"]
  if predictions.ndim != 4 or predictions.shape[-1] != 1 or 0 in predictions.shape:
    raise checks.fail(
      WHERE,
      "per_task['predictions']",
      "[tasks, draws >= 1, queries >= 1, 1] (one output per query)",
      checks.describe(predictions),
    )
  num_query = predictions.shape[2]
  arrays["targets"] = _as_column("targets", arrays["targets"], num_tasks, num_query)
  _refuse_non_finite("targets", arrays["targets"], num_tasks)
  if "truth" in arrays:
    arrays["truth"] = _as_column("truth", arrays["truth"], num_tasks, num_query)
  scores = regression_scores(predictions, arrays["targets"], noise_std)
  rtol = _tolerance(predictions, arrays["mse"], arrays["nll"])
  for field in ("mse", "predictive_mean_mse"):
    _refuse_other_targets(field, arrays[field], scores[field], rtol=rtol, atol=rtol)
  if not np.allclose(arrays["nll"].astype(np.float64), scores["nll"], rtol=rtol, atol=rtol):
    raise InputError(
      f"{WHERE}: noise_std must be the evaluator's: its NLL is not that of noise_std "
      f"{noise_std:g} for these predictions and targets (task "
      f"{int(np.argmax(~np.isclose(arrays['nll'], scores['nll'], rtol=rtol, atol=rtol)))}); "
      "pass the noise_std given to vj.make_regression_evaluator. A recalibrated learner's "
      "NLL (vj.recalibrate, vj.fit_recalibration) is not that of one noise_std: summarise "
      "the raw learner's results, with the raw noise_std (vj.load_run(folder).noise_std)"
    )


def regression_scores(predictions, targets, noise_std: float) -> dict:
  """The regression evaluator's per-task scores, recomputed in float64 on the host.

  Args:
    predictions: `[tasks, draws, queries, 1]`, each draw's network output.
    targets: `[tasks, queries, 1]`.
    noise_std: the likelihood's noise standard deviation.

  Returns:
    `{"mse", "predictive_mean_mse", "nll"}`, each `[tasks]`: the squared
    error averaged over draws, the predictive mean's, and
    -mean_q log mean_l N(y_q; f_l(x_q), noise_std^2).
  """
  means = np.asarray(predictions, np.float64)  # [tasks, draws, queries, 1]
  targets = np.asarray(targets, np.float64)[:, None]  # [tasks, 1, queries, 1]
  mse = np.mean(np.square(means - targets), axis=(1, 2, 3))
  mean_mse = np.mean(np.square(np.mean(means, axis=1) - targets[:, 0]), axis=(1, 2))
  log_pdf = -0.5 * np.square((targets - means) / noise_std)[..., 0]  # [tasks, draws, queries]
  log_pdf -= math.log(noise_std) + 0.5 * math.log(2.0 * math.pi)
  largest = np.max(log_pdf, axis=1, keepdims=True)
  log_mixture = largest[:, 0] + np.log(np.mean(np.exp(log_pdf - largest), axis=1))
  return {"mse": mse, "predictive_mean_mse": mean_mse, "nll": -np.mean(log_mixture, axis=1)}


def _refuse_other_targets(field: str, given, recomputed, *, rtol: float, atol: float) -> None:
  given = np.asarray(given, np.float64)
  differ = ~np.isclose(given, recomputed, rtol=rtol, atol=atol)
  if differ.any():
    task = int(np.flatnonzero(differ)[0])
    raise checks.fail(
      WHERE,
      "targets",
      "those the evaluator scored (the same tasks' query_y, in the same order)",
      f"targets that give per_task[{field!r}] {recomputed[task]:.6g} for task {task} where "
      f"the evaluator gave {given[task]:.6g} ({int(differ.sum())} tasks differ)",
    )
