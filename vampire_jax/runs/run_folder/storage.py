"""The run folder's files: their names, atomic writes, the append-only log, and storage
errors said in one line (a full disk, a read-only folder, a file in the way)."""

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from vampire_jax._src.core.errors import StorageError

PyTree = Any

RUN_RECORD = "run.json"
RUN_RECORD_FORMAT = 2  # 2: the config by parts, its algorithm a spec (`config_records`)
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


def json_bytes(value: Any) -> bytes:
  """`value` as the indented JSON that `write_json` writes."""
  return json.dumps(value, indent=2, default=_jsonable).encode()


def write_json(path: os.PathLike | str, value: Any, *, hint: str = "") -> None:
  """`value` as indented JSON in `path`, atomically (`write_atomic`)."""
  text = json_bytes(value)
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
