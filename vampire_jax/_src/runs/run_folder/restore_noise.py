"""What orbax, TensorStore and asyncio leave behind a restore that failed: dropped, since
the failure itself is said in one line by the caller."""

import logging
import sys
from typing import Any, Optional

PyTree = Any

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
  orbax's deserialising tasks collected with their error is dropped too, and
  orbax's log of a step folder without its metadata (an incomplete step, said
  in one line by `RunCheckpoints`).
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
  logging.getLogger("absl").addFilter(_drop_missing_step_metadata)
  _noise_filter_installed = True


# Orbax's deserialising task of an array that does not restore, collected with its error
# unretrieved: asyncio logs "Task exception was never retrieved" with the traceback (about
# half the time, by when the collector runs). The restore's failure is said by the caller.
_RESTORE_TASK = "coro=<async_deserialize()"


def _drop_unretrieved_restore_tasks(record: logging.LogRecord) -> bool:
  message = str(record.msg)
  return not (message.startswith("Task exception was never retrieved") and _RESTORE_TASK in message)


# What orbax logs (through absl) of a step folder without its `_CHECKPOINT_METADATA`, as it
# lists the steps: an incomplete step (said in one line by `RunCheckpoints`, which skips it),
# or a complete one of an older orbax, which restores as it is.
_MISSING_METADATA = "Metadata file does not exist: %s"


def _drop_missing_step_metadata(record: logging.LogRecord) -> bool:
  return not (
    record.msg == _MISSING_METADATA
    and str(record.args[0] if record.args else "").endswith("_CHECKPOINT_METADATA")
  )
