"""`python -m experiments.zoo recalibrate` (issue 61): a cell's map without retraining.

On a zoo in a temporary folder holding a copy of the repository's smallest cell (MAML,
one weight draw): the map is fitted on the cell's validation tasks, written beside the
run and into the manifest with the test scored both ways, and the zoo stays consistent.
"""

import json
import math
import shutil

import numpy as np
import pytest

import vampire_jax as vj
from experiments import zoo, zoo_verify
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.runs import programs, recalibration

CELL = "regression_cpu_maml"


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
  from vampire_jax._src.runs import kinds

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
