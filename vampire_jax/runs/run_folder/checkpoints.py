"""Orbax checkpoints of a run folder: the log window a checkpoint carries, and
`RunCheckpoints` (save, restore with fallback, incomplete steps skipped, `best/`). Reading a
checkpoint in this process (restore targets, the environment's faults) is `reading`."""

import contextlib
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from vampire_jax.runs.run_folder.orbax_module import ocp

from vampire_jax._src.core.errors import RunFolderError, StorageError
from vampire_jax.runs.run_folder.reading import _first_line, environment_cause, restore_target
from vampire_jax.runs.run_folder.record import (
  _partial_steps,
  _step_folders,
  _step_metadata,
  folder_run_id,
  with_run_id,
)
from vampire_jax.runs.run_folder.restore_noise import drop_restore_noise, quiet_restore
from vampire_jax.runs.run_folder.storage import (
  BEST_SCORE_FILE,
  DAMAGED_FOLDER,
  SET_ASIDE_FOLDER,
  TRAIN_TIME_FILE,
  read_json,
  storage_errno,
  storage_error,
  write_json,
  writing,
)

PyTree = Any

# -- Checkpoints ----------------------------------------------------------------------------


def _manager(folder: Path, max_to_keep: int, create: bool) -> "ocp.CheckpointManager":
  return ocp.CheckpointManager(
    folder.absolute(),
    options=ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=create, cleanup_tmp_directories=create
    ),
  )


def _encode_window(window: list[dict]) -> dict:
  """The metrics of the calls since the last log, as JSON: `{name: {"dtype", "values"}}`.

  A checkpoint carries them (float32 values are exact as JSON numbers), so
  that the row a resumed run logs next averages the same steps as the
  uninterrupted run's.
  """
  if not window:
    return {}
  return {
    name: {
      "dtype": str(np.asarray(window[0][name]).dtype),
      "values": np.concatenate([np.ravel(m[name]) for m in window]).tolist(),
    }
    for name in window[0]
  }


def _decode_window(encoded: dict) -> list[dict]:
  """`_encode_window`'s inverse: a window of one entry holding every value, or []."""
  if not encoded:
    return []
  return [{name: np.asarray(v["values"], v["dtype"]) for name, v in encoded.items()}]


class _FailedSave(contextlib.AbstractContextManager):
  """A save that failed for want of space (or permission) as a one-line StorageError.

  Orbax saves in the background, so an error shows when a later call waits:
  the failed step is the one left as a temporary folder (else the last
  handed over), and the intact one is the newest finished step before it.
  """

  def __init__(self, checkpoints: "RunCheckpoints"):
    self._checkpoints = checkpoints

  def __exit__(self, kind, error, traceback):
    if error is None or not isinstance(error, Exception) or isinstance(error, StorageError):
      return False
    if storage_errno(error) is None:
      return False
    with contextlib.suppress(Exception):  # let the saves still in flight finish (or fail)
      self._checkpoints._latest.wait_until_finished()
    folder = self._checkpoints.workdir / "checkpoints"
    unfinished = sorted(
      int(p.name.split(".")[0])
      for p in folder.glob("*.orbax-checkpoint-tmp*")
      if p.name.split(".")[0].isdigit()
    )
    failed = unfinished[-1] if unfinished else self._checkpoints._saving
    intact = [step for step in _step_folders(folder) if failed is None or step < failed]
    hint = f"checkpoint {intact[0]} is intact" if intact else "no checkpoint was complete yet"
    target = folder / str(failed) if failed is not None else folder
    raise storage_error(error, target, f"{hint}; free space and run again") from error


def _quiet_stderr_print(message: str) -> None:
  warnings.warn(message, stacklevel=3)


