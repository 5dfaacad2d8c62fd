"""Issue 61's measurement: the zoo's cells raw and recalibrated, and VAMPIRE against MAML.

    python -m experiments.recalibration_report                      # every cell, as trained
    python -m experiments.recalibration_report --cells 'regression_cpu_*' \\
        --num-val-tasks 100 --num-test-tasks 300                    # the issue's done-when
    python -m experiments.recalibration_report --num-val-tasks 4 --num-test-tasks 4   # minutes

For each cell (`zoo/`), a map is fitted on its first validation tasks (`vj.recalibrate`'s
default: a temperature for a classifier; for a regressor a quantile map over a variance
scale of the predictive, noise included) and its first test tasks are scored raw and
recalibrated: NLL, the ECE the README reports (the paper's quantile ECE for regression,
the confidence ECE for classification), the PIT ECE and the central 90 % interval's
coverage and width (regression). A regressor is also scored under the variance scale
alone and under the quantile map alone (Kuleshov et al.'s R of the raw predictive), to
choose the default. Then, for the regression cells of one seed that are VAMPIRE and MAML,
both recalibrated by the same one-parameter map (a variance scale): does VAMPIRE's
per-input spread beat MAML's constant one? The test points are binned by VAMPIRE's
recalibrated predictive standard deviation (quintiles) and by the input x; each bin gives
each method's coverage and NLL.

The paper's quantile ECE takes the quantiles of the network's outputs, without the
likelihood's noise (`vj.paper_quantile_calibration`), so a point estimate's does not move
under a variance scale. Under a quantile map the outputs are no longer the predictive's
quantiles: its ECE is taken of the recalibrated predictive's own quantiles, noise included
(`predictive_quantile_calibration`); the raw whole predictive's is given beside it.

Writes a JSON file (`--out`) with every number and prints the tables, with the seconds each
cell took (the full measurement's time scales with the task counts).
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import cli, zoo, zoo_recalibrate, zoo_verify
from vampire_jax import metrics
from vampire_jax.runs import programs, recalibration

DEFAULT_CELLS = "regression_*,omniglot_*"
NUM_BINS = 5


def point_log_density(predictions, targets, noise_std: float) -> np.ndarray:
  """`[tasks, query]`: log mean_l N(y; f_l, noise_std^2), from `[tasks, draws, query, 1]`."""
  f = np.asarray(predictions, np.float64)[..., 0]
  y = np.asarray(targets, np.float64)[:, None, :, 0]
  log_pdf = -0.5 * np.square((y - f) / noise_std) - math.log(noise_std * math.sqrt(2 * math.pi))
  top = log_pdf.max(axis=1, keepdims=True)
  return top[:, 0] + np.log(np.mean(np.exp(log_pdf - top), axis=1))


def predictive_std(predictions, noise_std: float) -> np.ndarray:
  """`[tasks, query]`: the mixture's standard deviation, sqrt(Var_l f_l + noise_std^2)."""
  f = np.asarray(predictions, np.float64)[..., 0]
  return np.sqrt(np.var(f, axis=1) + noise_std**2)


def test_inputs(run: vj.Run, problem: vj.Problem, num_tasks: int) -> np.ndarray:
  """`[tasks, query]`: the inputs x of the run's first test tasks (its test's own tasks)."""
  indices = jnp.arange(num_tasks, dtype=jnp.uint32)
  sample_keys, _ = metrics.index_keys(programs.run_keys(run.config.seed).test, indices)
  tasks = jax.jit(problem.sample_tasks)(problem.splits["test"], sample_keys)
  return np.asarray(tasks.query_x)[..., 0]


def regression_extras(run: vj.Run, result) -> dict:
  """Beside the cell's map (the default, a quantile map over a variance scale): the variance
  scale alone and R alone (the quantile map of the raw predictive, s = 1), fitted on the
  same validation tasks and scored on the same test tasks; and the paper's quantile ECE of
  the raw whole predictive (its quantiles, noise included), beside the paper's own of the
  network's outputs."""
  sigma = run.noise_std
  scored = {k: v for k, v in result.per_task.items() if k in _REGRESSION_FIELDS}
  scale = metrics.fit_recalibration(
    "regression", result.val_per_task, sigma, "report", metrics.VARIANCE_SCALE
  )
  # R alone: the map of the raw predictive's PIT values (no scale), as Kuleshov et al.
  val_pit = metrics.predictive_pit(
    result.val_per_task["predictions"], result.val_per_task["targets"], sigma
  )
  alone = metrics.Calibration(
    metrics.QUANTILE, 1.0, scale.num_tasks, scale.nll_before, float("nan"),
    metrics.fit_quantile_map(val_pit, metrics.quantile_map_bins(val_pit.size)),
  )  # fmt: skip
  extras = {}
  for name, calibration in (("variance_scale", scale), ("quantile_map_alone", alone)):
    summary = recalibration.recalibrated_summary(
      "regression", calibration, scored, run.config.evaluation.num_bins, sigma
    )
    extras[name] = {k: float(summary.metrics[k]) for k in _KEPT if k in summary.metrics}
    extras[name]["map"] = metrics.describe_recalibration(calibration)
  raw_whole = metrics.predictive_quantile_calibration(
    np.asarray(scored["predictions"])[..., 0], np.asarray(scored["truth"])[..., 0], sigma, sigma
  )
  extras["raw_predictive_quantile_ece"] = raw_whole.ece
  return extras


