"""Gives the memory a compile freed back to the operating system (issue 62).

XLA:CPU compiles a Conv4 meta-step with about a gigabyte of the C library's heap and frees
it when the program is built; glibc's `malloc` keeps freed memory for the process, so a run
that steps in 350 MB stays at the compile's 1.3 GB until it ends (docs/performance.md).
`malloc_trim(0)` hands the free pages of every arena back; nothing a program computes
changes, only the resident memory the process holds.

    step = host_memory.releasing_after_compiles(jax.jit(train_step))
    state, metrics = step(state, data, key)  # compiles, then returns the freed memory

`releasing_after_compiles` releases after any call during which JAX compiled a program
(its backend-compile event, a cache hit included), so a program that compiles again for a
new input shape gives its memory back too, and a call that compiled nothing costs one
integer comparison. Where the C library is not glibc (macOS, musl) it does nothing.

`VAMPIRE_JAX_MEMORY_RELEASE` turns it off (to measure what it saves): 0, off, false or no
(in any case); 1, on, true or yes, unset or empty, leave it on. Any other value is refused
(a `ConfigError` naming the variable and the values it takes) when a function is wrapped,
before anything is compiled, and by each release: `disabled` or `00` would otherwise leave
it on without a word.
"""

import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Callable, Optional, TypeVar

from vampire_jax._src.core.errors import ConfigError

F = TypeVar("F", bound=Callable)

ENV_VAR = "VAMPIRE_JAX_MEMORY_RELEASE"
ON_VALUES = ("1", "on", "true", "yes")  # and unset or empty: the default
OFF_VALUES = ("0", "off", "false", "no")
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch's name

_lock = threading.Lock()
_compiles = [0]  # compilations seen since the listener was registered
_listening = [False]
_malloc_trim: list = []  # [function or None], looked up once


def enabled() -> bool:
  """Whether the release is on: `VAMPIRE_JAX_MEMORY_RELEASE` unset, empty, 1, on, true or yes.

  0, off, false or no (any case) turn it off; any other value raises a `ConfigError`
  naming the variable, the value and the values it takes.
  """
  setting = os.environ.get(ENV_VAR, "")
  value = setting.strip().lower()
  if value in ("",) + ON_VALUES:
    return True
  if value in OFF_VALUES:
    return False
  raise ConfigError(
    f"{ENV_VAR}={setting!r} is not a setting it takes: {', '.join(OFF_VALUES)} turn the "
    f"release of freed memory off; {', '.join(ON_VALUES)} (or unset) leave it on"
  )


def _glibc_malloc_trim() -> Optional[Callable[[int], int]]:
  """glibc's `malloc_trim`, or None where the process's C library has none."""
  if not _malloc_trim:
    try:
      libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
      trim = libc.malloc_trim  # glibc only: musl and macOS's libc have no such symbol
      trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
      trim = None
    _malloc_trim.append(trim)
  return _malloc_trim[0]


def release_freed_memory() -> bool:
  """Returns the C heap's free pages to the operating system; True if anything ran.

  `malloc_trim(0)` on glibc (every arena, and the free pages inside each heap, not only
  its top); nothing elsewhere or when turned off. Safe while other threads allocate: glibc
  takes each arena's lock.
  """
  trim = _glibc_malloc_trim() if enabled() else None
  if trim is None:
    return False
  trim(0)
  return True


def drop_compiled_programs() -> bool:
  """Forgets every program JAX has compiled in this process (`jax.clear_caches`) and gives
  their memory back (`release_freed_memory`); True if anything ran.

  For the programs a run compiles once before it steps (the network's and the optimiser's
  initialisation, the inner-loop check, a tried task): kept, they hold about 45 MB (VAMPIRE,
  Omniglot Conv4-64) for the length of the run. A program called again after this compiles
  again, to the same numbers. Off with the release (`VAMPIRE_JAX_MEMORY_RELEASE=0`).
  """
  if not enabled():
    return False
  import jax

  jax.clear_caches()
  return release_freed_memory()


def _count_compile(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  if event == COMPILE_EVENT:
    with _lock:
      _compiles[0] += 1


def _listen() -> None:
  """Registers the compile counter with `jax.monitoring`, once per process."""
  with _lock:
    if _listening[0]:
      return
    _listening[0] = True
  import jax.monitoring

  jax.monitoring.register_event_duration_secs_listener(_count_compile)


def compiles_seen() -> int:
  """How many programs JAX has compiled (or loaded from its cache) since the first wrap."""
  return _compiles[0]


def releasing_after_compiles(fn: F) -> F:
  """`fn`, giving the freed memory back after each call during which JAX compiled.

  The compile runs on the calling thread before the program is dispatched, so its memory
  is free when `fn` returns; the release does not wait for the results. A value of
  `VAMPIRE_JAX_MEMORY_RELEASE` it does not take is refused here, before anything compiles.
  """
  enabled()
  _listen()

  @functools.wraps(fn)
  def call(*args, **kwargs):
    before = _compiles[0]
    out = fn(*args, **kwargs)
    if _compiles[0] != before:
      release_freed_memory()
    return out

  return call
