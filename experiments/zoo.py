"""The model zoo: the trained runs behind the README's results table, in `zoo/`.

    python -m experiments.zoo add runs/regression_cpu_seed0        # each run folder in it
    python -m experiments.zoo add omniglot_original_5way1shot_vampire.tar.gz   # from a GPU
    python -m experiments.zoo verify                               # every cell, 20 tasks each
    python -m experiments.zoo verify --cells 'regression_*' --num-test-tasks all
    python -m experiments.zoo table                                # README + zoo/README.md
    python -m experiments.zoo check                                # checksums, tables
    python -m experiments.zoo recalibrate --cells 'regression_*'   # issue 61: raw and recalibrated

Each cell is a folder `zoo/<cell>/` holding a run folder's own files, copied unchanged:
the checkpoint of the meta-parameters the run tested (`best/<step>/` or
`checkpoints/<step>/`, that one only), `run.json`, `results.json`, `metrics.jsonl` and
`test_per_task.npz` (the test's per-task scores, when the run left it; above 2 MB, the
per-task scores alone, as `test_scores.npz`). So
`vj.load_run("zoo/<cell>")` loads it as it loads any run folder. `zoo/manifest.json`
records each cell's command, commit, device, training time, test numbers, the sha256 of
every file and the verifications made; `zoo/README.md` and the README's results table
are generated from it.

`add` takes run folders, folders that hold run folders (a regression comparison), or
tar files of either (what comes back from a GPU). A cell is named after the experiment
preset that its config matches (`regression_cpu_vampire`,
`omniglot_original_5way1shot_vampire`; `_seed<n>` for another seed); a run whose
settings differ from every preset beyond speed and data-location knobs needs `--name`.
Each added cell is loaded and verified here (its first 20 test tasks; `--num-test-tasks
N` or `all` for more, `--no-verify` to skip it), and the tables are written again.

`verify` loads each cell, scores its test split again here with a progress bar
(`experiments.zoo_verify`), and prints one table. It exits 1 when a number falls
outside what it should be: equal, bit for bit, on a machine where the cell was verified
equal before (`--record` writes this machine's verification into the manifest); within
the cross-platform tolerance elsewhere. By default each cell's first 20 test tasks are
scored (a cell trained on a GPU tests 1000 tasks: over an hour on a laptop's CPU) and
compared with the first 20 rows of its per-task scores; `--num-test-tasks N` takes N,
`--num-test-tasks all` every task.
"""

import argparse
import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import re
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from experiments import cli, paper_table, presets, zoo_recalibrate, zoo_tables, zoo_verify
from vampire_jax import ConfigError, UserError
from vampire_jax.runs import run_folder

REPO_ROOT = Path(__file__).resolve().parents[1]
ZOO = REPO_ROOT / "zoo"
README = REPO_ROOT / "README.md"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# A run folder's files that a cell keeps, besides its tested checkpoint; the last is optional.
RUN_FILES = (run_folder.RUN_RECORD, run_folder.RESULTS_FILE, run_folder.METRICS_FILE)
PER_TASK_FILE = run_folder.PER_TASK_FILE
# A classifier's per-task file holds every query's probabilities: 20-way cells' come to
# about 20 MB. Above this size a cell keeps, instead, the per-task scores taken from it
# (SCORES_FILE: the same arrays, the probabilities and open-set arrays left out).
PER_TASK_LIMIT_BYTES = 2_000_000
SCORES_FILE = "test_scores.npz"
SCORE_FIELDS = ("accuracy", "mse", "predictive_mean_mse", "nll")
# Config fields that say where the data was read from: not part of a cell's command.
DATA_LOCATION = ("data_dir", "cache_dir", "data_source", "source")
TABLE_START, TABLE_END = zoo_tables.TABLE_START, zoo_tables.TABLE_END
readme_table, zoo_readme = zoo_tables.readme_table, zoo_tables.zoo_readme
_order, _paper = zoo_tables.order, zoo_tables.paper_text


# -- The manifest -------------------------------------------------------------------------


def read_manifest(zoo: Path) -> dict:
  """The zoo's manifest; an empty one where `zoo/manifest.json` is missing (a new zoo)."""
  path = zoo / MANIFEST
  if not path.is_file():
    return {"format": MANIFEST_FORMAT, "cells": {}}
  return json.loads(path.read_text())


def existing_manifest(zoo: Path, command: str) -> dict:
  """The manifest of a zoo that has one: a missing `manifest.json` is refused, not read as empty.

  `table` and `check` would otherwise write (or pass) tables of no cells beside cell folders.
  """
  if not (zoo / MANIFEST).is_file():
    raise ConfigError(
      f"zoo {command}: {zoo / MANIFEST} is missing, so the cells in {zoo} are unknown; "
      f"restore it (git checkout {zoo.name}/{MANIFEST}) or add the cells again with "
      "`python -m experiments.zoo add`"
    )
  return read_manifest(zoo)


def write_manifest(zoo: Path, manifest: dict) -> None:
  manifest = dict(manifest, cells=dict(sorted(manifest["cells"].items())))
  zoo.mkdir(parents=True, exist_ok=True)
  run_folder.write_atomic(
    zoo / MANIFEST, lambda f: f.write((json.dumps(manifest, indent=2) + "\n").encode())
  )


