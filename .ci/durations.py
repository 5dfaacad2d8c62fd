"""The suite's time from a pytest JUnit report: the slowest tests and the time per module.

    python -m pytest ... --junitxml=report.xml
    python .ci/durations.py report.xml [--top 40]
    python .ci/durations.py ci.log  # or a log of pytest's `--durations=0` (what .ci/run prints)

Prints two Markdown tables (docs/development.md holds them): the `--top` slowest tests and
every module's summed time, with each one's tier (fast, or `slow` for the tests marked so;
the report has no markers, so a test counts as slow when the file named by `--slow-list`
lists it: `python -m pytest -m slow --collect-only -q > slow.txt`). A test's time is its
set-up, call and tear-down: a module's first test carries its module fixtures.
"""

import argparse
import collections
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def read_report(path: Path) -> list[tuple[str, float, str]]:
  """`(test id, seconds, outcome)` of every test case in a JUnit report."""
  cases = []
  for case in ElementTree.parse(path).getroot().iter("testcase"):
    module = case.get("file") or _path_of(case.get("classname", ""))
    outcome = next(
      (tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed"
    )
    cases.append((f"{module}::{case.get('name')}", float(case.get("time", 0)), outcome))
  return cases


def read_log(path: Path) -> list[tuple[str, float, str]]:
  """`(test id, seconds, "passed")` from the lines pytest's `--durations=N` prints
  ("12.34s call     tests/test_zoo.py::test_x"), set-up, call and tear-down summed. Only
  the times printed are there: run with `--durations=0` for every test."""
  seconds = collections.defaultdict(float)
  for line in path.read_text().splitlines():
    match = DURATION_LINE.match(line.strip())
    if match:
      seconds[match["test"]] += float(match["seconds"])
  return [(test_id, total, "passed") for test_id, total in seconds.items()]


DURATION_LINE = re.compile(r"^(?P<seconds>\d+\.\d+)s (?:setup|call|teardown)\s+(?P<test>\S+::.+)$")


def _path_of(classname: str) -> str:
  """ "tests.test_zoo" (or "tests.test_zoo.SomeTest") -> "tests/test_zoo.py"; a doctest
  file's "docs.user_guide.md" -> "docs/user_guide.md"."""
  parts = classname.split(".")
  if parts[-1] == "md":
    return "/".join(parts[:-1]) + ".md"
  while len(parts) > 1 and parts[-1][:1].isupper():  # a test class inside the module
    parts.pop()
  return "/".join(parts) + ".py"


def module_of(test_id: str) -> str:
  return test_id.split("::")[0]


def tables(cases, slow: set[str], top: int) -> str:
  ranked = sorted(cases, key=lambda case: -case[1])[:top]
  lines = ["| # | test | seconds | tier |", "|---|---|---|---|"]
  for rank, (test_id, seconds, outcome) in enumerate(ranked, 1):
    tier = "slow" if test_id in slow else "fast"
    note = "" if outcome == "passed" else f" ({outcome})"
    lines.append(f"| {rank} | `{test_id}`{note} | {seconds:.1f} | {tier} |")
  per_module = collections.defaultdict(lambda: [0.0, 0, 0.0])
  for test_id, seconds, _ in cases:
    entry = per_module[module_of(test_id)]
    entry[0] += seconds
    entry[1] += 1
    entry[2] += seconds if test_id in slow else 0.0
  lines += ["", "| module | tests | seconds | of which slow tier |", "|---|---|---|---|"]
  for module, (seconds, count, slow_seconds) in sorted(per_module.items(), key=lambda m: -m[1][0]):
    lines.append(f"| `{module}` | {count} | {seconds:.0f} | {slow_seconds:.0f} |")
  total = sum(seconds for _, seconds, _ in cases)
  lines.append(
    f"| all | {len(cases)} | {total:.0f} | {sum(s for t, s, _ in cases if t in slow):.0f} |"
  )
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("report", type=Path)
  parser.add_argument("--top", type=int, default=40)
  parser.add_argument("--slow-list", type=Path, help="test ids of the slow tier, one a line")
  args = parser.parse_args()
  slow = set()
  if args.slow_list:
    slow = {line.strip() for line in args.slow_list.read_text().splitlines() if "::" in line}
  read = read_report if args.report.suffix == ".xml" else read_log
  print(tables(read(args.report), slow, args.top))


if __name__ == "__main__":
  main()
