"""The run record (`run.json`): what a run is, its id, the checks that a resumed run is
the same run, and the results written at its end."""

import json
import os
import re
import subprocess
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from vampire_jax._src import deprecations
from vampire_jax._src.core import models
from vampire_jax._src.core.errors import ConfigError, InputError, RunFolderError, StorageError
from vampire_jax.runs import config_records
from vampire_jax.runs import experiment_configs as configs
from vampire_jax.runs import run_config as config_lib
from vampire_jax.runs.run_folder import checksums
from vampire_jax.runs.run_folder.storage import (
  CONFIG_FILE,
  PER_TASK_FILE,
  RESULTS_FILE,
  RUN_RECORD,
  RUN_RECORD_FORMAT,
  _jsonable,
  check_writable,
  read_json,
  save_npz,
  write_json,
  writing,
)

PyTree = Any

# -- The run record ------------------------------------------------------------------------


def config_class_name(config) -> str:
  cls = type(config)
  return f"{cls.__module__}.{cls.__qualname__}"


def x64_enabled() -> bool:
  """Whether this process (or the `jax.enable_x64` context it is in) computes in 64 bits."""
  import jax

  return bool(jax.config.jax_enable_x64)


def recorded_x64(record: dict) -> bool:
  """Whether the run of `record` trained with `JAX_ENABLE_X64` on; records written before
  it was recorded (issue 49) are of runs in float32, the default."""
  return bool(record.get("x64", False))


def run_record(problem, config) -> dict:
  """What `run.json` holds: enough to rebuild the trained model without the data.

  `x64`: whether JAX computed in 64 bits (`JAX_ENABLE_X64`): the random task
  streams and the precision depend on it, so a resumed run must have the same.
  """
  return {
    "format": RUN_RECORD_FORMAT,
    "config_class": config_class_name(config),
    "config": config_records.to_record(config),
    "model": models.module_spec(problem.model),
    "input_shape": list(problem.input_shape),
    "kind": problem.kind,
    "noise_std": problem.noise_std,
    "data": problem.data_info,
    "x64": x64_enabled(),
  }


_WARNED_SCRIPT_CLASSES: set[str] = set()  # warned of once per process


def check_model_recordable(model) -> None:
  """Refuses a network whose run could never be loaded; warns of one defined in a script.

  A run folder names the network's class by its import path (`run.json`). A
  class defined inside a function has none, nor a field that is not a JSON
  value: refused before anything is made. A class of the script being run
  (`__main__`) is found again only by a script that defines it, so training
  warns once that `vj.load_run(workdir, model=TheClass)` loads it elsewhere.

  Raises:
    InputError: `models.unloadable_reason` names why it could never be loaded.
  """
  reason = models.unloadable_reason(model)
  if reason is not None:
    raise InputError(
      f"train_and_evaluate: problem.model cannot be recorded to load again: {reason}"
    )
  cls = type(model)
  if cls.__module__ == "__main__" and cls.__qualname__ not in _WARNED_SCRIPT_CLASSES:
    _WARNED_SCRIPT_CLASSES.add(cls.__qualname__)
    warnings.warn(
      f"train_and_evaluate: problem.model's class {cls.__qualname__} is defined in the script "
      "being run (__main__), so vj.load_run finds it only from a script that defines it again; "
      f"elsewhere load the run with vj.load_run(workdir, model={cls.__qualname__}), or move "
      f"{cls.__qualname__} into a module that both import",
      stacklevel=3,
    )


# Orbax names a step's folder by the step in decimal digits, without leading zeros.
_STEP_NAME = re.compile(r"0|[1-9][0-9]*")
# A step folder holds its tree in `default/` (`ocp.args.StandardSave` of one item).
_STEP_ITEM = "default"


def _step_names(folder: Path) -> list[Path]:
  """The folders of `folder` named as orbax names a step (others are not checkpoints)."""
  if not folder.is_dir():
    return []
  return [p for p in folder.iterdir() if _STEP_NAME.fullmatch(p.name) and p.is_dir()]


def _step_folders(folder: Path) -> list[int]:
  """The steps of the complete orbax checkpoints in `folder`, newest first.

  A step folder without its `default/` item (an empty one, a copy or sync cut
  short) is not a checkpoint (`_partial_steps`): orbax takes the layout of
  the first step it opens for all, so one such folder would make every
  intact checkpoint fail to restore.
  """
  return sorted(
    (int(p.name) for p in _step_names(folder) if (p / _STEP_ITEM).is_dir()), reverse=True
  )


def _partial_steps(folder: Path) -> list[int]:
  """The step folders of `folder` without their `default/` item (never complete), newest first."""
  return sorted(
    (int(p.name) for p in _step_names(folder) if not (p / _STEP_ITEM).is_dir()), reverse=True
  )


