import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.conftest import needs_omniglot, untrained_regression_run
from vampire_jax._src.metrics import evaluation, predictive_distributions
from vampire_jax._src.metrics import recalibration as maps
from vampire_jax.runs import recalibration, run_folder


@pytest.fixture(scope="module")
def quantile_mapped_run(tmp_path_factory):
  """An untrained VAMPIRE regression `vj.Run` and 10 validation tasks (100 targets)."""
  return untrained_regression_run(tmp_path_factory.mktemp("run"), 10)


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
  """An untrained VAMPIRE regression `vj.Run` (its record as training writes it), and tasks."""
  return untrained_regression_run(tmp_path_factory.mktemp("run"), 6)


ZOO_CELL = "regression_cpu_maml"  # the smallest cell (0.4 MB), its map recorded in the manifest


def _zoo_of_one_cell(tmp_path, without_map=False):
  """A copy of `ZOO_CELL` with a manifest holding its entry (the files' sha256), as
  test_checksummed_runs makes one; `without_map`: neither `recalibration.json` nor its entry
  (a cell recorded before issue 61). The real zoo/ is only read."""
  from experiments import zoo

  cell = tmp_path / "zoo" / ZOO_CELL
  shutil.copytree(zoo.ZOO / ZOO_CELL, cell)
  entry = zoo.read_manifest(zoo.ZOO)["cells"][ZOO_CELL]
  if without_map:
    (cell / recalibration.RECALIBRATION_FILE).unlink()
    entry["files"].pop(recalibration.RECALIBRATION_FILE)
  manifest = {"format": 1, "cells": {ZOO_CELL: entry}}
  (cell.parent / "manifest.json").write_text(json.dumps(manifest))
  return cell


def test_a_run_recalibrated_by_a_quantile_map_predicts_and_scores_its_predictive(
  quantile_mapped_run, tmp_path
):
  run, tasks = quantile_mapped_run
  fitted = vj.recalibrate(run, tasks, jax.random.key(3))  # the default on 100 targets
  calibration = fitted.calibration
  assert calibration.method == "quantile" and calibration.quantile_map.num_bins == 2
  assert fitted.noise_std == pytest.approx(run.noise_std * math.sqrt(calibration.value))
  assert vj.recalibrate(run, tasks, jax.random.key(3), method="quantile").calibration == calibration
  scale = vj.recalibrate(run, tasks, jax.random.key(3), method="variance_scale").calibration
  assert scale.value == calibration.value and scale.quantile_map is None

  # The evaluator scores the map's NLL, as `recalibrated_per_task` makes it of the raw run.
  key = jax.random.key(5)
  scored = recalibration.evaluate_tasks(fitted, tasks, key, 10)
  mapped = maps.recalibrated_per_task(
    calibration, recalibration.evaluate_tasks(run, tasks, key, 10), run.noise_std
  )
  for field in ("mse", "nll", "predictions"):
    np.testing.assert_allclose(scored[field], mapped[field], rtol=1e-4, atol=1e-5)
  # Task 0's predictive, with its key of the evaluator's split: the same NLL and interval.
  task = jax.tree.map(lambda field: field[0], tasks)
  task_key = evaluation.per_task_keys(key, 10)[0]
  dist = fitted.predictive(task.support_x, task.support_y, task.query_x, task_key)
  assert isinstance(dist, predictive_distributions.RecalibratedPredictive)
  assert -float(jnp.mean(dist.log_prob(task.query_y))) == pytest.approx(scored["nll"][0], 1e-4)
  lower, upper = vj.predictive_interval(dist)
  covered = (task.query_y >= lower) & (task.query_y <= upper)
  in_summary = maps.interval_coverage(
    mapped["predictions"], mapped["targets"], fitted.noise_std, qmap=calibration.quantile_map
  )
  np.testing.assert_array_equal(covered[:, 0], in_summary[0])
  samples = fitted.predict(task.support_x, task.support_y, task.query_x, task_key, num_samples=7)
  assert samples.shape == (7, 10, 1) and bool(jnp.all(jnp.isfinite(samples)))

  # Saved and read back whole (the knots included); refused for a method it does not know.
  path = fitted.save(tmp_path)
  assert json.loads(path.read_text())["quantile_map"]["level"] == [0.0, 0.5, 1.0]
  assert recalibration.read_calibration(tmp_path, run.record) == (calibration, 0)
  with pytest.raises(vj.InputError, match=r"method must be 'quantile' or 'variance_scale'"):
    vj.recalibrate(run, tasks, jax.random.key(3), method="temperature")