def checksums(cell: Path) -> dict:
  """`{relative path: {"sha256", "bytes"}}` of every file under `cell`, sorted."""
  files = {}
  for path in sorted(p for p in cell.rglob("*") if p.is_file()):
    data = path.read_bytes()
    files[path.relative_to(cell).as_posix()] = {
      "sha256": hashlib.sha256(data).hexdigest(),
      "bytes": len(data),
    }
  return files


def check_cells(zoo: Path, manifest: Optional[dict] = None) -> list[str]:
  """What in `zoo/` disagrees with its manifest: a file missing, extra or changed ([]: none)."""
  manifest = manifest or read_manifest(zoo)
  problems = []
  folders = {p.name for p in zoo.iterdir() if p.is_dir()} if zoo.is_dir() else set()
  for name in sorted(folders - set(manifest["cells"])):
    problems.append(f"zoo/{name} is not in the manifest")
  for name, entry in manifest["cells"].items():
    if name not in folders:
      problems.append(f"zoo/{name} is in the manifest but missing")
      continue
    found = checksums(zoo / name)
    for path in sorted(set(entry["files"]) | set(found)):
      if path not in found:
        problems.append(f"zoo/{name}/{path} is missing")
      elif path not in entry["files"]:
        problems.append(f"zoo/{name}/{path} is not in the manifest")
      elif found[path] != entry["files"][path]:
        problems.append(f"zoo/{name}/{path} has changed (its sha256 is not the manifest's)")
  return problems


# -- Which run folders a source holds, and what a cell keeps of one ----------------------


def run_folders(source: Path) -> list[Path]:
  """The run folders in `source`: itself, or those below it (up to 4 levels), sorted.

  A folder with `run.json`; those a run set aside (`damaged/`, `set_aside/`) are not runs.
  """
  if not source.is_dir():
    raise ConfigError(f"zoo add: {source} is not a folder or a tar file")
  set_aside = {run_folder.DAMAGED_FOLDER, run_folder.SET_ASIDE_FOLDER}
  found = sorted(
    record.parent
    for record in source.rglob(run_folder.RUN_RECORD)
    if len(record.relative_to(source).parts) <= 5
    and not set_aside & set(record.relative_to(source).parts)
  )
  if not found:
    raise ConfigError(f"zoo add: {source} holds no run folder (a folder with run.json)")
  return found


def tested_checkpoint(folder: Path, results: dict) -> str:
  """The folder of the checkpoint that `vj.load_run` reads for the tested meta-parameters.

  `best/<step>` when the run tested the best by validation and kept it; else
  `checkpoints/<step>`, the final state (`test_parameters` "final", or "best" with no
  validation kept), which `load_run` falls back to when there is no `best/`.
  """
  step = results["tested_step"]
  if results.get("test_parameters", "best") == "best" and (folder / "best" / str(step)).is_dir():
    return f"best/{step}"
  path = f"checkpoints/{step}"
  if not (folder / path).is_dir():
    raise ConfigError(
      f"zoo add: {folder} has no {path}, the checkpoint its test used; add the run "
      "folder as training left it"
    )
  return path


def _finished_results(folder: Path) -> dict:
  if not _is_finished(folder):
    diverged = _divergence(folder)
    if diverged:
      raise ConfigError(
        f"zoo add: {folder}'s training diverged ({diverged}), so it has no test to add; "
        "train it again with stable settings (see vj.check_inner_loop), then add that run"
      )
    raise ConfigError(
      f"zoo add: {folder} has no finished results.json (a run still training or stopped "
      "before its test, or not a run of vj.train_and_evaluate); finish it first"
    )
  return run_folder.read_json(folder / run_folder.RESULTS_FILE)


def _divergence(folder: Path) -> Optional[str]:
  """What a comparison recorded of the run's divergence (its folder's parent holds the
  comparison's results.json, `methods[<run folder>]["diverged"]`); None: nothing."""
  comparison = run_folder.read_json(folder.parent / run_folder.RESULTS_FILE)
  methods = comparison.get("methods") if isinstance(comparison, dict) else None
  method = methods.get(folder.name) if isinstance(methods, dict) else None
  diverged = method.get("diverged") if isinstance(method, dict) else None
  return str(diverged).split(": ")[0][:200] if diverged else None


# -- A cell's name and command, from its config --------------------------------------------


def _json(value):
  return json.loads(json.dumps(value))


def matching_preset(experiment: str, config: dict) -> tuple[str, dict]:
  """`(preset, {field: value})`: the preset of `experiment` for the run's algorithm that
  needs the fewest changed fields to give `config`, and those fields' recorded values."""
  best = None
  for preset in presets.PRESETS[experiment]:
    try:
      base = presets.get_config(experiment, preset, config["algorithm"])
    except ConfigError:
      continue  # a preset that is one algorithm's only (authors2019)
    base = _json(base.flat())
    changed = {
      name: value
      for name, value in config.items()
      if name not in DATA_LOCATION and name in base and value != base[name]
    }
    if best is None or len(changed) < len(best[1]):
      best = (preset, changed)
  if best is None:
    raise ConfigError(f"zoo add: no {experiment} preset has the algorithm {config['algorithm']}")
  return best


