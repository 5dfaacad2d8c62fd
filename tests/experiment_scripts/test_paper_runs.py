"""experiments.paper_runs: the cells are the paper's presets; finished cells are skipped; a
time budget stops a child cleanly and the next call finishes it (tiny cells on the CPU)."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from experiments import cli, omniglot, paper_runs, paper_table, regression
from tests.conftest import OMNIGLOT_DIR, needs_omniglot
from vampire_jax.runs import config_records

REPO = Path(__file__).resolve().parents[2]


CHILD = """
import os, signal, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
def saved(signum, frame):
  open(sys.argv[1] + ".saved", "w").write(signal.Signals(signum).name)
  sys.exit(128 + signum)
signal.signal(signal.SIGTERM, saved)
signal.signal(signal.SIGINT, saved)
time.sleep(120)
"""


CELL = "omniglot_original_5way1shot_maml"


def _configs_of(cell, flags) -> list[dict]:
  """The configs the cell's child process trains with (regression: one per method), as its
  results.json records them (`config_records.to_record`)."""
  if cell.group == "omniglot":
    return [config_records.to_record(omniglot.parse_args(flags)[0])]
  _, args = regression.parse_args(flags)
  return [
    config_records.to_record(cli.apply_overrides(regression.get_config(args.preset, name), args))
    for name in args.algorithms.split(",")
  ]


# The children's VAMPIRE_JAX_CACHE. A fixed path: their XLA cache lives in it, and its
# entries are found again only under the same path, so later sessions compile nothing.
CHILD_CACHE = Path(tempfile.gettempdir()) / "vampire_jax_test_paper_runs_cache"


@pytest.fixture
def child_env(omniglot_cache, tmp_path, monkeypatch):
  """The children read Omniglot from the session's cache; returns the runner's --root."""
  CHILD_CACHE.mkdir(exist_ok=True)
  for path in omniglot_cache.iterdir():  # re-pointed atomically (xdist workers share it)
    link = CHILD_CACHE / f".{path.name}.{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(path)
    os.replace(link, CHILD_CACHE / path.name)
  monkeypatch.setenv("VAMPIRE_JAX_CACHE", str(CHILD_CACHE))
  monkeypatch.setenv("OMNIGLOT_DIR", str(OMNIGLOT_DIR))
  return tmp_path / "paper"


def _fake_run(folder: Path, step: int) -> None:
  """A run folder at checkpoint `step`, as far as the runner and `training_cells` read it: a
  run.json and a complete `checkpoints/<step>/default/` (no training)."""
  (folder / "checkpoints" / str(step) / "default").mkdir(parents=True)
  (folder / "checkpoints" / str(step) / "default" / "state").write_text(str(step))
  (folder / "run.json").write_text(json.dumps({"step": step}))


def _kept_step(kept: Path) -> list[str]:
  return sorted(p.name for p in (kept / "checkpoints").iterdir())


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_to_paper_runs_stops_its_child_first(name, tmp_path):
  """SIGTERM or SIGINT to paper_runs reaches its child once and stops it before the runner
  exits, in one line."""
  pid_file = tmp_path / "child.pid"
  script = textwrap.dedent(f"""
    import sys
    from experiments import paper_runs
    paper_runs.child_command = lambda *a: [sys.executable, "-c", {CHILD!r}, {str(pid_file)!r}]
    paper_runs.skip_reason = lambda cell: None
    sys.exit(paper_runs.entry(["--root", {str(tmp_path / "root")!r}, "--cells",
                               "regression", "--grace", "20"]))
  """)
  runner = subprocess.Popen(
    [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
  )
  deadline = time.monotonic() + 120
  while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
    time.sleep(0.2)
  child = int(pid_file.read_text())
  runner.send_signal(getattr(signal, name))
  out, err = runner.communicate(timeout=60)
  assert runner.returncode == 128 + getattr(signal, name), err.decode()
  lines = [line for line in err.decode().splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{name}: stopped before the run finished"), lines
  assert (tmp_path / "child.pid.saved").read_text() == name  # the child got it, once
  with pytest.raises(ProcessLookupError):
    os.kill(child, 0)


def test_every_cell_trains_the_papers_protocol():
  cells = paper_runs.all_cells()
  assert [c.group for c in cells].count("omniglot") == 16
  assert len({c.name for c in cells}) == len(cells) == 16 + 2 + 4
  for cell in cells:
    if cell.group == "mini_imagenet":  # needs the data to parse its flags
      continue
    if cell.name == "regression_authors2019":  # the authors' settings: not the paper's cell
      assert cell.flags[:2] == ("--preset", "authors2019")
      assert set(cell.flags[3].split(",")) == {"vampire", "maml", "platipus", "bmaml", "abml"}
      continue
    command = paper_runs.child_command(cell, Path("/tmp/cell"), False, [])
    assert command[1:3] == ["-m", cell.module] and command[-3:] == [
      "--workdir",
      "/tmp/cell",
      "--no-progress",
    ]
    for config in _configs_of(cell, command[3:]):
      recorded = config_records.flat(json.loads(json.dumps(config)))  # as paper_table reads it
      run = paper_table.Run(Path("/tmp/cell"), cell.group, recorded, {}, None)
      placed = paper_table.sort_runs([run])  # lands in a cell of the table, not apart
      assert list(placed.cells.values()) == [[run]], (cell.name, placed)
  assert [c.name for c in paper_runs.select_cells(cells, "regression,omniglot_random_20way*")] == [
    "omniglot_random_20way1shot_vampire",
    "omniglot_random_20way1shot_maml",
    "omniglot_random_20way5shot_vampire",
    "omniglot_random_20way5shot_maml",
    "regression_paper",
    "regression_authors2019",
  ]
  mini = [c for c in cells if c.group == "mini_imagenet"]
  assert [c.outputs for c in mini] == [("results.json", "calibration.json")] * 2 + [
    ("results.json",)
  ] * 2
  assert all(("--calibration-tasks" in c.flags) == ("5way1shot" in c.name) for c in mini)


def test_mini_imagenet_cells_say_why_they_are_skipped(tmp_path, monkeypatch, capsys):
  monkeypatch.delenv("MINI_IMAGENET_DIR", raising=False)
  assert paper_runs.main(["--root", str(tmp_path), "--cells", "mini_imagenet", "--tiny"]) == 0
  out = capsys.readouterr().out
  assert "skipping the mini-ImageNet cells: MINI_IMAGENET_DIR is not set" in out
  assert "0 done, 0 partial, 0 not started, 4 skipped, 0 failed" in out
  assert "training" not in out and os.listdir(tmp_path) == []
  assert paper_runs.main(["--root", str(tmp_path), "--cells", "bogus"]) == 2


@needs_omniglot
def test_a_second_call_skips_finished_cells(child_env, capsys):
  argv = ["--root", str(child_env), "--cells", CELL, "--tiny"]
  assert paper_runs.main(argv) == 0
  out = capsys.readouterr().out
  results_path = child_env / CELL / "results.json"
  results = json.loads(results_path.read_text())
  assert f"== {CELL}: training" in out and f"done:\n  {CELL}\n" in out
  config = config_records.flat(results["config"])
  assert (config["algorithm"], config["split"]) == ("maml", "original")
  assert config["num_meta_steps"] == 4 and results["resumed_from_step"] == 0
  # The table printed at the end holds the tiny run apart, with its measured accuracy.
  apart = out.split("## Not the paper's protocol", 1)[1]
  assert f"`{child_env / CELL}`" in apart
  test = results["test"]
  assert f"{100 * test['accuracy']:.2f} ± {100 * test['accuracy_ci95']:.2f}" in apart

  written = results_path.stat().st_mtime_ns
  assert paper_runs.main(argv) == 0
  out = capsys.readouterr().out
  assert "training" not in out and f"done:\n  {CELL}\n" in out
  assert results_path.stat().st_mtime_ns == written
  assert (child_env / f"{CELL}.log").read_text().count("\n$ ") == 1  # one child, ever


@needs_omniglot
def test_a_budget_stops_a_cell_cleanly_and_the_next_call_finishes_it(
  child_env, monkeypatch, capsys
):
  folder = child_env / CELL
  argv = [
    "--root",
    str(child_env),
    "--cells",
    CELL,
    "--tiny",
    "--grace",
    "30",
    "--extra-flags=--num-meta-steps 400 --eval-every 200 --checkpoint-every 200 --log-every 5",
  ]

  def clock():  # the budget runs out once the child is training, however fast this machine is
    metrics = folder / "metrics.jsonl"
    return 1e9 if metrics.exists() and "train/loss" in metrics.read_text() else 0.0

  monkeypatch.setattr(paper_runs, "_now", clock)
  assert paper_runs.main(argv + ["--time-budget", "100"]) == paper_runs.EXIT_BUDGET
  out = capsys.readouterr().out
  step = paper_runs.checkpoint_steps(folder)[CELL]
  assert 5 <= step < 400 and not (folder / "results.json").exists()
  assert f"partial:\n  {CELL} (checkpoint step {step})\n" in out
  assert "stopped by the time budget: run the same command again" in out
  # The child saved its checkpoint on SIGTERM and said so (not a kill).
  assert (
    f"SIGTERM: stopped at step {step}, checkpoint saved" in (child_env / f"{CELL}.log").read_text()
  )

  monkeypatch.setattr(paper_runs, "_now", time.monotonic)
  assert paper_runs.main(argv) == 0
  results = json.loads((folder / "results.json").read_text())
  assert results["resumed_from_step"] == step
  assert results["config"]["schedule"]["num_meta_steps"] == 400
  assert f"done:\n  {CELL}\n" in capsys.readouterr().out


def test_a_kept_cell_newer_than_the_run_folder_is_never_replaced(tmp_path, monkeypatch, capsys):
  """The run folder at step 10, `training/<cell>` at step 40, a child that would fail (a
  mistyped flag): the cell is refused before its child starts, in one line naming both steps
  (the cause) and how to resume from the kept one (the fix); the kept cell stays at step 40
  and the call fails (exit 1)."""
  root, training = tmp_path / "paper", tmp_path / "training"
  _fake_run(root / CELL, 10)
  _fake_run(training / CELL, 40)
  children = []

  def failing_child(command, log_path, stop_at, grace):  # as a mistyped --extra-flags fails
    children.append(command)
    log_path.write_text("error: unrecognized arguments: --num-meta-stepz\n")
    return 2, False

  monkeypatch.setattr(paper_runs, "run_child", failing_child)
  argv = ["--root", str(root), "--cells", CELL, "--tiny", "--training", str(training)]
  assert paper_runs.main(argv + ["--extra-flags=--num-meta-stepz 4"]) == 1
  out = capsys.readouterr().out
  assert children == []  # nothing trained over the older folder
  assert _kept_step(training / CELL) == ["40"] and _kept_step(root / CELL) == ["10"]
  (line,) = [line for line in out.splitlines() if line.startswith(f"== {CELL}: not trained")]
  assert f"{training / CELL} holds step 40, newer than {root / CELL}'s step 10" in line
  assert f"remove {root / CELL} to resume from {training / CELL}" in line
  assert "kept step" not in out and "git add" not in out  # nothing to commit
  assert re.search(rf"failed:\n  {CELL} \({re.escape(str(training / CELL))} is newer", out)


def test_keep_never_puts_an_older_run_over_a_newer_kept_cell(tmp_path, capsys):
  """`keep` of a step-10 folder over a kept step 40 (by hand, or after a cell's call) is
  refused in one line saying which is newer; the kept cell is left as it was."""
  older, kept = tmp_path / "runs" / CELL, tmp_path / "training" / CELL
  _fake_run(older, 10)
  _fake_run(kept, 40)
  assert paper_runs.main(["keep", str(older), "--training", str(tmp_path / "training")]) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith(f"error: keep: {kept} "), err
  assert f"{kept} holds step 40, newer than {older}'s step 10" in err  # which is newer
  assert f"resume from {kept}" in err and f"git rm -r {kept}" in err  # the ways out
  assert _kept_step(kept) == ["40"] and json.loads((kept / "run.json").read_text()) == {"step": 40}
  _fake_run(tmp_path / "newer" / CELL, 50)  # a newer run is kept over it, as before
  assert (
    paper_runs.main(["keep", str(tmp_path / "newer" / CELL), "--training", str(kept.parent)]) == 0
  )
  assert _kept_step(kept) == ["50"]
