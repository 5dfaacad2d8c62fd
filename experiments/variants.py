"""Several comparisons side by side: each method's calibration under each variant of the settings.

    python -m experiments.variants \\
        --variant "a: cpu preset, before issue 29=runs/cmp_a_s0,runs/cmp_a_s1" \\
        --variant "b: + log-std weight decay=runs/cmp_b_s0,runs/cmp_b_s1" \\
        --variant "c: authors2019, 3000 steps=runs/cmp_c_s0,runs/cmp_c_s1" \\
        --fallback b=a --figure docs/comparison_regression.png --json variants.json

A variant is a label and its run folders, one per seed: folders of
`experiments.compare` or `experiments.regression` (each method in a sub-folder),
or a single method's run folder. `--fallback b=a` takes a method that variant b
did not train from variant a (e.g. MAML, which has no log-stds to decay). Prints
a markdown table (per method and variant: ECE, MCE, NLL, the paper's MSE and the
median task MSE, mean over seeds with each seed's value, and the prior's mean
log-std at the end of training) and draws ECE as grouped bars, a dot per seed.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from experiments import plots
from vampire_jax import ConfigError, UserError
from vampire_jax.runs import config_records, reporting

METRICS = ("ece", "mce", "nll", "mse", "median_mse")


def _run_metrics(folder: Path) -> dict:
  """A run folder's test metrics, its median task MSE and its last logged prior log-std."""
  results = json.loads((folder / "results.json").read_text())
  metrics = dict(results["test"])
  per_task = folder / "test_per_task.npz"
  if per_task.is_file() and "mse" in metrics:
    metrics["median_mse"] = float(np.median(np.load(per_task)["mse"]))
  logged = [
    row["train/log_std"] for row in reporting.read_metrics(folder) if "train/log_std" in row
  ]
  if logged:
    metrics["log_std"] = logged[-1]
  return metrics


def read_methods(folder: Path) -> dict[str, dict]:
  """`{method: metrics}` of a comparison folder, or `{algorithm: metrics}` of one run folder.

  Raises:
    UserError: the folder holds neither.
  """
  folder = Path(folder)
  if (folder / "run.json").is_file():
    config = config_records.flat_or_as_is(
      json.loads((folder / "results.json").read_text())["config"]
    )
    return {config["algorithm"]: _run_metrics(folder)}
  methods = {}
  for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
    if (sub / "results.json").is_file() and (sub / "run.json").is_file():
      methods[sub.name] = _run_metrics(sub)
    elif (sub / "run.json").is_file():
      methods[sub.name] = {"diverged": True}
  if not methods:
    raise UserError(f"{folder} holds no run folder (results.json and run.json) to compare")
  return methods


def collect(variants: dict[str, list[Path]], fallbacks: dict[str, str]) -> dict:
  """`{variant: {method: [metrics per seed]}}`, with the fallbacks' methods filled in."""
  table = {
    label: _by_method([read_methods(folder) for folder in folders])
    for label, folders in variants.items()
  }
  for label, source in fallbacks.items():
    for method, seeds in table[source].items():
      table[label].setdefault(method, [dict(m, fallback=source) for m in seeds])
  return table


def _by_method(per_seed: list[dict]) -> dict[str, list[dict]]:
  methods: dict[str, list[dict]] = {}
  for seed in per_seed:
    for method, metrics in seed.items():
      methods.setdefault(method, []).append(metrics)
  return methods


def _cell(seeds: list[dict], metric: str) -> str:
  values = [s[metric] for s in seeds if metric in s]
  if not values:
    return "diverged" if any(s.get("diverged") for s in seeds) else "–"
  mean = float(np.mean(values))
  text = f"{mean:.3f}" if abs(mean) < 1e4 else f"{mean:.2g}"
  return text if len(values) == 1 else f"{text} ({', '.join(f'{v:.3g}' for v in values)})"


def to_markdown(table: dict) -> str:
  """One row per method and variant; each cell the mean over seeds (the seeds in brackets)."""
  columns = ("ECE", "MCE", "NLL", "MSE (paper's)", "median task MSE", "prior log-std")
  lines = ["| method | variant | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
  methods = list(dict.fromkeys(m for variant in table.values() for m in variant))
  for method in methods:
    for label, variant in table.items():
      seeds = variant.get(method)
      if not seeds:
        continue
      note = f" (= {seeds[0]['fallback']})" if "fallback" in seeds[0] else ""
      cells = [_cell(seeds, m) for m in METRICS + ("log_std",)]
      lines.append(f"| {method.upper()} | {label}{note} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> dict:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--variant", action="append", required=True, metavar="LABEL=FOLDER[,FOLDER...]"
  )
  parser.add_argument("--fallback", action="append", default=[], metavar="VARIANT=FROM")
  parser.add_argument("--figure", type=Path, help="ECE per method and variant (PNG)")
  parser.add_argument("--json", type=Path, help="also write the table as JSON")
  args = parser.parse_args(argv)
  variants = {}
  for spec in args.variant:
    label, _, folders = spec.partition("=")
    if not folders:
      raise ConfigError(f"--variant {spec!r}: expected LABEL=FOLDER[,FOLDER...]")
    variants[label] = [Path(f) for f in folders.split(",")]
  short = {label.split(":")[0].strip(): label for label in variants}
  fallbacks = {}
  for spec in args.fallback:
    to, _, source = spec.partition("=")
    if to not in short or source not in short:
      raise ConfigError(f"--fallback {spec!r}: variants are {', '.join(short)}")
    fallbacks[short[to]] = short[source]
  table = collect(variants, fallbacks)
  print(to_markdown(table))
  if args.figure:
    plots.plot_variant_bars(table, "ece", args.figure, ylabel="ECE (quantile calibration)")
  if args.json:
    args.json.write_text(json.dumps(table, indent=2, default=float))
  return table


def entry(argv=None) -> int:
  try:
    main(argv)
  except UserError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(entry())
