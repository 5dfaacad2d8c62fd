"""Our meta-steps timed beside the authors' algorithm in PyTorch, one process at a time (issue 22).

    python -m benchmarks.side_by_side --torch-python /work/torchenv/bin/python --json side_by_side.json
    python -m benchmarks.side_by_side --rows omniglot_vampire,omniglot_maml --rounds 2 --repeats 3
    python -m benchmarks.side_by_side --rows omniglot_vampire,regression_vampire --tasks 2 \\
        --mc-samples 2 --repeats 1 --rounds 1                                  # smoke test, ~2 min
    python -m benchmarks.side_by_side --torch-args="--inner-grad joint"       # PyTorch, one backward per inner step

For each row, each round runs the PyTorch script (`benchmarks/authors_pytorch.py`
with --torch-python, which needs torch and numpy only) and our own benchmark,
each in its own process, one after the other; the order alternates between
rounds (PyTorch first in odd rounds), so drift in the machine's load falls on
both. Ours, per row (the same settings as `benchmarks.suite.SETTINGS`; the
like-for-like check of the two is tests/benchmark_scripts/test_authors_pytorch.py):

  omniglot_vampire       python -m benchmarks.meta_step --algorithms vampire --second-order-steps 1
  omniglot_maml          python -m benchmarks.meta_step --algorithms maml
  mini_imagenet_vampire  python -m benchmarks.suite --settings mini_imagenet_5w1s --algorithms vampire
                             --second-order-steps 1
  regression_vampire     python -m benchmarks.suite --settings regression --algorithms vampire
                             --second-order-steps 1
  episode_vampire_omniglot       python -m benchmarks.suite --episodes --settings omniglot_5w1s
  episode_vampire_mini_imagenet  python -m benchmarks.suite --episodes --settings mini_imagenet_5w1s

VAMPIRE's training rows use the authors' truncation on both sides (the
likelihood's gradient differentiated in inner step 1 only);
`--second-order-steps all` makes both fully second order (Alg. 1, our
default). MAML is second order in every step on both sides. --tasks, --repeats,
--mc-samples (mini-ImageNet and regression; Omniglot's L is 1 on both sides),
--episode-tasks and --episode-mc-samples go to both commands.

Prints one markdown table (s/step, or s/call for an episode, per round; the
ratio PyTorch / ours of the rounds' means, each round's in brackets; the
largest peak resident memory of the rounds, MB, of the whole process and of
its timed steps alone: ours after the compile's freed memory went back to the
system, `benchmarks.suite.measure_stepping`) and writes every result, the
commands and each process's log under --log-dir. Our compile time is left
out of s/step (as PyTorch's first step is), and reported in the JSON. A process that
failed is "failed" in the table, and then the command exits with status 1 naming it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
ROWS = (
  "omniglot_vampire",
  "omniglot_maml",
  "mini_imagenet_vampire",
  "regression_vampire",
  "episode_vampire_omniglot",
  "episode_vampire_mini_imagenet",
)
# Rows our `benchmarks.suite` runs, by its setting name; the Omniglot training rows run
# `benchmarks.meta_step` (that setting, L = 1).
SUITE_SETTINGS = {
  "mini_imagenet_vampire": "mini_imagenet_5w1s",
  "regression_vampire": "regression",
  "episode_vampire_omniglot": "omniglot_5w1s",
  "episode_vampire_mini_imagenet": "mini_imagenet_5w1s",
}


def _is_episode(row: str) -> bool:
  return row.startswith("episode_")


def our_command(row: str, options: dict, json_path: str) -> list[str]:
  """The command that times our side of `row`, writing its rows to `json_path`."""
  repeats = ["--repeats", str(options["repeats"])]
  second_order = (
    []
    if options["second_order_steps"] is None
    else ["--second-order-steps", str(options["second_order_steps"])]
  )
  if row in ("omniglot_vampire", "omniglot_maml"):
    algorithm = row.split("_")[1]
    command = [sys.executable, "-m", "benchmarks.meta_step", "--algorithms", algorithm]
    command += second_order if algorithm == "vampire" else []
    if options["tasks"]:
      command += ["--tasks", str(options["tasks"])]
    return command + repeats + ["--json", json_path]
  command = [sys.executable, "-m", "benchmarks.suite", "--settings", SUITE_SETTINGS[row]]
  if _is_episode(row):
    command += ["--episodes", "--episode-tasks", options["episode_tasks"]]
    command += ["--episode-mc-samples", str(options["episode_mc_samples"])]
  else:
    command += ["--algorithms", "vampire"] + second_order
    if options["tasks"]:
      command += ["--tasks", str(options["tasks"])]
    if options["mc_samples"]:
      command += ["--mc-samples", str(options["mc_samples"])]
  return command + repeats + ["--json", json_path]


def torch_command(row: str, options: dict, json_path: str) -> list[str]:
  """The command that times the authors' algorithm in PyTorch for `row`."""
  command = [
    options["torch_python"],
    str(REPO / "benchmarks" / "authors_pytorch.py"),
    "--rows",
    row,
    "--repeats",
    str(options["repeats"]),
    "--threads",
    str(options["threads"]),
    "--second-order-steps",
    "all" if options["second_order_steps"] is None else str(options["second_order_steps"]),
  ]
  if _is_episode(row):
    command += ["--episode-tasks", options["episode_tasks"]]
    command += ["--episode-mc-samples", str(options["episode_mc_samples"])]
  else:
    if options["tasks"]:
      command += ["--tasks", str(options["tasks"])]
    if options["mc_samples"] and row not in ("omniglot_vampire", "omniglot_maml"):
      command += ["--mc-samples", str(options["mc_samples"])]
  return command + options["torch_args"] + ["--json", json_path]


