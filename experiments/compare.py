"""Every method under one configuration: the paper's calibration comparison.

    python -m experiments.compare --benchmark regression                 # all methods, CPU preset
    python -m experiments.compare --benchmark regression --preset quick  # minutes
    python -m experiments.compare --benchmark omniglot --preset 5way1shot  # GPU-sized
    python -m experiments.compare --benchmark omniglot --preset quick --algorithms maml,vampire

Trains each of MAML, first-order MAML, PLATIPUS, BMAML, ABML and VAMPIRE with
the benchmark's shared settings (the experiment's preset; per-method changes
are listed in BUILD_NOTES.md) in `<workdir>/<algorithm>/`, resuming finished
or interrupted runs, and writes to `<workdir>`:

  comparison.png       every method's reliability diagram (regression: one
                       panel of quantile-calibration curves, Fig. 2c;
                       classification: one panel per method, Fig. 3)
  calibration_bars.png ECE and MCE per method (Fig. 2d)
  results.md           table: MSE or accuracy, NLL, ECE, MCE, wall time
  comparison.json      the same numbers
"""

import argparse
import json
import sys
from pathlib import Path

import jax

from experiments import cli, omniglot, regression, runner
from vampire_jax import plotting

ALGORITHMS = ("maml", "fomaml", "platipus", "bmaml", "abml", "vampire")
BENCHMARKS = ("regression", "omniglot")


def _omniglot_runs(algorithms, preset, workdir: Path, overrides, progress) -> dict:
  methods = {}
  for algorithm in algorithms:
    config = cli.apply_overrides(omniglot.get_config(preset, algorithm), overrides)
    config.algorithm = algorithm
    print(f"== {algorithm}: {config.ways}-way {config.shots}-shot, {config.num_meta_steps} steps;"
          f" {workdir / algorithm}")
    problem = omniglot.make_problem(config, workdir / algorithm)
    try:
      results = runner.train_and_evaluate(problem, config, workdir / algorithm, progress=progress)
    except FloatingPointError as error:  # recorded, and the other methods still run
      print(f"   {algorithm}: {error}")
      methods[algorithm] = {"diverged": str(error)}
      continue
    methods[algorithm] = dict(results["test"], wall_time_s=results["wall_time_s"],
                              calibration=results["calibration"])
  return methods


def _table(methods: dict, kind: str) -> str:
  score = ("MSE", "mse") if kind == "regression" else ("accuracy (%)", "accuracy")
  scale = 1.0 if kind == "regression" else 100.0
  lines = [f"| method | {score[0]} | NLL | ECE | MCE | train time (s) |",
           "|---|---|---|---|---|---|"]
  for name, m in methods.items():
    if "diverged" in m:
      lines.append(f"| {name} | {m['diverged']} | | | | |")
      continue
    lines.append(f"| {name} | {scale * m[score[1]]:.3f} ± {scale * m[score[1] + '_ci95']:.3f} | "
                 f"{m['nll']:.3f} | {m['ece']:.4f} | {m['mce']:.4f} | "
                 f"{m['wall_time_s']['train']:.0f} |")
  return "\n".join(lines) + "\n"


def write_comparison(methods: dict, kind: str, workdir: Path, title: str) -> dict:
  """Draws the joint figures and writes the table for finished runs.

  Args:
    methods: `{algorithm: test summary}` with a `calibration` record
      (`runner.calibration_record`) and `wall_time_s` per algorithm.
    kind: 'regression' or 'classification'.
    workdir: where the figures and table go.
    title: figure title.

  Methods whose training diverged (`{"diverged": message}`) are a row of
  the table and absent from the figures.

  Returns:
    `{"plots": {...}, "table": markdown}`.
  """
  finished = {name: m for name, m in methods.items() if "diverged" not in m}
  curves = {name.upper(): runner.calibration_from_record(m["calibration"])
            for name, m in finished.items()}
  if kind == "regression":
    comparison = plotting.plot_quantile_calibration(curves, workdir / "comparison.png", title=title)
  else:
    comparison = plotting.plot_reliability_diagram(curves, workdir / "comparison.png", title=title)
  bars = plotting.plot_calibration_bars(
      {name.upper(): (m["ece"], m["mce"]) for name, m in finished.items()},
      workdir / "calibration_bars.png", title=title)
  table = _table(methods, kind)
  (workdir / "results.md").write_text(f"# {title}\n\n{table}")
  return {"plots": {"comparison": str(comparison), "calibration_bars": str(bars)}, "table": table}


def run(benchmark: str, algorithms, preset: str, workdir: Path, overrides=None,
        progress: bool = True) -> dict:
  """Trains (or resumes) every algorithm on `benchmark`, then compares them."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  overrides = overrides if overrides is not None else {}
  if benchmark == "regression":
    methods = regression.run(list(algorithms), preset, workdir, overrides, progress)["methods"]
    kind = "regression"
  elif benchmark == "omniglot":
    methods = _omniglot_runs(algorithms, preset, workdir, overrides, progress)
    kind = "classification"
  else:
    raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {BENCHMARKS}")
  finished = [m for m in methods.values() if "diverged" not in m]
  if not finished:
    raise FloatingPointError(f"every method diverged: {methods}")
  title = f"{benchmark} ({preset}), {finished[0]['num_tasks']} test tasks"
  written = write_comparison(methods, kind, workdir, title)
  results = {"benchmark": benchmark, "preset": preset, "methods": methods, **written,
             "command": " ".join(["python -m experiments.compare"] + sys.argv[1:]),
             "device": runner.device_description()}
  (workdir / "comparison.json").write_text(json.dumps(results, indent=2, default=float))
  print(written["table"])
  return results


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--benchmark", default="regression", choices=BENCHMARKS)
  parser.add_argument("--preset", default=None,
                      help="the experiment's preset (regression: cpu/paper/quick, default cpu; "
                           "omniglot: 5way1shot/.../quick, default 5way1shot)")
  parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                      help=f"comma-separated subset of {','.join(ALGORITHMS)}")
  parser.add_argument("--workdir", type=Path, default=None)
  parser.add_argument("--no-progress", action="store_true")
  known, rest = parser.parse_known_args(argv)
  # The remaining flags are the experiment's config fields (--num-meta-steps 500 ...).
  config_parser = argparse.ArgumentParser(prog="config flags")
  config_class = (regression.RegressionConfig if known.benchmark == "regression"
                  else omniglot.OmniglotConfig)
  cli.add_config_flags(config_parser, config_class)
  overrides = config_parser.parse_args(rest)
  if overrides.algorithm is not None:
    parser.error("use --algorithms (comma-separated) to choose the methods")
  algorithms = [a.strip() for a in known.algorithms.split(",") if a.strip()]
  unknown = [a for a in algorithms if a not in ALGORITHMS]
  if unknown or not algorithms:
    parser.error(f"unknown algorithms {unknown}; choose from {ALGORITHMS}")
  preset = known.preset or ("cpu" if known.benchmark == "regression" else "5way1shot")
  workdir = known.workdir or Path("runs") / f"compare_{known.benchmark}_{preset}"
  return known.benchmark, algorithms, preset, workdir, overrides, not known.no_progress


def main(argv=None) -> dict:
  benchmark, algorithms, preset, workdir, overrides, progress = parse_args(argv)
  print(f"comparing {algorithms} on {benchmark} ({preset}); workdir {workdir}; "
        f"backend {jax.default_backend()}")
  return run(benchmark, algorithms, preset, workdir, overrides, progress)


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
