"""The compiler's freed memory goes back to the system, and no number changes (issue 62)."""

import ctypes
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import regression
from tests.conftest import tiny_regression_config
from tests.helpers import check_page_out_drops_a_files_pages
from vampire_jax._src.core import host_memory
from vampire_jax._src.core.errors import ConfigError

GLIBC = host_memory._glibc_malloc_trim() is not None


needs_glibc = pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")


RELEASE = host_memory.release_freed_memory  # the function itself, before any test patches it


def _rss_mb() -> float:
  """The process's resident memory now (Linux), MB."""
  pages = int(Path("/proc/self/statm").read_text().split()[1])
  return pages * 4096 / 2**20


def _freed_heap_mb(megabytes: int) -> tuple[float, object]:
  """Fills `megabytes` of the C heap in 1 KiB blocks and frees all but the last.

  The last block sits at the heap's top, so glibc's `free` cannot shrink it: the freed
  pages stay resident until `malloc_trim`, as a compile's do. Returns (RSS after the free,
  the kept block, to free later).
  """
  libc = ctypes.CDLL("libc.so.6")
  libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
  libc.free.argtypes = [ctypes.c_void_p]
  blocks = [libc.malloc(1024) for _ in range(megabytes * 1024)]
  for block in blocks:
    ctypes.memset(block, 1, 1024)  # resident
  for block in blocks[:-1]:
    libc.free(block)
  return _rss_mb(), (libc, blocks[-1])


def _train(workdir: Path, monkeypatch, setting: str) -> tuple[list[dict], list[bool]]:
  """A tiny regression run's logged rows (no wall-clock rates) and what each release did."""
  monkeypatch.setenv(host_memory.ENV_VAR, setting)
  released = []
  monkeypatch.setattr(
    host_memory,
    "release_freed_memory",
    lambda page_out=True: released.append(RELEASE(page_out)),
  )
  config = tiny_regression_config("vampire", num_meta_steps=4, num_mc_test=2)
  results = regression.run_experiment(config, workdir, progress=False, print_fn=lambda m: None)
  rows = [
    {k: v for k, v in json.loads(line).items() if not k.endswith("_per_s")}
    for line in (workdir / "metrics.jsonl").read_text().splitlines()
  ]
  return rows + [{"test": results["test"]}], released


@needs_glibc
@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_release_gives_freed_heap_pages_back_unless_turned_off(monkeypatch, setting):
  monkeypatch.setenv(host_memory.ENV_VAR, setting)
  held, (libc, last) = _freed_heap_mb(128)
  try:
    released = host_memory.release_freed_memory()
    drop = held - _rss_mb()
  finally:
    libc.free(last)
  if setting == "1":
    assert released and drop > 100, (held, drop)
  else:
    assert not released and drop < 20, (held, drop)


def test_the_release_runs_once_after_each_call_that_compiled(monkeypatch):
  calls = []
  monkeypatch.setattr(host_memory, "release_freed_memory", lambda: calls.append(1))
  square = host_memory.releasing_after_compiles(jax.jit(lambda x: x * x + 1.0))
  assert float(square(jnp.float32(3.0))) == 10.0
  assert len(calls) == 1  # compiled
  square(jnp.float32(4.0))
  assert len(calls) == 1  # the same program
  square(jnp.ones(3, jnp.float32))
  assert len(calls) == 2  # a new shape compiles again


@pytest.mark.slow  # two tiny runs: 37 s of CPU (12.5 min niced on the shared 2 cores)
def test_a_run_logs_the_same_rows_with_and_without_the_release(tmp_path, monkeypatch):
  rows_on, released_on = _train(tmp_path / "on", monkeypatch, "1")
  rows_off, released_off = _train(tmp_path / "off", monkeypatch, "0")
  assert len(rows_on) >= 4 and rows_on == rows_off  # bit for bit: JSON floats as written
  # The train step and the evaluator each released after their first call, and only then.
  assert len(released_on) >= 2 and released_on == [GLIBC] * len(released_on)
  assert len(released_off) >= 2 and not any(released_off)


