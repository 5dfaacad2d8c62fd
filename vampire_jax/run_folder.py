"""The run folder, a small database with one owner: records, lock, checkpoints, logs, results.

    workdir/
      .lock              pid and host of the process that owns the folder (`fcntl.flock`)
      run.json           the run record: config, network, input shape, kind, data
      config.json        the config alone, for people
      checkpoints/<n>/   orbax: the full `MetaState` of the last two saves; each step
                         also carries the run record (with the run's id), its step and
                         the training seconds up to it
      best/<n>/          the meta-parameters with the best validation score, carrying
                         that score's record, the run's id and the step
      best_score.json    {"step", "score", "metric"} of `best/` (a copy of what it carries)
      train_time.json    training seconds up to each saved step (a copy, too)
      metrics.jsonl      one JSON line per logged step, append-only
      results.json, test_per_task.npz

What survives what (docs/reliability.md, "Run folder guarantees"):
  - Every JSON and npz file is written whole or not at all: a temporary file
    in the same folder, fsync, `os.replace`. Orbax does the same for
    checkpoint folders. A full disk or a kill leaves the previous version.
  - `metrics.jsonl` is append-only; a torn last line is dropped by the reader
    and cut off before the next append.
  - A checkpoint that does not restore is reported in one line and the next
    older one is tried (a damaged newer one is moved to `damaged/` once an
    older one restores, so training can save that step again); a damaged
    `best/` gives way to the latest checkpoint. Only when nothing restores is
    it an error (`RunFolderError`, naming the folder).
  - `run.json`, `best_score.json` and `train_time.json` can be lost or damaged:
    the checkpoints carry what they hold, and `run.json` is rebuilt from the
    newest checkpoint, never from the new command line.
  - A run reads only what it wrote. `run.json` holds the run's id (`run_id`,
    made when the folder is first recorded); every checkpoint and `best/`
    carries it and its step. A checkpoint or `best/` of another run (copied
    in) is refused in one line (`RunFolderError`), in training and in
    `load_run`; so is one whose carried step is not its folder's. A `best/`
    ahead of the state a run starts from (its checkpoints were removed, or a
    crash came between the validation and the next checkpoint) was not
    reached by this history: training sets it aside (`set_aside/`, with a
    line) and the validations from there on choose the best again. Folders
    written before run ids existed carry none and are taken as they are.
  - A reader (`load_run`) racing a training process: a `best/` or
    checkpoint that the writer replaced while it was read is read again at
    its new step, not reported as damaged.
  - One process per folder: the first process of a job holds an exclusive
    `flock` on `.lock`; a second is refused at once, naming the holder. The
    operating system drops the lock when its holder dies, so a stale lock is
    simply taken over. The other processes of a multi-host job share the
    folder without taking it.
  - An environment problem (a file where the folder should be, a read-only
    folder, a full disk) is a `StorageError`: one line naming the path.
  - A checkpoint that does not restore is one line; the tracebacks orbax and
    TensorStore leave behind it are dropped (`drop_restore_noise`).
"""

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import orbax.checkpoint as ocp

from vampire_jax import config as config_lib
from vampire_jax import configs
from vampire_jax import models
from vampire_jax.errors import ConfigError, RunFolderError, StorageError

PyTree = Any
RUN_RECORD = "run.json"
RUN_RECORD_FORMAT = 1
CONFIG_FILE = "config.json"
LOCK_FILE = ".lock"
METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"
PER_TASK_FILE = "test_per_task.npz"
BEST_SCORE_FILE = "best_score.json"
TRAIN_TIME_FILE = "train_time.json"
DAMAGED_FOLDER = "damaged"
SET_ASIDE_FOLDER = "set_aside"

# -- Errors of the environment ----------------------------------------------------

_STORAGE_ERRNOS = {
  errno.ENOSPC: "no space left on device",
  errno.EDQUOT: "disk quota exceeded",
  errno.EROFS: "read-only file system",
  errno.EACCES: "permission denied",
  errno.EPERM: "operation not permitted",
  errno.ENOTDIR: "not a folder",
  errno.EEXIST: "a file is in the way",
  errno.EISDIR: "a folder is in the way",
}
# What tensorstore (orbax's writer) says for the same errors; it raises plain exceptions.
_STORAGE_TEXTS = {
  "No space left on device": errno.ENOSPC,
  "Disk quota exceeded": errno.EDQUOT,
  "Read-only file system": errno.EROFS,
  "Permission denied": errno.EACCES,
}


