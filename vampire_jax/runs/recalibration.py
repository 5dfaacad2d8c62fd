"""`vj.recalibrate`: a run whose predictive is recalibrated on held-out tasks, and its file.

    run = vj.load_run("runs/regression_cpu_seed0/vampire")
    tasks = vj.draw_tasks(problem, "val", jax.random.key(0), 100)
    recalibrated = vj.recalibrate(run, tasks, jax.random.key(1))
    recalibrated.calibration            # Calibration(method='quantile', value=3.1, ...)
    recalibrated.save()                 # recalibration.json in the run folder
    vj.load_run(run.workdir, recalibrated=True)   # the same run again, recalibrated

The maps and their maths are in `metrics.recalibration`; the tasks are checked, scored and
the map fitted as `vj.fit_recalibration` does for a learner of your own
(`metrics.learner_recalibration`, shared by both routes). A recalibrated run applies its map
in its learner's `predict` (the network's outputs under each weight draw) and in its
likelihood's noise, so `Run.predict`, `predict_draws`, `predictive`,
`predict_function_draws` and the evaluators built from `run.learner` and `run.noise_std`
all score the recalibrated predictive. The adaptation to a task is not changed.

The training loop fits a map on its validation split after the test and reports the
test both ways (`fit_on_split`, `recalibrated_summary`); `experiments.zoo recalibrate`
does the same for a zoo's cells.
"""

import hashlib
from pathlib import Path
from typing import Callable, Optional

import jax
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError, RunFolderError
from vampire_jax._src.core.tasks import Task
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.metrics import learner_recalibration as fitting
from vampire_jax._src.metrics import recalibration as maps
from vampire_jax._src.metrics import quantile_calibration, summary_inputs
from vampire_jax.runs import kinds, programs, run_folder
from vampire_jax.runs.run_folder import checksums

RECALIBRATION_FILE = "recalibration.json"
RECALIBRATION_FORMAT = 1


# -- Fitting on a run's tasks -----------------------------------------------------------------


def recalibrate(run, tasks: Task, key: jax.Array, *, method: Optional[str] = None):
  """A run whose predictive is recalibrated by a map fitted on its predictive of `tasks`.

  The run adapts to each task and predicts its queries as its test did (its
  `num_mc_test` weight draws; task i with key i of `key`'s split, as the evaluators
  split one key), and one parameter is fitted by the NLL of the query targets
  (`metrics.recalibration` has the maths):

  - classification: a temperature T of the predictive p = mean_l softmax(f_l):
    p_T = softmax(log p / T), which keeps each query's arg max;
  - regression, `method="variance_scale"`: a variance scale s of the predictive mixture
    mean_l N(f_l, sigma^2): p_s = mean_l N(m + sqrt(s) (f_l - m), s sigma^2), m the
    draws' mean, so its mean is unchanged and its variance is s times the raw one. The
    likelihood's noise is scaled too, so a point estimate (MAML) is recalibrated as well.
  - regression, `method="quantile"` (Kuleshov et al. 2018): that variance scale, then a
    piecewise-linear monotone map R of the scaled predictive's CDF F_s, through the
    empirical quantiles of the tasks' PIT values F_s(y) (`metrics.quantile_map`): the
    predictive's CDF becomes R(F_s(y)), its density R'(F_s(y)) f_s(y). It needs at
    least 100 query targets (two bins of 50).

  `method` None (the default): the temperature for a classifier; for a regressor the
  quantile map where the tasks hold at least 100 query targets, else the variance scale.
  On the zoo's regression cells the quantile map measured better on the test tasks than
  the variance scale alone, in NLL, interval coverage and ECE (docs/fidelity.md,
  "Recalibration").

  The returned run's `predict`, `predict_draws`, `predictive` and
  `predict_function_draws` apply the map, and so do the evaluators built from its
  `learner` and `noise_std` (sqrt(s) sigma; a quantile map rides on the learner's
  likelihood, `learner.nll.quantile_map`); its `calibration` holds what was fitted,
  and `.save()` writes it beside the run (`vj.load_run(..., recalibrated=True)` reads it).
  A run that is already recalibrated is fitted afresh, from its raw predictive. For a
  learner and meta-parameters of your own (`vj.make_train_step`), `vj.fit_recalibration`
  fits the same map (on `run.learner` and `run.meta_params`, this one).

  Args:
    run: a `vj.Run` (`vj.load_run`).
    tasks: a `vj.Task` batch with a leading task axis, of the run's kind and input shape,
      that the run never trained on (its validation tasks, e.g.
      `vj.draw_tasks(problem, "val", key, 100)`); at least 2 tasks.
    key: PRNG key of the adaptation and prediction draws; the same key gives the same map.
    method: None, 'temperature' (classification), 'quantile' or 'variance_scale'
      (regression).

  Returns:
    A new `vj.Run`; `run` is unchanged.

  Raises:
    InputError: `run` is not a `vj.Run`; tasks that are not a `vj.Task` batch of the run's
      input shape and kind (integer labels for a classifier, `[tasks, n, outputs]` float
      targets for a regressor), fewer than 2 tasks, non-finite values; tasks whose
      predictive is not finite (naming them); a method not of the run's kind, a quantile map of fewer than 100 query targets; or a predictive
      whose NLL has no minimum inside the range searched (T in [0.01, 100], s in
      [1e-4, 1e4]).
  """
  where = "vj.recalibrate"
  if not hasattr(run, "_with_calibration"):
    raise checks.fail(where, "run", "a vj.Run (vj.load_run(workdir))", checks.describe(run))
  checks.prng_key(where, "key", key)
  maps.check_method(where, run.kind, method)
  raw = run._uncalibrated
  with run._precision():
    num_tasks, _ = fitting.check_tasks(where, tasks, run.kind, run.input_shape, run.num_outputs)
    per_task = evaluate_tasks(raw, tasks, key, num_tasks)
  calibration = fitting.fit_per_task(run.kind, per_task, raw.noise_std, where, method)
  return run._with_calibration(calibration)


