"""The paper's results tables beside the measured ones, read from run folders.

    python -m experiments.paper_table runs/
    python -m experiments.paper_table runs/paper runs/regression_paper_seed0 --json table.json

Each RUN_DIR is a run folder or a folder of run folders (one level of
sub-folders is read too). A run of `experiments.omniglot` or
`experiments.mini_imagenet` leaves results.json with "config" and "test"
(and calibration.json after `--calibration-tasks`); `experiments.regression`
and `experiments.compare` leave results.json or comparison.json with a
summary per method under "methods", each method trained in
`<folder>/<method>/` (read from there when it holds its own results.json).

A run fills a cell of the paper's tables when its experiment, algorithm and
setting (split, ways, shots) are the cell's and every setting of its config
is the paper preset's (`experiments.presets.get_config`, read each time, so
a preset that changes is followed), but those that do not change what a run
measures (`NOT_PROTOCOL`: speed knobs, where the data was read from, the
seed, how often it logged or saved, the number of test tasks, which is shown).
Any other run is listed apart, with every setting that differs, never mixed
into a cell. Where several runs fill a cell, the one with the most test tasks
is shown and the count is given. Accuracy is in %, ± the 95% CI half-width,
and Δ = measured − paper. Every measured number comes from the files read; a
results.json that does not hold what a run writes (no "test": a run that has
not finished; a field missing or of the wrong type: a hand edit) is skipped
with a line naming the file and the field.
"""

import argparse
import json
import numbers
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from experiments import cli, presets
from vampire_jax import ConfigError, UserError
from vampire_jax.runs import config_records

# The paper's published numbers (Nguyen et al., WACV 2020; paper/vampire_wacv2020.tex),
# written as printed there: "mean±95% CI", or the mean alone.
PAPER = {
  # Table 1 (tab:omniglot_results): Omniglot accuracy %, 1000 test tasks.
  "omniglot": {
    "original": {
      "maml": {
        "5way1shot": "96.68±0.57",
        "5way5shot": "98.33±0.22",
        "20way1shot": "84.38±0.64",
        "20way5shot": "96.32±0.17",
      },
      "vampire": {
        "5way1shot": "96.27±0.38",
        "5way5shot": "98.77±0.27",
        "20way1shot": "86.60±0.24",
        "20way5shot": "96.14±0.10",
      },
    },
    "random": {
      "maml": {
        "5way1shot": "98.7±0.4",
        "5way5shot": "99.9±0.1",
        "20way1shot": "95.8±0.3",
        "20way5shot": "98.9±0.2",
      },
      "vampire": {
        "5way1shot": "98.43±0.19",
        "5way5shot": "99.56±0.08",
        "20way1shot": "93.20±0.28",
        "20way5shot": "98.52±0.13",
      },
    },
  },
  # Table 2 (tab:miniImageNet_results): mini-ImageNet 5-way accuracy %, 600 test
  # tasks; MAML's row is Finn et al. 2017's, with its CI as the table prints it.
  "mini_imagenet": {
    "maml": {"5way1shot": "48.70±1.84", "5way5shot": "63.15±0.91"},
    "vampire": {"5way1shot": "51.54±0.74", "5way5shot": "64.31±0.74"},
  },
  # Supplementary table tab:regression_mse: sine/line MSE (averaged over weight
  # draws), 1000 test tasks. ECE/MCE are only a bar chart (Fig. 2d), no numbers.
  "regression_mse": {
    "maml": "1.96",
    "platipus": "1.86",
    "bmaml": "1.12",
    "abml": "2.32",
    "vampire": "2.24",
  },
  # Supplementary table tab:classification_ece_mce: mini-ImageNet 5-way 1-shot,
  # all C(20, 5) = 15 504 test tasks: (ECE±CI, MCE).
  "calibration": {
    "maml": ("0.0410±0.005", "0.124"),
    "platipus": ("0.032±0.005", "0.108"),
    "bmaml": ("0.025±0.006", "0.092"),
    "abml": ("0.026±0.003", "0.058"),
    "vampire": ("0.008±0.002", "0.038"),
  },
}