def test_a_recalibrated_run_predicts_what_its_map_makes_of_the_raw_run(regression_run):
  run, tasks = regression_run
  recalibrated = vj.recalibrate(run, tasks, jax.random.key(3))
  scale = recalibrated.calibration.value
  assert run.calibration is None and recalibrated.calibration.method == "variance_scale"
  assert recalibrated.noise_std == pytest.approx(run.noise_std * math.sqrt(scale))
  # Deterministic for a key; fitted afresh from the raw predictive when recalibrated again.
  assert vj.recalibrate(run, tasks, jax.random.key(3)).calibration == recalibrated.calibration
  again = vj.recalibrate(recalibrated, tasks, jax.random.key(3))
  assert again.calibration == recalibrated.calibration

  task = jax.tree.map(lambda field: field[0], tasks)
  args = (task.support_x, task.support_y, task.query_x, jax.random.key(4))
  raw_draws, draws = run.predict_function_draws(*args), recalibrated.predict_function_draws(*args)
  mean = jnp.mean(raw_draws, 0)
  np.testing.assert_allclose(draws, mean + math.sqrt(scale) * (raw_draws - mean), rtol=1e-5)
  raw, dist = run.predictive(*args), recalibrated.predictive(*args)
  np.testing.assert_allclose(dist.variance(), scale * raw.variance(), rtol=1e-4)
  samples = recalibrated.predict_draws(*args)  # draw l plus its noise of sqrt(s) sigma
  noise = (samples - draws) / recalibrated.noise_std
  np.testing.assert_allclose(noise, (run.predict_draws(*args) - raw_draws) / run.noise_std, 1e-4)

  # The evaluator built from the run scores what `recalibrated_per_task` makes of the raw one.
  key = jax.random.key(5)
  scored = recalibration.evaluate_tasks(recalibrated, tasks, key, 6)
  mapped = maps.recalibrated_per_task(
    recalibrated.calibration, recalibration.evaluate_tasks(run, tasks, key, 6), run.noise_std
  )
  for field in ("mse", "predictive_mean_mse", "nll", "predictions"):
    np.testing.assert_allclose(scored[field], mapped[field], rtol=1e-4, atol=1e-5)


def test_recalibrate_refuses_what_it_cannot_fit_by_name(regression_run):
  run, tasks = regression_run
  key = jax.random.key(0)
  one = jax.tree.map(lambda field: field[:1], tasks)
  with pytest.raises(vj.InputError, match=r"vj.recalibrate: tasks must be at least 2 tasks"):
    vj.recalibrate(run, one, key)
  labels = tasks._replace(support_y=jnp.zeros(tasks.support_y.shape[:2], jnp.int32))
  with pytest.raises(vj.InputError, match=r"tasks.support_y must be \[tasks, n, 1\] float"):
    vj.recalibrate(run, labels, key)
  with pytest.raises(vj.InputError, match=r"tasks.query_x must be \[tasks, n, 1\]"):
    vj.recalibrate(run, tasks._replace(query_x=tasks.query_x[..., None]), key)
  with pytest.raises(vj.InputError, match=r"vj.recalibrate: tasks must be a vampire_jax.Task"):
    vj.recalibrate(run, tuple(tasks), key)
  with pytest.raises(vj.InputError, match=r"vj.recalibrate: run must be a vj.Run"):
    vj.recalibrate("runs/x", tasks, key)
  with pytest.raises(vj.InputError, match="no calibration to save"):
    run.save()