def _flag(name: str, value) -> str:
  flag = cli.flag(name)
  if isinstance(value, bool):
    return flag if value else "--no-" + flag[2:]
  if value is None and name == "meta_grad_clip_norm":
    return f"{flag} 0"
  if value is None:
    raise ConfigError(f"zoo add: the run's {name} is None, which no flag of its command sets")
  if isinstance(value, list):
    return f"{flag} {' '.join(map(str, value))}"
  return f"{flag} {value}"


def command_of(experiment: str, preset: str, algorithm: str, changed: dict) -> str:
  """The command that trains the run (its folder: the experiment's default workdir)."""
  module = {"features": "tiered_imagenet"}.get(experiment, experiment)
  which = "--algorithms" if experiment == "regression" else "--algorithm"
  flags = [_flag(name, value) for name, value in changed.items()]
  return " ".join([f"python -m experiments.{module} --preset {preset} {which} {algorithm}", *flags])


def cell_name(experiment: str, preset: str, config: dict) -> str:
  parts = [experiment]
  if experiment == "omniglot":
    parts.append(config["split"])
  elif experiment == "features":
    parts.append(config["dataset"])
  parts += [preset, config["algorithm"]]
  if config.get("seed", 0) != 0:
    parts.append(f"seed{config['seed']}")
  return "_".join(parts)


def describe_run(folder: Path, name: Optional[str] = None) -> tuple[str, dict]:
  """`(cell name, manifest entry without files)` of a finished run folder."""
  results = _finished_results(folder)
  (run,) = paper_table.runs_in(folder) or [None]
  if run is None or run.experiment == "unknown":
    raise ConfigError(f"zoo add: {folder}'s results.json is not one of the experiments' runs")
  config = run.config
  preset, changed = matching_preset(run.experiment, config)
  beyond = sorted(set(changed) - paper_table.NOT_PROTOCOL)
  if beyond and name is None:
    raise ConfigError(
      f"zoo add: {folder} differs from the {preset} preset in {', '.join(beyond)}; "
      "name its cell with --name"
    )
  entry = {
    "experiment": run.experiment,
    "algorithm": config["algorithm"],
    "preset": preset,
    "setting": paper_table.setting_of(run),
    "kind": results["kind"],
    "command": command_of(run.experiment, preset, config["algorithm"], changed),
    "paper": paper_table.paper_text(run),
    "paper_protocol": bool(paper_table.sort_runs([run]).cells),
    **from_results(results),
    "training": zoo_tables.training_rate(folder),
    "checkpoint": tested_checkpoint(folder, results),
  }
  return name or cell_name(run.experiment, preset, config), entry


def from_results(results: dict) -> dict:
  """The manifest entry's fields copied from the run's `results.json` (its numbers)."""
  score = "accuracy" if results["kind"] == "classification" else "mse"
  # A regressor's PIT ECE too: the calibration its recalibrated test is compared by.
  keep = (score, f"{score}_ci95", "nll", "nll_ci95", "ece", "mce", "pit_ece", "num_tasks")
  return {
    "commit": results.get("git_commit", "unknown"),
    "device": results.get("device", "unknown"),
    "jax_version": results.get("jax_version"),
    "jaxlib_version": results.get("jaxlib_version"),
    "meta_steps": results["meta_steps"],
    "test_parameters": results.get("test_parameters", "best"),
    "tested_step": results["tested_step"],
    "train_seconds": results["wall_time_s"]["train"],
    "test_seconds": results["wall_time_s"].get("test"),
    "test": {k: results["test"][k] for k in keep if k in results["test"]},
  }


def numbers_disagree(zoo: Path, manifest: dict) -> list[str]:
  """Where a manifest entry's numbers are not its cell's `results.json`'s, its training
  rate not its `metrics.jsonl`'s, or its recalibrated numbers not its `recalibration.json`'s
  (`zoo_recalibrate.numbers_disagree`) ([]: none).

  The tables are written from the manifest: an edited number there would reach the README.
  """
  problems = []
  for name, entry in manifest["cells"].items():
    results = run_folder.read_json(zoo / name / run_folder.RESULTS_FILE)
    if not isinstance(results, dict) or "test" not in results:
      problems.append(f"zoo/{name}/{run_folder.RESULTS_FILE} is missing or has no test")
      continue
    expected = from_results(results)
    flat = {**{k: v for k, v in expected.items() if k != "test"}, **expected["test"]}
    recorded = {**{k: entry.get(k) for k in expected if k != "test"}, **entry.get("test", {})}
    for field in sorted(set(flat) | set(recorded)):
      if recorded.get(field) != flat.get(field):
        problems.append(
          f"zoo/{name}: the manifest's {field} {recorded.get(field)!r} is not its "
          f"results.json's {flat.get(field)!r}"
        )
    rate = zoo_tables.training_rate(zoo / name)
    if entry.get("training") != rate:
      problems.append(
        f"zoo/{name}: the manifest's training {entry.get('training')!r} is not what its "
        f"metrics.jsonl and run.json give, {rate!r}"
      )
    problems += zoo_recalibrate.numbers_disagree(zoo / name, name, entry)
  return problems


