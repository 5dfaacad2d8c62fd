"""Stopping and failing in one line: the one owner of every interrupt and fault path.

    with interrupts.requests() as received:        # the training loop
      ...
      interrupts.stop_if_requested(received, checkpoints, step, state, seconds, ...)

    sys.exit(interrupts.run_command(main))          # a command line (experiments.cli)

What a run does when it is stopped or fails, in every phase:

  - **SIGINT / SIGTERM in the training loop.** `requests()` turns the signal
    into a request the loop reads after its current call (a second signal
    stops at once: the default handlers are back). `stop_if_requested` saves
    the step's checkpoint unless it is already saved (a signal during the
    validation of a checkpoint step: the step was just saved, and orbax
    refuses to save a step twice), waits for the write and raises
    `TrainingInterrupted`; the command line prints its one line and exits
    with 128 + the signal's number (130, 143). Running again resumes.
  - **A signal in any other phase** (data loading, compiling, the test):
    `run_command` has SIGTERM raise `Terminated` (a `KeyboardInterrupt`, as
    Ctrl-C raises one) so that the `with` blocks release the run folder's
    lock; one line, 130/143.
  - **A child process** (`experiments.paper_runs`): `forwarding(child)`
    passes SIGINT/SIGTERM on to the child, gives it `grace` seconds to save
    its checkpoint and kills it after that, so no orphan keeps the lock.
  - **Faults.** A `UserError` (a bad flag, data, a run folder in use, full
    or read-only) is `error: ...` and exit 2; a file-system error anywhere
    else (a full disk while a figure is written) is one line naming the path
    and exit 2; divergence (`FloatingPointError`) is one line and exit 1.
    A real bug keeps its traceback.
  - **Background noise.** Orbax and TensorStore log a failed or damaged
    checkpoint from their own threads and event loops, and then hand the
    error to the caller, which says it in one line. `quiet_background()`
    keeps those logs and a background thread's traceback of an environment
    error (a full disk) off the screen. A checkpoint whose files are garbage
    leaves TensorStore callbacks that fire into orbax's closed event loop
    ("RuntimeError: Event loop is closed") and orbax read coroutines that
    raise again as they are closed ("Encountered error while reading array
    index"): a screen of tracebacks as "unraisable" exceptions
    (`sys.unraisablehook`; under pytest, hundreds of
    `PytestUnraisableExceptionWarning`s), while and after the restore fails;
    `run_folder.drop_restore_noise()` (installed by `RunCheckpoints` before
    it reads anything, and here) drops exactly those, and passes every other
    one on to the hook it found.
"""

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from vampire_jax._src.core.errors import UserError
from vampire_jax.runs import run_folder

# Loggers of the checkpoint stack: their records repeat an error the caller raises.
_NOISY_LOGGERS = ("absl", "asyncio", "orbax", "orbax.checkpoint", "tensorstore")


