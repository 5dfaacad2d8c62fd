"""A paper cell in training survives its machine (issue 59, item 5): `training/<cell>/`, kept
in git, holds its newest checkpoint, best/, run.json and metrics.jsonl; a fresh clone's
`python -m experiments.paper_runs` resumes the cell from there and gives what an
uninterrupted run gives, row for row and bit for bit."""

import importlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import compare, paper_runs, regression, training_cells
from tests.conftest import tiny_regression_config
from vampire_jax.runs import reporting, run_folder

REPO = Path(__file__).resolve().parents[2]


CELL = "regression_paper"


# The tiny regression cell, one method, six steps: a checkpoint every 2, SIGTERM after 3.
RUNNER = ["--cells", CELL, "--regression-methods", "vampire", "--tiny"]


EXTRA = ["--num-meta-steps", "6"]


def _cell_flags(workdir: Path) -> list[str]:
  """The flags `paper_runs` gives the cell's child process, with `workdir`."""
  (cell,) = paper_runs.select_cells(paper_runs.all_cells("vampire"), CELL)
  command = paper_runs.child_command(cell, workdir, True, EXTRA)
  assert command[1:3] == ["-m", "experiments.regression"]
  return command[3:]


def _train_the_method(flags: list[str]) -> None:
  """What the cell's child trains (`regression.main`), less the comparison's joint figures."""
  _, args = regression.parse_args(flags)
  compare.run_methods(regression, ["vampire"], args.preset, args.workdir, args, progress=False)


def _stop_after(step: int, monkeypatch) -> None:
  """SIGTERM to this process right after meta-step `step` (tests/sigterm_at_step.py's way)."""
  advance = reporting.Progress.advance

  def advance_then_stop(progress, at: int) -> None:
    advance(progress, at)
    if at == step:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(reporting.Progress, "advance", advance_then_stop)


def rows_and_test(comparison: Path):
  """The method's metrics.jsonl rows without the wall-clock rates, its test metrics, the
  best validation and the step tested."""
  rows = [
    {k: v for k, v in row.items() if not k.endswith("_per_s")}
    for row in run_folder.read_metrics(comparison / "vampire")
  ]
  results = run_folder.read_json(comparison / "vampire" / "results.json")
  return rows, results["test"], results["best_validation"], results["tested_step"]


def _git(*args, cwd: Path) -> None:
  identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
  subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)


def _committed_and_cloned(tmp_path: Path, kept_from: Path) -> Path:
  """A repository of this one's .gitignore and the kept cell, committed, then cloned: the
  files a fresh clone has (an empty folder, or an ignored file, does not survive)."""
  origin = tmp_path / "origin"
  origin.mkdir()
  shutil.copy2(REPO / ".gitignore", origin / ".gitignore")
  _git("init", "-q", cwd=origin)
  assert paper_runs.main(["keep", str(kept_from), "--training", str(origin / "training")]) == 0
  _git("add", "-A", cwd=origin)
  _git("commit", "-q", "-m", "a cell in training", cwd=origin)
  _git("clone", "-q", str(origin), str(tmp_path / "clone"), cwd=tmp_path)
  return tmp_path / "clone"


def _cell_configs(cell: paper_runs.Cell, folder: Path) -> dict[Path, object]:
  """`{run folder: config}` that the cell's child process would train in `folder`."""
  flags = paper_runs.child_command(cell, folder, False, [])[3:]
  if cell.group == "regression":  # a comparison: one run folder per method
    _, args = regression.parse_args(flags)
    return {
      folder / name: compare.method_config(regression, args.preset, name, args)
      for name in args.algorithms.split(",")
    }
  experiment = importlib.import_module(cell.module)
  config, workdir, _ = experiment.parse_args(flags)
  return {Path(workdir): config}


TRACKED_CELLS = sorted(p for p in training_cells.TRAINING.iterdir() if p.is_dir())


@pytest.mark.slow  # two tiny regression runs in this process and one resumed fresh: ~1 min
def test_a_cell_resumes_from_a_fresh_clone_bit_for_bit(tmp_path, monkeypatch, capsys):
  full = tmp_path / "full" / CELL  # the uninterrupted run
  _train_the_method(_cell_flags(full))
  part = tmp_path / "part" / CELL  # stopped after step 3, between logged rows
  _stop_after(3, monkeypatch)
  with pytest.raises(vj.TrainingInterrupted):
    _train_the_method(_cell_flags(part))
  monkeypatch.undo()

  clone = _committed_and_cloned(tmp_path, part)
  kept = clone / "training" / CELL / "vampire"
  assert sorted(p.name for p in kept.iterdir()) == [
    "best",
    "checkpoints",
    "metrics.jsonl",
    "run.json",
  ]
  assert [p.name for p in (kept / "checkpoints").iterdir()] == ["3"]  # the newest only
  assert [p.name for p in (kept / "best").iterdir()] == ["2"]
  size = sum(p.stat().st_size for p in kept.rglob("*") if p.is_file())
  assert size < 2**20  # the tiny cell's; the paper's are a few MB
  capsys.readouterr()

  # On the "GPU machine": the clone, no runs/ folder. The runner resumes the cell from the
  # tracked folder in a fresh process, and writes it back there for the next commit.
  root = clone / "runs" / "paper"
  argv = RUNNER + ["--root", str(root), "--training", str(clone / "training")]
  assert paper_runs.main(argv + [f"--extra-flags={' '.join(EXTRA)}"]) == 0
  out = capsys.readouterr().out
  assert f"resuming from {clone / 'training' / CELL} (checkpoint step 3)" in out
  assert f"kept step 6 of {root / CELL} in {clone / 'training' / CELL}" in out
  assert "resuming from step 3" in (root / f"{CELL}.log").read_text()
  assert rows_and_test(root / CELL) == rows_and_test(full)  # every row, each once; the test
  with np.load(root / CELL / "vampire" / "test_per_task.npz") as resumed:
    with np.load(full / "vampire" / "test_per_task.npz") as uninterrupted:
      assert sorted(resumed.files) == sorted(uninterrupted.files)
      for name in resumed.files:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)
  assert [p.name for p in (kept / "checkpoints").iterdir()] == ["6"]
  assert not (kept / "results.json").exists()