# -- add ------------------------------------------------------------------------------------


# A cell's name: one plain path component, not a name of the zoo's own files.
CELL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ZOO_FILES = (MANIFEST, "README.md")


def check_cell_name(name: str) -> None:
  """Refuses a `--name` that is not one plain folder name inside the zoo.

  `.`, `..`, a path with separators or an absolute path would join to a folder outside the
  cell (the zoo itself, its parent), which `--replace` would delete.
  """
  if not CELL_NAME.fullmatch(name) or name in ZOO_FILES or name.endswith("."):
    raise ConfigError(
      f"zoo add: --name {name!r} is not a cell's name: give one plain folder name of letters, "
      "digits, '_', '-' and '.' (not starting or ending with '.', no '/'), e.g. "
      "--name regression_cpu_vampire_wide"
    )


def _replaceable(target: Path, name: str, manifest: dict, replace: bool) -> None:
  """Refuses to put a cell at `target` unless it is free, or a cell of the manifest to replace.

  `--replace` deletes only a folder that the manifest lists as a cell: nothing else in the
  zoo (a folder of the user's, a symbolic link, a file) is deleted.
  """
  listed = name in manifest["cells"]
  if not (listed or target.exists() or target.is_symlink()):
    return
  if not replace:
    raise ConfigError(f"zoo add: {target} exists; pass --replace to put this run in its place")
  if target.is_symlink() or (target.exists() and not target.is_dir()):
    raise ConfigError(
      f"zoo add: {target} is not a cell's folder (a file or a link); --replace replaces only "
      "a cell of the manifest: move it away first"
    )
  if target.exists() and not listed:
    raise ConfigError(
      f"zoo add: {target} exists but is not a cell of {target.parent / MANIFEST}; --replace "
      "replaces only a cell of the manifest: move that folder away, or choose another --name"
    )


def add_run(folder: Path, zoo: Path, name: Optional[str] = None, replace: bool = False) -> str:
  """Copies a finished run folder's files into `zoo/<cell>/` and records them; returns the name.

  Writes and deletes nothing outside `zoo/<cell>/` but the manifest (and a staging folder
  inside the zoo, removed at the end). `name` is checked by `add` (`check_cell_name`).
  """
  name, entry = describe_run(folder, name)
  manifest = read_manifest(zoo)
  target = zoo / name
  _replaceable(target, name, manifest, replace)
  staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=_made(zoo)))
  replaced = staging.with_name(staging.name + ".replaced")
  try:
    for file in RUN_FILES:
      if not (folder / file).is_file():
        raise ConfigError(f"zoo add: {folder} has no {file}")
      shutil.copy2(folder / file, staging / file)
    entry["per_task"] = _keep_per_task_scores(folder / PER_TASK_FILE, staging)
    shutil.copytree(folder / entry["checkpoint"], staging / entry["checkpoint"])
    if target.is_dir():  # a cell of the manifest (`_replaceable`)
      target.rename(replaced)
    staging.rename(target)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(replaced, ignore_errors=True)
  files = checksums(target)
  manifest["cells"][name] = dict(
    entry, files=files, bytes=sum(f["bytes"] for f in files.values()), verifications=[]
  )
  write_manifest(zoo, manifest)
  return name


def _keep_per_task_scores(per_task: Path, cell: Path) -> Optional[str]:
  """Copies the run's per-task file into `cell`, or its scores alone when it is too large.

  Returns what the cell keeps, in words (None: the run left no per-task file).
  """
  if not per_task.is_file():
    return None
  size = per_task.stat().st_size
  if size <= PER_TASK_LIMIT_BYTES:
    shutil.copy2(per_task, cell / PER_TASK_FILE)
    return PER_TASK_FILE
  with np.load(per_task) as saved:
    scores = {name: saved[name] for name in SCORE_FIELDS if name in saved.files}
  np.savez_compressed(cell / SCORES_FILE, **scores)
  return (
    f"{SCORES_FILE}: {', '.join(scores)} per task, from the run's {PER_TASK_FILE} "
    f"({size / 1e6:.1f} MB, over the {PER_TASK_LIMIT_BYTES / 1e6:.0f} MB a cell keeps whole)"
  )


def per_task_file(cell: Path) -> Optional[Path]:
  """The cell's per-task scores: the run's file, or the scores taken from it (None: neither)."""
  for name in (PER_TASK_FILE, SCORES_FILE):
    if (cell / name).is_file():
      return cell / name
  return None


def _made(folder: Path) -> Path:
  folder.mkdir(parents=True, exist_ok=True)
  return folder