class TrainingInterrupted(Exception):
  """Training stopped on SIGINT or SIGTERM, after saving a checkpoint."""

  def __init__(self, step: int, signum: int, workdir: Path):
    self.step, self.signum, self.workdir = step, signum, workdir
    name = signal.Signals(signum).name
    super().__init__(
      f"{name}: stopped at step {step}, checkpoint saved in {workdir}; run the "
      "same command again to resume"
    )


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised where the program is (as Ctrl-C raises KeyboardInterrupt)."""

  signum = signal.SIGTERM


@contextlib.contextmanager
def requests() -> Iterator[list]:
  """Yields a list that holds the signal number once SIGINT or SIGTERM arrives.

  A second signal stops at once (the default handlers are back by then).
  Outside the main thread (no handlers can be set) signals act as usual.
  """
  received: list[int] = []

  def handler(signum, frame):
    del frame
    received.append(signum)
    for sig, old in previous.items():
      signal.signal(sig, old)

  previous = {}
  try:
    for sig in (signal.SIGINT, signal.SIGTERM):
      previous[sig] = signal.signal(sig, handler)
  except ValueError:  # not the main thread
    previous.clear()
  try:
    yield received
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def stop_if_requested(
  received: list,
  checkpoints,
  step: int,
  state: Any,
  train_seconds: float,
  *,
  workdir: Path,
  write_files: bool,
  log_window: Optional[list] = None,
) -> None:
  """If a signal was received: the checkpoint of `step` (unless saved already), then stop.

  `log_window`: the training metrics since the last logged row (`RunCheckpoints.save`).

  Raises:
    TrainingInterrupted: a signal was received; the state of `step` is saved.
    StorageError: the checkpoint could not be written (said in one line instead).
  """
  if not received:
    return
  if not checkpoints.has_step(step):  # saved already when the step was a checkpoint step
    checkpoints.save(step, state, train_seconds, write_files=write_files, log_window=log_window)
  checkpoints.wait()
  raise TrainingInterrupted(step, received[0], workdir)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
  """SIGTERM raises `Terminated` in the main thread, so that it ends in one line too."""

  def handler(signum, frame):
    del signum, frame
    raise Terminated()

  try:
    previous = signal.signal(signal.SIGTERM, handler)
  except ValueError:  # not the main thread
    yield
    return
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def quiet_background() -> Iterator[None]:
  """Keeps the checkpoint stack's logs, and background threads' environment errors, quiet.

  Orbax logs a failed background save (a full disk) or a checkpoint that does
  not restore with tracebacks, and its event loop may complain once closed;
  it then raises the error to the caller, who says it in one line. A thread
  that dies of an environment error (a full disk: TensorBoard's writer, an
  orbax save) would print a traceback; its error is reported by the caller
  too. Any other thread's error is printed as usual. The loggers stay quiet
  after the block: orbax's tasks of a failed save are logged ("Task exception
  was never retrieved") when they are collected, as the process ends.
  """
  for name in _NOISY_LOGGERS:
    logging.getLogger(name).setLevel(logging.CRITICAL)
  previous_hook = threading.excepthook

  def hook(args):
    if args.exc_value is not None and (
      run_folder.storage_errno(args.exc_value) is not None
      or run_folder.is_event_loop_noise(args.exc_value)
    ):
      return
    previous_hook(args)

  threading.excepthook = hook
  run_folder.drop_restore_noise()
  try:
    yield
  finally:
    threading.excepthook = previous_hook


def exit_code(error: BaseException, print_fn: Callable[[str], None]) -> Optional[int]:
  """The exit code of a command that raised `error`, its one line said; None: a bug (re-raise)."""
  if isinstance(error, UserError):
    print_fn(f"error: {error}")
    return 2
  if isinstance(error, TrainingInterrupted):
    print_fn(f"\n{error}")
    return 128 + error.signum
  if isinstance(error, KeyboardInterrupt):  # Ctrl-C or SIGTERM outside the training loop
    signum = getattr(error, "signum", signal.SIGINT)
    print_fn(
      f"\n{signal.Signals(signum).name}: stopped before the run finished; its saved "
      "checkpoints are kept: run the same command again to resume"
    )
    return 128 + signum
  if isinstance(error, FloatingPointError):
    print_fn(f"error: {error}")
    return 1
  if isinstance(error, Exception) and run_folder.storage_errno(error) is not None:
    path = getattr(error, "filename", None) or "a file"
    print_fn(f"error: {run_folder.storage_error(error, path)}")
    return 2
  return None


def _stderr(message: str) -> None:
  print(message, file=sys.stderr)


def run_command(main: Callable[[], object], print_fn: Callable[[str], None] = _stderr) -> int:
  """Runs `main()` as a command; returns its exit code (see the module docstring).

  0 when it returns; 2 for a `UserError` or an environment error; 128 + the
  signal's number when stopped; 1 for divergence. Anything else is a bug and
  is raised with its traceback.
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  # A save cut short by a full disk leaves an orbax coroutine that Python names at exit.
  warnings.filterwarnings(
    "ignore", message=run_folder.restore_noise.UNAWAITED_COROUTINE, category=RuntimeWarning
  )
  with quiet_background():
    try:
      with sigterm_raises():
        main()
    except BaseException as error:  # noqa: BLE001 - sorted into exit codes below
      code = exit_code(error, print_fn)
      if code is None:
        raise
      return code
  return 0


@contextlib.contextmanager
def forwarding(child, grace: float) -> Iterator[None]:
  """While the block runs, SIGINT and SIGTERM to this process stop `child` first.

  The child (a `subprocess.Popen` of a training run) gets the same signal,
  `grace` seconds to save its checkpoint and exit, then SIGKILL; only then
  does the signal stop this process (`KeyboardInterrupt` / `Terminated`), so
  that no orphan keeps the run folder's lock.
  """

  def handler(signum, frame):
    del frame
    for sig, old in previous.items():  # a second signal: the defaults
      signal.signal(sig, old)
    if child.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        child.send_signal(signum)
      wait_or_kill(child, grace)
    if signum == signal.SIGTERM:
      raise Terminated()
    raise KeyboardInterrupt()

  previous = {}
  try:
    for sig in (signal.SIGINT, signal.SIGTERM):
      previous[sig] = signal.signal(sig, handler)
  except ValueError:  # not the main thread: signals act as usual
    previous.clear()
  try:
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def wait_or_kill(child, grace: float) -> int:
  """`child`'s exit code, killing it if it has not exited within `grace` seconds."""
  import subprocess

  try:
    return child.wait(timeout=grace)
  except subprocess.TimeoutExpired:
    child.kill()
    return child.wait()