def _step_metadata(folder: Path, step: int) -> dict:
  """The custom metadata saved with an orbax step (`{}` if none or unreadable)."""
  # Orbax keeps a step's metadata, ours included, in `<step>/_CHECKPOINT_METADATA`.
  metadata = read_json(folder / str(step) / "_CHECKPOINT_METADATA", default={})
  custom = metadata.get("custom_metadata") if isinstance(metadata, dict) else None
  return custom if isinstance(custom, dict) else {}


def checkpointed_record(workdir: os.PathLike | str) -> Optional[dict]:
  """The run record carried by the newest checkpoint that has one, or None."""
  folder = Path(workdir) / "checkpoints"
  for step in _step_folders(folder):
    record = _step_metadata(folder, step).get("record")
    if record:
      return record
  return None


# What a resumed run may change is in the config's resumable fields; the rest of a record
# is what the checkpoints were trained with.
_RECORDED_FACTS = ("config_class", "model", "kind", "input_shape", "noise_std", "run_id", "x64")


def _current_model_spec(spec) -> str:
  if isinstance(spec, dict) and isinstance(spec.get("class"), str):
    spec = dict(spec, **{"class": deprecations.current_path(spec["class"])})
  return str(spec)


def check_record_matches_checkpoints(workdir: os.PathLike | str, record: dict) -> None:
  """Raises RunFolderError if `record` (`run.json`) says other than the newest checkpoint's record.

  Every checkpoint carries the record of the run that wrote it, so an edited
  `run.json` (another `kl_weight`, `noise_std`, network...) is caught here
  rather than used to rebuild a learner the weights were not trained for.
  Settings a resumed run may change (schedule, evaluation, speed) are not compared.
  """
  listed = _record_differences(workdir, record)
  if listed:
    raise RunFolderError(
      f"{Path(workdir) / RUN_RECORD} disagrees with the record its checkpoints carry "
      f"({listed}): it was edited after training. Put the trained values back, or delete "
      f"{RUN_RECORD}: the checkpoints' own record is then used"
    )


def check_new_record(workdir: os.PathLike | str, record: dict) -> None:
  """Raises RunFolderError if `record`, about to be written as `run.json` by a resumed run,
  says other than the record its newest checkpoint carries: written, it would make the
  folder unloadable (`check_record_matches_checkpoints`), so `run.json` is left as it was."""
  as_written = json.loads(json.dumps(with_run_id(Path(workdir), record), default=_jsonable))
  listed = _record_differences(workdir, as_written)
  if listed:
    raise RunFolderError(
      f"{workdir}: this run's record differs from the one its checkpoints carry ({listed}), "
      f"so it cannot resume them; {RUN_RECORD} is left as it was"
    )


def _record_differences(workdir: os.PathLike | str, record: dict) -> str:
  """Where `record` and the newest checkpoint's record differ, in words ('' where they agree,
  or the folder has no checkpoint, or its checkpoints are another run's)."""
  carried = checkpointed_record(workdir)
  if not isinstance(carried, dict) or "config" not in carried:
    return ""
  if carried.get("run_id") and record.get("run_id") and carried["run_id"] != record["run_id"]:
    return ""  # checkpoints of another run: refused as such where they are read (`_check_own`)
  # Older runs' names of the same classes (`experiments.configs.<Class>`,
  # `vampire_jax.models.MLP` before issue 43) compare equal to today's.
  normal = {
    "config_class": configs.recorded_class_name,
    "model": _current_model_spec,
    "x64": bool,  # absent: written before it was recorded, a float32 run
  }
  differences = {
    name: (carried.get(name), record.get(name))
    for name in _RECORDED_FACTS
    if name in carried
    and normal.get(name, str)(carried.get(name)) != normal.get(name, str)(record.get(name))
  }
  saved = config_records.flat(carried["config"])
  now = config_records.flat(record.get("config") or {"algorithm": saved["algorithm"]})
  resumable = _resumable_names(carried)
  for name in sorted(set(saved) | set(now)):
    if name not in resumable and saved.get(name) != now.get(name):
      differences[f"config.{name}"] = (saved.get(name), now.get(name))
  return "; ".join(
    f"{name}: {theirs!r} in the checkpoints, {ours!r} in {RUN_RECORD}"
    for name, (theirs, ours) in list(differences.items())[:4]
  )


def _resumable_names(record: dict) -> frozenset[str]:
  """The fields a resumed run of `record` may change (its config class's and parts'), or none
  where the class does not import here."""
  from vampire_jax.runs import run_from_record

  try:
    config = run_from_record.config_from_record(record, quiet=True)
  except Exception:  # an unimportable class: compare every field
    return frozenset()
  return config.resumable_names()


def latest_checkpoint_step(workdir: os.PathLike | str) -> Optional[int]:
  """The newest checkpoint step in `workdir`, or None (read from the folder names)."""
  steps = _step_folders(Path(workdir) / "checkpoints")
  return steps[0] if steps else None