def add(sources: list[Path], zoo: Path, *, name=None, replace=False) -> list[str]:
  """Adds every finished run folder of `sources` (folders or tar files); returns the names.

  In a source of several runs, one still training (no test in its results.json) is
  skipped with a line; a source of one run that has not finished is refused.
  """
  if name is not None:
    check_cell_name(name)  # before a tar is unpacked or anything read
  added = []
  for source in sources:
    with tempfile.TemporaryDirectory() as unpacked:
      if source.is_file() and tarfile.is_tarfile(source):
        with tarfile.open(source) as tar:
          tar.extractall(unpacked, filter="data")
        source = Path(unpacked)
      folders = run_folders(source)
      if len(folders) > 1:
        for folder in [f for f in folders if not _is_finished(f)]:
          print(f"skipped {folder}: it has not finished (no test in its results.json)")
        folders = [f for f in folders if _is_finished(f)] or folders
      if name is not None and len(folders) + len(added) > 1:
        raise ConfigError(f"zoo add: --name names one cell; {source} holds {len(folders)} runs")
      for folder in folders:
        added.append(add_run(folder, zoo, name, replace))
        print(f"added zoo/{added[-1]} from {folder}")
  return added


def _is_finished(folder: Path) -> bool:
  results = run_folder.read_json(folder / run_folder.RESULTS_FILE)
  return isinstance(results, dict) and "test" in results and "tested_step" in results


# -- verify ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Verified:
  """One cell scored again here."""

  name: str
  num_tasks: int
  expected_equal: bool
  outcome: str  # "equal", "within tolerance", "differs" or "error"
  detail: str
  trained: str  # the run's number for those tasks
  verified: str  # this machine's
  seconds: float

  @property
  def passed(self) -> bool:
    return self.outcome == "equal" or (
      self.outcome == "within tolerance" and not self.expected_equal
    )


def select(manifest: dict, pattern: Optional[str]) -> list[str]:
  names = sorted(manifest["cells"], key=lambda n: _order(n, manifest["cells"][n]))
  if pattern is None:
    return names
  chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pattern.split(","))]
  if not chosen:
    raise ConfigError(
      f"zoo verify: --cells {pattern!r} names no cell; the cells: {', '.join(names)}"
    )
  return chosen


def verify_cell(zoo: Path, name: str, entry: dict, num_tasks: Optional[int], machine: dict):
  """Scores the cell's first `num_tasks` test tasks (None: all) here; returns `Verified`."""
  import vampire_jax as vj

  start = time.perf_counter()
  count = int(entry["test"]["num_tasks"])
  num_tasks = count if num_tasks is None else min(num_tasks, count)
  expected = any(
    v["machine"] == machine and v["outcome"] == "equal" for v in entry.get("verifications", [])
  )
  results = json.loads((zoo / name / run_folder.RESULTS_FILE).read_text())
  run = vj.load_run(zoo / name)
  ref = zoo_verify.reference(
    results, per_task_file(zoo / name), num_tasks, getattr(run.config, "num_bins", 15)
  )
  if ref is None:
    return Verified(
      name, num_tasks, expected, "error",
      f"no per-task scores: verify it on all its {count} tasks", "–", "–", 0.0,
    )  # fmt: skip
  problem = zoo_verify.make_problem(run)
  recorded = _json((results.get("data") or {}).get("fingerprint"))
  here = _json((problem.data_info or {}).get("fingerprint"))
  if recorded and here and recorded != here:  # zips by name, size and sha256
    return Verified(
      name, num_tasks, expected, "error",
      f"the data here are not the run's (its files: {recorded}; here: {here})", "–", "–", 0.0,
    )  # fmt: skip
  with _progress_bar(name, num_tasks) as on_batch:
    per_task, numbers = zoo_verify.score_test_split(run, problem, num_tasks, on_batch)
  if num_tasks < count:
    numbers = zoo_verify.numbers_from_arrays(run.kind, per_task, run.config.evaluation.num_bins)
  arrays = {k: v for k, v in per_task.items() if k in ref.arrays}
  comparison = zoo_verify.compare(run.kind, ref, numbers, arrays)
  return Verified(
    name,
    num_tasks,
    expected,
    comparison.outcome,
    comparison.detail,
    zoo_verify.headline(run.kind, ref.numbers),
    zoo_verify.headline(run.kind, numbers),
    time.perf_counter() - start,
  )


class _progress_bar:
  """`on_batch(done, total)` drawing a tqdm bar on stderr (nothing if tqdm is missing)."""

  def __init__(self, name: str, total: int):
    try:
      from tqdm import tqdm
    except ImportError:
      self._bar = None
    else:
      self._bar = tqdm(total=total, desc=f"verifying {name}", unit="task", leave=False)

  def __enter__(self):
    def on_batch(done: int, total: int) -> None:
      if self._bar is not None:
        self._bar.update(done - self._bar.n)

    return on_batch

  def __exit__(self, *exc):
    if self._bar is not None:
      self._bar.close()


def verify(
  zoo: Path,
  pattern: Optional[str] = None,
  num_tasks: Optional[int] = None,
  record: bool = False,
  readme: Path = README,
) -> list[Verified]:
  """Verifies the selected cells; with `record`, writes this machine's verifications (and the
  tables that show them)."""
  manifest = read_manifest(zoo)
  problems = check_cells(zoo, manifest)
  if problems:
    raise ConfigError(f"zoo verify: the zoo does not match its manifest: {'; '.join(problems)}")
  machine = zoo_verify.this_machine()
  rows = []
  for name in select(manifest, pattern):
    try:
      # What loading a cell prints (the data's "building" and "cached arrays" lines) is
      # progress, on stderr with the bars: stdout holds the table alone.
      with contextlib.redirect_stdout(sys.stderr):
        row = verify_cell(zoo, name, manifest["cells"][name], num_tasks, machine)
    except UserError as error:  # missing data, say: the cell is not verified
      row = Verified(name, 0, False, "error", f"{type(error).__name__}: {error}", "–", "–", 0.0)
    rows.append(row)
    if record and row.outcome != "error":
      _record(manifest["cells"][name], row, machine)
  if record:
    write_manifest(zoo, manifest)
    write_tables(zoo, readme, "verify")
  return rows


