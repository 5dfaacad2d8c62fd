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

The release also drops the resident pages of the process's read-only file mappings
(`page_out_file_pages`), above all jaxlib's: XLA's compiler, LLVM and MLIR live in
`libjax_common.so`, and about 120 MB of it is resident after a compile, of which a CPU step
runs about 25 MB. The pages are the files', read-only; the kernel reads back what runs
again. A Conv4 Omniglot step then holds about 120 MB less while it steps
(docs/performance.md, "jaxlib's pages").

A run's train step is compiled ahead of time at its first call and kept as the executable
alone (`compiled_on_first_call`): the jit's traces and lowering, about 12 MB of the Omniglot
VAMPIRE step, are not held while it steps.

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
_libc_functions: dict = {}  # name: the C library's function, or None; looked up once


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


def _libc_function(name: str, argtypes: list) -> Optional[Callable[..., int]]:
  """The process's C library's function `name` (returning an int), or None where it has
  none; looked up once."""
  if name not in _libc_functions:
    try:
      function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
      function.argtypes, function.restype = argtypes, ctypes.c_int
    except (OSError, AttributeError):
      function = None
    _libc_functions[name] = function
  return _libc_functions[name]


def _glibc_malloc_trim() -> Optional[Callable[[int], int]]:
  """glibc's `malloc_trim`, or None where the process's C library has none (musl, macOS)."""
  return _libc_function("malloc_trim", [ctypes.c_size_t])


# madvise(2), Linux 5.4: reclaim the range's pages now, keeping their contents (a page
# copied on write, such as a library's relocated read-only data, goes to swap or stays).
# Never MADV_DONTNEED here: it discards such a page, and the process would read the
# file's unrelocated bytes back.
MADV_PAGEOUT = 21


def _libc_madvise() -> Optional[Callable[[int, int, int], int]]:
  """The C library's `madvise`, or None where there is none."""
  return _libc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])


def file_mappings(maps_text: str) -> list[tuple[int, int]]:
  """`[(start, end)]` of the read-only mappings of regular files in a `/proc/PID/maps` text.

  Writable mappings (a library's data, copied on write) and devices (`/dev/...`) are left
  out: their pages are not the file's.
  """
  ranges = []
  for line in maps_text.splitlines():
    fields = line.split(maxsplit=5)
    if len(fields) < 6 or "w" in fields[1]:
      continue
    if not fields[5].startswith("/") or fields[5].startswith("/dev/"):
      continue
    start, end = (int(address, 16) for address in fields[0].split("-"))
    ranges.append((start, end))
  return ranges


def page_out_file_pages() -> int:
  """Drops this process's resident pages of its read-only file mappings; the mappings taken.

  `madvise(MADV_PAGEOUT)` on each mapping of `file_mappings`: the libraries' code, above
  all jaxlib's `libjax_common.so` (XLA's compiler, LLVM, MLIR and runtime), of which about
  120 MB is resident after a compile and a CPU step runs about 25 MB. The pages are the
  files' own, so nothing is lost and no number changes: a page the process touches again
  is read back from its file (the step's code on its next call; a later compile, the
  compiler's: about a second on a 2-core VM's disk). The kernel leaves pages another
  process maps too, and those of files the process neither owns nor could write. 0 where
  there is no `/proc/self/maps` or `madvise`; on Linux before 5.4 (no `MADV_PAGEOUT`) the
  kernel refuses each advice and 0 is returned.
  """
  try:
    with open("/proc/self/maps") as maps:
      text = maps.read()
  except OSError:
    return 0
  advise = _libc_madvise()
  if advise is None:
    return 0
  return sum(advise(start, end - start, MADV_PAGEOUT) == 0 for start, end in file_mappings(text))


def release_freed_memory(page_out: bool = True) -> bool:
  """Gives the C heap's free pages and the read-only file pages back; True if anything ran.

  `malloc_trim(0)` on glibc (every arena, and the free pages inside each heap, not only
  its top), then `page_out_file_pages` (unless `page_out` is False); nothing when turned
  off. Safe while other threads allocate (glibc takes each arena's lock) or run jaxlib's
  code (a page dropped under a running thread is read back, as under memory pressure).
  """
  if not enabled():
    return False
  trim = _glibc_malloc_trim()
  if trim is not None:
    trim(0)
  paged_out = page_out and page_out_file_pages() > 0
  return paged_out or trim is not None


def drop_compiled_programs() -> bool:
  """Forgets every program JAX has compiled in this process (`jax.clear_caches`) and gives
  their memory back (`release_freed_memory`, the files' pages kept); True if anything ran.

  For the programs a run compiles once before it steps (the network's and the optimiser's
  initialisation, the inner-loop check, a tried task): kept, they hold about 45 MB (VAMPIRE,
  Omniglot Conv4-64) for the length of the run. A program called again after this compiles
  again, to the same numbers. The files' pages stay: the compile that follows would read
  XLA's compiler back from the disk. Off with the release (`VAMPIRE_JAX_MEMORY_RELEASE=0`).
  """
  if not enabled():
    return False
  import jax

  jax.clear_caches()
  return release_freed_memory(page_out=False)


def compiled_on_first_call(jitted: F) -> F:
  """`jitted` (a `jax.jit` function), compiled for its first call's arguments and run as that
  one program from then on, with what JAX traced and lowered to compile it dropped.

  A jitted function keeps its jaxpr and its StableHLO module for as long as the process
  runs, to compile again for new arguments: about 12 MB of the Conv4 VAMPIRE step on
  Omniglot, held while a run steps. A training loop calls its step with arguments of one
  shape, so the run compiles it ahead of time (`jitted.lower(*args).compile()`, the same
  program as the jit's), keeps the executable alone, and empties JAX's caches
  (`jax.clear_caches()`, as `drop_compiled_programs`). Later calls take the first call's
  shapes, dtypes and shardings, positional or by keyword as it was: JAX refuses others with
  an error naming the argument, where a jit would compile again. `.lower` is the jit's, for
  analyses of the program. Off with the release (`VAMPIRE_JAX_MEMORY_RELEASE=0`): `jitted`
  itself.
  """
  if not enabled():
    return jitted
  import jax

  compiled = []

  @functools.wraps(jitted)
  def call(*args, **kwargs):
    if not compiled:
      compiled.append(jitted.lower(*args, **kwargs).compile())
      jax.clear_caches()
    return compiled[0](*args, **kwargs)

  call.lower = jitted.lower  # the same program, for its analyses (memory, costs)
  return call


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
