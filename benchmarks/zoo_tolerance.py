"""How far a zoo cell's test numbers move when another program scores it: the evidence for
`experiments.zoo_verify`'s cross-platform tolerance.

    python -m benchmarks.zoo_tolerance                          # every cell, all test tasks
    python -m benchmarks.zoo_tolerance --cells 'regression_*' --num-test-tasks 200
    XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 python -m benchmarks.zoo_tolerance   # another CPU

A GPU scores a cell with other kernels than a CPU (and, by default, TF32 matmuls and
convolutions on recent NVIDIA GPUs: 10 bits of mantissa). Without a GPU at hand, three
stand-ins on this CPU bracket that change, each set against the cell's own numbers
(its `results.json`, or its per-task scores for fewer tasks):
  - `this process`: the cell scored as `zoo verify` scores it; under
    `XLA_FLAGS=--xla_cpu_max_isa=SSE4_2`, XLA's code for an older CPU (narrower vectors,
    no FMA: other sums), as another machine's CPU gives;
  - `vmap`: the tasks of a batch vmapped instead of looped (`--eval-task-batching vmap`):
    another XLA program, other fusions;
  - `bfloat16`: the network's matmuls and convolutions on bfloat16 inputs
    (`--compute-dtype bfloat16`, 8 bits of mantissa): coarser than TF32's rounding.
Each row gives the score, the NLL and the ECE against the cell's own, the first two also
in units of their 95 % half-width (the tolerance is `zoo_verify.CI_FRACTION` of it).
"""

import argparse
import copy
import json
import sys
import time

from experiments import zoo, zoo_verify
from vampire_jax.runs import algorithms, run_folder

STAND_INS = {
  "vmap": {"eval_task_batching": "vmap"},
  "bfloat16": {"compute_dtype": "bfloat16"},
}


def rescored(run, changes: dict):
  """`run` with its config changed and its test learner rebuilt from that config."""
  other = copy.copy(run)
  other.config = run.config.replace(**changes)
  other.learner = algorithms.make_learner(
    run.model,
    run.kind,
    run.noise_std,
    other.config,
    num_mc_train=other.config.algorithm.num_mc_test,
    num_mc_query=other.config.algorithm.num_mc_test,
  )
  return other


def measure(zoo_dir, name: str, num_tasks=None) -> list[dict]:
  """`[{cell, stand_in, num_tasks, <score>, nll, ece (each the change), seconds}]`."""
  import vampire_jax as vj

  run = vj.load_run(zoo_dir / name)
  results = json.loads((zoo_dir / name / run_folder.RESULTS_FILE).read_text())
  count = int(results["test"]["num_tasks"])
  num_tasks = count if num_tasks is None else min(num_tasks, count)
  num_bins = run.config.evaluation.num_bins
  reference = zoo_verify.reference(results, zoo.per_task_file(zoo_dir / name), num_tasks, num_bins)
  if reference is None:
    raise ValueError(f"{name} keeps no per-task scores: measure it on all its {count} tasks")
  problem = zoo_verify.make_problem(run)
  score = "accuracy" if run.kind == "classification" else "mse"
  rows = []
  for stand_in, changes in [("this process", {})] + list(STAND_INS.items()):
    start = time.perf_counter()
    per_task, numbers = zoo_verify.score_test_split(rescored(run, changes), problem, num_tasks)
    if num_tasks < count:
      numbers = zoo_verify.numbers_from_arrays(run.kind, per_task, num_bins)
    row = {"cell": name, "stand_in": stand_in, "num_tasks": num_tasks}
    for metric in (score, "nll"):
      row[metric] = numbers[metric] - reference.numbers[metric]
      row[f"{metric}_in_ci"] = row[metric] / reference.numbers[f"{metric}_ci95"]
    both = "ece" in numbers and "ece" in reference.numbers
    row["ece"] = numbers["ece"] - reference.numbers["ece"] if both else None
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
