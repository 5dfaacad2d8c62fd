"""Where a test's time goes: tracing, lowering, XLA's compiles, and the rest (running).

    python -m benchmarks.suite_time tests/baselines/test_simpa.py
    python -m benchmarks.suite_time tests -m "not slow" --top 40 --json build/suite_time.json

Runs pytest in this one process (no xdist, so each test's time is its own) with a plugin
that listens to JAX's monitoring events and, for each test (setup, call and teardown
together), sums the seconds spent tracing to jaxprs, lowering them to MLIR, and in XLA's
backend compiles, with the number of compiles. What is left is running the programs and
Python. Tests in fresh processes count only their parent's share: their children's time is
"rest". Any pytest arguments after the script's own are passed on. Before the table it
prints the processor the tests ran on, `processor: ...`; each test's row of `--json` carries
it as `processor` (`vampire_jax.backend.processor_record()`).
"""

import argparse
import collections
import json
import sys
import time

import pytest
from jax import monitoring

from benchmarks import suite

EVENTS = {
  "/jax/core/compile/jaxpr_trace_duration": "trace",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
  "/jax/core/compile/backend_compile_duration": "compile",
}


class TimeBreakdown:
  """A pytest plugin: per test, wall seconds and the seconds of each JAX event."""

  def __init__(self):
    self.current = None
    self.rows = collections.defaultdict(collections.Counter)
    self.programs = collections.Counter()  # (test, program's name): compile seconds
    monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_duration(self, event, duration, fun_name="?", **_):
    part = EVENTS.get(event)
    if part is not None and self.current is not None:
      self.rows[self.current][part] += duration
      if part == "compile":
        self.rows[self.current]["compiles"] += 1
        self.programs[(self.current, fun_name)] += duration

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item, nextitem):
    self.current = item.nodeid
    start, cpu_start = time.perf_counter(), time.process_time()
    yield
    self.rows[item.nodeid]["wall"] += time.perf_counter() - start
    # This process's CPU seconds (every thread): on a busy machine, the fairer measure.
    self.rows[item.nodeid]["cpu"] += time.process_time() - cpu_start
    self.current = None


def table(rows: dict, top: int) -> str:
  parts = ("trace", "lower", "compile")
  lines = [
    "| test | wall s | cpu s | trace s | lower s | compile s | compiles | rest s |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  ordered = sorted(rows.items(), key=lambda item: -item[1]["wall"])
  totals = collections.Counter()
  for _, row in ordered:
    totals.update(row)
  for name, row in ordered[:top] + [("all tests", totals)]:
    rest = row["wall"] - sum(row[p] for p in parts)
    cells = [f"{row[p]:.1f}" for p in ("wall", "cpu", *parts)] + [
      f"{row['compiles']:.0f}",
      f"{rest:.1f}",
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--top", type=int, default=30, help="rows in the table (slowest first)")
  parser.add_argument("--json", help="also write every test's numbers here")
  parser.add_argument(
    "--programs", type=int, default=0, help="also list the N programs with most compile time"
  )
  args, pytest_args = parser.parse_known_args(argv)
  plugin = TimeBreakdown()
  code = pytest.main(["-p", "no:xdist", "-q", *pytest_args], plugins=[plugin])
  from vampire_jax import backend  # after the tests, which import the library as they need

  processor = backend.processor_record()
  print(suite.processor_line(processor))
  print(table(plugin.rows, args.top))
  for (test, program), seconds in plugin.programs.most_common(args.programs):
    print(f"{seconds:7.2f} s  {program}  ({test})")
  if args.json:
    with open(args.json, "w") as f:
      rows = {name: dict(row, processor=processor) for name, row in plugin.rows.items()}
      json.dump(rows, f, indent=1)
  return int(code)


if __name__ == "__main__":
  sys.exit(main())