OMNIGLOT_SETTINGS = ("5way1shot", "5way5shot", "20way1shot", "20way5shot")
MINI_IMAGENET_SETTINGS = ("5way1shot", "5way5shot")
CALIBRATION_SETTING = "5way1shot"

# Config fields that do not change what a run measures; every other field must equal the
# paper preset's (experiments.presets, for the run's algorithm) for the run to fill a cell.
# The speed group changes nothing beyond float rounding (but bfloat16 compute does more).
NOT_PROTOCOL = (frozenset(cli.GROUPS["speed"]) - {"compute_dtype"}) | {
  "seed",  # another seed is a replicate of the same protocol
  "data_dir",
  "data_source",
  "source",
  "cache_dir",
  "log_every",
  "checkpoint_every",
  "num_test_tasks",  # shown beside the number, and the largest run is chosen
  "num_plot_tasks",
  "debug_nans",
}
# A config field only that experiment's config has (experiments.presets).
EXPERIMENT_MARKERS = {
  "class_sampling": "omniglot",
  "image_size": "mini_imagenet",
  "crop": "features",
  "num_support": "regression",
}
RESULT_FILES = ("results.json", "comparison.json")
UNMEASURED = "unmeasured"


class Run(NamedTuple):
  """One trained run, as its folder records it."""

  folder: Path
  experiment: str  # omniglot, mini_imagenet, features, regression or unknown
  config: dict
  test: dict  # test metrics: accuracy(_ci95) or mse(_ci95), num_tasks, ...
  calibration: Optional[dict]  # calibration.json (the calibration protocol), if any


class SortedRuns(NamedTuple):
  """Runs by where they belong."""

  cells: dict  # {cell key: [Run]}: the paper's protocol
  off_protocol: list  # [(Run, what differs from the paper preset)]
  other: list  # [(Run, why it has no cell)]


# -- Reading run folders --------------------------------------------------------------


def read_runs(folders, skipped: Optional[list] = None) -> list[Run]:
  """Every run recorded in `folders` and their sub-folders, each once.

  A file that does not hold what a run writes is skipped with a line on
  stderr; `skipped` (if given) collects `(path, why)`.
  """
  runs = {}
  for folder in map(Path, folders):
    if not folder.is_dir():
      raise ConfigError(f"{folder} is not a folder")
    for candidate in [folder] + sorted(p for p in folder.iterdir() if p.is_dir()):
      for run in runs_in(candidate, skipped):
        runs.setdefault(run.folder.resolve(), run)
  return list(runs.values())


def runs_in(folder: Path, skipped: Optional[list] = None) -> list[Run]:
  """The runs that one folder's results.json or comparison.json records."""
  runs = []
  for name in RESULT_FILES:
    path = folder / name
    record = _read_json(path)
    if record is None:
      continue
    if isinstance(record, dict) and isinstance(record.get("methods"), dict):
      for method, summary in record["methods"].items():
        run = _method_run(folder / method, summary, path, skipped)
        if run is not None:
          runs.append(run)
      continue
    run, why = _checked_run(folder, record)
    if run is None:
      _skip(path, why, skipped)
    else:
      runs.append(run)
  return runs


def _skip(path: Path, why: str, skipped: Optional[list]) -> None:
  print(f"warning: skipped {path}: {why}", file=sys.stderr)
  if skipped is not None:
    skipped.append((str(path), why))


def _method_run(folder: Path, summary, comparison: Path, skipped: Optional[list]) -> Optional[Run]:
  """A method of a comparison: its own results.json if there is one, else the summary."""
  own = folder / "results.json"
  record = _read_json(own)
  if record is not None:
    run, why = _checked_run(folder, record)
    if run is not None:
      return run
    _skip(own, why + "; using the comparison's summary", skipped)
  if not isinstance(summary, dict):
    _skip(comparison, f"methods[{folder.name!r}] is not an object", skipped)
    return None
  test = {k: v for k, v in summary.items() if k not in ("config", "calibration")}
  run, why = _checked_run(folder, {"config": summary.get("config", {}), "test": test})
  if run is None:
    _skip(comparison, f"methods[{folder.name!r}]: {why}", skipped)
  return run