def evaluate_tasks(run, tasks: Task, key: jax.Array, num_tasks: int) -> dict:
  """`run`'s evaluator's per-task results on `tasks` (numpy), with `targets`.

  In batches of the run's `eval_batch_tasks`; task i with key i of `key`'s split, so a
  task's results do not depend on the batch.
  """
  batch = programs.eval_batch_size(run.config)
  return fitting.evaluate_tasks(run._evaluator, run.meta_params, tasks, key, num_tasks, batch)


def fit_on_split(
  evaluate_indices: Callable,
  meta_params,
  key: jax.Array,
  num_tasks: int,
  batch_tasks: int,
  kind: str,
  noise_std: Optional[float],
  where: str,
) -> tuple[maps.Calibration, dict]:
  """`(map, per-task results)` of the first `num_tasks` tasks of a split (`evaluate_split`).

  Raises:
    InputError: too few tasks, non-finite results on some task, or no minimum in range.
  """
  per_task = evaluation.evaluate_split(
    evaluate_indices, meta_params, key, num_tasks, batch_tasks, refuse_non_finite=False
  )
  return fitting.fit_per_task(kind, per_task, noise_std, where, None), per_task


# -- Scoring a split under a map ------------------------------------------------------------


def recalibrated_summary(
  kind: str,
  calibration: maps.Calibration,
  per_task: dict,
  num_bins: int,
  noise_std: Optional[float],
) -> evaluation.Summary:
  """The summary of a split under `calibration`, from its raw per-task results.

  As `kinds.summarise` scores a run's test, of `recalibrated_per_task`'s results.
  Regression: the NLL, PIT calibration and variance split under the noise sqrt(s) sigma;
  the paper's quantile calibration (`ece`, `mce`, given the truth) of the recalibrated
  draws m + sqrt(s) (f_l - m), against the data's own noise sigma, as the paper computes
  it of raw draws; and the central 90 % interval's coverage and mean width. Under a
  quantile map R the draws are no longer the predictive's quantiles: the NLL is that of
  its density, the PIT values are R(F_s(y)), the interval's ends F_s^-1(R^-1(0.05)) and
  F_s^-1(R^-1(0.95)), and the paper's calibration is taken of the recalibrated
  predictive's own p-quantiles F_s^-1(R^-1(p)) (`predictive_quantile_calibration`).
  """
  scaled_noise = maps.calibrated_noise_std(calibration, noise_std)
  recalibrated = maps.recalibrated_per_task(calibration, per_task, noise_std)
  qmap = calibration.quantile_map
  # The summary's own checks recompute a Gaussian mixture's NLL: give it that one, and
  # the map's NLL after.
  checked = recalibrated
  if qmap is not None:
    checked = {
      **recalibrated,
      **summary_inputs.regression_scores(
        recalibrated["predictions"], recalibrated["targets"], scaled_noise
      ),
    }
  summary = kinds.summarise(kind, checked, num_bins=num_bins, noise_std=scaled_noise)
  if kind != "regression":
    return summary
  if qmap is not None:
    summary = evaluation.with_nll(summary.metrics, summary.calibration, recalibrated)
    pit = maps.predictive_pit(
      recalibrated["predictions"], recalibrated["targets"], scaled_noise, qmap
    )
    pit_curve = quantile_calibration.pit_calibration(pit)
    summary.metrics.update(pit_ece=pit_curve.ece, pit_mce=pit_curve.mce)
    summary.calibration["pit_calibration"] = pit_curve
  if "truth" in recalibrated:
    truth = np.asarray(recalibrated["truth"])[..., 0]
    predictions = recalibrated["predictions"][..., 0]
    if qmap is None:
      paper = quantile_calibration.paper_quantile_calibration(predictions, truth, noise_std)
    else:
      paper = quantile_calibration.predictive_quantile_calibration(
        predictions, truth, scaled_noise, noise_std, qmap.inverse
      )
    summary.metrics.update(ece=paper.ece, mce=paper.mce)
    summary.calibration["quantile_calibration"] = paper
  summary.metrics.update(maps.interval_metrics(recalibrated, scaled_noise, qmap))
  return summary


