"""Starting a run from a trained run (issue 59, item 2): `vj.train_and_evaluate(...,
init_from=)` and `--init-from`. A fine-tune of a zoo cell writes a new run folder whose
`run.json` records where it started, leaves the cell byte for byte as it was, and resumes
without starting from the cell again; a source whose meta-parameters do not fit is refused
in one line before the data is loaded or the folder made."""

import hashlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, omniglot, regression, zoo
from tests.conftest import needs_omniglot, tiny_regression_config
from vampire_jax.runs import init_from as run_start
from vampire_jax.runs import run_folder

REPO = Path(__file__).resolve().parents[2]


CELL = REPO / "zoo" / "regression_cpu_vampire"  # VAMPIRE, a 100-100-100 MLP, 3000 steps


def _files(folder: Path) -> dict:
  return {
    p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(folder.rglob("*"))
    if p.is_file()
  }


def _config(algorithm="vampire", **changes):
  """Tiny settings on the cell's network; meta_lr 1e-20 keeps the start's values in sight."""
  settings = dict(hidden_sizes=(100, 100, 100), num_meta_steps=2, log_every=1)
  if "num_mc_test" in vj.specs.get(algorithm).field_names():
    settings["num_mc_test"] = 2
  return tiny_regression_config(algorithm, **{**settings, "meta_lr": 1e-20, **changes})


def _train(config, workdir, init_from, lines=None):
  say = lines.append if lines is not None else lambda message: None
  return regression.run_experiment(
    config, workdir, progress=False, print_fn=say, init_from=init_from
  )


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
  """Two steps from the zoo cell (by its path) into a new folder: `(workdir, results, before)`,
  `before` the cell's files' sha256 before."""
  before = _files(CELL)
  workdir = tmp_path_factory.mktemp("fine_tune") / "mine"
  results = _train(_config(), workdir, str(CELL))
  return workdir, results, before


def _refused(config, init_from, tmp_path, error=vj.ConfigError, problem=None) -> str:
  workdir = tmp_path / "new"
  with pytest.raises(error) as refused:
    vj.train_and_evaluate(
      problem or (lambda: regression.make_problem(config)),
      config,
      workdir,
      init_from=init_from,
      progress=False,
      print_fn=lambda message: None,
    )
  assert not workdir.exists()
  message = str(refused.value)
  assert len(message.splitlines()) == 1, message
  return message


class OtherMLP(vj.MLP):
  """The cell's layers under another class: its parameters fit, its network is another."""