def _checked_run(folder: Path, record) -> tuple[Optional[Run], str]:
  """`(Run, "")` if `record` holds what a run writes, else `(None, what is wrong)`."""
  if not isinstance(record, dict):
    return None, "not a JSON object"
  if not isinstance(record.get("config"), dict):
    return None, 'no "config" object (not a results.json of a run)'
  if "test" not in record:
    return None, 'no "test" (a run that has not finished its test?)'
  if not isinstance(record["test"], dict):
    return None, '"test" is not an object'
  run = _make_run(folder, record["config"], record["test"])
  why = _problem(run)
  return (None, why) if why else (run, "")


# What each experiment's settings and each score need, as the tables read them.
_SETTING_FIELDS = {
  "omniglot": ("split", "ways", "shots"),
  "mini_imagenet": ("ways", "shots"),
  "features": ("ways", "shots"),
  "regression": ("num_support",),
}


def _problem(run: Run) -> str:
  """What in a run's record the tables cannot read ("" if nothing)."""
  if not isinstance(run.config.get("algorithm"), str):
    return 'config["algorithm"] is missing or not a name'
  for name in _SETTING_FIELDS.get(run.experiment, ()):
    value = run.config.get(name)
    if name == "split" and not isinstance(value, str):
      return f'config["{name}"] is missing or not a name'
    if name != "split" and (isinstance(value, bool) or not isinstance(value, int)):
      return f'config["{name}"] is missing or not an integer'
  test = run.test
  if "diverged" in test:
    return ""
  if "accuracy" in test:
    needed = ("accuracy", "accuracy_ci95") + (
      ("ece", "mce") if run.experiment == "mini_imagenet" else ()
    )
  elif "mse" in test:
    needed = ("mse", "mse_ci95")
  else:
    return 'test has neither "accuracy" nor "mse"'
  optional = ("ece", "mce", "num_tasks")
  for name in needed + optional:
    value = test.get(name)
    if (name in needed or value is not None) and (
      isinstance(value, bool) or not isinstance(value, numbers.Real)
    ):
      return f'test["{name}"] is {"missing" if value is None else repr(value)}, not a number'
  return ""


def _make_run(folder: Path, config: dict, test: dict) -> Run:
  config = config_records.flat_or_as_is(config)  # by name, from either format of record
  experiment = next(
    (name for field, name in EXPERIMENT_MARKERS.items() if field in config), "unknown"
  )
  return Run(folder, experiment, config, test, _read_json(folder / "calibration.json"))


def _read_json(path: Path):
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
    print(f"warning: skipped {path}: {error}", file=sys.stderr)
    return None


# -- Which cell a run fills --------------------------------------------------------


def paper_cells() -> set:
  """The keys of every cell of the tables."""
  cells = {
    ("omniglot", split, algorithm, setting)
    for split, methods in PAPER["omniglot"].items()
    for algorithm, settings in methods.items()
    for setting in settings
  }
  cells |= {
    ("mini_imagenet", algorithm, setting)
    for algorithm, settings in PAPER["mini_imagenet"].items()
    for setting in settings
  }
  cells |= {("mini_imagenet", algorithm, CALIBRATION_SETTING) for algorithm in PAPER["calibration"]}
  return cells | {("regression", algorithm) for algorithm in PAPER["regression_mse"]}


def _cell_key(run: Run) -> Optional[tuple]:
  """The key of the cell the run's setting would fill (None: the experiment has none)."""
  c, algorithm = run.config, run.config.get("algorithm")
  if run.experiment == "omniglot":
    return ("omniglot", c["split"], algorithm, f"{c['ways']}way{c['shots']}shot")
  if run.experiment == "mini_imagenet":
    return ("mini_imagenet", algorithm, f"{c['ways']}way{c['shots']}shot")
  if run.experiment == "regression":
    return ("regression", algorithm)
  return None