# -- recalibration.json ----------------------------------------------------------------------


def write_calibration(
  workdir: Path,
  calibration: maps.Calibration,
  record: dict,
  step: Optional[int],
  *,
  recorded_again: bool = False,
) -> Path:
  """`recalibration.json` in `workdir`, atomically: the map, the run's id and the step fitted.

  Raises:
    RunFolderError: `workdir` holds another run (another `run_id`), whose own map this
      would replace; or it is a zoo's cell whose manifest records no such file (the cell
      would no longer load), unless `recorded_again`: the caller records the cell's files
      in the manifest again (`experiments.zoo recalibrate`).
  """
  path = Path(workdir) / RECALIBRATION_FILE
  value = {
    "format": RECALIBRATION_FORMAT,
    "kind": record["kind"],
    **maps.to_record(calibration),
    "run_id": record.get("run_id"),
    "step": step,
  }
  _check_own_folder(Path(workdir), record.get("run_id"))
  if not recorded_again:
    _check_not_a_changed_cell(Path(workdir), run_folder.json_bytes(value))
  run_folder.write_json(path, value)
  return path


def _check_own_folder(workdir: Path, run_id: Optional[str]) -> None:
  """Refuses (RunFolderError) a folder that holds another run than `run_id`'s."""
  theirs = run_folder.folder_run_id(workdir)
  if theirs and run_id and theirs != run_id:
    raise RunFolderError(
      f"Run.save: {workdir} holds another run (run_id {theirs[:8]}) than this one (run_id "
      f"{run_id[:8]}), and its own {RECALIBRATION_FILE} would be replaced; save into an "
      "empty folder or the run's own folder"
    )


def _check_not_a_changed_cell(workdir: Path, text: bytes) -> None:
  """Refuses (RunFolderError) a zoo's cell whose manifest does not record `text` as the file."""
  files = checksums.recorded_files(workdir)
  if files is None:
    return
  recorded = files.get(RECALIBRATION_FILE)
  if isinstance(recorded, dict) and recorded.get("sha256") == hashlib.sha256(text).hexdigest():
    return  # the very file recorded
  manifest = workdir.resolve().parent / checksums.MANIFEST
  raise RunFolderError(
    f"Run.save: {workdir} is a cell of a zoo: {manifest} records its files' sha256, and a "
    f"{RECALIBRATION_FILE} it does not record would leave the cell unloadable; recalibrate "
    f"the cell with the clone's python -m experiments.zoo recalibrate, naming the cell "
    f"({workdir.resolve().name}; it records the file in the manifest), or save into a copy of the folder outside "
    "the zoo (not checked) and load that copy with recalibrated=True"
  )


def read_calibration(workdir: Path, record: dict) -> tuple[maps.Calibration, Optional[int]]:
  """`(map, step it was fitted on)` of `workdir/recalibration.json`, checked against the record.

  Read before the checkpoint, so that a missing or foreign file is refused at once;
  `check_fitted_step` checks the step once the meta-parameters are restored.

  Raises:
    RunFolderError: no such file (saying how to make one), a damaged one, or one of
      another run or kind.
  """
  path = Path(workdir) / RECALIBRATION_FILE
  where = f"load_run(recalibrated=True): {path}"
  if not path.is_file() and checksums.recorded_files(workdir) is not None:
    raise RunFolderError(
      f"load_run(recalibrated=True): {workdir} has no {RECALIBRATION_FILE}; it is a cell of "
      f"a zoo ({Path(workdir).resolve().parent / checksums.MANIFEST} records its files), so "
      "make one with the clone's python -m experiments.zoo recalibrate, naming the cell "
      f"({Path(workdir).resolve().name}; it records the file there), or load it raw"
    )
  if not path.is_file():
    raise RunFolderError(
      f"load_run(recalibrated=True): {workdir} has no {RECALIBRATION_FILE}; make one with "
      "vj.recalibrate(run, validation_tasks, key).save() (a run trained by this version "
      "writes it after its test), or load it raw"
    )
  saved = run_folder.read_json(path, default=None)
  if not isinstance(saved, dict) or saved.get("format") != RECALIBRATION_FORMAT:
    raise RunFolderError(f"{where} is damaged or of another format; fit and save it again")
  try:
    calibration = maps.from_record(saved, where)
  except InputError as error:
    raise RunFolderError(str(error)) from None
  if calibration.method not in maps.METHODS[record["kind"]]:
    raise RunFolderError(
      f"{where} holds a {calibration.method} map, which does not fit a {record['kind']} run "
      f"(its maps: {', '.join(maps.METHODS[record['kind']])}); fit and save it again"
    )
  if saved.get("kind") != record["kind"]:
    raise RunFolderError(
      f"{where} was fitted for a {saved.get('kind')} run, not a {record['kind']} run; fit "
      "and save it again"
    )
  if saved.get("run_id") and record.get("run_id") and saved["run_id"] != record["run_id"]:
    raise RunFolderError(f"{where} was fitted for another run (its run_id); fit and save it again")
  return calibration, saved.get("step")