_REGRESSION_FIELDS = ("mse", "predictive_mean_mse", "nll", "predictions", "targets", "truth")
_KEPT = ("nll", "ece", "pit_ece", "interval_90_coverage", "interval_90_width")


def _points(run: vj.Run, calibration, per_task: dict) -> dict:
  """Per test point under `calibration`: covered (90 %), log density, predictive std."""
  noise = metrics.calibrated_noise_std(calibration, run.noise_std)
  scored = metrics.recalibrated_per_task(calibration, per_task, run.noise_std)
  qmap = calibration.quantile_map
  log_density = point_log_density(scored["predictions"], scored["targets"], noise)
  if qmap is not None:
    log_density += qmap.log_slope(
      metrics.predictive_pit(scored["predictions"], scored["targets"], noise)
    )
  return {
    "covered": metrics.interval_coverage(
      scored["predictions"], scored["targets"], noise, qmap=qmap
    ),
    "log_density": log_density,
    "std": predictive_std(scored["predictions"], noise),
  }


def _binned(points: dict, bins: np.ndarray, edges: np.ndarray) -> list[dict]:
  rows = []
  for b in range(len(edges) - 1):
    inside = bins == b
    rows.append(
      {
        "range": [float(edges[b]), float(edges[b + 1])],
        "count": int(inside.sum()),
        **{
          method: {
            "coverage": float(np.mean(p["covered"][inside])),
            "nll": float(-np.mean(p["log_density"][inside])),
            "mean_std": float(np.mean(p["std"][inside])),
          }
          for method, p in points.items()
        },
      }
    )
  return rows


def compare_methods(runs: dict, results: dict, problem: vj.Problem, num_tasks: int) -> dict:
  """VAMPIRE and MAML, both recalibrated by the same one-parameter map (a variance scale,
  each fitted on its own validation tasks), per bin of VAMPIRE's spread and of the input x;
  and overall under each one's default map (the quantile map) too."""
  scales = {
    m: metrics.fit_recalibration(
      "regression", results[m].val_per_task, runs[m].noise_std, "report", metrics.VARIANCE_SCALE
    )
    for m in runs
  }
  points = {m: _points(runs[m], scales[m], results[m].per_task) for m in runs}
  spread = points["vampire"]["std"]
  edges = np.quantile(spread, np.linspace(0, 1, NUM_BINS + 1))
  by_spread = np.clip(np.searchsorted(edges, spread, side="right") - 1, 0, NUM_BINS - 1)
  x = test_inputs(runs["vampire"], problem, num_tasks)
  x_edges = np.linspace(x.min(), x.max(), NUM_BINS + 1)
  by_x = np.clip(np.searchsorted(x_edges, x, side="right") - 1, 0, NUM_BINS - 1)
  default = {m: _points(runs[m], results[m].calibration, results[m].per_task) for m in runs}
  return {
    "overall": {
      m: {"coverage": float(np.mean(p["covered"])), "nll": float(-np.mean(p["log_density"]))}
      for m, p in points.items()
    },
    "overall_default_map": {
      m: {"coverage": float(np.mean(p["covered"])), "nll": float(-np.mean(p["log_density"]))}
      for m, p in default.items()
    },
    "by_vampire_spread": _binned(points, by_spread, edges),
    "by_input": _binned(points, by_x, x_edges),
  }


def _cell_table(cells: dict) -> str:
  notes = []
  lines = [
    "| cell | map | NLL raw → recal. | ECE raw → recal. | PIT ECE raw → recal. "
    "| 90 % coverage raw → recal. | tasks (val/test) | seconds |",
    "|---|---|---|---|---|---|---|---|",
  ]

  def pair(cell, name, scale=1.0, digits=3):
    raw, recal = cell["raw"].get(name), cell["recalibrated"].get(name)
    if raw is None or recal is None:
      return "–"
    return f"{scale * raw:.{digits}f} → {scale * recal:.{digits}f}"

  for name, cell in cells.items():
    if "variance_scale" in cell:
      scale, alone = cell["variance_scale"], cell["quantile_map_alone"]

      def four(m):
        return (
          f"{m['nll']:.3f} | {m.get('ece', float('nan')):.3f} | {m['pit_ece']:.3f} "
          f"| {100 * m['interval_90_coverage']:.1f}"
        )

      notes.append(
        f"| {name} | {cell['raw_predictive_quantile_ece']:.3f} | {four(scale)} | {four(alone)} |"
      )
    if "skipped" in cell:
      lines.append(f"| {name} | none: {cell['skipped']} | | | | | {cell['num_val_tasks']}/– | |")
      continue
    lines.append(
      f"| {name} | {cell['map']} | {pair(cell, 'nll')} | {pair(cell, 'ece')} "
      f"| {pair(cell, 'pit_ece')} | {pair(cell, 'interval_90_coverage', 100, 1)} "
      f"| {cell['num_val_tasks']}/{cell['num_test_tasks']} | {cell['seconds']:.0f} |"
    )
  if notes:
    lines += [
      "",
      "| cell | raw whole predictive's quantile ECE | variance scale alone: NLL | ECE | PIT ECE "
      "| 90 % coverage | R alone (s = 1): NLL | ECE | PIT ECE | 90 % coverage |",
      "|---|---|---|---|---|---|---|---|---|---|",
      *notes,
    ]
  return "\n".join(lines)