def _as_json(value):
  return json.loads(json.dumps(value))  # tuples -> lists, as results.json holds them


def protocol_differences(run: Run, key: tuple) -> dict:
  """`{field: (the run's value, the paper preset's)}` for each setting that differs.

  Every field of the paper preset's config (`presets.get_config`, for the
  run's algorithm) but `NOT_PROTOCOL` and the cell's own setting (split,
  ways, shots); a field the run's record lacks (added since) counts as its
  default.
  """
  preset = "paper" if run.experiment == "regression" else key[-1]
  paper = presets.get_config(run.experiment, preset, run.config["algorithm"])
  # A field the run's record lacks (added since) counts as its default.
  defaults = {**type(paper)().flat(), **type(paper.algorithm)().settings()}
  differences = {}
  for name, value in paper.flat().items():
    if name in NOT_PROTOCOL or name in _SETTING_FIELDS.get(run.experiment, ()):
      continue  # the cell's own setting (the split, ways, shots) chose the cell
    wanted = _as_json(value)
    mine = _as_json(run.config.get(name, defaults.get(name)))
    if mine != wanted:
      differences[name] = (mine, wanted)
  return differences


def sort_runs(runs: list[Run]) -> SortedRuns:
  """Puts each run in its cell, or in one of the two lists apart."""
  cells, sorted_runs = paper_cells(), SortedRuns({}, [], [])
  for run in sorted(runs, key=lambda r: str(r.folder)):
    key = _cell_key(run)
    if "diverged" in run.test:
      sorted_runs.other.append((run, f"diverged: {run.test['diverged']}"))
    elif key not in cells:
      sorted_runs.other.append((run, "no cell of the paper's tables has this setting"))
    elif differences := protocol_differences(run, key):
      sorted_runs.off_protocol.append(
        (
          run,
          "; ".join(
            f"{name} {mine} (paper preset {paper})" for name, (mine, paper) in differences.items()
          ),
        )
      )
    else:
      sorted_runs.cells.setdefault(key, []).append(run)
  return sorted_runs


# -- The tables as data ---------------------------------------------------------------


def _published(text: str) -> dict:
  """'96.68±0.57' -> {'value': 96.68, 'ci95': 0.57, 'text': '96.68 ± 0.57'}."""
  value, _, ci = text.partition("±")
  return {
    "value": float(value),
    "ci95": float(ci) if ci else None,
    "text": text.replace("±", " ± "),
  }


def _most_test_tasks(runs: list[Run]) -> Run:
  return max(runs, key=lambda run: run.test.get("num_tasks", 0))


def _shown(run: Run, matched: int, **numbers) -> dict:
  return {
    **numbers,
    "num_tasks": run.test.get("num_tasks"),
    "run": str(run.folder),
    "matched_runs": matched,
  }


def accuracy_cell(paper_text: str, runs: list[Run]) -> dict:
  """A cell of Table 1 or 2: paper, measured (the run with the most test tasks), Δ."""
  cell = {"paper": _published(paper_text), "measured": None, "difference": None}
  if runs:
    run = _most_test_tasks(runs)
    value, ci = 100 * run.test["accuracy"], 100 * run.test["accuracy_ci95"]
    cell["measured"] = _shown(run, len(runs), value=value, ci95=ci)
    cell["difference"] = value - cell["paper"]["value"]
  return cell


def omniglot_table(cells: dict) -> list[dict]:
  return [
    {
      "split": split,
      "algorithm": algorithm,
      "setting": setting,
      **accuracy_cell(text, cells.get(("omniglot", split, algorithm, setting), [])),
    }
    for split, methods in PAPER["omniglot"].items()
    for algorithm in ("vampire", "maml")
    for setting, text in methods[algorithm].items()
  ]