def check_fitted_step(workdir: Path, fitted_step: Optional[int], step: Optional[int]) -> None:
  """Refuses (RunFolderError) a map fitted on the meta-parameters of another step than loaded."""
  if fitted_step is not None and step is not None and fitted_step != step:
    raise RunFolderError(
      f"load_run(recalibrated=True): {Path(workdir) / RECALIBRATION_FILE} was fitted on the "
      f"meta-parameters of step {fitted_step}, but those of step {step} are loaded; fit and "
      "save it again"
    )


def calibration_record(calibration: maps.Calibration, split: str) -> dict:
  """`results.json`'s `recalibration`: the map and where it was fitted."""
  return {**maps.to_record(calibration), "fitted_on": split}


# -- After a run's test ------------------------------------------------------------------------


def after_test(session, record: dict, meta_params, step: int, test_per_task: dict) -> dict:
  """The loop's recalibration: a map fitted on the validation split, the test scored with it.

  The map is fitted on the run's `num_val_tasks` validation tasks (the tasks and draws its
  validations scored) under the tested meta-parameters, written to `recalibration.json`
  (`vj.load_run(..., recalibrated=True)`), and the test's per-task results are scored
  again under it, without running the network again.

  Args:
    session: the loop's `Session`; `record` the run record (`run.json`).
    meta_params: the tested meta-parameters; `step` their step.
    test_per_task: the test's per-task results (`evaluation.evaluate_split`).

  Returns:
    `results.json`'s fields: `recalibration` (the map, or `{"skipped": why}` when none can
    be fitted: one validation task, or non-finite results) and `test_recalibrated` (the
    test's summary under it, with a regressor's 90 % interval coverage and width; also
    under `recalibration`, the raw test's, to compare).
  """
  problem, config = session.problem, session.config
  if problem.kind not in summary_inputs.FIELDS:  # a kind of the user's own: no map is defined
    why = f"no recalibration is defined for the kind {problem.kind!r}"
    session.progress.warn(f"no recalibration: {why}")
    return {"recalibration": {"skipped": why}}
  where = "recalibration on the validation tasks"
  try:
    calibration, _ = fit_on_split(
      session.evaluate_val,
      meta_params,
      session.val_key,
      config.evaluation.num_val_tasks,
      programs.eval_batch_size(config, session.mesh),
      problem.kind,
      problem.noise_std,
      where,
    )
  except InputError as error:
    session.progress.warn(f"no recalibration: {error}")
    return {"recalibration": {"skipped": str(error)}}
  fields = summary_inputs.FIELDS[problem.kind] + ("targets", "truth")
  per_task = {name: value for name, value in test_per_task.items() if name in fields}
  summary = recalibrated_summary(
    problem.kind, calibration, per_task, config.evaluation.num_bins, problem.noise_std
  )
  fitted = calibration_record(calibration, f"val: {config.evaluation.num_val_tasks} tasks")
  if problem.kind == "regression":
    fitted["raw_test"] = maps.interval_metrics(per_task, problem.noise_std)
  if session.is_main:
    write_calibration(session.workdir, calibration, record, step)
  line = kinds.get(problem.kind).summary_line(summary.metrics)
  coverage = summary.metrics.get("interval_90_coverage")
  coverage_part = "" if coverage is None else f"; 90 % interval coverage {100 * coverage:.1f} %"
  session.progress.message(f"recalibrated ({maps.describe(calibration)}): {line}{coverage_part}")
  return {"recalibration": fitted, "test_recalibrated": summary.metrics}
