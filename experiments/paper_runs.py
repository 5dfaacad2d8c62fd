"""Every cell of the paper's tables, trained in turn, resumable over short sessions.

    python -m experiments.paper_runs                                    # all cells, runs/paper
    python -m experiments.paper_runs --time-budget 540                  # a ten-minute session
    python -m experiments.paper_runs --cells omniglot,regression --root runs/paper
    python -m experiments.paper_runs --cells 'omniglot_original_5way*'  # a name pattern

The cells, each a run folder with a fixed name under --root (default runs/paper):

  omniglot_{split}_{preset}_{algorithm}   Table 1: VAMPIRE and MAML, original and
                                          random split, the four presets (16 runs)
  regression_paper                        `experiments.regression --preset paper`,
                                          methods --regression-methods (vampire,maml)
  regression_authors2019                  `experiments.regression --preset authors2019`:
                                          the authors' 2019 settings, 52 000 steps,
                                          every method (Fig. 2 as they ran it)
  mini_imagenet_{preset}_{algorithm}      Table 2: 5way1shot and 5way5shot, VAMPIRE
                                          and MAML; 5way1shot also scores the
                                          15 504-task calibration protocol. Only with
                                          MINI_IMAGENET_DIR set (else skipped, said so)

`--cells` takes group names (omniglot, regression, mini_imagenet) or cell-name
patterns (shell wildcards), comma-separated. Each cell trains in a child
process (`python -m experiments.omniglot --preset ... --workdir <root>/<cell>`),
its output appended to `<root>/<cell>.log`. A cell whose results are written
(results.json; for 5way1shot mini-ImageNet also calibration.json) is skipped;
an interrupted one resumes from its last checkpoint, as the training loop does
when given the same folder and settings.

`--time-budget SECONDS` spreads the work over several short sessions: at
budget - grace (`--grace`, default 60 s) the running child gets SIGTERM, saves
a checkpoint after its current step and exits (if it has not exited after
--grace more seconds it is killed, and later resumes from its last periodic
checkpoint); no cell starts after that point. Run the same command again to go
on. At the end, or when stopped, it lists the cells done, partial (with their
last checkpoint step) and not started, and prints
`python -m experiments.paper_table <root>`.

A cell in training survives the machine: after each call of a cell, its newest checkpoint,
best/, run.json and metrics.jsonl are written to `training/<cell>/` (tracked: commit it), and
a cell whose run folder is absent (a fresh clone) resumes from there
(`experiments.training_cells`; `--training DIR` puts it elsewhere; with --tiny, only where
given). `python -m experiments.paper_runs keep RUN_DIR` puts a run folder there by hand.
A kept cell is never replaced by an older run: where `training/<cell>/` is newer than the
cell's run folder, the cell is refused (a failed cell, in one line naming both steps) and
nothing is copied back.

Ctrl-C or SIGTERM to this runner is passed on to the running child (which
runs in its own session, so it gets the signal once): the child saves its
checkpoint and exits (or is killed after --grace seconds), then the runner
says so in one line and exits with 128 + the signal's number; no child is
left behind holding its run folder's lock (`vampire_jax.runs.interrupts`).

Exit status: 0 when every selected cell is done (cells skipped for a stated
reason aside); 3 when the time budget stopped it first; 1 when a cell failed
(its log says why); 2 for a bad flag; 130 / 143 when stopped by a signal.
"""

import argparse
import fnmatch
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

from experiments import paper_table, training_cells
from vampire_jax import ConfigError, UserError
from vampire_jax.runs import interrupts

REPO_ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("omniglot", "regression", "mini_imagenet")
# The regression comparison of the authors' 2019 settings (`--preset authors2019`).
AUTHORS2019_REGRESSION_METHODS = "vampire,maml,platipus,bmaml,abml"
EXIT_BUDGET = 3
POLL_SECONDS = 0.5

# --tiny (hidden; for the tests): a few steps of small networks, so the runner
# itself can be checked on a CPU. Appended after each cell's flags.
TINY_FLAGS = {
  "omniglot": (
    "--num-meta-steps",
    "4",
    "--num-filters",
    "8",
    "--num-inner-steps",
    "1",
    "--tasks-per-step",
    "2",
    "--query",
    "1",
    "--num-val-tasks",
    "2",
    "--num-test-tasks",
    "4",
    "--eval-batch-tasks",
    "2",
    "--eval-every",
    "2",
    "--checkpoint-every",
    "2",
    "--log-every",
    "2",
    "--num-mc-test",
    "2",
  ),
  "regression": (
    "--num-meta-steps",
    "4",
    "--hidden-sizes",
    "8",
    "8",
    "8",
    "--num-mc-train",
    "2",
    "--num-mc-query",
    "2",
    "--num-mc-test",
    "2",
    "--num-val-tasks",
    "4",
    "--num-test-tasks",
    "10",
    "--eval-batch-tasks",
    "5",
    "--eval-every",
    "2",
    "--checkpoint-every",
    "2",
    "--log-every",
    "2",
  ),
  "mini_imagenet": (
    "--num-meta-steps",
    "4",
    "--image-size",
    "16",
    "--num-filters",
    "8",
    "--num-inner-steps",
    "1",
    "--query",
    "1",
    "--num-mc-train",
    "1",
    "--num-mc-query",
    "1",
    "--num-mc-test",
    "2",
    "--num-val-tasks",
    "2",
    "--num-test-tasks",
    "4",
    "--eval-batch-tasks",
    "2",
    "--eval-every",
    "2",
    "--checkpoint-every",
    "2",
    "--log-every",
    "2",
    "--existing-only",
    "--calibration-tasks",
    "5",
  ),
}