def mini_imagenet_table(cells: dict) -> list[dict]:
  return [
    {
      "algorithm": algorithm,
      "setting": setting,
      **accuracy_cell(text, cells.get(("mini_imagenet", algorithm, setting), [])),
    }
    for algorithm in ("vampire", "maml")
    for setting, text in PAPER["mini_imagenet"][algorithm].items()
  ]


def regression_table(cells: dict) -> list[dict]:
  """Per method: the paper's MSE and the measured MSE, ECE, MCE (the paper gives no ECE/MCE)."""
  rows = []
  for algorithm, text in PAPER["regression_mse"].items():
    runs = cells.get(("regression", algorithm), [])
    row = {
      "algorithm": algorithm,
      "paper": {"mse": _published(text), "ece": None, "mce": None},
      "measured": None,
      "difference": None,
    }
    if runs:
      run = _most_test_tasks(runs)
      row["measured"] = _shown(
        run, len(runs), **{k: run.test.get(k) for k in ("mse", "mse_ci95", "ece", "mce")}
      )
      row["difference"] = run.test["mse"] - row["paper"]["mse"]["value"]
    rows.append(row)
  return rows


def _calibration_measured(runs: list[Run]) -> Optional[dict]:
  """ECE/MCE of the calibration protocol (calibration.json) if a run has it, else of the test."""
  protocol = [run for run in runs if run.calibration and "ece" in run.calibration]
  if protocol:
    run = max(protocol, key=lambda r: r.calibration.get("num_tasks", 0))
    return {
      "ece": run.calibration["ece"],
      "mce": run.calibration["mce"],
      "source": "calibration protocol (calibration.json)",
      "num_tasks": run.calibration.get("num_tasks"),
      "run": str(run.folder),
      "matched_runs": len(runs),
    }
  if runs:
    run = _most_test_tasks(runs)
    return dict(
      _shown(run, len(runs), ece=run.test["ece"], mce=run.test["mce"]),
      source="test split (results.json)",
    )
  return None


def calibration_table(cells: dict) -> list[dict]:
  rows = []
  for algorithm, (ece, mce) in PAPER["calibration"].items():
    runs = cells.get(("mini_imagenet", algorithm, CALIBRATION_SETTING), [])
    rows.append(
      {
        "algorithm": algorithm,
        "paper": {"ece": _published(ece), "mce": _published(mce)},
        "measured": _calibration_measured(runs),
      }
    )
  return rows


def _listed(run: Run, reason: str) -> dict:
  return {
    "run": str(run.folder),
    "experiment": run.experiment,
    "algorithm": run.config.get("algorithm"),
    "setting": setting_of(run),
    "measured": _headline(run),
    "reason": reason,
  }


def build_tables(runs: list[Run], skipped: Optional[list] = None) -> dict:
  """Every table as JSON-ready data; `skipped`: the `(file, why)` that `read_runs` skipped."""
  placed = sort_runs(runs)
  return {
    "omniglot": omniglot_table(placed.cells),
    "mini_imagenet": mini_imagenet_table(placed.cells),
    "regression": regression_table(placed.cells),
    "calibration": calibration_table(placed.cells),
    "not_paper_protocol": [_listed(run, why) for run, why in placed.off_protocol],
    "other_runs": [_listed(run, why) for run, why in placed.other],
    "num_runs_read": len(runs),
    "skipped_files": [{"file": path, "why": why} for path, why in skipped or []],
  }


def setting_of(run: Run) -> str:
  """The run's setting in words, e.g. "original split, 5-way 1-shot" or "5-shot sine/line"."""
  c = run.config
  if run.experiment == "omniglot":
    return f"{c['split']} split, {c['ways']}-way {c['shots']}-shot"
  if run.experiment in ("mini_imagenet", "features"):
    return f"{c.get('dataset', '')} {c['ways']}-way {c['shots']}-shot".strip()
  if run.experiment == "regression":
    return f"{c['num_support']}-shot sine/line"
  return ""