def read_run_record(
  workdir: os.PathLike | str, *, print_fn: Optional[Callable[[str], None]] = None
) -> Optional[dict]:
  """The run record: `run.json`, else (missing or damaged) the one the newest checkpoint carries.

  Returns None when the folder has neither.

  Raises:
    RunFolderError: `run.json` disagrees with the record its checkpoints carry
      (`check_record_matches_checkpoints`).
  """
  path = Path(workdir) / RUN_RECORD
  record = read_json(path, print_fn=print_fn)
  if isinstance(record, dict) and "config" in record:
    check_record_matches_checkpoints(workdir, record)
    return record
  record = checkpointed_record(workdir)
  if record is not None and print_fn is not None:
    print_fn(
      f"{path} is {'damaged' if path.exists() else 'missing'}; using the run record "
      "its checkpoints carry"
    )
  return record


def folder_run_id(workdir: os.PathLike | str) -> Optional[str]:
  """The id of the run `workdir` holds (`run.json`, else its checkpoints' record); None if none."""
  record = read_run_record(workdir)
  run_id = record.get("run_id") if isinstance(record, dict) else None
  return run_id if isinstance(run_id, str) and run_id else None


def with_run_id(workdir: os.PathLike | str, record: dict) -> dict:
  """`record` with the folder's run id: the one recorded, else a new one (a new run)."""
  return dict(record, run_id=folder_run_id(workdir) or uuid.uuid4().hex)


def check_resumable(
  workdir: os.PathLike | str, config, *, print_fn: Optional[Callable[[str], None]] = None
) -> None:
  """Raises ConfigError if `workdir` holds a run that `config` may not resume.

  Schedule, evaluation and speed settings may change on a resume (e.g. a
  longer `num_meta_steps`); the message names any other field that differs.
  The saved config comes from `run.json` or, if it is lost, from the
  checkpoints. A run trained past `num_meta_steps` is refused too: its record
  would claim fewer steps than it was trained for.

  A run trained with `JAX_ENABLE_X64` on (or off) resumes only with it on (or
  off): the task streams depend on it. A record without `x64` is of a float32 run.

  A finished run (`results.json`) without a checkpoint, such as a copy of a zoo cell, cannot
  be resumed: it is refused, naming every setting that differs from `config`
  (`init_from` starts a new run from its meta-parameters).

  Raises:
    ConfigError: another config, another `JAX_ENABLE_X64`, fewer meta-steps
      than already trained, or a finished run without a checkpoint.
    RunFolderError: checkpoints with no record of their config to check against, or a
      zoo's cell (a manifest beside it records its files).
  """
  if checksums.recorded_files(Path(workdir)) is not None:
    raise RunFolderError(
      f"{workdir} is a cell of a zoo: {Path(workdir).resolve().parent / checksums.MANIFEST} "
      "records its files' sha256, and training there would change them. Start from it with "
      f"init_from={str(workdir)!r} and another workdir",
      fields=("init_from", "workdir"),
    )
  saved = read_run_record(workdir, print_fn=print_fn)
  latest = latest_checkpoint_step(workdir)
  if saved is None:
    if latest is not None:
      raise RunFolderError(
        f"{workdir} holds checkpoints but no run record ({RUN_RECORD} is "
        "missing and the checkpoints carry none), so they cannot be checked "
        "against this config; use another workdir",
        fields=("workdir",),
      )
    return
  if recorded_x64(saved) != x64_enabled():
    trained, now = ("on", "off") if recorded_x64(saved) else ("off", "on")
    raise ConfigError(
      f"{workdir} holds a run trained with JAX_ENABLE_X64 {trained}, and this process has it "
      f"{now}: resumed, it would go on with other random task streams and precision. Resume it "
      f"with JAX_ENABLE_X64={'1' if trained == 'on' else '0 (or unset)'}, or use another workdir",
      fields=("workdir",),
    )
  if latest is None and _is_finished(workdir):
    _refuse_finished_without_checkpoints(workdir, saved, config)
  differences = _differences(saved, config)
  if differences:
    listed = "; ".join(f"{name}: {old!r} -> {new!r}" for name, (old, new) in differences.items())
    raise ConfigError(
      f"{workdir} holds a run with another config ({listed}). Use another "
      "workdir, or the same settings to resume it.",
      fields=tuple(differences),
    )
  steps = config.schedule.num_meta_steps
  if latest is not None and latest > steps:
    raise ConfigError(
      f"num_meta_steps {steps}: {workdir} holds a run trained to step {latest}; set "
      f"num_meta_steps {latest} (or more) to test or continue it, or use another workdir",
      fields=("num_meta_steps",),
    )