class Cell(NamedTuple):
  """One run of the paper's tables."""

  name: str  # its run folder under --root
  group: str  # omniglot, regression or mini_imagenet
  module: str  # the experiment the child process runs
  flags: tuple  # the experiment's flags (the workdir is added)
  outputs: tuple  # the files that say it is done


def all_cells(regression_methods: str = "vampire,maml") -> list[Cell]:
  """Every cell, in the order they are trained (cheapest settings first)."""
  cells = [
    Cell(
      f"omniglot_{split}_{preset}_{algorithm}",
      "omniglot",
      "experiments.omniglot",
      ("--preset", preset, "--algorithm", algorithm, "--split", split),
      ("results.json",),
    )
    for preset in paper_table.OMNIGLOT_SETTINGS
    for split in ("original", "random")
    for algorithm in ("vampire", "maml")
  ]
  cells.append(
    Cell(
      "regression_paper",
      "regression",
      "experiments.regression",
      ("--preset", "paper", "--algorithms", regression_methods),
      ("results.json",),
    )
  )
  cells.append(  # what the authors' 2019 code ran for Fig. 2, every method (issue 29)
    Cell(
      "regression_authors2019",
      "regression",
      "experiments.regression",
      ("--preset", "authors2019", "--algorithms", AUTHORS2019_REGRESSION_METHODS),
      ("results.json",),
    )
  )
  return cells + [
    _mini_imagenet_cell(preset, algorithm)
    for preset in paper_table.MINI_IMAGENET_SETTINGS
    for algorithm in ("vampire", "maml")
  ]


def _mini_imagenet_cell(preset: str, algorithm: str) -> Cell:
  calibration = preset == paper_table.CALIBRATION_SETTING  # the paper's Fig. 4 setting
  return Cell(
    f"mini_imagenet_{preset}_{algorithm}",
    "mini_imagenet",
    "experiments.mini_imagenet",
    ("--preset", preset, "--algorithm", algorithm)
    + (("--calibration-tasks", "all") if calibration else ()),
    ("results.json", "calibration.json") if calibration else ("results.json",),
  )


def select_cells(cells: list[Cell], spec: str) -> list[Cell]:
  """The cells named by `spec`: comma-separated groups or name patterns, in `cells`' order."""
  items = [item.strip() for item in spec.split(",") if item.strip()]
  for item in items:
    if not any(_matches(cell, item) for cell in cells):
      raise ConfigError(
        f"--cells: {item!r} names no cell; groups are {', '.join(GROUPS)}, "
        f"cells are named like {cells[0].name}"
      )
  return [cell for cell in cells if any(_matches(cell, item) for item in items)]


def _matches(cell: Cell, item: str) -> bool:
  return item == cell.group or fnmatch.fnmatchcase(cell.name, item)


# -- A cell's state, from its folder ------------------------------------------------


def is_done(cell: Cell, folder: Path) -> bool:
  return all((folder / name).is_file() for name in cell.outputs)


def checkpoint_steps(folder: Path) -> dict[str, int]:
  """`{run folder name: its latest checkpoint step}` for the cell's run(s).

  A comparison (regression) holds one run per method in a sub-folder.
  """
  steps = {}
  for checkpoints in [folder / "checkpoints", *sorted(folder.glob("*/checkpoints"))]:
    numbered = (
      [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()]
      if checkpoints.is_dir()
      else []
    )
    if numbered:
      steps[checkpoints.parent.name] = max(numbered)
  return steps


def cell_state(cell: Cell, folder: Path) -> tuple[str, str]:
  """('done' | 'partial' | 'not started', detail)."""
  if is_done(cell, folder):
    return "done", ""
  steps = checkpoint_steps(folder)
  if not steps:
    return "not started", ""
  if list(steps) == [folder.name]:
    return "partial", f"checkpoint step {steps[folder.name]}"
  return "partial", ", ".join(f"{name}: checkpoint step {step}" for name, step in steps.items())