def paper_text(run: Run) -> Optional[str]:
  """The paper's number for the run's setting and algorithm, as `PAPER` prints it (None: none).

  Accuracy % for Omniglot and mini-ImageNet ("96.27±0.38"), the MSE for sine/line
  ("2.24"), whatever the run's protocol: `sort_runs` says whether the run is the paper's.
  """
  key = _cell_key(run)
  if key is None:
    return None
  if key[0] == "omniglot":
    _, split, algorithm, setting = key
    return PAPER["omniglot"].get(split, {}).get(algorithm, {}).get(setting)
  if key[0] == "mini_imagenet":
    _, algorithm, setting = key
    return PAPER["mini_imagenet"].get(algorithm, {}).get(setting)
  return PAPER["regression_mse"].get(key[1])


def _headline(run: Run) -> str:
  t = run.test
  if "accuracy" in t:
    return (
      f"accuracy {100 * t['accuracy']:.2f} ± {100 * t['accuracy_ci95']:.2f} % "
      f"({t.get('num_tasks')} tasks)"
    )
  if "mse" in t:
    return f"MSE {t['mse']:.3f} ± {t['mse_ci95']:.3f} ({t.get('num_tasks')} tasks)"
  return "–"


# -- Markdown ---------------------------------------------------------------------------


def _accuracy_text(cell: dict) -> str:
  paper = cell["paper"]["text"]
  if cell["measured"] is None:
    return f"{UNMEASURED} (paper {paper})"
  m = cell["measured"]
  return f"{m['value']:.2f} ± {m['ci95']:.2f} (paper {paper}, Δ {cell['difference']:+.2f})"


def _setting_name(setting: str) -> str:
  ways, shots = setting.split("way")
  return f"{ways}-way {shots.replace('shot', '')}-shot"


def _row(cells) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def _header(names) -> list[str]:
  return [_row(names), "|" + "---|" * len(names)]


def _sources(entries: list[dict], label) -> list[str]:
  lines = []
  for entry in entries:
    m = entry["measured"]
    if m is not None:
      count = (
        f"; the one with the most test tasks of {m['matched_runs']} matching runs"
        if m["matched_runs"] > 1
        else ""
      )
      lines.append(f"- {label(entry)}: `{m['run']}` ({m['num_tasks']} test tasks{count})")
  return ["", "Runs shown:"] + lines if lines else []


def omniglot_markdown(rows: list[dict]) -> list[str]:
  lines = [
    "## Omniglot (Table 1): accuracy %, measured ± 95% CI (paper ± CI, Δ = measured − paper)",
    "",
  ] + _header(["split", "method"] + [_setting_name(s) for s in OMNIGLOT_SETTINGS])
  for split in PAPER["omniglot"]:
    for algorithm in ("vampire", "maml"):
      cells = {r["setting"]: r for r in rows if (r["split"], r["algorithm"]) == (split, algorithm)}
      lines.append(
        _row([split, algorithm.upper()] + [_accuracy_text(cells[s]) for s in OMNIGLOT_SETTINGS])
      )
  return lines + _sources(rows, _omniglot_label)


def _omniglot_label(row: dict) -> str:
  return f"{row['split']} {_setting_name(row['setting'])} {row['algorithm'].upper()}"


def mini_imagenet_markdown(rows: list[dict]) -> list[str]:
  lines = ["## mini-ImageNet 5-way (Table 2): accuracy %, measured ± 95% CI (paper ± CI, Δ)", ""]
  lines += _header(["method"] + [_setting_name(s) for s in MINI_IMAGENET_SETTINGS])
  for algorithm in ("vampire", "maml"):
    cells = {r["setting"]: r for r in rows if r["algorithm"] == algorithm}
    lines.append(
      _row([algorithm.upper()] + [_accuracy_text(cells[s]) for s in MINI_IMAGENET_SETTINGS])
    )
  return lines + _sources(
    rows, lambda row: f"{_setting_name(row['setting'])} {row['algorithm'].upper()}"
  )


def _number(value, digits: int) -> str:
  return UNMEASURED if value is None else f"{value:.{digits}f}"


