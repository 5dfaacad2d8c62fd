"""experiments.zoo's commands touch nothing they do not own, and check what they read.

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


def _edit_manifest(zoo_dir, edit) -> None:
  manifest = zoo.read_manifest(zoo_dir)
  edit(manifest["cells"])
  zoo.write_manifest(zoo_dir, manifest)


@pytest.mark.parametrize("name", [".", ".."])
def test_a_name_that_is_the_zoo_or_its_parent_deletes_nothing(clone, source_run, name):
  """`--name . --replace` (the whole zoo) and `--name .. --replace` (the clone holding it) are
  refused as not a cell's name, and no file of the clone changes."""
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
  """`../outside`, `a/b`, an absolute name, '' and `manifest.json` are refused as not one
  plain folder name, naming the characters allowed and an example, before anything is made."""
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
  message = _one_line(raised)
  assert message.startswith(f"zoo add: --name {name!r} is not a cell's name")  # the value
  assert "give one plain folder name of letters, digits, '_', '-' and '.'" in message
  assert "(not starting or ending with '.', no '/')" in message  # what it must be
  assert "e.g. --name regression_cpu_vampire_wide" in message
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # no zoo, no "outside", nothing


def test_replace_replaces_only_a_cell_of_the_manifest(clone, source_run, tmp_path):
  """A folder of the user's in the zoo, or a link in it to a folder elsewhere, is not a cell:
  `--replace` refuses to delete it, and replaces a cell of the manifest only."""
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
  message = _one_line(raised)
  assert message.startswith(f"zoo add: {zoo_dir / 'mine'} exists")
  assert f"is not a cell of {zoo_dir / 'manifest.json'}" in message  # the cause
  assert "--replace replaces only a cell of the manifest" in message
  assert "move that folder away, or choose another --name" in message  # the fix
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
  """A method whose training diverged in a comparison is refused naming the divergence and
  the fix (train again with stable settings), not told to finish."""
  comparison = tmp_path / "regression_cpu_seed0"
  shutil.copytree(source_run, comparison / "simpa")
  (comparison / "simpa" / "results.json").unlink()
  diverged = "meta-training diverged at step 100: {'train/loss': nan}; see vj.kl_step_factor"
  (comparison / "results.json").write_text(
    json.dumps({"methods": {"simpa": {"diverged": diverged}}})
  )
  with pytest.raises(ConfigError) as raised:
    zoo.add([comparison / "simpa"], tmp_path / "zoo")
  message = _one_line(raised)
  assert message.startswith(f"zoo add: {comparison / 'simpa'}'s training diverged")
  assert "(meta-training diverged at step 100)" in message and "no test to add" in message
  assert "train it again with stable settings (see vj.check_inner_loop)" in message  # the fix
  assert "then add that run" in message


def test_an_edited_number_in_the_manifest_never_reaches_the_tables(clone, capsys):
  """The manifest's MSE edited (results.json untouched) is refused by `table`, naming both
  numbers and the fix, and reported by `check`; neither README is written."""
  before = _files(clone)
  recorded = zoo.read_manifest(clone / "zoo")["cells"][CELL]["test"]["mse"]

  def edit(cells):
    cells[CELL]["test"]["mse"] = 1.0

  _edit_manifest(clone / "zoo", edit)
  with pytest.raises(ConfigError) as raised:
    _main(clone, "table")
  message = _one_line(raised)
  assert message.startswith(f"zoo table: zoo/{CELL}: ")  # the command and the cell
  assert f"the manifest's mse 1.0 is not its results.json's {recorded!r}" in message
  assert "the tables are written from the manifest" in message  # why it matters
  assert "mend it (git checkout zoo/) or add the cell again" in message  # the fix
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
  """Without manifest.json, `table` and `check` refuse naming the file and how to restore it."""
  (clone / "zoo" / "manifest.json").unlink()
  before = _files(clone)
  for command in ("table", "check"):
    with pytest.raises(ConfigError) as raised:
      _main(clone, command)
    message = _one_line(raised)
    assert message.startswith(f"zoo {command}: {clone / 'zoo' / 'manifest.json'} is missing")
    assert f"the cells in {clone / 'zoo'} are unknown" in message  # what follows
    assert "restore it (git checkout zoo/manifest.json)" in message  # the fix, or the way out:
    assert "add the cells again with `python -m experiments.zoo add`" in message
  assert _files(clone) == before


def test_table_refuses_a_manifest_cell_without_its_folder(clone):
  """A cell of the manifest whose folder is gone is refused by `table`, naming the cell."""
  shutil.rmtree(clone / "zoo" / CELL)
  before = _files(clone)
  with pytest.raises(ConfigError) as raised:
    _main(clone, "table")
  assert _one_line(raised).startswith(f"zoo table: zoo/{CELL} is in the manifest but missing; ")
  assert _files(clone) == before


def test_check_fails_on_a_duplicated_table_block_and_table_refuses_it(clone, capsys):
  """A README holding the generated block twice fails `check` and is refused by `table`,
  naming the count and the fix."""
  readme = clone / "README.md"
  text = readme.read_text()
  block = text[text.index(zoo.TABLE_START) : text.index(zoo.TABLE_END) + len(zoo.TABLE_END)]
  readme.write_text(text + "\n" + block + "\n")
  capsys.readouterr()
  assert _main(clone, "check") == 1
  facts = (
    f"{readme} holds 2 zoo-table blocks",  # the file and the cause
    f"({zoo.TABLE_START} ... {zoo.TABLE_END})",  # which blocks
    "delete all but one, then run `python -m experiments.zoo table`",  # the fix
  )
  out = capsys.readouterr().out
  assert len(out.splitlines()) == 2 and out.endswith("\nzoo: problems above\n"), out
  assert all(fact in out.splitlines()[0] for fact in facts), out
  with pytest.raises(ConfigError) as raised:
    _main(clone, "table")
  message = _one_line(raised)
  assert message.startswith("zoo table: ") and all(fact in message for fact in facts), message


def test_the_repositorys_manifest_holds_its_cells_numbers():
  manifest = zoo.read_manifest(zoo.ZOO)
  assert manifest["cells"] and zoo.numbers_disagree(zoo.ZOO, manifest) == []


def test_verify_of_one_task_is_refused_with_its_cause(capsys):
  """`verify --num-test-tasks 1` is refused: one task has no 95 % half-width, which the
  tolerance is a fraction of; give at least 2, or 'all'."""
  with pytest.raises(SystemExit):
    zoo.parse_args(["verify", "--num-test-tasks", "1"])
  last_line = capsys.readouterr().err.splitlines()[-1]
  assert last_line.endswith(
    "argument --num-test-tasks: 1 task has no 95 % half-width, which the tolerance across "
    "machines is a fraction of: give at least 2, or 'all'"
  )