def _bins_table(rows: list[dict], what: str) -> str:
  lines = [
    f"| {what} | points | VAMPIRE coverage | MAML coverage | VAMPIRE NLL | MAML NLL "
    "| VAMPIRE std | MAML std |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    v, m = row["vampire"], row["maml"]
    lines.append(
      f"| {row['range'][0]:.2f}–{row['range'][1]:.2f} | {row['count']} "
      f"| {100 * v['coverage']:.1f} % | {100 * m['coverage']:.1f} % | {v['nll']:.3f} "
      f"| {m['nll']:.3f} | {v['mean_std']:.3f} | {m['mean_std']:.3f} |"
    )
  return "\n".join(lines)


def measure(zoo_dir: Path, pattern: str, num_val_tasks, num_test_tasks, print_fn=print) -> dict:
  """Every selected cell raw and recalibrated, and the VAMPIRE/MAML comparison."""
  manifest = zoo.existing_manifest(zoo_dir, "recalibration_report")
  cells, runs, results, problems = {}, {}, {}, {}
  for name in zoo.select(manifest, pattern):
    start = time.perf_counter()
    run = vj.load_run(zoo_dir / name)
    problem = zoo_verify.make_problem(run)
    num_val = num_val_tasks or run.config.evaluation.num_val_tasks
    count = int(manifest["cells"][name]["test"]["num_tasks"])
    num_test = count if num_test_tasks is None else min(num_test_tasks, count)
    try:
      result = zoo_recalibrate.recalibrate_cell(run, problem, num_val, num_test)
    except vj.InputError as error:  # no map: e.g. every validation query right
      cells[name] = {"kind": run.kind, "skipped": str(error), "num_val_tasks": num_val}
      print_fn(f"{name}: no map: {error}")
      continue
    cells[name] = {
      "kind": run.kind,
      "map": metrics.describe_recalibration(result.calibration),
      "calibration": metrics.recalibration_to_record(result.calibration),
      "raw": result.raw,
      "recalibrated": result.recalibrated,
      "num_val_tasks": num_val,
      "num_test_tasks": num_test,
      "seconds": time.perf_counter() - start,
    }
    if run.kind == "regression" and "truth" in result.per_task:
      cells[name].update(regression_extras(run, result))
    print_fn(f"{zoo_recalibrate.line(name, run.kind, result)} ({cells[name]['seconds']:.0f} s)")
    if run.kind == "regression" and run.config.seed == 0:
      algorithm = run.config.algorithm.name
      runs[algorithm], results[algorithm], problems[algorithm] = run, result, problem
  report = {"cells": cells}
  if {"vampire", "maml"} <= set(runs):
    counts = {len(results[m].per_task["nll"]) for m in ("vampire", "maml")}
    report["vampire_vs_maml"] = compare_methods(
      {m: runs[m] for m in ("vampire", "maml")},
      {m: results[m] for m in ("vampire", "maml")},
      problems["vampire"],
      min(counts),
    )
  return report


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    prog="python -m experiments.recalibration_report",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--zoo", type=Path, default=zoo.ZOO, help=argparse.SUPPRESS)
  parser.add_argument("--cells", default=DEFAULT_CELLS, help=f"default: {DEFAULT_CELLS}")
  parser.add_argument("--num-val-tasks", type=zoo._task_count, default=None, metavar="N",
                      help="validation tasks to fit each map on (default: the run's)")  # fmt: skip
  parser.add_argument("--num-test-tasks", type=zoo._task_count, default=None, metavar="N",
                      help="test tasks to score (default: all the cell scored)")  # fmt: skip
  parser.add_argument("--out", type=Path, default=Path("runs/recalibration_report.json"))
  args = parser.parse_args(argv)
  start = time.perf_counter()
  report = measure(args.zoo, args.cells, args.num_val_tasks, args.num_test_tasks)
  report["seconds"] = time.perf_counter() - start
  report["command"] = " ".join(["python -m experiments.recalibration_report"] + sys.argv[1:])
  print(_cell_table(report["cells"]))
  if "vampire_vs_maml" in report:
    comparison = report["vampire_vs_maml"]
    print("\nVAMPIRE and MAML, each recalibrated by a variance scale:", comparison["overall"])
    print("each by its default map:", comparison["overall_default_map"])
    print(_bins_table(comparison["by_vampire_spread"], "VAMPIRE's std"))
    print(_bins_table(comparison["by_input"], "input x"))
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(report, indent=2, default=float))
  print(f"{report['seconds']:.0f} s; {args.out}")
  return report


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