def _differences(saved: dict, config, *, resumable: bool = False) -> dict:
  """`{field: (saved, now)}` between a folder's record and `config` (`config_differences`);
  the config class too, where it differs."""
  differences = config_lib.config_differences(
    config_lib.jsonable(config_records.flat(saved["config"])), config, resumable=resumable
  )
  # Runs recorded before the experiments' configs moved into the library name
  # experiments.configs.<Class>, the same class as vampire_jax.runs.experiment_configs.<Class>.
  if configs.recorded_class_name(saved["config_class"]) != config_class_name(config):
    differences["config class"] = (saved["config_class"], config_class_name(config))
  return differences


def _is_finished(workdir: os.PathLike | str) -> bool:
  """Whether `workdir` holds a run that was tested (`results.json` with its test)."""
  results = read_json(Path(workdir) / RESULTS_FILE)
  return isinstance(results, dict) and "test" in results


def _refuse_finished_without_checkpoints(workdir, saved: dict, config) -> None:
  """Refuses to train in a finished run's folder that holds no checkpoint to resume from.

  A zoo cell keeps its tested meta-parameters (`best/<step>`) but no training state; a
  copy of one, or a run folder whose `checkpoints/` were deleted, has nothing to resume,
  and training there would start again at step 0 over a finished run (the issue-59 zoo
  copy did so with 240 meta-steps, setting the cell's weights aside in one line).
  The refusal names what differs from the command, every field included (a resumed run
  could change the schedule; this one cannot be resumed).

  Raises:
    ConfigError: always, in one line.
  """
  best = _step_folders(Path(workdir) / "best")
  kept = f"its best/ of step {best[0]}" if best else "no best/"
  differences = _differences(saved, config, resumable=True)
  if differences:
    listed = "; ".join(
      f"{name}: {old!r} -> {new!r}" for name, (old, new) in list(differences.items())[:4]
    )
    more = len(differences) - 4
    settings = (
      f"its settings differ from this command's ({listed}{f'; {more} more' if more > 0 else ''})"
    )
  else:
    settings = "its settings are this command's (load it with vj.load_run)"
  raise ConfigError(
    f"{workdir} holds a finished run ({RESULTS_FILE}, {kept}) but no checkpoint to resume "
    f"it from (a zoo cell keeps only its tested meta-parameters), and {settings}: training "
    "here would start again at step 0 over it. To start from its meta-parameters, pass "
    f"init_from={str(workdir)!r} with another workdir; to train anew, use another workdir",
    fields=("init_from", "workdir"),
  )


def forget_unused_record(workdir: os.PathLike | str) -> None:
  """Removes `run.json` and `config.json` of a folder that holds no saved state yet.

  A run refused before anything was saved (no checkpoint, no `best/`) then
  leaves no record that would refuse the corrected settings next time.
  """
  workdir = Path(workdir)
  if _step_folders(workdir / "checkpoints") or _step_folders(workdir / "best"):
    return
  for name in (RUN_RECORD, CONFIG_FILE):
    (workdir / name).unlink(missing_ok=True)


def write_run_record(workdir: Path, record: dict) -> None:
  """`run.json` (with the run's id, `with_run_id`) and `config.json`, atomically (left alone
  if they already say the same)."""
  record = with_run_id(workdir, record)
  for name, value in ((RUN_RECORD, record), (CONFIG_FILE, record["config"])):
    text = json.dumps(value, indent=2, default=_jsonable)
    if read_json(workdir / name) != json.loads(text):
      write_json(workdir / name, value)


def make_folder(workdir: Path) -> None:
  """Creates the run folder (and its parents); a StorageError names the path if it cannot."""
  check_writable(workdir)
  with writing(workdir):
    try:
      workdir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
      raise StorageError(error.errno, f"run folder {workdir} cannot be made: {error}") from error


def write_results(workdir: os.PathLike | str, results: dict) -> None:
  """`results` to `workdir/results.json`, atomically (on the first process only)."""
  import jax

  if jax.process_index() == 0:
    write_json(Path(workdir) / RESULTS_FILE, results)


def git_commit() -> str:
  try:
    return subprocess.run(
      ["git", "rev-parse", "HEAD"],
      capture_output=True,
      text=True,
      cwd=Path(__file__).parent,
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def device_description() -> str:
  """`platform: kind xN`, e.g. `gpu: NVIDIA H100 80GB HBM3 x1`."""
  import jax

  device = jax.devices()[0]
  return f"{device.platform}: {getattr(device, 'device_kind', '')} x{jax.device_count()}"


def save_per_task(workdir: os.PathLike | str, per_task: dict) -> None:
  """The test's per-task arrays (but the predictions) to `workdir/test_per_task.npz`."""
  save_npz(
    Path(workdir) / PER_TASK_FILE, **{k: v for k, v in per_task.items() if k != "predictions"}
  )
