"""`python -m experiments.zoo recalibrate` (issue 61): a cell's map without retraining.

On a zoo in a temporary folder holding a copy of the repository's smallest cell (MAML,
one weight draw): the map is fitted on the cell's validation tasks, written beside the
run and into the manifest with the test scored both ways, and the zoo stays consistent.
"""

import json
import math
import re
import shutil

import numpy as np
import pytest

import vampire_jax as vj
from experiments import zoo, zoo_verify
from vampire_jax._src.metrics import evaluation
from vampire_jax.runs import programs, recalibration

CELL = "regression_cpu_maml"


def _zoo_of_one_cell(root):
  """`root/zoo` holding a copy of the cell (not recalibrated), and `root/README.md` with the
  table block; returns the arguments naming them."""
  source = root / "source" / "maml"
  shutil.copytree(zoo.ZOO / CELL, source)
  zoo.add([source], root / "zoo")
  (root / "README.md").write_text(f"{zoo.TABLE_START}\n{zoo.TABLE_END}\n")
  zoo.write_tables(root / "zoo", root / "README.md")
  return ["--zoo", str(root / "zoo"), "--readme", str(root / "README.md")]


@pytest.fixture(scope="module")
def recalibrated(tmp_path_factory):
  """A zoo whose cell `zoo recalibrate` fitted on 4 validation tasks and scored on 4 of its
  1000 test tasks (copy it before changing it)."""
  root = tmp_path_factory.mktemp("recalibrated")
  args = _zoo_of_one_cell(root)
  assert zoo.main([*args, "recalibrate", "--num-val-tasks", "4", "--num-test-tasks", "4"]) == 0
  return root


def _copy(recalibrated, tmp_path):
  shutil.copytree(recalibrated, tmp_path / "clone")
  root = tmp_path / "clone"
  return root, ["--zoo", str(root / "zoo"), "--readme", str(root / "README.md")]


def _files(folder) -> dict:
  """Every file under `folder` and its bytes."""
  return {
    p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
  }


def test_recalibrate_writes_the_map_beside_the_cell_and_its_numbers_in_the_manifest(
  tmp_path, capsys
):
  source = tmp_path / "source" / "maml"
  shutil.copytree(zoo.ZOO / CELL, source)
  zoo_dir, readme = tmp_path / "zoo", tmp_path / "README.md"
  zoo.add([source], zoo_dir)
  readme.write_text(f"{zoo.TABLE_START}\n{zoo.TABLE_END}\n")
  zoo.write_tables(zoo_dir, readme)
  args = ["--zoo", str(zoo_dir), "--readme", str(readme), "recalibrate"]
  assert zoo.main([*args, "--num-val-tasks", "3", "--num-test-tasks", "3"]) == 0
  assert "variance scale" in capsys.readouterr().out
  assert zoo.main(["--zoo", str(zoo_dir), "--readme", str(readme), "check"]) == 0

  entry = json.loads((zoo_dir / zoo.MANIFEST).read_text())["cells"][CELL]
  fitted, recalibrated = entry["recalibration"], entry["test_recalibrated"]
  assert fitted["method"] == "variance_scale" and fitted["num_tasks"] == 3
  assert recalibrated["num_tasks"] == 3 and recalibration.RECALIBRATION_FILE in entry["files"]
  run = vj.load_run(zoo_dir / CELL, recalibrated=True)  # its checksums hold the new file
  assert run.calibration.value == fitted["value"]
  assert run.noise_std == math.sqrt(fitted["value"]) * run.record["noise_std"]

  # One draw (MAML): the scale is the closed form mean((y - f)^2) / sigma^2 of the
  # validation queries, and the NLL under it the Gaussian's at that variance.
  raw = vj.load_run(zoo_dir / CELL)
  per_task = evaluation.evaluate_split(
    programs.split_evaluator(zoo_verify.make_problem(raw), raw._evaluator, "val"),
    raw.meta_params,
    programs.run_keys(raw.config.seed).val,
    3,
    3,
  )
  variance = np.mean(np.square(per_task["predictions"][:, 0] - per_task["targets"]))
  assert fitted["value"] == pytest.approx(variance / raw.noise_std**2, rel=1e-6)
  assert fitted["nll_after"] == pytest.approx(0.5 * (1 + math.log(2 * math.pi * variance)), 1e-6)


def test_a_classifiers_stored_test_is_scored_without_running_it_again():
  """A classifier's `test_per_task.npz` holds what a temperature needs: its summary of the
  stored probabilities is the cell's recorded test; a regressor's keeps no predictions."""
  from types import SimpleNamespace

  from experiments import zoo_recalibrate
  from vampire_jax.runs import kinds

  name = "omniglot_original_quick_protonet"
  entry = json.loads((zoo.ZOO / zoo.MANIFEST).read_text())["cells"][name]
  cell = SimpleNamespace(kind="classification", workdir=zoo.ZOO / name)
  stored = zoo_recalibrate.stored_test(cell, 200)
  metrics = kinds.summarise("classification", stored, num_bins=15).metrics
  for field in ("accuracy", "nll", "ece"):
    assert metrics[field] == pytest.approx(entry["test"][field], rel=1e-6), field
  assert len(zoo_recalibrate.stored_test(cell, 7)["nll"]) == 7
  assert zoo_recalibrate.stored_test(cell, 201) is None  # more tasks than it keeps
  regressor = SimpleNamespace(kind="regression", workdir=zoo.ZOO / CELL)
  assert zoo_recalibrate.stored_test(regressor, 3) is None


