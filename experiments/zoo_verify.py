"""A zoo cell scored again on its own test split, and compared with what its run reported.

`score_test_split(run, num_tasks)` re-runs the test of a loaded run as the training loop
ran it: the same split (the experiment's `make_problem` from the run's config), the same
keys (`programs.run_keys(config.seed).test`: task i is drawn and adapted from that key and
i alone, so the first N tasks are the run's first N), the same evaluator and summary.
The open-set episodes are not scored again.

`compare(...)` sets the scores beside the run's own: `results.json` when all its test
tasks are scored, else the first N rows of `test_per_task.npz`. Two outcomes pass:
"equal" (every number and every per-task array the same, bit for bit) and "within
tolerance" (only where equality is not expected: see `CI_FRACTION`); anything else is a
difference. Equality is expected on a machine of the identity where the cell was verified
equal before (recorded in the manifest by `zoo add` or `zoo verify --record`;
`this_machine` says what the identity holds): it compiles the same programs, so a
difference there is unexpected. What changed (the code, the cell, the data, or something
of the machine the identity does not hold) the failure does not claim to know.
"""

import importlib
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

import vampire_jax as vj
from vampire_jax import backend
from vampire_jax.metrics import evaluate_split
from vampire_jax.runs import kinds, programs

# Across platforms (trained on a GPU, verified on a CPU; or another CPU kind or jaxlib),
# XLA compiles other kernels and the last bits differ. A mean score (accuracy or MSE) and
# the NLL then pass if they moved by at most this fraction of their own 95 % half-width:
# a twentieth of the statistical uncertainty changes no conclusion drawn from the number.
# The ECE passes within ECE_TOLERANCE (absolute). The MCE, one bin's gap, is shown but not
# held to a tolerance. Provisional: docs/zoo.md says how they were measured.
CI_FRACTION = 0.05
ECE_TOLERANCE = 0.002

# The experiment module whose `make_problem(config)` builds a run's data, by config class.
EXPERIMENT_MODULES = {
  "OmniglotConfig": "experiments.omniglot",
  "RegressionConfig": "experiments.regression",
  "MiniImagenetConfig": "experiments.mini_imagenet",
  "FeaturesConfig": "experiments.tiered_imagenet",
}


# -- The machine -------------------------------------------------------------------------

# What decides the last bits of a score here, and nothing else: the library's identity of
# the machine (`vampire_jax.backend.machine_identity`: the device kind; on a CPU the
# processor's vendor, family, model, stepping, instruction sets and cores; jaxlib and XLA's
# flags; not the device count). The manifest records it where a cell was verified equal.
this_machine = backend.machine_identity
cpu_identity = backend.cpu_identity
describe_machine = backend.describe_machine


# -- Scoring -------------------------------------------------------------------------------


def make_problem(run: vj.Run) -> vj.Problem:
  """The run's problem, built by its experiment from the run's config (its data loaded)."""
  name = type(run.config).__name__
  if name not in EXPERIMENT_MODULES:
    raise vj.ConfigError(
      f"zoo verify: a run of {name} has no experiment here to build its test split; "
      f"known: {', '.join(EXPERIMENT_MODULES)}"
    )
  return importlib.import_module(EXPERIMENT_MODULES[name]).make_problem(run.config)


def score_test_split(
  run: vj.Run,
  problem: vj.Problem,
  num_tasks: int,
  on_batch: Optional[Callable[[int, int], None]] = None,
) -> tuple[dict, dict]:
  """`(per_task, metrics)` of the run's first `num_tasks` test tasks, as its test scored them.

  The training loop's evaluator (`programs.build_evaluator`, with the devices it would
  take here), the run's test learner and meta-parameters (`vj.load_run`), the test key.
  """
  config = run.config
  mesh = backend.task_mesh_for(config, config.schedule.tasks_per_step)
  evaluate = programs.build_evaluator(run.kind, run.noise_std, config, run.learner, mesh)
  meta_params = run.meta_params if mesh is None else vj.replicate(run.meta_params, mesh)
  per_task = evaluate_split(
    programs.split_evaluator(problem, evaluate, "test", mesh),
    meta_params,
    programs.run_keys(config.seed).test,
    num_tasks,
    programs.eval_batch_size(config, mesh),
    on_batch=on_batch,
  )
  summary = kinds.summarise(
    run.kind, per_task, num_bins=config.evaluation.num_bins, noise_std=run.noise_std
  )
  return per_task, _scalars(summary.metrics)


