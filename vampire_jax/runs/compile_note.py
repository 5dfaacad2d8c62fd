"""One line on stderr when the first prediction of a process is slow to compile (issue 59).

`Run.predict` and its siblings compile their program on the first call: seconds for an MLP,
up to a minute for a Conv4 with many weight draws on a CPU, during which nothing happens on
the screen. The first such call in a process that is still running after `NOTE_AFTER_S`
prints one line to stderr saying that XLA is compiling, as the data loaders and the loop
print their progress there; a call that finishes sooner prints nothing, and no later call
prints anything (one note per process at most).
"""

import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")
NOTE_AFTER_S = 3.0
NOTE = (
  "vampire_jax: compiling the run's prediction for inputs of this shape (once per process "
  "and shape; later calls reuse it)..."
)
_first_call = threading.Event()  # set by the first call of the process


def _print_note() -> None:
  print(NOTE, file=sys.stderr, flush=True)


def noting_a_slow_first_call(call: Callable[..., T], *args) -> T:
  """`call(*args)`; the first time in a process, the note if it runs past `NOTE_AFTER_S`."""
  if _first_call.is_set():
    return call(*args)
  _first_call.set()
  timer = threading.Timer(NOTE_AFTER_S, _print_note)
  timer.daemon = True
  timer.start()
  try:
    return call(*args)
  finally:
    timer.cancel()