@pytest.mark.parametrize(
  "section, field, value",
  [
    ("test_recalibrated", "interval_90_coverage", 0.999),
    ("test_recalibrated", "nll", -5.0),
    ("test_recalibrated", "ece", 0.0),
    ("test_recalibrated", "num_tasks", 1000.0),  # the count the columns show
    ("test_raw_interval", "interval_90_coverage", 0.999),
    ("recalibration", "value", 2.0),
  ],
)
def test_an_edited_recalibrated_number_is_refused_by_table_and_check(
  recalibrated, tmp_path, capsys, section, field, value
):
  """A recalibrated number edited in the manifest (the cell's files untouched) is refused by
  `table` in one line naming the cell, the field and both values, and fails `check`; the
  numbers are those `zoo recalibrate` recorded in the cell's recalibration.json."""
  root, args = _copy(recalibrated, tmp_path)
  manifest = json.loads((root / "zoo" / zoo.MANIFEST).read_text())
  recorded = manifest["cells"][CELL][section][field]
  manifest["cells"][CELL][section][field] = value
  (root / "zoo" / zoo.MANIFEST).write_text(json.dumps(manifest))
  with pytest.raises(vj.ConfigError) as raised:
    zoo.main([*args, "table"])
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  wrong = f"zoo/{CELL}: the manifest's {section}.{field} {value!r} is not its "
  assert message.startswith(f"zoo table: {wrong}")
  assert f"recalibration.json's {recorded!r}" in message
  capsys.readouterr()
  assert zoo.main([*args, "check"]) == 1
  assert wrong in capsys.readouterr().out


def test_a_column_scored_on_a_subset_says_on_how_many_tasks(recalibrated, capsys):
  """Each recalibrated column of a cell scored on 4 of its 1000 test tasks (ECE, NLL, the
  90 % coverage) ends "(4 tasks)", an integer count; `check` passes on it."""
  readme = (recalibrated / "README.md").read_text()
  row = next(line for line in readme.splitlines() if f"`{CELL}`" in line)
  cells = [c.strip() for c in row.split("|")]
  coverage = next(c for c in cells if c.count(" %") == 2)
  assert coverage.endswith(" (4 tasks)"), coverage
  assert row.count(" (4 tasks)") == 3 and "4.0 tasks" not in row, row
  args = ["--zoo", str(recalibrated / "zoo"), "--readme", str(recalibrated / "README.md")]
  assert zoo.main([*args, "check"]) == 0


def test_recalibrate_refuses_a_readme_without_the_block_before_fitting(tmp_path):
  """A `--readme` without the zoo-table block is refused before any fit: the cause (no
  block) and the fix (put one where the table goes), and no file of the zoo changes."""
  args = _zoo_of_one_cell(tmp_path)
  (tmp_path / "README.md").write_text("no table here\n")
  before = _files(tmp_path)
  with pytest.raises(vj.ConfigError) as raised:
    zoo.main([*args, "recalibrate", "--num-val-tasks", "2", "--num-test-tasks", "2"])
  message = str(raised.value)
  assert message.startswith("zoo recalibrate: ") and f"has no {zoo.TABLE_START}" in message
  assert "put one where the table goes" in message
  assert _files(tmp_path) == before


def test_recalibrate_without_the_data_exits_non_zero_with_the_reason(tmp_path, monkeypatch, capsys):
  """A cell whose data is missing is found before any fit; a run that recalibrated no cell
  exits 2 (a user error) naming the cell and the reason, and writes nothing."""
  args = _zoo_of_one_cell(tmp_path)
  before = _files(tmp_path)

  def missing(run):
    raise vj.MissingDataError("no sine/line data at /nowhere; download it first")

  monkeypatch.setattr(zoo_verify, "make_problem", missing)
  code = zoo.entry([*args, "recalibrate", "--num-val-tasks", "2", "--num-test-tasks", "2"])
  captured = capsys.readouterr()
  assert code == 2, captured
  said = captured.out + captured.err
  assert re.search(rf"no cell recalibrated.*{CELL}.*MissingDataError.*download it first", said)
  assert _files(tmp_path) == before


def test_recalibrate_of_one_validation_task_gives_its_own_reason(capsys):
  """`recalibrate --num-val-tasks 1` is refused with the fit's reason (a map needs at least
  2 validation tasks), not verify's tolerance across machines."""
  with pytest.raises(SystemExit):
    zoo.parse_args(["recalibrate", "--num-val-tasks", "1"])
  last_line = capsys.readouterr().err.splitlines()[-1]
  assert "argument --num-val-tasks: 1 validation task is too few to fit a map" in last_line
  assert "at least 2" in last_line and "tolerance" not in last_line
