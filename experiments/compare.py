"""Every method under one configuration: the paper's calibration comparison, and the one
driver that trains several methods (the regression experiment uses it too).

    python -m experiments.compare --benchmark regression                 # all methods, CPU preset
    python -m experiments.compare --benchmark regression --preset quick  # minutes
    python -m experiments.compare --benchmark omniglot --preset 5way1shot  # GPU-sized
    python -m experiments.compare --benchmark omniglot --preset quick --algorithms maml,vampire

Trains each of MAML, first-order MAML, PLATIPUS, BMAML, ABML and VAMPIRE with
the benchmark's preset (each algorithm's own settings come from
`vampire_jax.runs.algorithms`) in `<workdir>/<algorithm>/`, resuming finished or
interrupted runs, and writes to `<workdir>`:

  comparison.png       every method's reliability diagram (regression: one
                       panel of quantile-calibration curves, Fig. 2c;
                       classification: one column per method, Fig. 3)
  risk_coverage.png    classification: selective prediction, every method
  calibration_bars.png ECE and MCE per method (Fig. 2d)
  open_set_roc.png     classification: ROC curves of telling unknown-class queries
                       from known ones, one panel per method, a curve per score
                       (max probability, entropy, mutual information)
  results.md           table: MSE or accuracy, NLL, ECE, MCE, AURC, wall time;
                       classification: a second table of open-set and
                       misclassification AUROCs per score
  comparison.json      the same numbers

A point estimate (MAML, FOMAML) has zero mutual information: its MI AUROC is
0.5 (every score tied), and its row and panel are shown, not hidden.
"""

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import jax

from experiments import cli, plots
from vampire_jax import ConfigError
from vampire_jax import metrics
import vampire_jax as vj
from vampire_jax.runs import algorithms as algorithm_registry
from vampire_jax.runs import config_records
from vampire_jax.runs import init_from as run_start
from vampire_jax.runs import kinds, run_folder

ALGORITHMS = ("maml", "fomaml", "platipus", "bmaml", "abml", "vampire")
BENCHMARKS = {
  "regression": "experiments.regression",
  "omniglot": "experiments.omniglot",
  "mini_imagenet": "experiments.mini_imagenet",
  "tiered_imagenet": "experiments.tiered_imagenet",
}
POINT_ESTIMATES = ("maml", "fomaml", "protonet")


def parse_algorithms(names: str) -> list[str]:
  """'maml,vampire' -> ['maml', 'vampire']; ConfigError for an unknown or repeated name."""
  chosen = [a.strip() for a in names.split(",") if a.strip()]
  unknown = [a for a in chosen if a not in vj.specs.SPECS]
  if unknown or not chosen:
    raise ConfigError(f"--algorithms: unknown {unknown}; choose from {','.join(vj.specs.SPECS)}")
  repeated = sorted({a for a in chosen if chosen.count(a) > 1})
  if repeated:  # each method has one folder: a repeat would train and test it twice
    raise ConfigError(f"--algorithms names {', '.join(repeated)} twice; name each method once")
  return chosen


def method_init_from(init_from, algorithm: str):
  """The run a comparison's method starts from: `<init_from>/<algorithm>` where `init_from` is
  a comparison's folder holding one, else `init_from` itself (None: none)."""
  if isinstance(init_from, (str, os.PathLike)):
    inside = Path(init_from) / algorithm
    if (inside / run_folder.RUN_RECORD).is_file():
      return inside
  return init_from


def _check_init_from(init_from, config) -> None:
  """Refuses, before the first method trains, a source of another algorithm than `config`'s,
  and a folder that is neither a run folder nor a comparison holding `config`'s method's run
  (`method_init_from`'s choice: a comparison without that method's run gives its own folder).

  Raises:
    ConfigError: either, in one line naming the method and the runs the folder holds.
  """
  if init_from is None:
    return
  if isinstance(init_from, (str, os.PathLike)):
    record = run_folder.read_run_record(init_from)
    if record is None:  # no run.json, no checkpoint's record: not a run folder
      _refuse_no_run(Path(init_from), config.algorithm.name)
    recorded = (record or {}).get("config") or {}
    algorithm = config_records.flat_or_as_is(recorded).get("algorithm") if recorded else None
  else:
    algorithm = init_from.config.algorithm.name
  if algorithm is not None:  # none recorded: load_run says why, when the method starts
    run_start.check_algorithm(init_from, algorithm, config)