def _record(entry: dict, row: Verified, machine: dict) -> None:
  verification = {
    "machine": machine,
    "num_tasks": row.num_tasks,
    "outcome": row.outcome,
    "detail": row.detail,
    "verified": row.verified,
    "seconds": round(row.seconds, 1),
    "commit": run_folder.git_commit(),
    "date": time.strftime("%Y-%m-%d"),
  }
  kept = [
    v
    for v in entry.get("verifications", [])
    if (v["machine"], v["num_tasks"]) != (machine, row.num_tasks)
  ]
  entry["verifications"] = kept + [verification]


# What a failure where equality was expected knows, and no more: not which of the code, the
# cell, the data or this machine's software changed since.
EQUAL_BEFORE = "verified equal on a machine of this identity before"


def verify_table(rows: list[Verified], manifest: dict, machine: dict) -> str:
  """cell | paper | trained (device, commit) | verified here (this machine) | seconds."""
  here = zoo_verify.describe_machine(machine)
  lines = [
    f"| cell | paper | trained (device, commit) | verified here ({here}) | seconds |",
    "|---|---|---|---|---|",
  ]
  for row in rows:
    entry = manifest["cells"][row.name]
    tasks = f"{row.num_tasks} tasks" if row.num_tasks else ""
    shown = row.outcome + (f": {row.detail}" if row.detail else "")
    if not row.passed:
      if row.expected_equal:
        shown += f" ({EQUAL_BEFORE})"
      shown = f"**FAILED** {shown}"
    lines.append(
      "| "
      + " | ".join(
        [
          row.name,
          _paper(entry),
          f"{row.trained} ({entry['device']}, {entry['commit'][:7]})",
          f"{row.verified}, {tasks}: {shown}",
          f"{row.seconds:.1f}",
        ]
      )
      + " |"
    )
  passed = sum(row.passed for row in rows)
  lines.append("")
  lines.append(
    f"{passed} of {len(rows)} cells verified in {sum(r.seconds for r in rows):.0f} s; "
    f"tolerance across machines: mean and NLL within {zoo_verify.CI_FRACTION} of their "
    f"95 % half-width, ECE within {zoo_verify.ECE_TOLERANCE}"
  )
  return "\n".join(lines)


# -- recalibrate (issue 61) ------------------------------------------------------------------


def recalibrate(
  zoo: Path,
  pattern: Optional[str] = None,
  num_val_tasks: Optional[int] = None,
  num_test_tasks: Optional[int] = None,
  readme: Path = README,
) -> list[str]:
  """Each selected cell's map fitted on its validation tasks (`zoo_recalibrate`), no retraining.

  Writes `recalibration.json` into the cell (`vj.load_run(cell, recalibrated=True)` reads
  it), and into its manifest entry the map (`recalibration`) and its test scored both ways
  (`test_recalibrated`, and the raw 90 % interval as `test_raw_interval`), then the
  tables. `num_val_tasks` None: the run's own `num_val_tasks`; `num_test_tasks` None:
  every test task the cell scored. Returns one line per cell.

  The README's table block and each cell's data are checked before any fit; a cell that
  cannot be recalibrated keeps what it had (its line says why), and a run that recalibrated
  no cell raises `ConfigError` with the reasons, having written nothing.
  """
  import vampire_jax as vj
  from vampire_jax.runs import recalibration as run_recalibration

  manifest = existing_manifest(zoo, "recalibrate")
  problems = check_cells(zoo, manifest)
  if problems:
    raise ConfigError(
      f"zoo recalibrate: the zoo does not match its manifest: {'; '.join(problems)}"
    )
  _refuse_table_problems(zoo, manifest, "recalibrate")
  block = (
    table_block_problem(readme.read_text(), readme)
    if readme.is_file()
    else (f"{readme} does not exist; give the README holding the table (--readme)")
  )
  if block:  # before any fit: the tables are written at the end
    raise ConfigError(f"zoo recalibrate: {block}")
  lines, ready = [], []
  for name in select(manifest, pattern):  # each cell's run and data, before any fit
    try:
      run = vj.load_run(zoo / name)
      ready.append((name, run, zoo_verify.make_problem(run)))
    except UserError as error:  # missing data, say: the cell keeps what it had
      lines.append(f"{name}: not recalibrated: {type(error).__name__}: {error}")
  done = 0
  for name, run, problem in ready:
    entry = manifest["cells"][name]
    try:
      num_val = num_val_tasks or run.config.evaluation.num_val_tasks
      count = int(entry["test"]["num_tasks"])
      num_test = count if num_test_tasks is None else min(num_test_tasks, count)
      with _progress_bar(name, num_test) as on_batch:
        result = zoo_recalibrate.recalibrate_cell(run, problem, num_val, num_test, on_batch)
    except UserError as error:  # the cell keeps what it had
      lines.append(f"{name}: not recalibrated: {type(error).__name__}: {error}")
      continue
    run_recalibration.write_calibration(  # its files recorded again below
      zoo / name, result.calibration, run.record, run.step, recorded_again=True
    )
    fields = zoo_recalibrate.manifest_fields(result, num_val)
    zoo_recalibrate.record_test(zoo / name, fields)  # what `zoo check` compares
    entry.update(fields)
    entry["files"] = checksums(zoo / name)
    lines.append(zoo_recalibrate.line(name, run.kind, result))
    done += 1
  if not done:
    raise ConfigError(f"zoo recalibrate: no cell recalibrated, nothing written: {'; '.join(lines)}")
  write_manifest(zoo, manifest)
  write_tables(zoo, readme, "recalibrate")
  return lines


