"""experiments.paper_runs: the cells are the paper's presets; finished cells are skipped; a
time budget stops a child cleanly and the next call finishes it (tiny cells on the CPU)."""

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from conftest import OMNIGLOT_DIR, needs_omniglot
from experiments import cli, omniglot, paper_runs, paper_table, regression

CELL = "omniglot_original_5way1shot_maml"


def _configs_of(cell, flags) -> list[dict]:
  """The configs the cell's child process trains with (regression: one per method)."""
  if cell.group == "omniglot":
    return [dataclasses.asdict(omniglot.parse_args(flags)[0])]
  _, args = regression.parse_args(flags)
  return [
    dataclasses.asdict(cli.apply_overrides(regression.get_config(args.preset, name), args))
    for name in args.algorithms.split(",")
  ]


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
      run = paper_table.Run(Path("/tmp/cell"), cell.group, json.loads(json.dumps(config)), {}, None)
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


@needs_omniglot
def test_a_second_call_skips_finished_cells(child_env, capsys):
  argv = ["--root", str(child_env), "--cells", CELL, "--tiny"]
  assert paper_runs.main(argv) == 0
  out = capsys.readouterr().out
  results_path = child_env / CELL / "results.json"
  results = json.loads(results_path.read_text())
  assert f"== {CELL}: training" in out and f"done:\n  {CELL}\n" in out
  assert (results["config"]["algorithm"], results["config"]["split"]) == ("maml", "original")
  assert results["config"]["num_meta_steps"] == 4 and results["resumed_from_step"] == 0
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
  assert results["resumed_from_step"] == step and results["config"]["num_meta_steps"] == 400
  assert f"done:\n  {CELL}\n" in capsys.readouterr().out