@pytest.mark.parametrize(
  "setting, on",
  [("1", True), ("on", True), ("TRUE", True), (" Yes ", True), ("", True)]
  + [("0", False), ("OFF", False), ("false", False), ("No", False)],
)
def test_the_switch_takes_the_documented_values_in_any_case(monkeypatch, setting, on):
  """VAMPIRE_JAX_MEMORY_RELEASE: 1, on, true, yes turn the release on and 0, off, false, no
  turn it off, in any case and with spaces around; set but empty is the default, on."""
  monkeypatch.setenv(host_memory.ENV_VAR, setting)
  assert host_memory.enabled() is on


def test_the_switch_is_on_when_unset(monkeypatch):
  """Without VAMPIRE_JAX_MEMORY_RELEASE the release is on."""
  monkeypatch.delenv(host_memory.ENV_VAR, raising=False)
  assert host_memory.enabled()


@pytest.mark.parametrize("setting", ["disabled", "none", "n", "00", "2", "offf"])
def test_the_switch_refuses_any_other_value_naming_it_and_the_values_it_takes(monkeypatch, setting):
  """Any other value of VAMPIRE_JAX_MEMORY_RELEASE is refused in one line (a ConfigError)
  naming the variable, the value and the values it takes: by `enabled`, by a release, and by
  `releasing_after_compiles` when it wraps a function, before anything is compiled."""
  monkeypatch.setenv(host_memory.ENV_VAR, setting)
  compiled = []
  for attempt in (
    host_memory.enabled,
    host_memory.release_freed_memory,
    lambda: host_memory.releasing_after_compiles(lambda: compiled.append(1)),
  ):
    with pytest.raises(ConfigError) as raised:
      attempt()
    message = str(raised.value)
    assert "\n" not in message
    assert host_memory.ENV_VAR in message and repr(setting) in message, message
    for value in ("1", "on", "true", "yes", "0", "off", "false", "no"):
      assert re.search(rf"\b{value}\b", message), (value, message)
  assert not compiled


def test_dropping_the_compiled_programs_forgets_them_unless_the_release_is_off(monkeypatch):
  """`drop_compiled_programs` empties JAX's caches (a program called again compiles again, to
  the same numbers) and gives the memory back; with the release off it does nothing."""
  host_memory._listen()
  square = jax.jit(lambda x: x * x + 1.0)
  x = jnp.arange(3.0)
  before = square(x)
  seen = host_memory.compiles_seen()
  square(x)
  assert host_memory.compiles_seen() == seen  # cached
  monkeypatch.setenv(host_memory.ENV_VAR, "0")
  assert host_memory.drop_compiled_programs() is False
  square(x)
  assert host_memory.compiles_seen() == seen  # still cached
  monkeypatch.setenv(host_memory.ENV_VAR, "1")
  assert host_memory.drop_compiled_programs() is GLIBC
  again = square(x)
  assert host_memory.compiles_seen() == seen + 1  # compiled again
  assert jnp.array_equal(again, before)


def test_the_training_loop_drops_its_setup_programs_before_it_steps(tmp_path, monkeypatch):
  """The run forgets what it compiled to set up (initialisation, the inner-loop check) once,
  before its training step compiles; its rows are those of the release tests above."""
  dropped = []
  drop = host_memory.drop_compiled_programs
  monkeypatch.setattr(
    host_memory,
    "drop_compiled_programs",
    lambda: dropped.append(host_memory.compiles_seen()) or drop(),
  )
  rows, _ = _train(tmp_path / "run", monkeypatch, "1")
  assert len(dropped) == 1 and dropped[0] > 0  # after the setup's compiles
  assert rows


def test_the_file_mappings_are_the_read_only_regular_files():
  """Writable mappings (copied on write: a library's data), anonymous memory, the heap and
  devices are not a file's own pages and are left out; paths with spaces are kept whole."""
  maps = "\n".join(
    [
      "7f0000000000-7f0000100000 r-xp 00000000 08:01 11 /lib/libjax_common.so",
      "7f0000100000-7f0000200000 r--p 00100000 08:01 11 /lib/libjax_common.so",
      "7f0000200000-7f0000210000 rw-p 00200000 08:01 11 /lib/libjax_common.so",
      "7f0000300000-7f0000400000 rw-p 00000000 00:00 0 ",
      "55d000000000-55d000100000 rw-p 00000000 00:00 0                [heap]",
      "7f0000500000-7f0000600000 r--s 00000000 00:05 3 /dev/shm/segment",
      "7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                [vdso]",
      "7f0000700000-7f0000800000 r--p 00000000 08:01 12 /opt/my libs/data file.bin",
    ]
  )
  assert host_memory.file_mappings(maps) == [
    (0x7F0000000000, 0x7F0000100000),
    (0x7F0000100000, 0x7F0000200000),
    (0x7F0000700000, 0x7F0000800000),
  ]