# -- Running a cell ------------------------------------------------------------------


def _now() -> float:
  """The runner's clock (a name of its own, so a test can move it)."""
  return time.monotonic()


def child_command(cell: Cell, folder: Path, tiny: bool, extra_flags: list[str]) -> list[str]:
  flags = list(cell.flags) + list(TINY_FLAGS[cell.group] if tiny else ()) + extra_flags
  return [
    sys.executable,
    "-m",
    cell.module,
    *flags,
    "--workdir",
    str(folder.resolve()),
    "--no-progress",
  ]


def run_child(command: list[str], log_path: Path, stop_at: float, grace: float) -> tuple[int, bool]:
  """Runs `command` to its end or to `stop_at`; returns (exit code, whether it was stopped).

  At `stop_at` the child gets SIGTERM (it saves a checkpoint and exits), and
  SIGKILL if it is still running `grace` seconds later. The child runs in its
  own session: a signal to this process (Ctrl-C, SIGTERM) reaches it once,
  passed on by `interrupts.forwarding`, which waits for it (or kills it after
  `grace`) before this process stops.
  """
  with open(log_path, "a") as log:
    log.write(f"\n$ {shlex.join(command)}\n")
    log.flush()
    child = subprocess.Popen(
      command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True
    )
    with interrupts.forwarding(child, grace):
      while True:
        try:
          return child.wait(timeout=POLL_SECONDS), False
        except subprocess.TimeoutExpired:
          if _now() >= stop_at:
            return _stop(child, grace), True


def _stop(child: subprocess.Popen, grace: float) -> int:
  child.send_signal(signal.SIGTERM)
  return interrupts.wait_or_kill(child, grace)


def _log_tail(log_path: Path, lines: int = 8) -> str:
  text = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
  return "\n".join("     " + line for line in text[-lines:])


def run_cell(cell: Cell, root: Path, args: argparse.Namespace, stop_at: float) -> str:
  """Trains one cell in a child process; returns 'done', 'stopped' or 'failed'."""
  folder, log_path = root / cell.name, root / f"{cell.name}.log"
  print(f"== {cell.name}: training (log {log_path})", flush=True)
  start = time.monotonic()
  code, stopped = run_child(
    child_command(cell, folder, args.tiny, args.extra_flags), log_path, stop_at, args.grace
  )
  minutes = (time.monotonic() - start) / 60
  if stopped:
    state, detail = cell_state(cell, folder)
    print(f"   stopped by the time budget after {minutes:.1f} min: {state} {detail}", flush=True)
    return "stopped"
  if code == 0 and is_done(cell, folder):
    print(f"   done in {minutes:.1f} min", flush=True)
    return "done"
  print(f"   failed (exit code {code}); the end of {log_path}:\n{_log_tail(log_path)}", flush=True)
  return "failed"


# -- The session ------------------------------------------------------------------------


def skip_reason(cell: Cell) -> Optional[str]:
  """Why a cell cannot run here, or None."""
  if cell.group == "mini_imagenet" and not os.environ.get("MINI_IMAGENET_DIR"):
    return "MINI_IMAGENET_DIR is not set"
  return None


def run_cells(cells: list[Cell], root: Path, args: argparse.Namespace) -> dict[str, str]:
  """Runs each cell not done yet; returns `{cell name: outcome}`.

  Outcomes: 'done' (before or now), 'skipped: why', 'stopped' (by the
  budget), 'not run' (no time left), 'failed' (or 'failed: why', refused). With a tracked
  folder (`args.training`), a cell resumes from its kept state where its run folder is
  absent, is refused where its kept state is newer than its run folder, and is kept after its
  call, never over a newer kept state (`training_cells`).
  """
  budget = math.inf if args.time_budget is None else args.time_budget
  stop_at = _now() + budget - args.grace
  outcomes = {}
  for cell in cells:
    reason = skip_reason(cell)
    if is_done(cell, root / cell.name):
      outcomes[cell.name] = "done"
    elif reason is not None:
      outcomes[cell.name] = f"skipped: {reason}"
    elif _now() >= stop_at:
      outcomes[cell.name] = "not run"
    else:
      outcomes[cell.name] = _run_and_keep(cell, root, args, stop_at)
  return outcomes


def _run_and_keep(cell: Cell, root: Path, args: argparse.Namespace, stop_at: float) -> str:
  """`run_cell`, resumed from its kept state and kept after its call where `args.training` is
  set; 'failed: why' where a kept cell is newer than its run folder (`training_cells`): a
  kept cell is never replaced by an older run, whatever the call's outcome."""
  folder = root / cell.name
  if args.training is None:
    return run_cell(cell, root, args, stop_at)
  try:
    training_cells.restore(folder, args.training / cell.name)
  except ConfigError as error:
    print(f"== {cell.name}: not trained: {error}", flush=True)
    return f"failed: {args.training / cell.name} is newer than {folder}"
  outcome = run_cell(cell, root, args, stop_at)
  if training_cells.newest_step(folder) is not None:
    try:
      training_cells.keep_and_say(folder, args.training / cell.name)
    except ConfigError as error:
      print(f"   not kept: {error}", flush=True)
      return f"failed: not kept, {args.training / cell.name} is newer"
  return outcome