def test_the_tracked_folder_is_not_ignored_by_git():
  for path in ("training/x/checkpoints/3/default/d/0a1b", "training/x/vampire/run.json"):
    done = subprocess.run(
      ["git", "check-ignore", "--no-index", "-q", path], cwd=REPO, capture_output=True
    )
    assert done.returncode == 1, path  # 1: not ignored


def test_keep_refuses_a_folder_without_a_run_or_a_checkpoint(tmp_path, capsys):
  assert paper_runs.main(["keep", str(tmp_path), "--name", CELL]) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith(f"error: keep: {tmp_path} "), err
  assert "holds no run folder (a folder with run.json)" in err
  cell = REPO / "zoo" / "omniglot_original_quick_vampire"  # best/ only, no training state
  assert paper_runs.main(["keep", str(cell), "--name", CELL]) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith(f"error: keep: {cell} "), err
  assert "has no checkpoint to resume from (checkpoints/<step>/)" in err
  assert "nothing to keep" in err
  assert not (REPO / "training" / CELL).exists()


def test_keep_takes_a_paper_cells_name(tmp_path, capsys):
  assert paper_runs.main(["keep", str(tmp_path / "my_run"), "--training", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith("error: keep: 'my_run' "), err
  assert "is not a paper cell's name (e.g. omniglot_original_5way1shot_vampire)" in err
  assert "pass --name" in err  # the fix, or the way out:
  assert "or keep the folder `python -m experiments.paper_runs` trained under --root" in err


def test_tiny_cells_are_never_kept_in_the_clones_tracked_folder():
  assert paper_runs.parse_args(["--tiny"]).training is None
  assert paper_runs.parse_args([]).training == training_cells.TRAINING == REPO / "training"


@pytest.mark.parametrize("kept", TRACKED_CELLS, ids=lambda p: p.name)
def test_every_tracked_cell_is_one_the_next_gpu_run_resumes(kept):
  """What a GPU session committed in training/ is what `paper_runs` resumes: a paper cell's
  name, its record the settings of that cell's command (else the child would refuse it), a
  whole newest checkpoint, and meta-parameters that load."""
  cells = {cell.name: cell for cell in paper_runs.all_cells()}
  assert kept.name in cells, f"{kept.name} is no cell of experiments.paper_runs"
  assert sum(f.stat().st_size for f in kept.rglob("*") if f.is_file()) <= (
    training_cells.SIZE_LIMIT_BYTES
  )
  configs = _cell_configs(cells[kept.name], kept)
  assert set(configs) == set(training_cells.run_folders(kept))
  for run, config in configs.items():
    run_folder.check_resumable(run, config)  # raises, naming the difference
    step = run_folder.latest_checkpoint_step(run)
    assert step is not None and 0 < step < config.schedule.num_meta_steps
    logged = [row["step"] for row in run_folder.read_metrics(run)]
    assert logged and max(logged) <= step
    loaded = vj.load_run(run)  # the best meta-parameters, as the zoo will take them
    assert loaded.step <= step
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(loaded.meta_params))


def test_a_kept_log_ends_at_its_checkpoint(tmp_path):
  """A cell's child killed past its checkpoint (out of memory, killed after the grace) logged
  steps its resumed run logs again: the kept metrics.jsonl ends at the checkpoint's step (a
  GPU campaign's 20-way cell: checkpoint 635, rows to 1000)."""
  run = tmp_path / "run"
  config = tiny_regression_config(num_meta_steps=4, log_every=1)
  vj.train_and_evaluate(
    regression.make_problem(config), config, run, progress=False, print_fn=lambda line: None
  )
  shutil.rmtree(run / "checkpoints" / "4")  # as if killed after logging steps 3 and 4
  assert run_folder.latest_checkpoint_step(run) == 2
  steps = [row["step"] for row in run_folder.read_metrics(run)]  # training and validation rows
  assert sorted(set(steps)) == [1, 2, 3, 4]
  training_cells.keep(run, tmp_path / "kept")
  assert [row["step"] for row in run_folder.read_metrics(tmp_path / "kept")] == [
    step for step in steps if step <= 2
  ]
  assert [row["step"] for row in run_folder.read_metrics(run)] == steps  # its own log, whole