def test_paging_out_drops_a_read_only_files_resident_pages_and_loses_nothing(tmp_path):
  """A file of this test's own, mapped read-only and read through: the release's page-out
  takes its pages out of this process's resident memory, and reading it again gives the
  same bytes (read back from the file). The PyTorch harness's twin:
  tests/benchmark_scripts/test_authors_pytorch.py."""
  check_page_out_drops_a_files_pages(tmp_path, host_memory.page_out_file_pages)


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_release_pages_the_files_out_unless_turned_off(monkeypatch, setting):
  """The release after a compile pages the files out; dropping the setup's programs does
  not (a compile follows it, and would read the compiler back from the disk)."""
  monkeypatch.setenv(host_memory.ENV_VAR, setting)
  calls = []
  monkeypatch.setattr(host_memory, "page_out_file_pages", lambda: calls.append(1) or 3)
  released = host_memory.release_freed_memory()
  assert calls == ([1] if setting == "1" else [])
  assert released is (setting == "1")
  host_memory.drop_compiled_programs()
  assert len(calls) == (1 if setting == "1" else 0)


def _events_during(fn) -> list[str]:
  """The names of the `jax.monitoring` duration events while `fn()` runs."""
  events, listening = [], [True]
  jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kwargs: listening[0] and events.append(event)
  )
  try:
    fn()
  finally:
    listening[0] = False  # jax.monitoring has no public way to unregister
  return events


def test_a_step_compiled_on_first_call_is_the_jits_program_and_keeps_nothing_else(monkeypatch):
  """`compiled_on_first_call` compiles once, for the first call's arguments, and empties JAX's
  caches (the jit's traces and lowering); every call equals the jit's, bit for bit, with the
  state donated; arguments of another shape are refused, naming the argument, not compiled
  again. With the release off it is the jit itself."""
  monkeypatch.setenv(host_memory.ENV_VAR, "1")
  host_memory._listen()
  step = jax.jit(lambda state, x: (state * 0.5 + x * x, jnp.sum(state)), donate_argnums=0)
  inputs = [jax.random.normal(jax.random.key(i), (5,)) for i in range(4)]
  expected, state = [], jnp.ones(5)
  for x in inputs:
    state, total = step(state, x)
    expected.append((np.asarray(state), np.asarray(total)))  # copies: the state is donated
  jax.clear_caches()  # so that the step compiles afresh
  compiled = host_memory.compiled_on_first_call(step)
  state, seen = jnp.ones(5), host_memory.compiles_seen()
  for i, x in enumerate(inputs):
    state, total = compiled(state, x)
    assert np.array_equal(state, expected[i][0]) and np.array_equal(total, expected[i][1])
    if i == 0:
      assert host_memory.compiles_seen() == seen + 1  # the one program
      seen += 1
      traced = _events_during(lambda: step.lower(state, x))
      assert "/jax/core/compile/jaxpr_trace_duration" in traced, traced  # its traces: dropped
  assert host_memory.compiles_seen() == seen  # no call after the first compiled
  with pytest.raises(TypeError, match="Argument 'state' compiled with float32\\[5\\]"):
    compiled(jnp.ones(6), jnp.ones(6))
  assert compiled.lower(state, inputs[0]).compile().memory_analysis() is not None  # the jit's
  by_keyword = host_memory.compiled_on_first_call(step)  # arguments by keyword, as the jit's
  state, total = by_keyword(state=jnp.ones(5), x=inputs[0])
  assert np.array_equal(state, expected[0][0]) and np.array_equal(total, expected[0][1])
  with pytest.raises(TypeError, match="input pytree"):  # then always by keyword
    by_keyword(state, inputs[1])
  monkeypatch.setenv(host_memory.ENV_VAR, "0")
  assert host_memory.compiled_on_first_call(step) is step