# -- The tables (experiments.zoo_tables renders them) -----------------------------------


def table_block_problem(text: str, readme: Path) -> Optional[str]:
  """What is wrong with the README's generated block: none, or more than one (None: fine)."""
  starts, ends = text.count(TABLE_START), text.count(TABLE_END)
  start, end = text.find(TABLE_START), text.find(TABLE_END)
  if starts == ends == 1 and start < end:
    return None
  if starts > 1 or ends > 1:
    return (
      f"{readme} holds {max(starts, ends)} zoo-table blocks ({TABLE_START} ... {TABLE_END}); "
      "delete all but one, then run `python -m experiments.zoo table`"
    )
  return f"{readme} has no {TABLE_START} ... {TABLE_END} block; put one where the table goes"


def readme_with_table(text: str, table: str, readme: Path = Path("README.md")) -> str:
  """`text` (the README) with the one block between the markers replaced by `table`."""
  problem = table_block_problem(text, readme)
  if problem:
    raise ConfigError(f"zoo table: {problem}")
  start, end = text.find(TABLE_START), text.find(TABLE_END)
  return text[:start] + table + text[end + len(TABLE_END) :]


def table_problems(zoo: Path, manifest: dict) -> list[str]:
  """Why the tables cannot be written from `manifest`: a cell without its folder, or numbers
  that are not the cell's results.json's ([]: none)."""
  missing = [
    f"zoo/{name} is in the manifest but missing" for name in manifest["cells"]
    if not (zoo / name).is_dir()
  ]  # fmt: skip
  return missing + numbers_disagree(zoo, _with_folders(zoo, manifest))


def _refuse_table_problems(zoo: Path, manifest: dict, command: str) -> None:
  problems = table_problems(zoo, manifest)
  if problems:
    more = f" (and {len(problems) - 1} more: `python -m experiments.zoo check` lists them)"
    raise ConfigError(
      f"zoo {command}: {problems[0]}{more if len(problems) > 1 else ''}; the tables are "
      "written from the manifest, so mend it (git checkout zoo/) or add the cell again"
    )


def write_tables(zoo: Path, readme: Path, command: str = "table") -> None:
  """Writes zoo/README.md and the README's block from the manifest, which must agree with
  the cells (a folder each, their results.json's numbers), else `ConfigError` and no write."""
  manifest = existing_manifest(zoo, command)
  _refuse_table_problems(zoo, manifest, command)
  text = readme.read_text() if readme.is_file() else None
  new_readme = None if text is None else readme_with_table(text, readme_table(manifest), readme)
  (zoo / "README.md").write_text(zoo_readme(manifest))
  if new_readme is not None:
    readme.write_text(new_readme)


def stale_tables(zoo: Path, readme: Path) -> list[str]:
  """The generated files that differ from what the manifest gives ([]: none)."""
  manifest = read_manifest(zoo)
  stale = []
  if not (zoo / "README.md").is_file() or (zoo / "README.md").read_text() != zoo_readme(manifest):
    stale.append(str(zoo / "README.md"))
  text = readme.read_text()
  if table_block_problem(text, readme):  # `check` says what is wrong with the block
    return stale
  if readme_with_table(text, readme_table(manifest), readme) != text:
    stale.append(f"{readme}'s results table")
  return stale


def _with_folders(zoo: Path, manifest: dict) -> dict:
  """`manifest` less its cells without a folder (`check_cells` names those)."""
  return dict(manifest, cells={n: e for n, e in manifest["cells"].items() if (zoo / n).is_dir()})


# -- Command line -----------------------------------------------------------------------------


DEFAULT_VERIFY_TASKS = 20  # every cell in a few minutes on a laptop's CPU


def _task_count(text: str) -> Optional[int]:
  """`--num-test-tasks`: a count of at least 2, or 'all' (None: every test task).

  One task has no 95 % half-width, and the tolerance across machines is a fraction of it.
  """
  if text == "all":
    return None
  try:
    count = int(text)
  except ValueError:
    count = 0
  if count == 1:
    raise argparse.ArgumentTypeError(
      "1 task has no 95 % half-width, which the tolerance across machines is a fraction of: "
      "give at least 2, or 'all'"
    )
  if count < 1:
    raise argparse.ArgumentTypeError(f"a count of at least 2 or 'all', not {text!r}")
  return count