def _refuse_no_run(folder: Path, algorithm: str) -> None:
  """Refuses `folder` as `algorithm`'s source: it holds no run record of its own."""
  runs = (
    sorted(p.name for p in folder.iterdir() if (p / run_folder.RUN_RECORD).is_file())
    if folder.is_dir()
    else []
  )
  held = f"its runs: {', '.join(runs)}" if runs else "it holds none"
  raise ConfigError(
    f"init_from: {folder} holds no {algorithm} run: it is neither a run folder (no "
    f"{run_folder.RUN_RECORD}) nor a comparison holding {algorithm}/ ({held}); give "
    f"{algorithm} a source of its own, or leave it out of algorithms",
    fields=("init_from", "algorithms"),
  )


def method_config(experiment, preset: str, algorithm: str, overrides, print_fn=lambda line: None):
  """The config `run_methods` trains `algorithm` with: the preset's, the overrides applied, the
  fields the algorithm never reads dropped (each said to `print_fn`)."""
  return cli.apply_overrides(experiment.get_config(preset, algorithm), overrides, print_fn=print_fn)


def run_methods(
  experiment,
  algorithms,
  preset: str,
  workdir: Path,
  overrides,
  progress: bool = True,
  init_from=None,
) -> dict:
  """Trains (or resumes) each algorithm with `experiment`'s preset; returns their summaries.

  Args:
    experiment: an experiment module (`get_config(preset, algorithm)` and
      `run_experiment(config, workdir, progress=...)`).
    algorithms: names, trained in turn, each in `workdir / name`.
    preset: the experiment's preset.
    workdir: the comparison's folder.
    overrides: config fields for every method (parsed flags or a dict).
    progress: show progress.
    init_from: a trained run each method starts from: a comparison's folder (each method
      from its own run in it), a run folder, or a `vj.Run` (`method_init_from`).

  Returns:
    `{algorithm: test summary with 'calibration', 'wall_time_s', 'config'}`;
    a method whose training diverged is `{"diverged": message}` and the
    others still run.
  """
  for algorithm in algorithms:  # every method's settings, before the first one trains
    config = method_config(experiment, preset, algorithm, overrides)
    algorithm_registry.check_config(config)
    _check_init_from(method_init_from(init_from, algorithm), config)
  methods = {}
  for algorithm in algorithms:
    config = method_config(
      experiment, preset, algorithm, overrides, lambda line: print(f"   {line}")
    )
    # An algorithm without a KL term (MAML, BMAML) ignores kl_weight, whatever the overrides set.
    kl = f", KL weight {config.algorithm.kl_weight}" if config.algorithm.has_kl else ""
    print(
      f"== {algorithm}: {config.schedule.num_meta_steps} meta-steps of {config.schedule.tasks_per_step} tasks,"
      f" inner lr {getattr(config.algorithm, 'inner_lr', None)}{kl}; {workdir / algorithm}"
    )
    try:
      source = method_init_from(init_from, algorithm)
      start = {} if source is None else {"init_from": source}  # `run_experiment`'s keyword
      results = experiment.run_experiment(config, workdir / algorithm, progress=progress, **start)
    except FloatingPointError as error:  # recorded, and the other methods still run
      print(f"   {algorithm}: {error}")
      methods[algorithm] = {"diverged": str(error), "config": config_records.to_record(config)}
      continue
    methods[algorithm] = dict(
      results["test"],
      kind=kinds.of_results(results).name,
      wall_time_s=results["wall_time_s"],
      calibration=results["calibration"],
      config=results["config"],
    )
  return methods


def every_method_diverged(methods: dict) -> FloatingPointError:
  """The error when no method trained: each method's reason, not its config."""
  return FloatingPointError(
    "every method diverged: "
    + "; ".join(f"{name}: {method['diverged']}" for name, method in methods.items())
  )


