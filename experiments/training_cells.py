"""Paper cells in training, kept in git: `training/<cell>/`, so that a GPU's minutes survive it.

    python -m experiments.paper_runs --cells omniglot_original_5way5shot_vampire --time-budget 480
    git add training/ && git commit -m "training: 5-way 5-shot at step N"   # after each call
    python -m experiments.paper_runs keep runs/paper/<cell>       # a run folder, by hand

A cell's run folder under `runs/` is git-ignored, and a GPU machine is lent for minutes: a
cell trained part of the way there is lost with the machine unless it is committed.
`training/<cell>/` (tracked, at the repository's root; not in `zoo/`, whose checks refuse
folders its manifest does not list) holds what resuming needs and nothing more:

  run.json, metrics.jsonl      the run's record and its log to the checkpoint's step
  checkpoints/<n>/             the newest complete checkpoint only (the full training state:
                               the meta-parameters, the optimiser state, the steps'
                               log window)
  best/<m>/                    the best meta-parameters by validation, with their score

(for a comparison, such as the regression cell, one such folder per method). A few MB for
the paper's networks. `experiments.paper_runs` writes it back after every call of a cell
(stopped by its time budget, failed or done), and, where the cell's run folder is absent
(a fresh clone), starts from it: the run then resumes from that checkpoint as it would in
its own folder, and gives what an uninterrupted run gives, row for row and bit for bit
(tests/experiment_scripts/test_training_cells.py). Once a cell is done and in `zoo/`, `git rm -r
training/<cell>`.
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from vampire_jax import ConfigError
from vampire_jax.runs import run_folder

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAINING = REPO_ROOT / "training"
# What a kept cell should stay under: the paper's networks come to a few MB.
SIZE_LIMIT_BYTES = 16 * 2**20


def run_folders(folder: Path) -> list[Path]:
  """`folder` itself if it is a run folder, else the run folders one level below it (a
  comparison), sorted; [] if none."""
  if (folder / run_folder.RUN_RECORD).is_file():
    return [folder]
  if not folder.is_dir():
    return []
  return sorted(p for p in folder.iterdir() if (p / run_folder.RUN_RECORD).is_file())


def newest_step(folder: Path) -> Optional[int]:
  """The newest complete checkpoint of `folder`'s run(s) (the oldest of a comparison's
  newest), or None where one has none."""
  steps = [run_folder.latest_checkpoint_step(run) for run in run_folders(folder)]
  return None if not steps or None in steps else min(steps)


def newer_kept(folder: Path, kept: Path) -> str:
  """Where `kept` holds a run at a newer checkpoint than `folder`'s same run (or one `folder`
  lacks), which is newer, in words ('' where none is): an older run is never put over it."""
  newer = []
  for run in run_folders(kept):
    step, here = (run_folder.latest_checkpoint_step(run), folder / run.relative_to(kept))
    here_step = run_folder.latest_checkpoint_step(here) if here.is_dir() else None
    if step is not None and (here_step is None or here_step < step):
      at = "none" if here_step is None else f"step {here_step}"
      newer.append(f"{run} holds step {step}, newer than {here}'s {at}")
  return "; ".join(newer)


def _keep_run(run: Path, target: Path) -> None:
  """Copies what resuming `run` needs into the empty folder `target`."""
  target.mkdir(parents=True)
  for name in (run_folder.RUN_RECORD, run_folder.METRICS_FILE):
    if (run / name).is_file():
      shutil.copy2(run / name, target / name)
  step = run_folder.latest_checkpoint_step(run)
  # A run killed past its checkpoint (a crash, a kill after the grace) logged steps that
  # the resumed run logs again: the kept log ends where its checkpoint is.
  run_folder.drop_rows_after(target / run_folder.METRICS_FILE, step)
  shutil.copytree(run / "checkpoints" / str(step), target / "checkpoints" / str(step))
  best = _best_step(run)
  if best is not None and best <= step:  # a best ahead of the state would be set aside
    shutil.copytree(run / "best" / str(best), target / "best" / str(best))


def _best_step(run: Path) -> Optional[int]:
  steps = [
    int(p.name) for p in (run / "best").glob("*") if p.name.isdigit() and (p / "default").is_dir()
  ]
  return max(steps) if steps else None


def keep(folder: Path, target: Path) -> int:
  """Writes `folder`'s run(s) into `target` (replacing what it held); returns its bytes.

  Raises:
    ConfigError: `folder` holds no run, or a run without a checkpoint, or `target` holds a
      newer one (`newer_kept`): a kept cell is never replaced by an older run.
  """
  runs = run_folders(folder)
  if not runs:
    raise ConfigError(f"keep: {folder} holds no run folder (a folder with run.json)")
  for run in runs:
    if run_folder.latest_checkpoint_step(run) is None:
      raise ConfigError(
        f"keep: {run} has no checkpoint to resume from (checkpoints/<step>/): nothing to keep"
      )
  newer = newer_kept(folder, target)
  if newer:
    raise ConfigError(
      f"keep: {newer}: not put over it; resume from {target} (remove {folder}), or "
      f"git rm -r {target} to keep {folder} instead"
    )
  target.parent.mkdir(parents=True, exist_ok=True)
  staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
  replaced = staging.with_name(staging.name + ".replaced")
  try:
    for run in runs:
      _keep_run(run, staging / "kept" / run.relative_to(folder))
    if target.exists():
      target.rename(replaced)
    (staging / "kept").rename(target)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(replaced, ignore_errors=True)
  return sum(p.stat().st_size for p in target.rglob("*") if p.is_file())


def keep_and_say(folder: Path, target: Path) -> None:
  """`keep`, and one line saying what was kept and that it is to be committed."""
  size = keep(folder, target)
  line = (
    f"   kept step {newest_step(target)} of {folder} in {target} ({size / 2**20:.1f} MiB): "
    f"commit it (git add {target} && git commit)"
  )
  if size > SIZE_LIMIT_BYTES:
    line += f"; warning: over {SIZE_LIMIT_BYTES / 2**20:.0f} MiB"
  print(line, flush=True)


def restore(folder: Path, kept: Path) -> bool:
  """Copies a kept cell `kept` to its run folder `folder` where that is absent; says so.

  Returns whether it did. Where both exist, the run folder is used, unless the kept one is
  newer (`newer_kept`).

  Raises:
    ConfigError: both exist and `kept` is newer: training the older folder would lose the
      kept steps (it is kept after its call), naming both steps.
  """
  step = newest_step(kept)
  if step is None:
    return False
  if folder.exists():
    newer = newer_kept(folder, kept)
    if newer:
      raise ConfigError(
        f"{newer}: the older run folder is not trained over it; remove {folder} to resume "
        f"from {kept}, or git rm -r {kept} to train {folder} on"
      )
    return False
  folder.parent.mkdir(parents=True, exist_ok=True)
  shutil.copytree(kept, folder)
  print(f"   resuming from {kept} (checkpoint step {step}), copied to {folder}", flush=True)
  return True


def main(argv, cells: list[str]) -> int:
  """`python -m experiments.paper_runs keep RUN_DIR [--name CELL] [--training DIR]`; `cells`:
  the paper cells' names (`paper_runs.all_cells`)."""
  parser = argparse.ArgumentParser(
    prog="python -m experiments.paper_runs keep",
    description="put a paper cell's run folder in training/<cell>/ (tracked): its newest "
    "checkpoint, best/, run.json and metrics.jsonl, for the next GPU session to resume",
  )
  parser.add_argument("folder", type=Path, metavar="RUN_DIR", help="the cell's run folder")
  parser.add_argument("--name", help="the cell's name (default: the folder's)")
  parser.add_argument(
    "--training", type=Path, default=TRAINING, help=f"the tracked folder (default: {TRAINING})"
  )
  args = parser.parse_args(argv)
  name = args.name or args.folder.resolve().name
  try:
    if name not in cells:
      raise ConfigError(
        f"keep: {name!r} is not a paper cell's name (e.g. {cells[0]}); pass --name, or keep "
        "the folder `python -m experiments.paper_runs` trained under --root"
      )
    keep_and_say(args.folder, args.training / name)
  except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  return 0