@needs_omniglot
def test_the_loop_recalibrates_on_validation_and_saves_the_map(tiny_omniglot_run, tmp_path):
  workdir, config, results = tiny_omniglot_run
  fitted = results["recalibration"]
  assert (
    fitted["method"] == "temperature" and fitted["num_tasks"] == config.evaluation.num_val_tasks
  )
  assert fitted["nll_after"] <= fitted["nll_before"]
  raw, recalibrated = results["test"], results["test_recalibrated"]
  assert recalibrated["accuracy"] == raw["accuracy"]  # a temperature keeps every arg max
  copy = tmp_path / "run"  # the shared run stays as it is
  shutil.copytree(workdir, copy)
  loaded = vj.load_run(copy, recalibrated=True)
  assert loaded.calibration.value == fitted["value"]
  # The recalibrated test is the raw test's per-task results under the saved map.
  with np.load(copy / run_folder.PER_TASK_FILE) as saved:
    per_task = {k: saved[k] for k in ("accuracy", "nll", "probabilities", "targets")}
  summary = recalibration.recalibrated_summary(
    "classification", loaded.calibration, per_task, config.evaluation.num_bins, None
  )
  for name in ("nll", "ece", "mce", "accuracy"):
    assert summary.metrics[name] == pytest.approx(recalibrated[name], rel=1e-9), name

  # Without the file: refused in one line, before the checkpoint is read; saved, loaded again.
  (copy / recalibration.RECALIBRATION_FILE).unlink()
  with pytest.raises(vj.RunFolderError, match=r"has no recalibration.json; make one with vj"):
    vj.load_run(copy, recalibrated=True)
  assert loaded.save() == copy / recalibration.RECALIBRATION_FILE
  reloaded = vj.load_run(copy, recalibrated=True)
  assert reloaded.calibration == loaded.calibration and reloaded.step == loaded.step

  from experiments import omniglot

  tasks = vj.draw_tasks(omniglot.make_problem(reloaded.config), "test", jax.random.key(0), 2)
  with pytest.raises(vj.InputError, match=r"tasks.query_y must be \[tasks, n\] integer labels"):
    vj.recalibrate(
      reloaded, tasks._replace(query_y=tasks.query_y[..., None] * 1.0), jax.random.key(1)
    )
  task = jax.tree.map(lambda field: field[0], tasks)
  args = (task.support_x, task.support_y, task.query_x, jax.random.key(2))
  probabilities = reloaded.predict(*args)
  np.testing.assert_allclose(jnp.mean(reloaded.predict_draws(*args), 0), probabilities, atol=1e-6)
  raw_probabilities = reloaded._with_calibration(None).predict(*args)
  tempered = jax.nn.softmax(jnp.log(raw_probabilities) / reloaded.calibration.value)
  np.testing.assert_allclose(probabilities, tempered, atol=2e-6)


def test_a_map_saved_into_a_zoo_cell_is_refused_and_the_cell_stays_loadable(tmp_path):
  """`vj.recalibrate(vj.load_run(cell), ...).save()` on a zoo cell, whose manifest records
  another `recalibration.json`, is refused in one line naming the cause and the routes that
  work (the zoo's recalibrate command, a copy outside the zoo), and leaves every file of the
  cell as recorded: the cell still loads, raw and recalibrated, and the zoo checks clean.
  The map the manifest records may be saved again (the same bytes), and the refused map
  saved into a copy of the cell outside the zoo loads with it."""
  from experiments import zoo, zoo_verify

  cell = _zoo_of_one_cell(tmp_path)
  recorded = zoo.checksums(cell)
  run = vj.load_run(cell)
  tasks = vj.draw_tasks(zoo_verify.make_problem(run), "val", jax.random.key(0), 4)
  recalibrated = vj.recalibrate(run, tasks, jax.random.key(1))
  for save in (
    recalibrated.save,
    lambda: recalibration.write_calibration(cell, recalibrated.calibration, run.record, run.step),
  ):
    with pytest.raises(vj.RunFolderError) as refused:
      save()
    message = str(refused.value)
    assert "\n" not in message and "cell of a zoo" in message, message
    assert str(cell.parent.resolve() / "manifest.json") in message, message
    assert "python -m experiments.zoo recalibrate, naming the cell" in message, message
    assert f"({ZOO_CELL};" in message, message
    assert "copy of the folder outside the zoo" in message, message
    assert zoo.checksums(cell) == recorded
  assert zoo.check_cells(cell.parent) == []
  assert vj.load_run(cell).step == run.step
  as_recorded = vj.load_run(cell, recalibrated=True)
  assert as_recorded.save() == cell / recalibration.RECALIBRATION_FILE  # the same bytes
  assert zoo.checksums(cell) == recorded

  copy = tmp_path / "mine"  # outside a zoo: not checked, the run's own id
  shutil.copytree(cell, copy)
  recalibrated.save(copy)
  assert vj.load_run(copy, recalibrated=True).calibration == recalibrated.calibration


def test_a_zoo_cell_without_a_map_names_the_zoo_command_not_a_save(tmp_path):
  """`load_run(cell, recalibrated=True)` on a zoo cell without `recalibration.json` sends the
  user to the zoo's recalibrate command (which records the file in the manifest), not to
  `vj.recalibrate(...).save()`, which the cell refuses; a folder outside a zoo keeps the
  advice to save one."""
  cell = _zoo_of_one_cell(tmp_path, without_map=True)
  with pytest.raises(vj.RunFolderError) as refused:
    vj.load_run(cell, recalibrated=True)
  message = str(refused.value)
  assert "has no recalibration.json" in message and "cell of a zoo" in message, message
  assert "python -m experiments.zoo recalibrate, naming the cell" in message, message
  assert f"({ZOO_CELL};" in message, message
  assert ".save()" not in message, message
  copy = tmp_path / "mine"
  shutil.copytree(cell, copy)
  with pytest.raises(vj.RunFolderError, match=r"has no recalibration.json; make one with vj"):
    vj.load_run(copy, recalibrated=True)