def test_a_fine_tune_records_where_it_started_and_leaves_the_cell_alone(fine_tuned):
  workdir, results, before = fine_tuned
  assert _files(CELL) == before  # the source, byte for byte
  source = vj.load_run(CELL)
  manifest = zoo.read_manifest(REPO / "zoo")["cells"][CELL.name]
  lines = "".join(  # the manifest's own checksums give the checkpoint's checksum
    f"{path} {entry['sha256']}\n"
    for path, entry in sorted(manifest["files"].items())
    if path.startswith("checkpoints/3000/")
  )
  expected = {
    "folder": str(CELL.resolve()),
    "zoo_cell": "regression_cpu_vampire",
    "run_id": source.record["run_id"],
    "algorithm": "vampire",
    "step": 3000,
    "tested_step": 3000,
    "checkpoint": "checkpoints/3000",
    "checkpoint_sha256": hashlib.sha256(lines.encode()).hexdigest(),
    "meta_params_sha256": run_start.meta_params_sha256(source.meta_params),
  }
  record = json.loads((workdir / "run.json").read_text())
  assert record["init_from"] == expected and results["init_from"] == expected
  assert record["run_id"] != source.record["run_id"]  # a run of its own
  assert results["resumed_from_step"] == 0 and results["meta_steps"] == 2
  # Step 0 was the cell's meta-parameters (meta_lr 1e-20: two steps move nothing in sight),
  # with a fresh optimiser: Adam has counted this run's 2 steps, not the cell's 3002.
  state = run_folder.read_checkpoint(workdir / "checkpoints", 2)
  theirs = source.meta_params._asdict()  # as the checkpoint reads back: a dict
  for mine, given in zip(jax.tree.leaves(state["meta_params"]), jax.tree.leaves(theirs)):
    np.testing.assert_allclose(mine, np.asarray(given), rtol=1e-6, atol=1e-12)
  counts = [
    int(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(state["opt_state"])[0]
    if "count" in jax.tree_util.keystr(path)
  ]
  assert counts and set(counts) == {2} and int(state["step"]) == 2
  assert vj.load_run(workdir).step == results["tested_step"]  # a run folder like any


def test_resuming_a_fine_tune_continues_it_without_starting_again(fine_tuned, tmp_path):
  workdir = tmp_path / "mine"
  shutil.copytree(fine_tuned[0], workdir)
  started = json.loads((workdir / "run.json").read_text())["init_from"]
  lines = []
  results = _train(_config(num_meta_steps=4), workdir, vj.load_run(CELL), lines)
  assert results["resumed_from_step"] == 2 and results["meta_steps"] == 4
  assert (
    f"resuming {workdir}, which started from {CELL.resolve()} (step 3000): init_from is not applied again"
    in lines
  )
  assert json.loads((workdir / "run.json").read_text())["init_from"] == started
  assert results["init_from"] == started
  steps = [row["step"] for row in run_folder.read_metrics(workdir) if "train/loss" in row]
  assert steps == [1, 2, 3, 4]  # each step's row once
  # Resumed without init_from, too: the folder says where it started.
  results = _train(_config(num_meta_steps=4), workdir, None)
  assert results["init_from"] == started


def test_a_source_of_another_algorithm_is_refused(tmp_path):
  message = _refused(_config("maml"), CELL, tmp_path)
  assert message.startswith(
    f"init_from: {CELL.resolve()} is a run of vampire, and this run trains maml: its "
    "meta-parameters are another algorithm's; "
  )
  assert message.endswith("start from a maml run, or train algorithm vampire")
  assert "--" not in message  # the library names fields; the command line says flags


def test_a_source_of_another_kind_is_refused(tmp_path):
  cell = REPO / "zoo" / "omniglot_original_quick_vampire"
  message = _refused(_config(), cell, tmp_path)
  assert message.startswith(f"init_from: {cell.resolve()} is a classification run")
  assert "this problem is regression: its meta-parameters do not fit" in message  # the cause
  assert message.endswith("start from a run of this kind")  # the fix


def test_a_network_of_other_shapes_is_refused_naming_the_fields(tmp_path):
  message = _refused(_config(hidden_sizes=(8, 8)), CELL, tmp_path)
  assert message.startswith(
    f"init_from: {CELL.resolve()}'s meta-parameters do not fit this network ("
  )
  assert "is [100] there, [8] here" in message or "is [1, 100] there, [1, 8] here" in message
  assert "; the network's hidden_sizes: [100, 100, 100] there, [8, 8] here" in message
  assert message.endswith("): build the same network, or start from a run of this one")


def test_another_network_class_is_refused(tmp_path):
  config = _config()
  problem = regression.make_problem(config)._replace(model=OtherMLP((100, 100, 100), 1))
  message = _refused(config, CELL, tmp_path, problem=problem)
  assert message.startswith(
    f"init_from: {CELL.resolve()}'s network is vampire_jax._src.core.models.MLP"
  )
  assert f"this problem's is {OtherMLP.__module__}.OtherMLP" in message
  assert "its meta-parameters do not fit" in message


def test_a_run_whose_meta_parameters_were_cut_is_refused_naming_the_leaf(tmp_path):
  source = vj.load_run(CELL)
  source.meta_params = jax.tree.map(lambda leaf: leaf[..., :1], source.meta_params)
  message = _refused(_config(), source, tmp_path)
  assert "meta-parameters do not fit this network (" in message
  assert "['Dense_0']['bias'] is [1] there, [100] here" in message


def test_init_from_must_be_a_run_or_a_path(tmp_path):
  message = _refused(_config(), 3000, tmp_path, error=vj.InputError)
  assert message.startswith("train_and_evaluate: init_from ")  # the function and the argument
  assert "must be a vj.Run or a run folder's path" in message and "got int" in message


@needs_omniglot
def test_init_from_into_a_folder_of_a_run_trained_from_scratch_is_refused(
  tiny_omniglot_run, tmp_path
):
  workdir = tmp_path / "scratch"
  shutil.copytree(tiny_omniglot_run[0], workdir)
  before = _files(workdir)
  cell = REPO / "zoo" / "omniglot_original_quick_vampire"
  with pytest.raises(vj.ConfigError) as refused:
    omniglot.run_experiment(
      tiny_omniglot_run[1], workdir, progress=False, print_fn=print, init_from=cell
    )
  message = str(refused.value)
  assert message.startswith(
    f"init_from: {workdir} holds a run trained from its own initialisation (checkpoint 6), "
    "and init_from starts a new run: "
  )
  assert "give it another workdir, or resume this one without init_from" in message
  assert _files(workdir) == before


def test_training_in_a_zoo_cell_itself_is_refused(tmp_path):
  """A copy of the zoo with the cell in its manifest: training would change recorded files."""
  cells = tmp_path / "zoo"
  shutil.copytree(CELL, cells / CELL.name)
  entry = zoo.read_manifest(REPO / "zoo")["cells"][CELL.name]
  zoo.write_manifest(cells, {"format": 1, "cells": {CELL.name: entry}})
  before = _files(cells)
  config = vj.load_run(cells / CELL.name).config
  with pytest.raises(vj.RunFolderError) as refused:
    _train(config, cells / CELL.name, None)
  message = str(refused.value)
  assert message.startswith(
    f"{cells / CELL.name} is a cell of a zoo: {(cells / 'manifest.json').resolve()} records "
    "its files' sha256, and training there would change them. "
  )
  assert f"Start from it with init_from={str(cells / CELL.name)!r} and another workdir" in message
  assert _files(cells) == before


def test_init_from_names_a_zoo_cell_or_a_folder():
  assert cli.init_from_folder("regression_cpu_vampire") == REPO / "zoo" / "regression_cpu_vampire"
  assert cli.init_from_folder(str(CELL)) == CELL
  with pytest.raises(vj.ConfigError) as refused:
    cli.init_from_folder("no_such_cell")
  assert str(refused.value).startswith(
    f"--init-from no_such_cell: no such run folder, nor a cell of {REPO / 'zoo'} (its cells: "
  )
  listed = str(refused.value).split("(its cells: ", 1)[1].rstrip(")").split(", ")
  assert listed == sorted(p.name for p in (REPO / "zoo").iterdir() if p.is_dir())


def test_a_comparison_checks_every_methods_source_before_the_first_trains(tmp_path, capsys):
  flags = [
    "--preset",
    "quick",
    "--algorithms",
    "vampire,maml",
    "--hidden-sizes",
    "100",
    "100",
    "100",
  ]
  argv = flags + ["--init-from", "regression_cpu_vampire", "--workdir", str(tmp_path / "c")]
  assert cli.main_entry(regression.main, argv + ["--no-compilation-cache"]) == 2
  said = capsys.readouterr()
  (line,) = [line for line in said.err.splitlines() if line.startswith("error:")]
  # The library's refusal, said in the command line's flags.
  assert line.startswith(
    f"error: --init-from: {CELL} is a run of vampire, and this run trains maml: its "
    "meta-parameters are another algorithm's; "
  )
  assert line.endswith("start from a maml run, or train --algorithm vampire")
  assert not (tmp_path / "c" / "vampire").exists()  # no method trained


def test_a_comparison_folder_gives_each_method_its_own_source(tmp_path):
  (tmp_path / "maml").mkdir()
  (tmp_path / "maml" / "run.json").write_text("{}")
  from experiments import compare

  assert compare.method_init_from(tmp_path, "maml") == tmp_path / "maml"
  assert compare.method_init_from(tmp_path, "vampire") == tmp_path
  assert compare.method_init_from(None, "maml") is None


def test_a_first_run_from_a_source_says_where_it_starts(tmp_path):
  lines = []
  _train(_config(), tmp_path / "mine", str(CELL), lines)
  starts = [line for line in lines if line.startswith("starting from")]
  assert starts == [
    f"starting from {CELL.resolve()} (zoo cell {CELL.name}): its meta-parameters of step "
    "3000, with a fresh optimiser state"
  ], lines[:5]
  # Resumed, it says that it resumes, not that it starts.
  again = []
  _train(_config(), tmp_path / "mine", str(CELL), again)
  assert not [line for line in again if line.startswith("starting from")]
  assert any(line.startswith(f"resuming {tmp_path / 'mine'}") for line in again), again[:5]
