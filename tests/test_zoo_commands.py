"""experiments.zoo's commands touch nothing they do not own, and check what they read (issue 60).

`add` writes and deletes only inside its cell's own folder: a `--name` is one plain folder
name, checked before anything is read, and `--replace` replaces only a cell of the manifest.
`table` writes the tables only from a manifest that agrees with its cells (a folder each,
their results.json's numbers); `check` finds what `table` would refuse, and a duplicated
table block. Each test works on a zoo in a temporary folder built from a copy of one of the
repository's cells (a run folder: `add` takes it as it takes any), never on `zoo/` itself.
"""

import json
import shutil

import pytest

from experiments import zoo
from vampire_jax._src.core.errors import ConfigError

CELL = "regression_cpu_maml"  # the smallest cell of the repository's zoo (0.4 MB)


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
  """A finished run folder: a copy of one of the repository's cells."""
  run = tmp_path_factory.mktemp("source") / "maml"
  shutil.copytree(zoo.ZOO / CELL, run)
  return run


@pytest.fixture
def clone(tmp_path, source_run):
  """A clone's folder holding a zoo of one cell, a README with the table and a user's file."""
  root = tmp_path / "clone"
  zoo.add([source_run], root / "zoo")
  readme = root / "README.md"
  readme.write_text(f"before\n{zoo.TABLE_START}\nold rows\n{zoo.TABLE_END}\nafter\n")
  zoo.write_tables(root / "zoo", readme)
  (root / "mine.txt").write_text("the user's own file")
  return root


def _main(clone, *args) -> int:
  return zoo.main(["--zoo", str(clone / "zoo"), "--readme", str(clone / "README.md"), *args])


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _files(folder) -> dict:
  """Every file under `folder` and its bytes."""
  return {
    p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
  }


# -- add: nothing outside the cell's folder --------------------------------------------------


@pytest.mark.parametrize("name", [".", ".."])
def test_a_name_that_is_the_zoo_or_its_parent_deletes_nothing(clone, source_run, name):
  """Before: `--name . --replace` deleted the whole zoo (every cell and the manifest), and
  `--name .. --replace` the zoo's parent, a clone with its README, .git and the user's files."""
  before = _files(clone)
  with pytest.raises(ConfigError) as raised:
    _main(clone, "add", str(source_run), "--name", name, "--replace", "--no-verify")
  assert _one_line(raised).startswith(f"zoo add: --name {name!r} is not a cell's name: give one ")
  assert _files(clone) == before
  assert zoo.check_cells(clone / "zoo") == []


@pytest.mark.parametrize("name", ["../outside", "a/b", "/tmp/elsewhere", "", "manifest.json"])
def test_a_name_that_is_not_one_plain_folder_name_is_refused_before_anything(
  tmp_path, source_run, name
):
  """Before: `../outside` and `a/b` gave a FileNotFoundError traceback (after the run was
  read); an absolute name would have put the cell outside the zoo."""
  target, readme = tmp_path / "zoo", tmp_path / "README.md"
  with pytest.raises(ConfigError) as raised:
    zoo.main(
      [
        "--zoo",
        str(target),
        "--readme",
        str(readme),
        "add",
        str(source_run),
        "--name",
        name,
        "--no-verify",
      ]
    )
  assert _one_line(raised) == (
    f"zoo add: --name {name!r} is not a cell's name: give one plain folder name of letters, "
    "digits, '_', '-' and '.' (not starting or ending with '.', no '/'), e.g. "
    "--name regression_cpu_vampire_wide"
  )
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # no zoo, no "outside", nothing


def test_replace_replaces_only_a_cell_of_the_manifest(clone, source_run, tmp_path):
  """A folder of the user's in the zoo, or a link in it to a folder elsewhere, is not a cell:
  `--replace` refuses to delete it (before: `shutil.rmtree` ran on whatever the name held)."""
  zoo_dir = clone / "zoo"
  (zoo_dir / "mine").mkdir()
  (zoo_dir / "mine" / "notes.txt").write_text("keep")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  (elsewhere / "data.txt").write_text("keep too")
  (zoo_dir / "linked").symlink_to(elsewhere, target_is_directory=True)
  before = _files(clone) | {"elsewhere": _files(elsewhere)}
  with pytest.raises(ConfigError) as raised:
    zoo.add([source_run], zoo_dir, name="mine", replace=True)
  assert _one_line(raised) == (
    f"zoo add: {zoo_dir / 'mine'} exists but is not a cell of {zoo_dir / 'manifest.json'}; "
    "--replace replaces only a cell of the manifest: move that folder away, or choose another "
    "--name"
  )
  with pytest.raises(ConfigError) as raised:
    zoo.add([source_run], zoo_dir, name="linked", replace=True)
  assert _one_line(raised).startswith(f"zoo add: {zoo_dir / 'linked'} is not a cell's folder (")
  assert _files(clone) | {"elsewhere": _files(elsewhere)} == before
  # A cell of the manifest is replaced, and nothing else changes.
  assert zoo.add([source_run], zoo_dir, name=CELL, replace=True) == [CELL]
  assert _files(clone) | {"elsewhere": _files(elsewhere)} == before
  assert sorted(p.name for p in zoo_dir.iterdir()) == sorted(
    ["README.md", "manifest.json", CELL, "mine", "linked"]
  )  # no staging folder left behind