def _val_task_count(text: str) -> Optional[int]:
  """`recalibrate --num-val-tasks`: a count a map can be fitted on, or 'all' (None: the run's
  own `num_val_tasks`)."""
  from vampire_jax.metrics import RECALIBRATION_MIN_TASKS as MIN_TASKS

  if text != "all" and text.isdigit() and 0 < int(text) < MIN_TASKS:
    raise argparse.ArgumentTypeError(
      f"{text} validation task is too few to fit a map: a fit needs at least {MIN_TASKS} "
      "(one task's queries share one adaptation, so a map fitted on them fits that task)"
    )
  return _task_count(text)


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    prog="python -m experiments.zoo",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--zoo", type=Path, default=ZOO, help=argparse.SUPPRESS)
  parser.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
  commands = parser.add_subparsers(dest="command", required=True)
  adding = commands.add_parser("add", help="add run folders (or tars of them) as cells")
  adding.add_argument("sources", nargs="+", type=Path, metavar="RUN_DIR_OR_TAR")
  adding.add_argument("--name", help="the cell's name (one run; default: from its preset)")
  adding.add_argument("--replace", action="store_true", help="replace a cell of that name")
  adding.add_argument("--no-verify", action="store_true", help="do not verify it here")
  checking = commands.add_parser("verify", help="score the cells again here")
  checking.add_argument("--cells", help="cell-name patterns, comma-separated (default: all)")
  checking.add_argument("--record", action="store_true", help="write this machine's results")
  for sub in (adding, checking):
    sub.add_argument(
      "--num-test-tasks",
      type=_task_count,
      default=DEFAULT_VERIFY_TASKS,
      metavar="N",
      help=f"score each cell's first N test tasks, or 'all' (default: {DEFAULT_VERIFY_TASKS})",
    )
  recalibrating = commands.add_parser(
    "recalibrate", help="fit each cell's recalibration on its validation tasks (issue 61)"
  )
  recalibrating.add_argument("--cells", help="cell-name patterns, comma-separated (default: all)")
  recalibrating.add_argument(
    "--num-val-tasks", type=_val_task_count, default=None, metavar="N",
    help="validation tasks to fit on (default: the run's num_val_tasks)",
  )  # fmt: skip
  recalibrating.add_argument(
    "--num-test-tasks", type=_task_count, default=None, metavar="N",
    help="test tasks to score both ways, or 'all' (default: all the cell scored)",
  )  # fmt: skip
  commands.add_parser("table", help="write zoo/README.md and the README's table")
  commands.add_parser("check", help="checksums and generated tables; exit 1 if stale")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.command == "add":
    if args.name is not None:
      check_cell_name(args.name)
    if (args.zoo / MANIFEST).is_file():  # the tables written at the end must be writable
      _refuse_table_problems(args.zoo, read_manifest(args.zoo), "add")
    added = add(args.sources, args.zoo, name=args.name, replace=args.replace)
    code = 0
    if not args.no_verify:
      code = _print_verification(
        args.zoo, ",".join(added), args.num_test_tasks, record=True, readme=args.readme
      )
    write_tables(args.zoo, args.readme, "add")
    print(f"wrote {args.zoo / 'README.md'}, {args.zoo / MANIFEST} and {args.readme}'s table")
    return code
  if args.command == "verify":
    return _print_verification(
      args.zoo, args.cells, args.num_test_tasks, record=args.record, readme=args.readme
    )
  if args.command == "recalibrate":
    for line in recalibrate(
      args.zoo, args.cells, args.num_val_tasks, args.num_test_tasks, readme=args.readme
    ):
      print(line)
    return 0
  if args.command == "table":
    write_tables(args.zoo, args.readme)
    print(f"wrote {args.zoo / 'README.md'} and {args.readme}'s table")
    return 0
  manifest = existing_manifest(args.zoo, "check")
  problems = check_cells(args.zoo, manifest)
  problems += numbers_disagree(args.zoo, _with_folders(args.zoo, manifest))
  problems += [f"{p} is stale" for p in stale_tables(args.zoo, args.readme)]
  block = table_block_problem(args.readme.read_text(), args.readme)
  problems += [block] if block else []
  for problem in problems:
    print(problem)
  for name, cell in _with_folders(args.zoo, manifest)["cells"].items():
    note = zoo_recalibrate.unchecked(args.zoo / name, name, cell)
    if note:
      print(note)
  print("zoo: " + ("problems above" if problems else "checksums and tables agree"))
  return 1 if problems else 0


def _print_verification(zoo: Path, pattern, num_tasks, record: bool, readme: Path) -> int:
  rows = verify(zoo, pattern, num_tasks, record, readme)
  print(verify_table(rows, read_manifest(zoo), zoo_verify.this_machine()))
  return 0 if all(row.passed for row in rows) else 1


def entry(argv=None) -> int:
  """`main` as a command (`cli.main_entry`: one device per core, a user error in one line)."""
  codes = []
  stopped = cli.main_entry(lambda args: codes.append(main(args)), argv)
  return codes[0] if codes else stopped


if __name__ == "__main__":
  sys.exit(entry())