def _scalars(metrics: dict) -> dict:
  """The numbers of a summary as `results.json` holds them (floats), nested records left out."""
  return {
    name: float(value)
    for name, value in metrics.items()
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
  }


def numbers_from_arrays(kind: str, per_task: dict, num_bins: int) -> dict:
  """The summary numbers that per-task arrays give (`test_per_task.npz`'s, or the scores
  a cell keeps of a large one).

  With the probabilities (a classifier's whole file): its whole summary. Without (a
  regressor's file holds no predictions; a large classifier's scores alone): the mean of
  each per-task score with its half-width.
  """
  if kind == "classification" and "probabilities" in per_task:
    fields = ("accuracy", "nll", "probabilities", "targets")
    return _scalars(
      kinds.summarise(kind, {k: per_task[k] for k in fields}, num_bins=num_bins).metrics
    )
  names = [n for n in ("accuracy", "mse", "predictive_mean_mse", "nll") if n in per_task]
  numbers = {"num_tasks": float(len(per_task[names[0]]))}
  for name in names:
    mean, half = vj.mean_confidence_interval(per_task[name])
    numbers.update({name: mean, f"{name}_ci95": half})
  return numbers


# -- Comparing -------------------------------------------------------------------------------


class Reference(NamedTuple):
  """What the run reported for the tasks scored again."""

  numbers: dict  # {metric: value}
  arrays: dict  # {field: [num_tasks, ...]}: per-task results ({} when the cell has none)
  num_tasks: int


def reference(results: dict, per_task_file: Optional[Path], num_tasks: int, num_bins: int):
  """The run's own numbers for its first `num_tasks` test tasks (None: the cell cannot say).

  All of them: `results.json`'s test numbers and, if kept, the per-task arrays. Fewer:
  the per-task arrays' first rows (None without them).
  """
  kind, count = results["kind"], int(results["test"]["num_tasks"])
  arrays = {}
  if per_task_file is not None and per_task_file.is_file():
    with np.load(per_task_file) as saved:
      arrays = {name: saved[name][:num_tasks] for name in saved.files}
  if num_tasks == count:
    return Reference(_scalars(results["test"]), arrays, count)
  if not arrays:
    return None
  return Reference(numbers_from_arrays(kind, arrays, num_bins), arrays, num_tasks)


class Comparison(NamedTuple):
  """How the scores of a verification stand against the run's."""

  outcome: str  # "equal", "within tolerance" or "differs"
  detail: str  # what moved, in words ("" when equal)


def compare(kind: str, ref: Reference, numbers: dict, arrays: dict) -> Comparison:
  """Equal (bit for bit), within the cross-platform tolerance, or different (and how)."""
  names = sorted(set(ref.numbers) & set(numbers))
  fields = sorted(set(ref.arrays) & set(arrays))
  unequal = [n for n in names if ref.numbers[n] != numbers[n]]
  unequal += [f"{f} (per task)" for f in fields if not _same_array(ref.arrays[f], arrays[f])]
  if not unequal:
    return Comparison("equal", "")
  score = kinds.get(kind).score
  outside, moved = [], []
  for name in (score, "nll", "ece"):
    if name not in ref.numbers or name not in numbers:
      continue
    delta = numbers[name] - ref.numbers[name]
    if name == "ece":
      limit, unit = ECE_TOLERANCE, "absolute"
    else:
      limit = CI_FRACTION * ref.numbers.get(f"{name}_ci95", float("nan"))
      unit = f"{CI_FRACTION} x its CI"
    text = f"{name} {delta:+.2g}"
    moved.append(text)
    if not abs(delta) <= limit:  # NaN (no CI) counts as outside
      outside.append(f"{text} (allowed {limit:.2g}, {unit})")
  if outside:
    return Comparison("differs", "; ".join(outside))
  return Comparison("within tolerance", ", ".join(moved))


def _same_array(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def headline(kind: str, numbers: dict) -> str:
  """The score and its half-width, as the tables print them ("58.61 ± 1.58 %")."""
  if kind == "classification":
    return f"{100 * numbers['accuracy']:.2f} ± {100 * numbers['accuracy_ci95']:.2f} %"
  return f"MSE {numbers['mse']:.3f} ± {numbers['mse_ci95']:.3f}"