def storage_errno(error: BaseException) -> Optional[int]:
  """The errno of an environment error (full disk, read-only, ...), from any layer; else None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
      return error.errno
    text = str(error)
    for marker, number in _STORAGE_TEXTS.items():
      if marker in text:
        return number
    error = error.__cause__ or error.__context__
  return None


def storage_error(error: BaseException, path: os.PathLike | str, hint: str = "") -> StorageError:
  """A one-line `StorageError`: what went wrong writing `path`, and `hint` (e.g. what is intact)."""
  number = storage_errno(error)
  cause = _STORAGE_ERRNOS.get(number) or getattr(error, "strerror", None) or type(error).__name__
  message = f"{cause} writing {path}"
  if hint:
    message += f" ({hint})"
  return StorageError(number or 0, message)


@contextlib.contextmanager
def writing(path: os.PathLike | str, hint: str = "") -> Iterator[None]:
  """Turns an environment error while writing `path` into a one-line `StorageError`."""
  try:
    yield
  except StorageError:
    raise
  except Exception as error:  # noqa: BLE001 - tensorstore raises plain exceptions
    if storage_errno(error) is None:
      raise
    raise storage_error(error, path, hint) from error


def check_writable(workdir: os.PathLike | str) -> None:
  """Raises StorageError if `workdir` cannot be a run folder: it is a file, is under a file,
  or its nearest existing folder cannot be written (read-only, no permission).

  Creates nothing; cheap enough to call before loading data or compiling.
  """
  path = Path(workdir)
  if path.exists() and not path.is_dir():
    raise StorageError(errno.EEXIST, f"run folder {path} is a file, not a folder")
  existing = path
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    raise StorageError(errno.ENOTDIR, f"run folder {path} cannot be made: {existing} is a file")
  try:
    fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-test-")
    os.close(fd)
    os.unlink(probe)
  except OSError as error:
    raise StorageError(
      error.errno or 0,
      f"run folder {path} cannot be written: {existing}: {error.strerror or error}",
    ) from error


# -- Whole-or-nothing files ----------------------------------------------------------


def write_atomic(path: os.PathLike | str, write: Callable[[Any], None], *, hint: str = "") -> None:
  """Writes `path` whole or not at all: `write(file)` to a temporary file beside it, fsync, rename.

  Raises:
    StorageError: the disk is full, the folder read-only, ... (the old file is kept).
  """
  path = Path(path)
  temporary = None
  with writing(path, hint):
    try:
      with tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
      ) as f:
        temporary = f.name
        write(f)
        f.flush()
        os.fsync(f.fileno())
      os.chmod(temporary, 0o644)  # not the temporary file's 0o600
      os.replace(temporary, path)
      temporary = None
    finally:
      if temporary is not None:
        with contextlib.suppress(OSError):
          os.unlink(temporary)


def _jsonable(value):
  if isinstance(value, (np.floating, np.integer)):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  return str(value)


def write_json(path: os.PathLike | str, value: Any, *, hint: str = "") -> None:
  """`value` as indented JSON in `path`, atomically (`write_atomic`)."""
  text = json.dumps(value, indent=2, default=_jsonable).encode()
  write_atomic(path, lambda f: f.write(text), hint=hint)


def save_npz(path: os.PathLike | str, **arrays) -> None:
  """`np.savez_compressed(path, **arrays)`, atomically."""
  write_atomic(path, lambda f: np.savez_compressed(f, **arrays))


def read_json(
  path: os.PathLike | str, *, print_fn: Optional[Callable[[str], None]] = None, default: Any = None
) -> Any:
  """The JSON in `path`; `default` if it is missing or damaged (said in a line to `print_fn`)."""
  path = Path(path)
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
    return default
  except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
    if print_fn is not None:
      print_fn(f"warning: {path} is damaged ({type(error).__name__}: {error}); ignoring it")
    return default


# -- The append-only log ---------------------------------------------------------------


def open_log(path: os.PathLike | str):
  """`path` opened for appending lines, a torn last line (a write cut short) cut off first."""
  path = Path(path)
  with writing(path):
    if path.exists():
      with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
          f.truncate(data.rfind(b"\n") + 1)
    return open(path, "a")


def append_line(log, path: os.PathLike | str, row: dict) -> None:
  """One JSON line to the open `log` of `path`, flushed."""
  with writing(path):
    log.write(json.dumps(row) + "\n")
    log.flush()


def read_log(path: os.PathLike | str) -> list[dict]:
  """The rows of a JSON-lines file (empty if there is none); a torn line is skipped."""
  path = Path(path)
  if not path.exists():
    return []
  rows = []
  for line in path.read_text(errors="replace").splitlines():
    try:
      rows.append(json.loads(line))
    except ValueError:
      continue  # a line cut short by a kill or a full disk
  return rows


def drop_rows_after(path: os.PathLike | str, step: int) -> None:
  """Rewrites the JSON-lines file `path` (atomically) without its rows of steps after `step`.

  A run resumed from the checkpoint of `step` logs those steps again; their
  earlier rows (written past that checkpoint before a kill) would be duplicates.
  """
  path = Path(path)
  if not path.exists():
    return
  lines = path.read_text(errors="replace").splitlines(keepends=True)
  kept = []
  for line in lines:
    try:
      row = json.loads(line)
    except ValueError:
      continue  # a line cut short by a kill or a full disk
    if not isinstance(row, dict) or not isinstance(row.get("step"), int) or row["step"] <= step:
      kept.append(line if line.endswith("\n") else line + "\n")
  if len(kept) != len(lines):
    write_atomic(path, lambda f: f.write("".join(kept).encode()))


def read_metrics(workdir: os.PathLike | str) -> list[dict]:
  """The rows of `workdir/metrics.jsonl` (empty if there is none; a torn line is skipped)."""
  return read_log(Path(workdir) / METRICS_FILE)


# -- One process per folder ----------------------------------------------------------------

_HELD: dict[str, list] = {}  # resolved lock path -> [file descriptor, nesting count]


def _holder(fd: int) -> str:
  os.lseek(fd, 0, os.SEEK_SET)
  return os.read(fd, 200).decode(errors="replace").strip()


def _describe_holder(text: str) -> str:
  parts = text.split()
  return f"process {parts[0]} on host {parts[1]}" if len(parts) >= 2 else "another process"


@contextlib.contextmanager
def lock(
  workdir: os.PathLike | str, *, is_main: bool = True, print_fn: Callable[[str], None] = print
) -> Iterator[None]:
  """Holds the run folder's lock (`workdir/.lock`) while the block runs.

  Only the first process of a job (`is_main`) takes it; the others share the
  folder. A second holder is refused at once; a lock whose holder died is free
  (the operating system drops an `flock` with its process) and is taken over.
  The same process may nest it.

  Raises:
    RunFolderError: another process holds the folder (naming its pid and host).
    StorageError: the lock file cannot be written.
  """
  if not is_main:
    yield
    return
  path = Path(workdir) / LOCK_FILE
  key = str(path.resolve())
  if key in _HELD:
    _HELD[key][1] += 1
    try:
      yield
    finally:
      _HELD[key][1] -= 1
    return
  with writing(path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _holder(fd)
    os.close(fd)
    raise RunFolderError(
      f"{workdir} is in use by {_describe_holder(holder)} (lock {path}); one "
      "process per run folder: wait for it, stop it, or use another --workdir"
    )
  try:
    left = _holder(fd)
    if left:
      print_fn(
        f"taking over {path} from {_describe_holder(left)}, which stopped without releasing it"
      )
    with contextlib.suppress(OSError):  # the holder's name is a courtesy (a full disk...)
      os.ftruncate(fd, 0)
      os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
      os.fsync(fd)
  except BaseException:
    os.close(fd)
    raise
  _HELD[key] = [fd, 1]
  try:
    yield
  finally:
    del _HELD[key]
    with contextlib.suppress(OSError):
      os.ftruncate(fd, 0)  # empty: released cleanly
    os.close(fd)  # closing drops the flock


def check_not_in_use(workdir: os.PathLike | str) -> None:
  """Raises RunFolderError if another process holds `workdir`'s lock; takes nothing, creates nothing."""
  path = Path(workdir) / LOCK_FILE
  if not path.exists() or str(path.resolve()) in _HELD:
    return
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except BlockingIOError:
    raise RunFolderError(
      f"{workdir} is in use by {_describe_holder(_holder(fd))} (lock {path}); "
      "one process per run folder: wait for it, stop it, or use another "
      "--workdir"
    ) from None
  finally:
    os.close(fd)


