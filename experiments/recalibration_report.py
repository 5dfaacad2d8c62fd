"""Issue 61's measurement: the zoo's cells raw and recalibrated, and VAMPIRE against MAML.

    python -m experiments.recalibration_report                      # every cell, as trained
    python -m experiments.recalibration_report --cells 'regression_cpu_*' \\
        --num-val-tasks 100 --num-test-tasks 300                    # the issue's done-when
    python -m experiments.recalibration_report --num-val-tasks 4 --num-test-tasks 4   # minutes

For each cell (`zoo/`), a map is fitted on its first validation tasks (a temperature for a
classifier, a variance scale of the predictive, noise included, for a regressor:
`vj.recalibrate`) and its first test tasks are scored raw and recalibrated: NLL, the ECE
the README reports (the paper's quantile ECE for regression, the confidence ECE for
classification), the PIT ECE and the central 90 % interval's coverage and width
(regression). Then, for the regression cells of one seed that are VAMPIRE and MAML, both
recalibrated by the same one-parameter map: does VAMPIRE's per-input spread beat MAML's
constant one? The test points are binned by VAMPIRE's recalibrated predictive standard
deviation (quintiles) and by the input x; each bin gives each method's coverage and NLL.

A point estimate's paper quantile ECE does not move under the map: the paper computes it
from the quantiles of the network's outputs, without the likelihood's noise, and one
output has the same quantile at every level (`vj.paper_quantile_calibration`).

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
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.metrics import quantile_calibration
from vampire_jax._src.metrics import recalibration as maps
from vampire_jax._src.metrics.normal_cdf import normal_cdf
from vampire_jax._src.runs import programs

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
  sample_keys, _ = evaluation.index_keys(programs.run_keys(run.config.seed).test, indices)
  tasks = jax.jit(problem.sample_tasks)(problem.splits["test"], sample_keys)
  return np.asarray(tasks.query_x)[..., 0]


def _predictive_quantile_ece(draws, noise_std: float, truth, data_noise: float, levels) -> float:
  """The paper's quantile ECE (11 levels 0, 0.1, .., 1) of the whole predictive's quantiles.

  As `vj.paper_quantile_calibration`, but each level's quantile is the predictive
  mixture's, noise included (`levels`: the mixture levels that give the 9 inner ones),
  not that of the network's outputs alone: observed_p = mean_x Phi((q_p(x) - y0(x)) / sigma).
  The levels 0 and 1 have quantiles -inf and inf, observed exactly.
  """
  levels = np.clip(levels, 1e-6, 1 - 1e-6)
  quantiles = quantile_calibration.mixture_quantile(levels, draws, noise_std, tol=1e-4)
  observed = np.mean(normal_cdf((quantiles - truth[None]) / data_noise).reshape(9, -1), axis=1)
  return float(np.sum(np.abs(observed - np.linspace(0.1, 0.9, 9))) / 11)


def regression_extras(run: vj.Run, result) -> dict:
  """Beside the variance scale: quantile recalibration (Kuleshov et al. 2018), measured only,
  and the paper's quantile ECE of the whole predictive, raw, scaled and isotonic.

  The isotonic map is the empirical CDF R of the validation tasks' PIT values F(y): the
  recalibrated CDF is R(F(y)), its p-quantile F^{-1}(R^{-1}(p)).
  """
  sigma, levels = run.noise_std, np.linspace(0.1, 0.9, 9)

  def draws_and_pit(per_task, noise):
    draws = np.moveaxis(np.asarray(per_task["predictions"], np.float64)[..., 0], 1, 0)
    targets = np.asarray(per_task["targets"], np.float64)[..., 0]
    return draws, quantile_calibration.mixture_cdf(targets, draws, noise)

  _, val_pit = draws_and_pit(result.val_per_task, sigma)
  draws, test_pit = draws_and_pit(result.per_task, sigma)
  ranked = np.sort(val_pit.reshape(-1))
  recalibrated = np.searchsorted(ranked, test_pit, side="right") / ranked.size  # R(F(y))
  observed = np.mean(recalibrated.reshape(1, -1) <= levels[:, None], axis=1)
  truth = np.asarray(result.per_task["truth"], np.float64)[..., 0]
  scaled = maps.recalibrated_per_task(result.calibration, result.per_task, sigma)
  scaled_noise = maps.calibrated_noise_std(result.calibration, sigma)
  scaled_draws, _ = draws_and_pit(scaled, scaled_noise)
  return {
    "isotonic": {
      "interval_90_coverage": float(np.mean((recalibrated >= 0.05) & (recalibrated <= 0.95))),
      "pit_ece": float(np.mean(np.abs(observed - levels))),
      "predictive_quantile_ece": _predictive_quantile_ece(
        draws, sigma, truth, sigma, np.quantile(ranked, levels)
      ),
    },
    "predictive_quantile_ece": {
      "raw": _predictive_quantile_ece(draws, sigma, truth, sigma, levels),
      "recalibrated": _predictive_quantile_ece(scaled_draws, scaled_noise, truth, sigma, levels),
    },
  }


def _recalibrated_points(run: vj.Run, result) -> dict:
  """Per test point under the cell's map: covered (90 %), log density, predictive std."""
  noise = maps.calibrated_noise_std(result.calibration, run.noise_std)
  scored = maps.recalibrated_per_task(result.calibration, result.per_task, run.noise_std)
  return {
    "covered": maps.interval_coverage(scored["predictions"], scored["targets"], noise),
    "log_density": point_log_density(scored["predictions"], scored["targets"], noise),
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
  """VAMPIRE and MAML recalibrated, per bin of VAMPIRE's spread and of the input x."""
  points = {m: _recalibrated_points(runs[m], results[m]) for m in runs}
  spread = points["vampire"]["std"]
  edges = np.quantile(spread, np.linspace(0, 1, NUM_BINS + 1))
  by_spread = np.clip(np.searchsorted(edges, spread, side="right") - 1, 0, NUM_BINS - 1)
  x = test_inputs(runs["vampire"], problem, num_tasks)
  x_edges = np.linspace(x.min(), x.max(), NUM_BINS + 1)
  by_x = np.clip(np.searchsorted(x_edges, x, side="right") - 1, 0, NUM_BINS - 1)
  return {
    "overall": {
      m: {"coverage": float(np.mean(p["covered"])), "nll": float(-np.mean(p["log_density"]))}
      for m, p in points.items()
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
    if "isotonic" in cell:
      iso, whole = cell["isotonic"], cell["predictive_quantile_ece"]
      notes.append(
        f"| {name} | {whole['raw']:.3f} → {whole['recalibrated']:.3f} "
        f"| {iso['predictive_quantile_ece']:.3f} | {iso['pit_ece']:.3f} "
        f"| {100 * iso['interval_90_coverage']:.1f} |"
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
      "| cell | whole predictive's quantile ECE, raw → scaled | isotonic: its quantile ECE "
      "| isotonic: PIT ECE | isotonic: 90 % coverage |",
      "|---|---|---|---|---|",
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
    num_val = num_val_tasks or run.config.num_val_tasks
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
      "map": maps.describe(result.calibration),
      "calibration": maps.to_record(result.calibration),
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
      algorithm = run.config.algorithm
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
    print(_bins_table(comparison["by_vampire_spread"], "VAMPIRE's std"))
    print(_bins_table(comparison["by_input"], "input x"))
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(report, indent=2, default=float))
  print(f"{report['seconds']:.0f} s; {args.out}")
  return report


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
