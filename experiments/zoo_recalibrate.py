"""A zoo cell recalibrated without retraining: a map fitted on its validation tasks, its test
scored raw and recalibrated (`python -m experiments.zoo recalibrate`, issue 61).

`recalibrate_cell(run, problem, num_val_tasks, num_test_tasks)` fits `vj.recalibrate`'s map
on the run's first validation tasks, as its training loop does after its test: the same
split and keys (`programs.run_keys(config.seed).val`: the tasks and draws its validations
scored), the tested meta-parameters. Then it scores the first test tasks as the loop and
`zoo verify` do (`zoo_verify.score_test_split`), raw and under the map
(`runs.recalibration.recalibrated_summary`), from one evaluation. A classifier's cell that
keeps its test's probabilities (`test_per_task.npz`, every field a temperature needs) is
not run again: its stored per-task results are the test's own (what `zoo verify` checks),
and a temperature needs nothing else. A regressor's file keeps no predictions, so its test
is scored again.
"""

from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

import vampire_jax as vj
from experiments import zoo_verify
from vampire_jax._src.core import backend_defaults
from vampire_jax._src.metrics import recalibration as maps
from vampire_jax._src.runs import kinds, programs, recalibration, run_folder

# What a cell's manifest entry keeps of each summary (beside the raw test it already has).
KEPT = (
  "accuracy", "mse", "mse_median", "nll", "ece", "mce", "pit_ece",
  "interval_90_coverage", "interval_90_width", "num_tasks",
)  # fmt: skip


class CellRecalibration(NamedTuple):
  """One cell's map and its test scored both ways (on the same tasks and draws)."""

  calibration: maps.Calibration
  raw: dict  # the raw test's summary numbers (with a regressor's 90 % interval)
  recalibrated: dict  # under the map
  per_task: dict  # the raw test's per-task results
  val_per_task: dict  # the validation's, that the map was fitted on


def fit_on_validation(run: vj.Run, problem: vj.Problem, num_tasks: int):
  """`(map, per-task results)` of the run's first `num_tasks` validation tasks, as its loop
  fits it."""
  config = run.config
  mesh = backend_defaults.task_mesh_for(config, config.tasks_per_step)
  evaluate = programs.build_evaluator(run.kind, run.noise_std, config, run.learner, mesh)
  meta_params = run.meta_params if mesh is None else vj.replicate(run.meta_params, mesh)
  return recalibration.fit_on_split(
    programs.split_evaluator(problem, evaluate, "val", mesh),
    meta_params,
    programs.run_keys(config.seed).val,
    num_tasks,
    programs.eval_batch_size(config, mesh),
    run.kind,
    run.noise_std,
    "zoo recalibrate",
  )


def recalibrate_cell(
  run: vj.Run,
  problem: vj.Problem,
  num_val_tasks: int,
  num_test_tasks: int,
  on_batch: Optional[Callable[[int, int], None]] = None,
) -> CellRecalibration:
  """The map of `num_val_tasks` validation tasks, and `num_test_tasks` test tasks both ways."""
  if run.calibration is not None:
    raise vj.InputError("zoo recalibrate: pass the raw run (vj.load_run without recalibrated)")
  calibration, val_per_task = fit_on_validation(run, problem, num_val_tasks)
  stored = stored_test(run, num_test_tasks)
  if stored is None:
    per_task, raw = zoo_verify.score_test_split(run, problem, num_test_tasks, on_batch)
  else:
    per_task = stored
    summary = kinds.summarise(run.kind, per_task, num_bins=run.config.num_bins)
    raw = {k: float(v) for k, v in summary.metrics.items() if isinstance(v, (int, float))}
  fields = ("accuracy", "nll", "probabilities", "mse", "predictive_mean_mse", "predictions")
  scored = {k: v for k, v in per_task.items() if k in fields + ("targets", "truth")}
  if run.kind == "regression":
    raw.update(maps.interval_metrics(scored, run.noise_std))
  summary = recalibration.recalibrated_summary(
    run.kind, calibration, scored, run.config.num_bins, run.noise_std
  )
  recalibrated = {k: float(v) for k, v in summary.metrics.items() if isinstance(v, (int, float))}
  return CellRecalibration(calibration, raw, recalibrated, per_task, val_per_task)


STORED_FIELDS = ("accuracy", "nll", "probabilities", "targets")


def stored_test(run: vj.Run, num_tasks: int) -> Optional[dict]:
  """A classifier's first `num_tasks` test results from its `test_per_task.npz`, or None
  (a regressor, or a file without the probabilities or with fewer tasks)."""
  path = Path(run.workdir) / run_folder.PER_TASK_FILE
  if run.kind != "classification" or not path.is_file():
    return None
  with np.load(path) as saved:
    if not all(k in saved.files for k in STORED_FIELDS) or len(saved["nll"]) < num_tasks:
      return None
    return {k: saved[k][:num_tasks] for k in STORED_FIELDS}


def manifest_fields(result: CellRecalibration, num_val_tasks: int) -> dict:
  """What a cell's manifest entry records of its recalibration."""
  return {
    "recalibration": {
      **maps.to_record(result.calibration),
      "fitted_on": f"val: {num_val_tasks} tasks",
    },
    "test_raw_interval": {
      k: result.raw[k] for k in ("interval_90_coverage", "interval_90_width") if k in result.raw
    },
    "test_recalibrated": {k: result.recalibrated[k] for k in KEPT if k in result.recalibrated},
  }


def line(name: str, kind: str, result: CellRecalibration) -> str:
  """One cell's numbers, raw -> recalibrated."""
  names = ["nll", "ece"] + (["interval_90_coverage", "pit_ece"] if kind == "regression" else [])
  parts = [
    f"{n} {result.raw[n]:.4f} -> {result.recalibrated[n]:.4f}"
    for n in names
    if n in result.raw and n in result.recalibrated and np.isfinite(result.raw[n])
  ]
  return f"{name}: {maps.describe(result.calibration)}; " + ", ".join(parts)
