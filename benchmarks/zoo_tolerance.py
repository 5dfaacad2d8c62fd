"""How far a zoo cell's test numbers move when another program scores it: the evidence for
`experiments.zoo_verify`'s cross-platform tolerance.

    python -m benchmarks.zoo_tolerance                          # every cell, all test tasks
    python -m benchmarks.zoo_tolerance --cells 'regression_*' --num-test-tasks 200

A GPU scores a cell with other kernels than a CPU (and, by default, TF32 matmuls and
convolutions on recent NVIDIA GPUs: 10 bits of mantissa). Without a GPU at hand, two
stand-ins on this CPU bracket that change:
  - `vmap`: the tasks of a batch vmapped instead of looped (`--eval-task-batching vmap`):
    another XLA program, so other fusions and another order of the sums: float32
    rounding, as another device's kernels give;
  - `bfloat16`: the network's matmuls and convolutions on bfloat16 inputs
    (`--compute-dtype bfloat16`, 8 bits of mantissa): coarser than TF32's rounding.
Each row gives the score, the NLL and the ECE against the cell's own, the first two in
units of their 95 % half-width (the tolerance is `zoo_verify.CI_FRACTION` of it).
"""

import argparse
import copy
import dataclasses
import json
import sys
import time

from experiments import zoo, zoo_verify
from vampire_jax._src.runs import algorithms, run_folder

STAND_INS = {
  "vmap": {"eval_task_batching": "vmap"},
  "bfloat16": {"compute_dtype": "bfloat16"},
}


def rescored(run, changes: dict):
  """`run` with its config changed and its test learner rebuilt from that config."""
  other = copy.copy(run)
  other.config = dataclasses.replace(run.config, **changes)
  other.learner = algorithms.make_learner(
    run.model,
    run.kind,
    run.noise_std,
    other.config,
    num_mc_train=other.config.num_mc_test,
    num_mc_query=other.config.num_mc_test,
  )
  return other


def measure(zoo_dir, name: str, num_tasks=None) -> list[dict]:
  """`[{stand_in, score, nll, ece (each the change), seconds}]` for one cell."""
  import vampire_jax as vj

  run = vj.load_run(zoo_dir / name)
  results = json.loads((zoo_dir / name / run_folder.RESULTS_FILE).read_text())
  count = int(results["test"]["num_tasks"])
  num_tasks = count if num_tasks is None else min(num_tasks, count)
  problem = zoo_verify.make_problem(run)
  rows, reference = [], None
  for stand_in, changes in [("as trained", {})] + list(STAND_INS.items()):
    start = time.perf_counter()
    per_task, numbers = zoo_verify.score_test_split(rescored(run, changes), problem, num_tasks)
    if num_tasks < count:
      numbers = zoo_verify.numbers_from_arrays(run.kind, per_task, run.config.num_bins)
    reference = reference or numbers
    score = "accuracy" if run.kind == "classification" else "mse"
    row = {"cell": name, "stand_in": stand_in, "num_tasks": num_tasks}
    for metric in (score, "nll"):
      delta = numbers[metric] - reference[metric]
      row[metric] = delta
      row[f"{metric}_in_ci"] = delta / reference[f"{metric}_ci95"]
    row["ece"] = numbers["ece"] - reference["ece"] if "ece" in numbers else None
    row["seconds"] = time.perf_counter() - start
    rows.append(row)
  return rows


def markdown(rows: list[dict]) -> str:
  lines = [
    "| cell | scored with | tasks | Δ score (in CI) | Δ NLL (in CI) | Δ ECE | seconds |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    score = "accuracy" if "accuracy" in r else "mse"
    ece = "–" if r["ece"] is None else f"{r['ece']:+.2g}"
    lines.append(
      f"| {r['cell']} | {r['stand_in']} | {r['num_tasks']} | {r[score]:+.3g} "
      f"({r[f'{score}_in_ci']:+.3f}) | {r['nll']:+.3g} ({r['nll_in_ci']:+.3f}) | {ece} | "
      f"{r['seconds']:.0f} |"
    )
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--cells", help="cell-name patterns, comma-separated (default: all)")
  parser.add_argument("--num-test-tasks", type=int, metavar="N", help="the first N tasks only")
  args = parser.parse_args(argv)
  rows = []
  for name in zoo.select(zoo.read_manifest(zoo.ZOO), args.cells):
    rows += measure(zoo.ZOO, name, args.num_test_tasks)
  print(markdown(rows))
  print(f"on {zoo_verify.describe_machine(zoo_verify.this_machine())}")
  return rows


if __name__ == "__main__":
  from experiments import cli

  sys.exit(cli.main_entry(main))