def _seconds(result: dict) -> Optional[float]:
  return result.get("episode_s", result.get("step_s"))


def _units(row: str, results: list[dict]) -> dict:
  """`{tasks or None: result}`: an episode row has one result per task count."""
  if _is_episode(row):
    return {r["tasks"]: r for r in results}
  return {None: results[0]} if results else {}


def run_process(command: list[str], log_path: Path, timeout: Optional[float]) -> tuple[bool, float]:
  """Runs `command` from the repository root, output to `log_path`: `(succeeded, wall seconds)`."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  start = time.perf_counter()
  with open(log_path, "w") as log:
    log.write(" ".join(command) + "\n\n")
    log.flush()
    try:
      code = subprocess.run(
        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
      ).returncode
    except subprocess.TimeoutExpired:
      log.write(f"\nside_by_side: stopped after {timeout} s\n")
      code = None
  return code == 0, time.perf_counter() - start


def _read(path: str) -> list[dict]:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return []


def collect(runs: list[dict], episode_tasks: list[int]) -> list[dict]:
  """One entry per row (and task count, for episodes), its rounds' results on both sides.

  A process that failed leaves its side's seconds None ("failed" in the table).
  """
  entries = {}
  for run in runs:
    counts = episode_tasks if _is_episode(run["row"]) else [None]
    for tasks in counts:
      entries.setdefault(
        (run["row"], tasks), {"row": run["row"], "tasks": tasks, "torch": {}, "ours": {}}
      )
    for tasks, result in _units(run["row"], run["results"]).items():
      entries[(run["row"], tasks)][run["side"]][run["round"]] = result
  rounds = sorted({run["round"] for run in runs})
  out = []
  for (row, _), entry in entries.items():
    torch_s = [_seconds(entry["torch"][r]) if r in entry["torch"] else None for r in rounds]
    ours_s = [_seconds(entry["ours"][r]) if r in entry["ours"] else None for r in rounds]
    any_result = next(iter([*entry["torch"].values(), *entry["ours"].values(), {}]))
    out.append(
      {
        "row": row,
        "tasks": entry["tasks"] if entry["tasks"] is not None else any_result.get("tasks"),
        "mc_samples": any_result.get("mc_samples"),
        "rounds": rounds,
        "torch_s": torch_s,
        "ours_s": ours_s,
        "ours_compile_s": [
          entry["ours"][r].get("compile_s") if r in entry["ours"] else None for r in rounds
        ],
        "round_ratios": [_ratio(t, o) for t, o in zip(torch_s, ours_s)],
        "ratio": _ratio(_mean(torch_s), _mean(ours_s)),
        "torch_peak_mb": _max([entry["torch"][r].get("peak_mb") for r in entry["torch"]]),
        "ours_peak_mb": _max([entry["ours"][r].get("peak_mb") for r in entry["ours"]]),
        "torch_stepping_mb": _max(
          [entry["torch"][r].get("stepping_peak_mb") for r in entry["torch"]]
        ),
        "ours_stepping_mb": _max([entry["ours"][r].get("stepping_peak_mb") for r in entry["ours"]]),
        "torch": [entry["torch"].get(r) for r in rounds],
        "ours": [entry["ours"].get(r) for r in rounds],
      }
    )
  return out


def _mean(values) -> Optional[float]:
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def _max(values) -> Optional[float]:
  values = [v for v in values if v is not None]
  return max(values) if values else None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return None if a is None or not b else a / b


def _fmt(value: Optional[float], spec: str) -> str:
  return "failed" if value is None else format(value, spec)


def format_table(entries: list[dict]) -> str:
  """The side-by-side table (markdown)."""
  lines = [
    "| setting | T | L | PyTorch s/step per round | ours s/step per round | PyTorch / ours"
    " | peak MB PyTorch / ours | stepping MB PyTorch / ours |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for e in entries:
    name = e["row"] + (" (s/call)" if _is_episode(e["row"]) else "")
    rounds_ratio = " / ".join(_fmt(r, ".2f") for r in e["round_ratios"])
    lines.append(
      f"| {name} | {e['tasks']} | {e['mc_samples']} |"
      f" {' / '.join(_fmt(s, '.3f') for s in e['torch_s'])} |"
      f" {' / '.join(_fmt(s, '.3f') for s in e['ours_s'])} |"
      f" {_fmt(e['ratio'], '.2f')} ({rounds_ratio}) |"
      f" {_fmt(e['torch_peak_mb'], '.0f')} / {_fmt(e['ours_peak_mb'], '.0f')} |"
      f" {_fmt(e.get('torch_stepping_mb'), '.0f')} / {_fmt(e.get('ours_stepping_mb'), '.0f')} |"
    )
  return "\n".join(lines)


def _second_order(value: str) -> Optional[int]:
  return None if value == "all" else int(value)


def build_parser() -> argparse.ArgumentParser:
  from benchmarks import arguments

  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
  parser.add_argument("--rounds", type=arguments.count(1), default=2)
  parser.add_argument(
    "--repeats", type=arguments.count(1), default=3, help="timed steps (calls) after the first"
  )
  parser.add_argument(
    "--tasks",
    type=arguments.count(0, " (0: the setting's)"),
    default=0,
    help="T of the training rows (0: the setting's)",
  )
  parser.add_argument(
    "--mc-samples",
    type=arguments.count(0, " (0: the setting's)"),
    default=0,
    help="L of the mini-ImageNet and regression rows (0: the setting's)",
  )
  parser.add_argument("--episode-tasks", default="1,32", help="tasks per episode call")
  parser.add_argument("--episode-mc-samples", type=int, default=10)
  parser.add_argument(
    "--second-order-steps",
    type=_second_order,
    default=1,
    help="VAMPIRE training rows on both sides: 1 (the authors' truncation) or all (Alg. 1)",
  )
  parser.add_argument("--torch-python", default="/work/torchenv/bin/python")
  parser.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
  parser.add_argument(
    "--torch-args",
    default="",
    help="more arguments for authors_pytorch.py, e.g. '--inner-grad joint'",
  )
  parser.add_argument(
    "--timeout", type=float, default=None, help="seconds before a process is stopped (a failed run)"
  )
  parser.add_argument(
    "--log-dir", default=None, help="each process's output (default: a temporary folder)"
  )
  parser.add_argument("--json", default=None, help="also write the results to this file")
  return parser


def options_from_args(args: argparse.Namespace) -> dict:
  """What `our_command` and `torch_command` read."""
  return {
    "repeats": args.repeats,
    "tasks": args.tasks,
    "mc_samples": args.mc_samples,
    "episode_tasks": args.episode_tasks,
    "episode_mc_samples": args.episode_mc_samples,
    "second_order_steps": args.second_order_steps,
    "torch_python": args.torch_python,
    "threads": args.threads,
    "torch_args": args.torch_args.split(),
  }


def this_processor() -> dict:
  """The CPU both sides ran on (`vampire_jax.backend.processor_record`) with this jaxlib,
  without starting JAX in this process (each side's rows name it too)."""
  from benchmarks import suite

  return suite.cpu_processor()


def main(argv=None) -> list[dict]:
  parser = build_parser()
  args = parser.parse_args(argv)
  rows = [r.strip() for r in args.rows.split(",") if r.strip()]
  unknown = [r for r in rows if r not in ROWS]
  if unknown:
    parser.error(f"--rows: unknown {unknown}; choose from {', '.join(ROWS)}")
  if not Path(args.torch_python).exists():
    parser.error(f"--torch-python {args.torch_python} does not exist")
  options = options_from_args(args)
  log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="side_by_side_"))
  log_dir.mkdir(parents=True, exist_ok=True)
  print(f"logs and per-process JSON in {log_dir}", flush=True)
  runs, start = [], time.time()
  for round_ in range(1, args.rounds + 1):
    sides = ("torch", "ours") if round_ % 2 else ("ours", "torch")
    for row in rows:
      for side in sides:
        json_path = str(log_dir / f"{row}.{side}.round{round_}.json")
        build = torch_command if side == "torch" else our_command
        command = build(row, options, json_path)
        ok, wall_s = run_process(command, Path(json_path).with_suffix(".log"), args.timeout)
        results = _read(json_path) if ok else []
        runs.append(
          {
            "row": row,
            "side": side,
            "round": round_,
            "command": command,
            "ok": ok,
            "results": results,
          }
        )
        seconds = ", ".join(_fmt(_seconds(r), ".3f") for r in results) or "failed"
        print(
          f"  round {round_} {row:30s} {side:5s} {seconds} s (process {wall_s:.0f} s)"
          + ("" if ok else f"  see {Path(json_path).with_suffix('.log')}"),
          flush=True,
        )
  entries = collect(runs, [int(n) for n in args.episode_tasks.split(",") if n.strip()])
  processor = this_processor()
  print(f"\ntotal wall time {time.time() - start:.0f} s on {processor['description']}\n")
  print(format_table(entries))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {"processor": processor, "options": options, "entries": entries, "runs": runs}, f, indent=2
      )
  failed = [f"{r['row']} {r['side']} round {r['round']}" for r in runs if not r["ok"]]
  if failed:  # the table is printed: the exit status says it is incomplete
    raise SystemExit(
      f"side_by_side: {len(failed)} process(es) failed (logs above): {'; '.join(failed)}"
    )
  return entries


if __name__ == "__main__":
  main()
