"""What orbax, TensorStore and asyncio leave behind a restore that failed: dropped, since
the failure itself is said in one line by the caller."""

import gc
import logging
import sys
import warnings
from typing import Any, Callable, Optional

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
  orbax's deserialising tasks and TensorStore's futures collected with their
  error is dropped too, and
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
# The same for a bare future of TensorStore's open of such an array (rarer): "Future exception
# was never retrieved", then the TensorStore error, which names the spec it could not open.
_TENSORSTORE_ERROR = "tensorstore_spec"


def _drop_unretrieved_restore_tasks(record: logging.LogRecord) -> bool:
  message = str(record.msg)
  if message.startswith("Task exception was never retrieved"):
    return _RESTORE_TASK not in message
  if message.startswith("Future exception was never retrieved"):
    return _TENSORSTORE_ERROR not in message
  return True


# Orbax's coroutines that a failed restore created and never started (its other reads are
# abandoned once one fails): Python warns "coroutine 'Store._get_array_metadatas' was never
# awaited" when they are collected, which may be during a later, unrelated call.
# A save cut short by a full disk leaves one too, named at exit (`interrupts.run_command`).
UNAWAITED_COROUTINE = r"coroutine '.*' was never awaited"


def _drop_tracebacks(error: Optional[BaseException], seen: set[int]) -> None:
  """Drops the tracebacks of `error` and of its causes; keeps the errors."""
  if error is None or id(error) in seen:
    return
  seen.add(id(error))
  error.__traceback__ = None
  _drop_tracebacks(error.__cause__, seen)
  _drop_tracebacks(error.__context__, seen)


def quiet_restore(restore: Callable[[], PyTree]) -> tuple[PyTree, Optional[Exception]]:
  """`restore()`'s tree and None, or None and the error it raised, with its leftovers collected.

  The error is returned rather than raised so that its traceback, which holds the
  coroutines orbax abandoned, is freed here, where their warnings are ignored; a
  collection then finalises them now rather than at some later, unrelated moment.
  """
  with warnings.catch_warnings():  # tried before the caller's, even `simplefilter("always")`
    warnings.filterwarnings("ignore", message=UNAWAITED_COROUTINE, category=RuntimeWarning)
    try:
      return restore(), None
    except Exception as error:  # noqa: BLE001 - tensorstore raises plain exceptions
      failure = error
    _drop_tracebacks(failure, set())  # the frames of the failed read, and what they hold
    gc.collect()
  return None, failure


# What orbax logs (through absl) of a step folder without its `_CHECKPOINT_METADATA`, as it
# lists the steps: an incomplete step (said in one line by `RunCheckpoints`, which skips it),
# or a complete one of an older orbax, which restores as it is.
_MISSING_METADATA = "Metadata file does not exist: %s"


def _drop_missing_step_metadata(record: logging.LogRecord) -> bool:
  return not (
    record.msg == _MISSING_METADATA
    and str(record.args[0] if record.args else "").endswith("_CHECKPOINT_METADATA")
  )