def test_save_refuses_the_folder_of_another_run_and_keeps_its_map(regression_run, tmp_path):
  """`Run.save(folder)` where `folder` holds another run (another `run_id` in its `run.json`)
  is refused in one line naming both ids (short) and the fix, and that run's own
  `recalibration.json` is left as it was (it still loads recalibrated); an empty folder and
  the run's own folder take the map as before."""
  raw, _ = regression_run
  mine_record, theirs_record = (dict(raw.record, run_id=c * 32) for c in "ab")
  mine = tmp_path / "mine"
  run_folder.make_folder(mine)
  run_folder.write_json(mine / run_folder.RUN_RECORD, mine_record)
  run = vj.Run(mine, mine_record, raw.config, raw.meta_params, raw.learner, step=0)
  saving = run._with_calibration(maps.Calibration("variance_scale", 2.0, 6, 1.0, 0.5))

  theirs = tmp_path / "theirs"
  run_folder.make_folder(theirs)
  run_folder.write_json(theirs / run_folder.RUN_RECORD, theirs_record)
  their_map = maps.Calibration("variance_scale", 3.0, 6, 1.0, 0.5)
  recalibration.write_calibration(theirs, their_map, theirs_record, 0)
  before = (theirs / recalibration.RECALIBRATION_FILE).read_bytes()

  with pytest.raises(vj.RunFolderError) as refused:
    saving.save(theirs)
  message = str(refused.value)
  assert "\n" not in message and "another run" in message, message
  assert "a" * 8 in message and "b" * 8 in message and "a" * 32 not in message, message
  assert "an empty folder" in message and "own folder" in message, message
  assert (theirs / recalibration.RECALIBRATION_FILE).read_bytes() == before
  assert recalibration.read_calibration(theirs, theirs_record)[0] == their_map

  (tmp_path / "empty").mkdir()
  for folder in (tmp_path / "empty", mine):
    assert saving.save(folder) == folder / recalibration.RECALIBRATION_FILE
    assert recalibration.read_calibration(folder, mine_record)[0] == saving.calibration


def test_summarise_of_a_recalibrated_runs_results_names_the_recalibration(quantile_mapped_run):
  run, tasks = quantile_mapped_run
  fitted = vj.recalibrate(run, tasks, jax.random.key(3))
  per_task = recalibration.evaluate_tasks(fitted, tasks, jax.random.key(5), 10)
  with pytest.raises(vj.InputError) as refused:
    vj.summarise("regression", per_task, noise_std=fitted.noise_std)
  message = str(refused.value)
  assert len(message.splitlines()) == 1, message
  for part in (f"noise_std {fitted.noise_std:g}", "recalibrated", "raw noise_std"):
    assert part in message, message
  # The raw run's results, with the raw noise_std, are summarised.
  raw = recalibration.evaluate_tasks(run, tasks, jax.random.key(5), 10)
  summary = vj.summarise("regression", raw, noise_std=run.noise_std)
  assert summary.metrics["num_tasks"] == 10


def test_a_saved_map_of_another_kind_says_the_method_does_not_fit_the_kind(regression_run):
  run, tasks = regression_run
  path = vj.recalibrate(run, tasks, jax.random.key(3)).save()  # the file it wrote
  folder = path.parent
  saved = json.loads(path.read_text())
  try:
    temperature = {**saved, "method": "temperature", "value": 1.5, "quantile_map": None}
    path.write_text(json.dumps(temperature))
    with pytest.raises(vj.RunFolderError) as refused:
      recalibration.read_calibration(folder, run.record)  # as load_run(recalibrated=True)
    message = str(refused.value)
    assert "temperature map, which does not fit a regression run" in message, message
    assert "quantile, variance_scale" in message and "fit and save it again" in message
    path.write_text(json.dumps({**saved, "kind": "classification"}))
    with pytest.raises(vj.RunFolderError, match="fitted for a classification run, not a regr"):
      recalibration.read_calibration(folder, run.record)
  finally:
    path.unlink()