def _table(methods: dict, kind: str) -> str:
  columns = kinds.get(kind).columns
  lines = [
    "| method | " + " | ".join(c[0] for c in columns) + " | train time (s) |",
    "|---" * (len(columns) + 2) + "|",
  ]
  for name, m in methods.items():
    if "diverged" in m:
      lines.append(f"| {name} | {m['diverged']} |" + " |" * len(columns))
      continue
    cells = []
    for _, key, scale in columns:
      if key not in m:
        cells.append("–")
      elif isinstance(m[key], int):  # a count, e.g. the tasks that ran away
        cells.append(str(m[key]))
      elif scale is None:
        cells.append(f"{m[key]:.4f}")
      else:
        cells.append(f"{scale * m[key]:.3f} ± {scale * m[key + '_ci95']:.3f}")
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {m['wall_time_s']['train']:.0f} |")
  return "\n".join(lines) + "\n"


OPEN_SET_SCORES = (("max prob", "max_prob"), ("entropy", "entropy"), ("MI", "mutual_information"))


def _open_set_table(methods: dict) -> str:
  """Open-set (unknown vs known queries) and misclassification AUROCs, one row per method."""
  scored = {name: m["open_set"] for name, m in methods.items() if "open_set" in m}
  if not scored:
    return ""

  header = (
    ["open-set AUROC: " + label for label, _ in OPEN_SET_SCORES]
    + ["misclassification AUROC: " + label for label, _ in OPEN_SET_SCORES]
    + ["known accuracy (%)"]
  )
  lines = ["| method | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
  for name, o in scored.items():
    cells = (
      [kinds.auroc_text(o, key) for _, key in OPEN_SET_SCORES]
      + [kinds.auroc_text(o, key, "misclassification_auroc") for _, key in OPEN_SET_SCORES]
      + ["–" if o["known_accuracy"] is None else f"{100 * o['known_accuracy']:.2f}"]
    )
    label = f"{name} (point estimate: MI = 0)" if name in POINT_ESTIMATES else name
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  first = next(iter(scored.values()))
  note = (
    f"\n{first['num_tasks']} test episodes, each with {first['num_unknown_classes']} "
    f"unknown classes ({first['num_unknown_queries']} unknown and "
    f"{first['num_known_queries']} known queries in all). AUROC 0.5: chance; n/a: a score "
    "that is the same for every query ranks none (MI without an epistemic part).\n"
  )
  return "\n".join(lines) + "\n" + note


def write_comparison(
  methods: dict, kind: str, workdir: Path, title: str, figure_name: str = "comparison.png"
) -> dict:
  """Draws the joint figures and writes the table for finished runs.

  `figure_name` is the file of the joint calibration figure.

  Methods whose training diverged (`{"diverged": message}`) are a row of
  the table and absent from the figures. Classification runs with open-set
  episodes also get `open_set_roc.png` and the open-set table.

  Returns:
    `{"plots": {...}, "table": markdown, "open_set_table": markdown or ""}`.
  """
  workdir = Path(workdir)
  finished = {name: m for name, m in methods.items() if "diverged" not in m}
  curves = {
    name: {k: metrics.calibration_from_record(r) for k, r in m["calibration"].items()}
    for name, m in finished.items()
  }
  figures, joint = {}, Path(figure_name).stem
  if kind == kinds.REGRESSION.name:  # which figures draw a kind's calibration curves
    figures[joint] = plots.plot_quantile_calibration(
      {
        name.upper(): c.get("quantile_calibration", c.get("pit_calibration"))
        for name, c in curves.items()
      },
      workdir / figure_name,
      title=title,
      point_estimates=[n.upper() for n in finished if n in POINT_ESTIMATES],
    )
  else:
    figures[joint] = plots.plot_reliability_diagram(
      {name.upper(): c["reliability"] for name, c in curves.items()},
      workdir / figure_name,
      title=title,
    )
    figures["risk_coverage"] = plots.plot_risk_coverage(
      {name.upper(): c["risk_coverage"] for name, c in curves.items()},
      workdir / "risk_coverage.png",
      title=f"Selective prediction, {title}",
    )
  figures["calibration_bars"] = plots.plot_calibration_bars(
    {name.upper(): (m["ece"], m["mce"]) for name, m in finished.items() if "ece" in m},
    workdir / "calibration_bars.png",
    title=title,
  )
  open_set = {name.upper(): m["open_set"] for name, m in finished.items() if "open_set" in m}
  if open_set:
    figures["open_set_roc"] = plots.plot_open_set_roc(
      open_set,
      workdir / "open_set_roc.png",
      title=f"Open-set detection, {title}",
      point_estimates=[n.upper() for n in finished if n in POINT_ESTIMATES],
    )
  table, open_set_table = _table(methods, kind), _open_set_table(methods)
  text = f"# {title}\n\n{table}"
  if open_set_table:
    text += f"\n## Open-set and misclassification detection (AUROC)\n\n{open_set_table}"
  (workdir / "results.md").write_text(text)
  return {
    "plots": {k: str(v) for k, v in figures.items()},
    "table": table,
    "open_set_table": open_set_table,
  }


def run(
  benchmark: str,
  algorithms,
  preset: str,
  workdir: Path,
  overrides=None,
  progress: bool = True,
  init_from=None,
) -> dict:
  """Trains (or resumes) every algorithm on `benchmark`, then compares them."""
  if benchmark not in BENCHMARKS:
    raise ConfigError(f"--benchmark {benchmark!r} is unknown; choose one of {sorted(BENCHMARKS)}")
  experiment = importlib.import_module(BENCHMARKS[benchmark])
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  methods = run_methods(
    experiment, algorithms, preset, workdir, overrides or {}, progress, init_from
  )
  finished = [m for m in methods.values() if "diverged" not in m]
  if not finished:
    raise every_method_diverged(methods)
  kind = finished[0]["kind"]
  title = f"{benchmark} ({preset}), {finished[0]['num_tasks']} test tasks"
  written = write_comparison(methods, kind, workdir, title)
  results = {
    "benchmark": benchmark,
    "preset": preset,
    "methods": methods,
    **written,
    "command": " ".join(["python -m experiments.compare"] + sys.argv[1:]),
    "device": run_folder.device_description(),
  }
  (workdir / "comparison.json").write_text(json.dumps(results, indent=2, default=float))
  print(written["table"])
  if written["open_set_table"]:
    print(written["open_set_table"])
  return results


def parse_args(argv=None):
  """`(benchmark, algorithms, preset, workdir, overrides, progress)` from the command line."""
  argv = list(sys.argv[1:] if argv is None else argv)
  first = argparse.ArgumentParser(add_help=False)
  first.add_argument("--benchmark", default="regression", choices=list(BENCHMARKS))
  known, _ = first.parse_known_args(argv)
  experiment = importlib.import_module(BENCHMARKS[known.benchmark])

  def add_flags(parser):
    parser.add_argument(
      "--benchmark",
      default="regression",
      choices=list(BENCHMARKS),
      help="which experiment's preset the methods share (default: regression)",
    )
    parser.add_argument(
      "--algorithms",
      default=",".join(ALGORITHMS),
      help=f"comma-separated subset (default: {','.join(ALGORITHMS)})",
    )

  default_preset = "cpu" if known.benchmark == "regression" else experiment.PRESETS[0]
  _, args = cli.parse(
    argv,
    __doc__,
    experiment.PRESETS,
    experiment.get_config,
    default_preset=default_preset,
    algorithm_flag=False,
    add_flags=add_flags,
  )
  workdir = args.workdir or Path("runs") / f"compare_{args.benchmark}_{args.preset}"
  return (
    args.benchmark,
    parse_algorithms(args.algorithms),
    args.preset,
    workdir,
    args,
    not args.no_progress,
  )


def main(argv=None) -> dict:
  benchmark, algorithms, preset, workdir, overrides, progress = parse_args(argv)
  print(
    f"comparing {algorithms} on {benchmark} ({preset}); workdir {workdir}; "
    f"backend {jax.default_backend()}"
  )
  return run(benchmark, algorithms, preset, workdir, overrides, progress, overrides.init_from)


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