def report(cells: list[Cell], root: Path, outcomes: dict[str, str]) -> str:
  """Which cells are done, partial (with their checkpoint step), not started, skipped, failed."""
  groups = {"done": [], "partial": [], "not started": [], "skipped": [], "failed": []}
  for cell in cells:
    outcome = outcomes[cell.name]
    state, detail = cell_state(cell, root / cell.name)
    if outcome.startswith("skipped") and state != "done":
      state, detail = "skipped", outcome.removeprefix("skipped: ")
    elif outcome == "failed":
      state, detail = "failed", f"see {root / cell.name}.log" + (f"; {detail}" if detail else "")
    elif outcome.startswith("failed: "):  # refused, for the reason it gives
      state, detail = "failed", outcome.removeprefix("failed: ") + (f"; {detail}" if detail else "")
    groups[state].append(cell.name + (f" ({detail})" if detail else ""))
  lines = [f"== paper runs in {root}: " + ", ".join(f"{len(v)} {k}" for k, v in groups.items())]
  for state, names in groups.items():
    lines += ([f"{state}:"] + [f"  {name}" for name in names]) if names else []
  return "\n".join(lines)


def exit_code(outcomes: dict[str, str]) -> int:
  values = set(outcomes.values())
  if any(value == "failed" or value.startswith("failed: ") for value in values):
    return 1
  return EXIT_BUDGET if values & {"stopped", "not run"} else 0


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--root",
    type=Path,
    default=Path("runs/paper"),
    help="folder of the cells' run folders (default: runs/paper)",
  )
  parser.add_argument(
    "--cells",
    default=",".join(GROUPS),
    help="groups or cell-name patterns, comma-separated (default: all groups)",
  )
  parser.add_argument(
    "--time-budget",
    type=float,
    default=None,
    metavar="SECONDS",
    help="stop cleanly before this many seconds have passed (exit code 3)",
  )
  parser.add_argument(
    "--grace",
    type=float,
    default=60.0,
    metavar="SECONDS",
    help="a stopped cell's time to save and exit, kept free at the end of the budget (default: 60)",
  )
  parser.add_argument(
    "--regression-methods",
    default="vampire,maml",
    help="methods of the regression cell (default: vampire,maml)",
  )
  parser.add_argument(
    "--extra-flags",
    type=shlex.split,
    default=[],
    metavar="'FLAGS'",
    help="more flags for every cell's experiment (the same on every call, or "
    "a cell will not resume), e.g. --extra-flags='--eval-batch-tasks 50'",
  )
  parser.add_argument(
    "--training",
    type=Path,
    default=None,
    metavar="DIR",
    help="the tracked folder of cells in training: a cell resumes from DIR/<cell> where its "
    "run folder is absent, and is written there after each call (default: training/ of "
    "this clone; with --tiny, none)",
  )
  parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.training is None and not args.tiny:  # tiny cells are the tests', never kept
    args.training = training_cells.TRAINING
  return args


def main(argv=None) -> int:
  """Runs the selected cells; prints the report and the paper table; returns the exit code.

  `main(["keep", RUN_DIR, ...])` puts a run folder in the tracked folder instead
  (`training_cells.main`).
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["keep"]:
    return training_cells.main(argv[1:], [cell.name for cell in all_cells()])
  try:
    args = parse_args(argv)
    cells = select_cells(all_cells(args.regression_methods), args.cells)
  except UserError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  args.root.mkdir(parents=True, exist_ok=True)
  unfinished = [cell for cell in cells if not is_done(cell, args.root / cell.name)]
  for reason in sorted({skip_reason(cell) for cell in unfinished} - {None}):
    print(
      f"skipping the mini-ImageNet cells: {reason}; set it to a mini-ImageNet folder (see "
      "experiments/mini_imagenet.py) to run them"
    )
  outcomes = run_cells(cells, args.root, args)
  print(report(cells, args.root, outcomes))
  code = exit_code(outcomes)
  if code == EXIT_BUDGET:
    print("stopped by the time budget: run the same command again to go on")
  print()
  paper_table.main([str(args.root)])
  return code


def entry(argv=None) -> int:
  """`main` as a command: a signal or a fault ends in one line (`interrupts.run_command`)."""
  codes = []
  stopped = interrupts.run_command(lambda: codes.append(main(argv)))
  return codes[0] if codes else stopped


if __name__ == "__main__":
  sys.exit(entry())