def regression_markdown(rows: list[dict]) -> list[str]:
  lines = [
    "## Sine/line regression (supplementary tab:regression_mse): MSE averaged over weight "
    "draws; ECE/MCE of the quantile calibration (the paper's are a bar chart: –)",
    "",
  ]
  lines += _header(
    [
      "method",
      "MSE measured ± 95% CI",
      "MSE paper",
      "Δ MSE",
      "ECE measured",
      "ECE paper",
      "MCE measured",
      "MCE paper",
    ]
  )
  for r in rows:
    m = r["measured"] or {}
    mse = f"{m['mse']:.3f} ± {m['mse_ci95']:.3f}" if m else UNMEASURED
    delta = f"{r['difference']:+.3f}" if m else "–"
    lines.append(
      _row(
        [
          r["algorithm"].upper(),
          mse,
          r["paper"]["mse"]["text"],
          delta,
          _number(m.get("ece"), 4),
          "–",
          _number(m.get("mce"), 4),
          "–",
        ]
      )
    )
  return lines + _sources(rows, lambda r: r["algorithm"].upper())


def calibration_markdown(rows: list[dict]) -> list[str]:
  lines = [
    "## Calibration, mini-ImageNet 5-way 1-shot (supplementary tab:classification_ece_mce; "
    "the paper's on all 15 504 test tasks)",
    "",
  ]
  lines += _header(
    ["method", "ECE measured", "ECE paper", "MCE measured", "MCE paper", "measured on"]
  )
  for r in rows:
    m = r["measured"] or {}
    source = f"{m['source']}, {m['num_tasks']} tasks" if m else "–"
    lines.append(
      _row(
        [
          r["algorithm"].upper(),
          _number(m.get("ece"), 4),
          r["paper"]["ece"]["text"],
          _number(m.get("mce"), 4),
          r["paper"]["mce"]["text"],
          source,
        ]
      )
    )
  return lines + _sources(rows, lambda r: r["algorithm"].upper())


def listed_markdown(title: str, entries: list[dict]) -> list[str]:
  lines = [f"## {title}", ""]
  if not entries:
    return lines + ["(none)"]
  lines += _header(["run", "experiment", "method", "setting", "measured", "why"])
  return lines + [
    _row(
      [
        f"`{e['run']}`",
        e["experiment"],
        str(e["algorithm"]).upper(),
        e["setting"],
        e["measured"],
        e["reason"],
      ]
    )
    for e in entries
  ]


def to_markdown(tables: dict) -> str:
  """All tables as markdown."""
  sections = [
    omniglot_markdown(tables["omniglot"]),
    mini_imagenet_markdown(tables["mini_imagenet"]),
    regression_markdown(tables["regression"]),
    calibration_markdown(tables["calibration"]),
    listed_markdown(
      "Not the paper's protocol (kept out of the tables)", tables["not_paper_protocol"]
    ),
    listed_markdown("Other runs (no cell in these tables)", tables["other_runs"]),
  ]
  count = tables["num_runs_read"]
  skipped = len(tables.get("skipped_files", []))
  head = f"# The paper's tables beside ours ({count} run{'' if count == 1 else 's'} read"
  head += (
    f"; {skipped} file{'' if skipped == 1 else 's'} skipped, see the warnings)" if skipped else ")"
  )
  return "\n\n".join([head] + ["\n".join(s) for s in sections]) + "\n"


# -- Command line -------------------------------------------------------------------------


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folders, or folders of them"
  )
  parser.add_argument("--json", type=Path, metavar="PATH", help="also write the tables as JSON")
  args = parser.parse_args(argv)
  skipped = []
  tables = build_tables(read_runs(args.run_dirs, skipped), skipped)
  print(to_markdown(tables))
  if args.json is not None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(tables, indent=2))
  return tables


def entry(argv=None) -> int:
  """`main` as a command: a bad folder prints one line and returns 2."""
  try:
    main(argv)
  except UserError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(entry())
