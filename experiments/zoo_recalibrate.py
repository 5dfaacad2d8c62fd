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
from vampire_jax import backend, metrics
from vampire_jax.runs import kinds, programs, recalibration, run_folder

# What a cell's manifest entry keeps of each summary (beside the raw test it already has).
KEPT = (
  "accuracy", "mse", "mse_median", "nll", "ece", "mce", "pit_ece",
  "interval_90_coverage", "interval_90_width", "num_tasks",
)  # fmt: skip


class CellRecalibration(NamedTuple):
  """One cell's map and its test scored both ways (on the same tasks and draws)."""

  calibration: metrics.Calibration
  raw: dict  # the raw test's summary numbers (with a regressor's 90 % interval)
  recalibrated: dict  # under the map
  per_task: dict  # the raw test's per-task results
  val_per_task: dict  # the validation's, that the map was fitted on


def fit_on_validation(run: vj.Run, problem: vj.Problem, num_tasks: int):
  """`(map, per-task results)` of the run's first `num_tasks` validation tasks, as its loop
  fits it."""
  config = run.config
  mesh = backend.task_mesh_for(config, config.schedule.tasks_per_step)
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
    summary = kinds.summarise(run.kind, per_task, num_bins=run.config.evaluation.num_bins)
    raw = {k: float(v) for k, v in summary.metrics.items() if isinstance(v, (int, float))}
  fields = ("accuracy", "nll", "probabilities", "mse", "predictive_mean_mse", "predictions")
  scored = {k: v for k, v in per_task.items() if k in fields + ("targets", "truth")}
  if run.kind == "regression":
    raw.update(metrics.interval_metrics(scored, run.noise_std))
  summary = recalibration.recalibrated_summary(
    run.kind, calibration, scored, run.config.evaluation.num_bins, run.noise_std
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
      **metrics.recalibration_to_record(result.calibration),
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
  return f"{name}: {metrics.describe_recalibration(result.calibration)}; " + ", ".join(parts)


# -- The numbers recorded in the cell, that `zoo check` compares the manifest's with --------

# recalibration.json's field holding the test as `zoo recalibrate` scored it under the map
# (the manifest's `test_recalibrated` and `test_raw_interval`, which the tables show).
RECORDED_TEST = "zoo_test"
TEST_SECTIONS = ("test_recalibrated", "test_raw_interval")
# recalibration.json's fields that are not the map's (`metrics.recalibration_to_record`).
NOT_THE_MAP = ("format", "kind", "run_id", "step", RECORDED_TEST)


def record_test(cell: Path, fields: dict) -> None:
  """Adds the test scored both ways (`manifest_fields`' test sections) to the cell's
  recalibration.json, as the cell's own record of the numbers the manifest copies."""
  path = Path(cell) / recalibration.RECALIBRATION_FILE
  saved = run_folder.read_json(path)
  saved[RECORDED_TEST] = {k: fields[k] for k in TEST_SECTIONS if k in fields}
  run_folder.write_json(path, saved)


def recorded(cell: Path) -> Optional[dict]:
  """The cell's recalibration.json (None: none, or not a JSON object)."""
  saved = run_folder.read_json(Path(cell) / recalibration.RECALIBRATION_FILE, default=None)
  return saved if isinstance(saved, dict) else None


def numbers_disagree(cell: Path, name: str, entry: dict) -> list[str]:
  """Where the entry's recalibration numbers (its map, its test both ways) are not those its
  cell's recalibration.json records ([]: none). A file written before the test was recorded
  there (`unchecked`) has only its map compared."""
  sections = ("recalibration", *TEST_SECTIONS)
  if not any(entry.get(k) for k in sections):
    return []
  saved = recorded(cell)
  if saved is None:
    return [
      f"zoo/{name}: the manifest holds its recalibrated numbers but the cell has no "
      f"readable {recalibration.RECALIBRATION_FILE}"
    ]
  expected = {
    "recalibration": {k: v for k, v in saved.items() if k not in NOT_THE_MAP},
    **(saved.get(RECORDED_TEST) or {}),
  }
  problems = []
  for section in sections:
    if section != "recalibration" and RECORDED_TEST not in saved:
      continue  # `unchecked`
    have, want = entry.get(section) or {}, expected.get(section) or {}
    for field in sorted((set(have) | set(want)) - {"fitted_on"}):
      if have.get(field) != want.get(field):
        problems.append(
          f"zoo/{name}: the manifest's {section}.{field} {have.get(field)!r} is not its "
          f"{recalibration.RECALIBRATION_FILE}'s {want.get(field)!r}"
        )
  return problems


def unchecked(cell: Path, name: str, entry: dict) -> Optional[str]:
  """A note for a cell whose recalibrated test numbers its recalibration.json does not
  record (recalibrated before they were recorded there), so that `zoo check` cannot check
  them (None: it records them, or the entry has none)."""
  if not any(entry.get(k) for k in TEST_SECTIONS):
    return None
  saved = recorded(cell)
  if saved is None or RECORDED_TEST in saved:
    return None
  return (
    f"note: zoo/{name}'s {recalibration.RECALIBRATION_FILE} does not record its recalibrated "
    "test numbers (written before they were), so they are not checked; `python -m "
    f"experiments.zoo recalibrate --cells {name}` records them"
  )