def test_a_diverged_run_is_not_told_to_finish(tmp_path, source_run):
  """Before: a method whose training diverged in a comparison was told to "finish it first"."""
  comparison = tmp_path / "regression_cpu_seed0"
  shutil.copytree(source_run, comparison / "simpa")
  (comparison / "simpa" / "results.json").unlink()
  diverged = "meta-training diverged at step 100: {'train/loss': nan}; see vj.kl_step_factor"
  (comparison / "results.json").write_text(
    json.dumps({"methods": {"simpa": {"diverged": diverged}}})
  )
  with pytest.raises(ConfigError) as raised:
    zoo.add([comparison / "simpa"], tmp_path / "zoo")
  assert _one_line(raised) == (
    f"zoo add: {comparison / 'simpa'}'s training diverged (meta-training diverged at step "
    "100), so it has no test to add; train it again with stable settings (see "
    "vj.check_inner_loop), then add that run"
  )


# -- table and check: the manifest agrees with its cells --------------------------------------


def _edit_manifest(zoo_dir, edit) -> None:
  manifest = zoo.read_manifest(zoo_dir)
  edit(manifest["cells"])
  zoo.write_manifest(zoo_dir, manifest)


def test_an_edited_number_in_the_manifest_never_reaches_the_tables(clone, capsys):
  """Before: the manifest's MSE edited (results.json untouched) went into the README's table,
  and `check` said "checksums and tables agree"."""
  before = _files(clone)
  recorded = zoo.read_manifest(clone / "zoo")["cells"][CELL]["test"]["mse"]

  def edit(cells):
    cells[CELL]["test"]["mse"] = 1.0

  _edit_manifest(clone / "zoo", edit)
  with pytest.raises(ConfigError) as raised:
    _main(clone, "table")
  assert _one_line(raised) == (
    f"zoo table: zoo/{CELL}: the manifest's mse 1.0 is not its results.json's {recorded!r}; "
    "the tables are written from the manifest, so mend it (git checkout zoo/) or add the cell "
    "again"
  )
  capsys.readouterr()
  assert _main(clone, "check") == 1
  out = capsys.readouterr().out
  assert f"zoo/{CELL}: the manifest's mse 1.0 is not its results.json's {recorded!r}\n" in out
  assert out.endswith("zoo: problems above\n")
  after = _files(clone)
  assert {k: v for k, v in after.items() if k != "zoo/manifest.json"} == {
    k: v for k, v in before.items() if k != "zoo/manifest.json"
  }  # neither README written


def test_table_refuses_a_zoo_without_its_manifest(clone):
  """Before: with manifest.json missing, `table` exited 0 and wrote tables of 0 cells."""
  (clone / "zoo" / "manifest.json").unlink()
  before = _files(clone)
  for command in ("table", "check"):
    with pytest.raises(ConfigError) as raised:
      _main(clone, command)
    assert _one_line(raised) == (
      f"zoo {command}: {clone / 'zoo' / 'manifest.json'} is missing, so the cells in "
      f"{clone / 'zoo'} are unknown; restore it (git checkout zoo/manifest.json) or add the "
      "cells again with `python -m experiments.zoo add`"
    )
  assert _files(clone) == before


def test_table_refuses_a_manifest_cell_without_its_folder(clone):
  """Before: a cell of the manifest whose folder was gone still got a README row."""
  shutil.rmtree(clone / "zoo" / CELL)
  before = _files(clone)
  with pytest.raises(ConfigError) as raised:
    _main(clone, "table")
  assert _one_line(raised).startswith(f"zoo table: zoo/{CELL} is in the manifest but missing; ")
  assert _files(clone) == before


def test_check_fails_on_a_duplicated_table_block_and_table_refuses_it(clone, capsys):
  """Before: a README holding the generated block twice passed `check`."""
  readme = clone / "README.md"
  text = readme.read_text()
  block = text[text.index(zoo.TABLE_START) : text.index(zoo.TABLE_END) + len(zoo.TABLE_END)]
  readme.write_text(text + "\n" + block + "\n")
  capsys.readouterr()
  assert _main(clone, "check") == 1
  expected = (
    f"{readme} holds 2 zoo-table blocks ({zoo.TABLE_START} ... {zoo.TABLE_END}); delete all "
    "but one, then run `python -m experiments.zoo table`"
  )
  assert capsys.readouterr().out == f"{expected}\nzoo: problems above\n"
  with pytest.raises(ConfigError) as raised:
    _main(clone, "table")
  assert _one_line(raised) == f"zoo table: {expected}"


def test_the_repositorys_manifest_holds_its_cells_numbers():
  manifest = zoo.read_manifest(zoo.ZOO)
  assert manifest["cells"] and zoo.numbers_disagree(zoo.ZOO, manifest) == []


def test_verify_of_one_task_is_refused_with_its_cause(capsys):
  """Before: `verify --num-test-tasks 1` could never pass ("allowed nan": one task has no
  half-width)."""
  with pytest.raises(SystemExit):
    zoo.parse_args(["verify", "--num-test-tasks", "1"])
  last_line = capsys.readouterr().err.splitlines()[-1]
  assert last_line.endswith(
    "argument --num-test-tasks: 1 task has no 95 % half-width, which the tolerance across "
    "machines is a fraction of: give at least 2, or 'all'"
  )
