"""One process per run folder: an exclusive `flock` on `.lock`, naming its holder."""

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

from vampire_jax._src.core.errors import RunFolderError
from vampire_jax.runs.run_folder.storage import LOCK_FILE, writing

PyTree = Any

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
      "process per run folder: wait for it, stop it, or use another workdir",
      fields=("workdir",),
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
      "one process per run folder: wait for it, stop it, or use another workdir",
      fields=("workdir",),
    ) from None
  finally:
    os.close(fd)
