"""A finished run without a checkpoint is refused, never trained again from step 0 (issue 59).

Training in a copy of a zoo cell (its `best/<step>`, no `checkpoints/`) is refused in one
line, before anything in the folder moves, naming what differs from the command and what to
do (`init_from` into a new folder, or another workdir; the command line says them as
`--init-from` and `--workdir`); a resume of a folder with its checkpoints is unchanged
(tests/test_run_identity.py).
"""

import hashlib
import shutil
from pathlib import Path

import pytest

import vampire_jax as vj
from conftest import needs_omniglot
from experiments import cli, omniglot, zoo
from vampire_jax.runs import run_folder

QUIET = dict(progress=False, print_fn=lambda message: None)
REPO = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict:
  return {
    p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(folder.rglob("*"))
    if p.is_file()
  }


@pytest.fixture(scope="module")
def copied_cell(tiny_omniglot_run, tmp_path_factory):
  """The suite's tiny finished run put in a zoo of its own (`best/<step>`, no checkpoints):
  `(the cell, the run's config, its best step)`."""
  workdir, config, results = tiny_omniglot_run
  zoo_folder = tmp_path_factory.mktemp("zoo")
  name = zoo.add_run(workdir, zoo_folder, name="tiny_cell")
  step = results["best_validation"]["step"]
  assert zoo.read_manifest(zoo_folder)["cells"][name]["checkpoint"] == f"best/{step}"
  return zoo_folder / name, config, step


def _copy(cell: Path, tmp_path: Path) -> Path:
  copy = tmp_path / "mine"
  shutil.copytree(cell, copy)
  assert run_folder.latest_checkpoint_step(copy) is None
  return copy


@needs_omniglot
def test_a_copied_cell_with_more_steps_is_refused_naming_the_difference(copied_cell, tmp_path):
  cell, config, step = copied_cell
  copy = _copy(cell, tmp_path)
  before = _files(copy)
  with pytest.raises(vj.ConfigError) as refused:
    omniglot.run_experiment(config.replace(num_meta_steps=8), copy, **QUIET)
  message = str(refused.value)
  assert message.startswith(
    f"{copy} holds a finished run (results.json, its best/ of step {step}) but no checkpoint "
    "to resume it from (a zoo cell keeps only its tested meta-parameters), and its settings "
    "differ from this command's (num_meta_steps: 6 -> 8): training here would start again "
    "at step 0 over it. "
  )
  assert f"pass init_from={str(copy)!r} with another workdir" in message
  assert message.endswith("to train anew, use another workdir")
  assert len(message.splitlines()) == 1 and "--" not in message
  assert _files(copy) == before  # nothing moved aside, nothing written


@needs_omniglot
def test_the_same_settings_are_refused_too(copied_cell, tmp_path):
  cell, config, _ = copied_cell
  copy = _copy(cell, tmp_path)
  with pytest.raises(vj.ConfigError, match=r"and its settings are this command's \(load it"):
    omniglot.run_experiment(config, copy, **QUIET)
  assert not (copy / run_folder.SET_ASIDE_FOLDER).exists()


def test_the_issues_command_on_a_copy_of_the_zoo_cell_exits_2_in_one_line(tmp_path, capsys):
  copy = _copy(REPO / "zoo" / "omniglot_original_quick_vampire", tmp_path)
  before = _files(copy)
  argv = ["--preset", "quick", "--workdir", str(copy), "--num-meta-steps", "240"]
  assert cli.main_entry(omniglot.main, argv + ["--no-compilation-cache"]) == 2
  said = capsys.readouterr()
  (line,) = [line for line in said.err.splitlines() if line.startswith("error:")]
  assert "holds a finished run (results.json, its best/ of step 200)" in line
  assert "num_meta_steps: 200 -> 240" in line
  # The library's fields, said as the command line's flags.
  assert f"pass --init-from={str(copy)!r} with another --workdir" in line
  assert line.endswith("to train anew, use another --workdir")
  assert "Traceback" not in said.out + said.err and _files(copy) == before