# -- The run record ------------------------------------------------------------------------


def config_class_name(config) -> str:
  cls = type(config)
  return f"{cls.__module__}.{cls.__qualname__}"


def run_record(problem, config) -> dict:
  """What `run.json` holds: enough to rebuild the trained model without the data."""
  return {
    "format": RUN_RECORD_FORMAT,
    "config_class": config_class_name(config),
    "config": dataclasses.asdict(config),
    "model": models.module_spec(problem.model),
    "input_shape": list(problem.input_shape),
    "kind": problem.kind,
    "noise_std": problem.noise_std,
    "data": problem.data_info,
  }


def _step_folders(folder: Path) -> list[int]:
  """The steps of the orbax checkpoints in `folder`, newest first."""
  if not folder.is_dir():
    return []
  return sorted(
    (int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), reverse=True
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
_RECORDED_FACTS = ("config_class", "model", "kind", "input_shape", "noise_std", "run_id")


def check_record_matches_checkpoints(workdir: os.PathLike | str, record: dict) -> None:
  """Raises RunFolderError if `record` (`run.json`) says other than the newest checkpoint's record.

  Every checkpoint carries the record of the run that wrote it, so an edited
  `run.json` (another `kl_weight`, `noise_std`, network...) is caught here
  rather than used to rebuild a learner the weights were not trained for.
  Settings a resumed run may change (schedule, evaluation, speed) are not compared.
  """
  carried = checkpointed_record(workdir)
  if not isinstance(carried, dict) or "config" not in carried:
    return
  if carried.get("run_id") and record.get("run_id") and carried["run_id"] != record["run_id"]:
    return  # checkpoints of another run: refused as such where they are read (`_check_own`)
  normal = {"config_class": configs.recorded_class_name}  # older runs' name of a class
  differences = {
    name: (carried.get(name), record.get(name))
    for name in _RECORDED_FACTS
    if name in carried
    and normal.get(name, str)(carried.get(name)) != normal.get(name, str)(record.get(name))
  }
  config_class = _config_class(carried.get("config_class", ""))
  resumable = config_lib.resumable_fields(config_class) if config_class else frozenset()
  saved, now = carried["config"], record.get("config") or {}
  # A field the algorithm never reads changes nothing (older runs recorded such values).
  from vampire_jax import algorithms

  algorithm = saved.get("algorithm")
  ignored = algorithms.ignored_fields(algorithm) if algorithm in algorithms.ALGORITHMS else ()
  for name in sorted(set(saved) | set(now)):
    if name not in resumable and name not in ignored and saved.get(name) != now.get(name):
      differences[f"config.{name}"] = (saved.get(name), now.get(name))
  if differences:
    listed = "; ".join(
      f"{name}: {theirs!r} in the checkpoints, {ours!r} in {RUN_RECORD}"
      for name, (theirs, ours) in list(differences.items())[:4]
    )
    raise RunFolderError(
      f"{Path(workdir) / RUN_RECORD} disagrees with the record its checkpoints carry "
      f"({listed}): it was edited after training. Put the trained values back, or delete "
      f"{RUN_RECORD}: the checkpoints' own record is then used"
    )


def _config_class(recorded: str):
  """The config dataclass a record names, or None (not importable here)."""
  module_name, _, class_name = configs.recorded_class_name(recorded).rpartition(".")
  try:
    import importlib

    cls = getattr(importlib.import_module(module_name), class_name)
  except (ImportError, AttributeError, ValueError):
    return None
  return cls if dataclasses.is_dataclass(cls) else None


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

  Raises:
    ConfigError: another config, or fewer meta-steps than already trained.
    RunFolderError: checkpoints with no record of their config to check against.
  """
  saved = read_run_record(workdir, print_fn=print_fn)
  latest = latest_checkpoint_step(workdir)
  if saved is None:
    if latest is not None:
      raise RunFolderError(
        f"{workdir} holds checkpoints but no run record ({RUN_RECORD} is "
        "missing and the checkpoints carry none), so they cannot be checked "
        "against this config; use another --workdir"
      )
    return
  differences = config_lib.config_differences(saved["config"], config)
  # A field the algorithm never reads changes nothing (older runs recorded such values).
  from vampire_jax import algorithms

  if (
    saved["config"].get("algorithm") == config.algorithm
    and config.algorithm in algorithms.ALGORITHMS
  ):
    for name in algorithms.ignored_fields(config.algorithm):
      differences.pop(name, None)
  # Runs recorded before the experiments' configs moved into the library name
  # experiments.configs.<Class>, the same class as vampire_jax.configs.<Class>.
  if configs.recorded_class_name(saved["config_class"]) != config_class_name(config):
    differences["config class"] = (saved["config_class"], config_class_name(config))
  if differences:
    listed = "; ".join(f"{name}: {old!r} -> {new!r}" for name, (old, new) in differences.items())
    raise ConfigError(
      f"{workdir} holds a run with another config ({listed}). Use another "
      "--workdir, or the same settings to resume it."
    )
  if latest is not None and latest > config.num_meta_steps:
    raise ConfigError(
      f"--num-meta-steps {config.num_meta_steps}: {workdir} holds a run trained "
      f"to step {latest}; pass --num-meta-steps {latest} (or more) to test or "
      "continue it, or use another --workdir"
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


# -- Checkpoints ----------------------------------------------------------------------------


def _manager(folder: Path, max_to_keep: int, create: bool) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
    folder.absolute(),
    options=ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=create, cleanup_tmp_directories=create
    ),
  )


def restore_target(template: PyTree) -> PyTree:
  """`template` as a restore target on this process's devices, whatever wrote the checkpoint.

  Orbax places each restored array on the sharding its target names. A target
  without one (`jax.eval_shape`'s) makes it use the sharding saved with the
  checkpoint, which names the writer's devices: a run trained on 8 devices
  then fails to restore on 1 ("Topology mismatch"). So every leaf names a
  sharding of this process: its own (a training state placed on the current
  mesh), else this process's first device. Values do not depend on where
  they are placed, so a run restores to the same numbers on any device count.
  """
  import jax

  device = jax.local_devices()[0]

  def target(leaf):
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
      sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)

  return jax.tree_util.tree_map(target, template)


def read_checkpoint(folder: os.PathLike | str, step: Optional[int] = None) -> PyTree:
  """The arrays of one saved step of `folder` (`checkpoints/` or `best/`), without a template.

  For inspecting a run folder: the step's tree as saved (dicts of arrays), on this
  process's first device whatever devices wrote it. Default: the newest step.
  """
  import jax

  manager = ocp.CheckpointManager(
    Path(folder).absolute(),
    options=ocp.CheckpointManagerOptions(create=False),
    item_handlers=ocp.StandardCheckpointHandler(),
  )
  try:
    step = manager.latest_step() if step is None else step
    saved = manager.item_metadata(step)
    template = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)
    return manager.restore(step, args=ocp.args.StandardRestore(restore_target(template)))
  finally:
    manager.close()


# What orbax and JAX say when a checkpoint is whole but this process cannot take it.
_ENVIRONMENT_TEXTS = {
  "Topology mismatch": "the checkpoint was placed on devices this process does not have",
}


def environment_cause(error: BaseException) -> Optional[str]:
  """What about the loading process (not the files) made a restore fail, or None.

  A missing package or a device layout the checkpoint does not fit is the
  environment's doing: the folder is intact and must not be treated as damaged.
  """
  if isinstance(error, ImportError):
    name = getattr(error, "name", None) or _first_line(error)
    return f"a package is missing in this environment ({name}): install it and load again"
  text = str(error)
  for marker, cause in _ENVIRONMENT_TEXTS.items():
    if marker in text:
      return (
        f"{cause} ({_first_line(error)}); this is about the loading process (JAX's devices, "
        f"JAX_NUM_CPU_DEVICES, XLA_FLAGS), not the files: please report it with `jax.devices()`"
      )
  return None


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


def _first_line(error: BaseException, limit: int = 160) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  text = f"{type(error).__name__}: {text}" if text else type(error).__name__
  return text if len(text) <= limit else text[: limit - 3] + "..."


# -- The noise of a restore that failed ------------------------------------------------------


def is_event_loop_noise(error: Optional[BaseException]) -> bool:
  return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


# Orbax's read coroutine of an array that does not restore re-raises as it is closed.
_RESTORE_COROUTINE = "_read_array_index_and_device_put"
_RESTORE_ERROR = "Encountered error while reading array index"


def _is_restore_noise(unraisable) -> bool:
  """An unraisable error left by a checkpoint restore that failed (reported by the caller)."""
  if is_event_loop_noise(unraisable.exc_value):
    return True
  where = getattr(unraisable.object, "__qualname__", "") or ""
  return _RESTORE_COROUTINE in where and str(unraisable.exc_value).startswith(_RESTORE_ERROR)


_noise_filter_installed = False


def drop_restore_noise() -> None:
  """Drops the unraisable errors a failed restore leaves behind (idempotent).

  A checkpoint whose files are garbage leaves TensorStore callbacks that fire
  into the event loop orbax closed ("RuntimeError: Event loop is closed") and
  orbax read coroutines that raise again as they are closed ("Encountered
  error while reading array index"). Python prints each as an "unraisable"
  exception (hundreds of tracebacks; `PytestUnraisableExceptionWarning`s under
  pytest), while and after the restore fails; the failure itself is said in
  one line by `RunCheckpoints`. This wraps `sys.unraisablehook` in place
  (pytest's, a notebook's) and passes every other error on; asyncio's log of
  orbax's deserialising tasks collected with their error is dropped too.
  """
  global _noise_filter_installed
  if _noise_filter_installed:
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _is_restore_noise(unraisable):
      previous(unraisable)

  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(_drop_unretrieved_restore_tasks)
  _noise_filter_installed = True


# Orbax's deserialising task of an array that does not restore, collected with its error
# unretrieved: asyncio logs "Task exception was never retrieved" with the traceback (about
# half the time, by when the collector runs). The restore's failure is said by the caller.
_RESTORE_TASK = "coro=<async_deserialize()"


def _drop_unretrieved_restore_tasks(record: logging.LogRecord) -> bool:
  message = str(record.msg)
  return not (message.startswith("Task exception was never retrieved") and _RESTORE_TASK in message)


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
    """The step of the newest training-state checkpoint, or None."""
    return self._latest.latest_step()

  def _check_own(self, folder: Path, step: int, what: str) -> None:
    """Refuses, in one line, a checkpoint of another run or one whose step is not its folder's."""
    carried = _step_metadata(folder, step)
    run_id = carried.get("run_id") or (carried.get("record") or {}).get("run_id")
    if run_id and self._run_id and run_id != self._run_id:
      raise RunFolderError(
        f"{folder / str(step)} was written by another run (run {run_id[:8]}; this folder's "
        f"run is {self._run_id[:8]}): a run reads only its own {what}; remove it, or use "
        "another --workdir"
      )
    carried_step = carried.get("step")
    if carried_step is not None and carried_step != step:
      raise RunFolderError(
        f"{folder / str(step)} carries the state of step {carried_step}, not {step}: it was "
        f"moved or renamed; remove it, or use another --workdir"
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
    failed = []
    for step in self._latest.all_steps()[::-1]:
      self._check_own(self.workdir / "checkpoints", step, "checkpoints")
      try:
        state = self._latest.restore(step, args=ocp.args.StandardRestore(restore_target(template)))
      except Exception as error:  # noqa: BLE001 - tensorstore raises plain exceptions
        if not self._create and not (self.workdir / "checkpoints" / str(step)).exists():
          # A training process rotated it out while we read: read its newer ones instead.
          self._latest.reload()
          return self.restore_latest(template)
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
        best = self._best.latest_step()
        if best is not None and best > step:
          self._best.close()
          self._set_aside_best(best, step)
          self._best = _manager(self.workdir / "best", 1, True)
      return state
    tried = f" (tried steps {', '.join(map(str, failed))})" if failed else ""
    raise RunFolderError(
      f"no checkpoint in {self.workdir / 'checkpoints'} restores{tried}: their files look "
      f"damaged (each error is in a line above), so {self.workdir} cannot be resumed or "
      "loaded; train into another --workdir"
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
    for _ in range(3):  # a writer may replace best/ while it is read: then read the new one
      step = self._best.latest_step()
      if step is None:
        return None
      self._check_own(self.workdir / "best", step, "best")
      try:
        return self._best.restore(step, args=ocp.args.StandardRestore(restore_target(template)))
      except Exception as error:  # noqa: BLE001 - tensorstore raises plain exceptions
        self._refuse_if_environment(error, self.workdir / "best", step)
        self._best.reload()
        if self._best.latest_step() != step:
          continue
        self._print(
          f"{self.workdir / 'best'} does not restore ({_first_line(error)}); using the "
          "latest checkpoint instead"
        )
        return None
    return None

  def restore_meta_params(self, template_state: PyTree, which: str = "best") -> PyTree:
    """The meta-parameters a run tests: `which` 'best' (by validation) or 'final'.

    'best' falls back to the latest state's that restores when no best was
    kept (or `best/` is damaged); 'final' is the latest state's.

    Args:
      template_state: a `MetaState` of the run's structure.
      which: the run's `test_parameters`.

    Raises:
      RunFolderError: nothing restores (or the folder holds no checkpoint).
    """
    best = self.restore_best(template_state.meta_params) if which == "best" else None
    if best is not None:
      return best
    if self.latest_step() is None:
      raise RunFolderError(
        f"no checkpoint in {self.workdir} (expected best/ or checkpoints/ from a training run)"
      )
    return self.restore_latest(template_state).meta_params

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