class RunCheckpoints:
  """The checkpoints of one run folder: the latest training states and the best meta-parameters.

  Orbax writes each checkpoint to a temporary folder and renames it when
  complete, so a run killed at any moment resumes from its last whole save.
  Each checkpoint and `best/` carries the run's id and its step; one of
  another run is refused (see the module docstring, "A run reads only what
  it wrote").

  Args:
    workdir: the run folder.
    create: create the folders (training); False only reads (loading a run).
    record: the run record each checkpoint carries (training); its `run_id`
      (`with_run_id`) is the run's identity.
    print_fn: where one-line notes go (a checkpoint skipped, a damaged file);
      default: a warning.

  Raises:
    RunFolderError: `best/` belongs to another run, or carries another step
      than its folder's.
  """

  def __init__(
    self,
    workdir: str | os.PathLike,
    *,
    create: bool = True,
    record: Optional[dict] = None,
    print_fn: Optional[Callable[[str], None]] = None,
  ):
    self.workdir = Path(workdir)
    self._create = create
    self._record = None if record is None else with_run_id(self.workdir, record)
    self._run_id = (
      self._record["run_id"] if self._record is not None else folder_run_id(self.workdir)
    )
    self._print = print_fn or _quiet_stderr_print
    drop_restore_noise()  # a restore that fails leaves orbax's and TensorStore's noise behind
    for name in ("checkpoints", "best"):  # before orbax lists the steps
      self._skip_partial(name)
    best_steps = _step_folders(self.workdir / "best")
    if best_steps:
      self._check_own(self.workdir / "best", best_steps[0], "best")
      if create and not _step_folders(self.workdir / "checkpoints"):
        self._set_aside_best(best_steps[0], 0)
    with writing(self.workdir / "checkpoints"):
      self._latest = _manager(self.workdir / "checkpoints", 2, create)
      self._best = _manager(self.workdir / "best", 1, create)
    self._best_path = self.workdir / BEST_SCORE_FILE
    self._time_path = self.workdir / TRAIN_TIME_FILE
    times = read_json(self._time_path, print_fn=self._print, default={})
    self._train_seconds = times if isinstance(times, dict) else {}
    self._saving: Optional[int] = None  # the step last handed to orbax

  def latest_step(self) -> Optional[int]:
    """The step of the newest complete training-state checkpoint, or None."""
    steps = _step_folders(self.workdir / "checkpoints")
    return steps[0] if steps else None

  def _skip_partial(self, name: str) -> None:
    """Step folders of `name` (`checkpoints` or `best`) without their `default/` item.

    An empty `checkpoints/400/`, or one a copy or sync left without its item,
    was never a checkpoint: it is skipped, so the newest complete one is used
    (as when a checkpoint's files are damaged), and said in a line. Training
    moves it to `damaged/`, so that its step can be saved again; a reader
    leaves it and names only one newer than every complete step (an older one
    changes nothing, and may be a step the writer is deleting).
    """
    import jax

    folder = self.workdir / name
    partial = _partial_steps(folder)
    if not partial:
      return
    complete = _step_folders(folder)
    using = f"using step {complete[0]}, the newest complete one" if complete else "none is complete"
    kind = "checkpoint" if name == "checkpoints" else "best"

    def incomplete(step: int) -> str:
      return (
        f"{folder / str(step)} is incomplete (no default/ folder: an empty folder, or a copy or "
        "sync cut short), not a checkpoint"
      )

    if not self._create:
      for step in partial:
        if not complete or step > complete[0]:
          self._print(f"{incomplete(step)}; skipped it, {using}")
      return
    if jax.process_index() != 0:  # the first process moves them (the others share the folder)
      return
    aside = self.workdir / DAMAGED_FOLDER
    with writing(aside):
      aside.mkdir(exist_ok=True)
      for step in partial:
        target = aside / f"{kind}_{step}_{int(time.time())}"
        shutil.move(str(folder / str(step)), str(target))
        self._print(f"{incomplete(step)}; moved it to {target}, {using}")

  def _check_own(self, folder: Path, step: int, what: str) -> None:
    """Refuses, in one line, a checkpoint of another run or one whose step is not its folder's."""
    carried = _step_metadata(folder, step)
    run_id = carried.get("run_id") or (carried.get("record") or {}).get("run_id")
    if run_id and self._run_id and run_id != self._run_id:
      raise RunFolderError(
        f"{folder / str(step)} was written by another run (run {run_id[:8]}; this folder's "
        f"run is {self._run_id[:8]}): a run reads only its own {what}; remove it, or use "
        "another workdir",
        fields=("workdir",),
      )
    carried_step = carried.get("step")
    if carried_step is not None and carried_step != step:
      raise RunFolderError(
        f"{folder / str(step)} carries the state of step {carried_step}, not {step}: it was "
        f"moved or renamed; remove it, or use another workdir",
        fields=("workdir",),
      )

  def _set_aside_best(self, best_step: int, start_step: int) -> None:
    """Moves `best/` (ahead of the state training starts from) to `set_aside/`, with a line.

    Only the first process of a job moves it (the others share the folder).
    """
    import jax

    if jax.process_index() != 0:
      return
    aside = self.workdir / SET_ASIDE_FOLDER
    target = aside / f"best_{best_step}_{int(time.time())}"
    with writing(aside):
      aside.mkdir(exist_ok=True)
      shutil.move(str(self.workdir / "best"), str(target))
      score = self.workdir / BEST_SCORE_FILE
      if score.exists():
        shutil.move(str(score), str(target / BEST_SCORE_FILE))
    self._print(
      f"{self.workdir / 'best'} holds step {best_step}, ahead of the state this run starts "
      f"from (step {start_step}): not this history's best, so it was set aside in {target}; "
      "the validations from here on choose the best again"
    )

  def has_step(self, step: int) -> bool:
    """Whether a checkpoint of `step` is saved (or being saved): orbax saves a step once."""
    return step in self._latest.all_steps()

  def _guard(self):
    """Turns a failed save into a StorageError naming the step and the newest intact one."""
    return _FailedSave(self)

  def restore_latest(self, template: PyTree) -> PyTree:
    """The newest checkpoint that restores, with `template`'s structure, shapes and shardings.

    A checkpoint that fails is reported in one line and the next older one
    is tried; once one restores, the newer damaged ones are moved to
    `workdir/damaged/` (when training), so that their steps can be saved again.

    Raises:
      RunFolderError: no checkpoint restores (or there is none).
    """
    return self._restore_latest(template)[0]

  def _restore_latest(self, template: PyTree) -> tuple[PyTree, int]:
    """`restore_latest`'s state and the step of the checkpoint it came from."""
    failed = []
    for step in _step_folders(self.workdir / "checkpoints"):
      self._check_own(self.workdir / "checkpoints", step, "checkpoints")
      args = ocp.args.StandardRestore(restore_target(template))
      state, error = quiet_restore(lambda: self._latest.restore(step, args=args))
      if error is not None:
        if not self._create and not (self.workdir / "checkpoints" / str(step)).exists():
          # A training process rotated it out while we read: read its newer ones instead.
          self._latest.reload()
          return self._restore_latest(template)
        self._refuse_if_environment(error, self.workdir / "checkpoints", step)
        failed.append(step)
        self._print(
          f"checkpoint {step} in {self.workdir / 'checkpoints'} does not restore "
          f"({_first_line(error)}); trying the next older one"
        )
        continue
      if failed and self._create:
        self._move_aside(failed)
      if self._create:
        best = next(iter(_step_folders(self.workdir / "best")), None)
        if best is not None and best > step:
          self._best.close()
          self._set_aside_best(best, step)
          self._best = _manager(self.workdir / "best", 1, True)
      return state, step
    tried = f" (tried steps {', '.join(map(str, failed))})" if failed else ""
    raise RunFolderError(
      f"no checkpoint in {self.workdir / 'checkpoints'} restores{tried}: their files look "
      f"damaged (each error is in a line above), so {self.workdir} cannot be resumed or "
      "loaded; train into another workdir",
      fields=("workdir",),
    )

  def _refuse_if_environment(self, error: BaseException, folder: Path, step: int) -> None:
    """Raises RunFolderError, leaving the folder as it is, if the loading process caused `error`."""
    cause = environment_cause(error)
    if cause is not None:
      raise RunFolderError(
        f"{folder / str(step)} did not restore in this process: {cause}. The run folder "
        f"{self.workdir} is intact; nothing in it was moved or changed"
      ) from error

  def _move_aside(self, steps: list[int]) -> None:
    aside = self.workdir / DAMAGED_FOLDER
    with writing(aside):
      aside.mkdir(exist_ok=True)
      for step in steps:
        target = aside / f"checkpoint_{step}_{int(time.time())}"
        shutil.move(str(self.workdir / "checkpoints" / str(step)), str(target))
        self._print(f"moved the damaged checkpoint {step} to {target}")
    self._latest.reload()

  def save(
    self,
    step: int,
    state: PyTree,
    train_seconds: float,
    *,
    write_files: bool,
    log_window: Optional[list] = None,
  ) -> None:
    """Saves the training state of `step`, and the training time up to it.

    `log_window` holds the training metrics of the calls since the last logged
    row (the loop's `[{name: array}]`); the checkpoint carries them as JSON, so
    that a run resumed from `step` logs its next row over the same steps as the
    uninterrupted run. Encoded only here, when a checkpoint is written.

    Raises:
      StorageError: the disk is full (or the folder unwritable); the message
        names the checkpoint that is intact.
    """
    with self._guard():
      self._latest.check_for_errors()  # an earlier save that failed in the background
      self._saving = step
      self._latest.save(
        step,
        args=ocp.args.StandardSave(state),
        force=True,
        custom_metadata={
          "record": self._record,
          "train_seconds": train_seconds,
          "run_id": self._run_id,
          "step": step,
          "log_window": _encode_window(log_window or []),
        },
      )
    self._train_seconds[str(step)] = train_seconds
    if write_files:
      write_json(self._time_path, self._train_seconds)

  def train_seconds(self, step: int) -> float:
    """Training seconds up to the checkpoint of `step`: what it carries, else
    `train_time.json`, else 0."""
    seconds = _step_metadata(self.workdir / "checkpoints", step).get("train_seconds")
    if seconds is None:
      seconds = self._train_seconds.get(str(step), 0.0)
    try:
      return float(seconds)
    except (TypeError, ValueError):
      return 0.0

  def log_window(self, step: int) -> list[dict]:
    """The training metrics since the last logged row, as the checkpoint of `step` carries
    them (`[]`: none, or a checkpoint written before they were carried)."""
    window = _step_metadata(self.workdir / "checkpoints", step).get("log_window")
    return _decode_window(window) if isinstance(window, dict) else []

  def best_record(self) -> Optional[dict]:
    """`{"step", "score", "metric"}` of the best validation so far, or None.

    What `best/` itself carries; `best_score.json` (a copy, for people) only
    where `best/` carries none, and only if it names `best/`'s step.
    """
    steps = _step_folders(self.workdir / "best")
    if not steps:
      return None
    carried = _step_metadata(self.workdir / "best", steps[0])
    if "score" in carried:
      return {k: v for k, v in carried.items() if k not in ("run_id",)}
    record = read_json(self._best_path, print_fn=self._print)
    if isinstance(record, dict) and "score" in record and record.get("step") == steps[0]:
      return record
    return None

  def save_best(self, meta_params: PyTree, record: dict, *, write_files: bool) -> None:
    """Keeps `meta_params` as the best, with its validation record."""
    target = self.workdir / "best" / str(record["step"])
    with writing(target, "the previous best is intact; free space and run again"):
      self._best.save(
        record["step"],
        args=ocp.args.StandardSave(meta_params),
        force=True,
        custom_metadata=dict(record, run_id=self._run_id),
      )
      self._best.wait_until_finished()
    if write_files:
      write_json(self._best_path, record)

  def restore_best(self, template: PyTree) -> Optional[PyTree]:
    """The best meta-parameters; None if no validation has saved any, or (said in a line)
    if `best/` does not restore."""
    best = self._restore_best(template)
    return None if best is None else best[0]

  def _restore_best(self, template: PyTree) -> Optional[tuple[PyTree, int]]:
    """`restore_best`'s meta-parameters and their step, or None."""

    def newest() -> Optional[int]:
      steps = _step_folders(self.workdir / "best")
      return steps[0] if steps else None

    for _ in range(3):  # a writer may replace best/ while it is read: then read the new one
      step = newest()
      if step is None:
        return None
      self._check_own(self.workdir / "best", step, "best")
      args = ocp.args.StandardRestore(restore_target(template))
      params, error = quiet_restore(lambda: self._best.restore(step, args=args))
      if error is None:
        return params, step
      self._refuse_if_environment(error, self.workdir / "best", step)
      self._best.reload()
      if newest() != step:
        continue
      self._print(
        f"{self.workdir / 'best'} does not restore ({_first_line(error)}); using the "
        "latest checkpoint instead"
      )
      return None
    return None

  def restore_meta_params(
    self, template_state: PyTree, which: str = "best"
  ) -> tuple[PyTree, int, str]:
    """The meta-parameters a run tests: `which` 'best' (by validation) or 'final'.

    'best' falls back to the latest state's that restores when no best was
    kept (or `best/` is damaged); 'final' is the latest state's.

    Args:
      template_state: a `MetaState` of the run's structure.
      which: the run's `test_parameters`.

    Returns:
      `(meta_params, step, source)`: the step whose meta-parameters they are,
      and where they came from ('best/' or 'checkpoints/').

    Raises:
      RunFolderError: nothing restores (or the folder holds no checkpoint).
    """
    best = self._restore_best(template_state.meta_params) if which == "best" else None
    if best is not None:
      return best[0], best[1], "best/"
    if self.latest_step() is None:
      raise RunFolderError(
        f"no checkpoint in {self.workdir} (expected best/ or checkpoints/ from a training run)"
      )
    state, step = self._restore_latest(template_state)
    return state.meta_params, step, "checkpoints/"

  def wait(self) -> None:
    """Blocks until every save in flight is written.

    Raises:
      StorageError: a save failed for want of space (or permission).
    """
    with self._guard():
      self._latest.wait_until_finished()
      self._latest.check_for_errors()
    self._best.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      with contextlib.suppress(Exception):
        self._latest.close()
      with contextlib.suppress(Exception):
        self._best.close()
