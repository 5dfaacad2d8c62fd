"""Issue 61: `vj.recalibrate`, a map fitted by NLL on held-out tasks, saved with the run.

The fits are checked on predictives with a known miscalibration (the fitted parameter must
recover it) and on calibrated ones (it must stay 1); the maps against their definitions;
a recalibrated run's predict, predict_draws, predictive and evaluator against each other
and against `recalibrated_per_task`; the file it saves; the loop's `test_recalibrated`.
"""

import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import needs_omniglot, untrained_regression_run

import vampire_jax as vj
from vampire_jax._src.metrics import recalibration as maps
from vampire_jax.runs import recalibration, run_folder

# -- Fits on predictives of known miscalibration ------------------------------------------------


def _mixture_tasks(rng, true_scale, num_tasks=40, num_query=25, num_draws=16, noise_std=0.3):
  """Draws `[tasks, draws, query, 1]` and targets drawn from the mixture scaled by `true_scale`.

  Target = m + sqrt(true_scale) (d_k + sigma eps): component k of the draws at random, so
  the raw predictive mean_l N(m + d_l, sigma^2) is miscalibrated by exactly that scale.
  """
  means = rng.normal(0.0, 2.0, (num_tasks, 1, num_query, 1))
  offsets = rng.normal(0.0, 0.5, (num_tasks, num_draws, num_query, 1))
  offsets -= offsets.mean(axis=1, keepdims=True)
  component = rng.integers(0, num_draws, (num_tasks, num_query))
  picked = np.take_along_axis(offsets[..., 0], component[:, None, :], axis=1)[:, 0]
  noise = noise_std * rng.normal(size=(num_tasks, num_query))
  targets = means[:, 0, :, 0] + math.sqrt(true_scale) * (picked + noise)
  return means + offsets, targets[..., None]


@pytest.mark.parametrize("true_scale", [0.25, 4.0])
def test_a_known_variance_miscalibration_is_recovered(true_scale):
  rng = np.random.default_rng(0)
  predictions, targets = _mixture_tasks(rng, true_scale)
  fitted = maps.fit_variance_scale(predictions, targets, 0.3)
  assert fitted.method == "variance_scale" and fitted.num_tasks == 40
  assert fitted.value == pytest.approx(true_scale, rel=0.1)
  assert fitted.nll_after < fitted.nll_before


def test_the_recalibrated_interval_covers_what_it_claims_on_new_tasks():
  rng = np.random.default_rng(1)
  fitted = maps.fit_variance_scale(*_mixture_tasks(rng, 4.0), 0.3)
  predictions, targets = _mixture_tasks(rng, 4.0)  # new tasks of the same miscalibration
  per_task = {"predictions": predictions, "targets": targets}
  raw = maps.interval_metrics(per_task, 0.3)["interval_90_coverage"]
  scaled = maps.recalibrated_per_task(fitted, per_task, 0.3)
  noise = maps.calibrated_noise_std(fitted, 0.3)
  coverage = maps.interval_metrics(scaled, noise)["interval_90_coverage"]
  assert raw < 0.7 and abs(coverage - 0.9) < 0.03, (raw, coverage)


def test_a_point_estimate_gets_the_closed_form_scale():
  """One draw (MAML): the NLL of N(y; f, s sigma^2) is least at s = mean((y - f)^2) / sigma^2."""
  rng = np.random.default_rng(2)
  predictions = rng.normal(size=(5, 1, 8, 1))
  targets = predictions[:, 0] + rng.normal(0.0, 0.7, (5, 8, 1))
  fitted = maps.fit_variance_scale(predictions, targets, 0.3)
  closed_form = np.mean(np.square(targets - predictions[:, 0])) / 0.3**2
  assert fitted.value == pytest.approx(closed_form, rel=1e-6)


def _class_tasks(rng, true_temperature, num_tasks=50, num_query=40, num_classes=5):
  """Probabilities softmax(z) and labels drawn from softmax(z / true_temperature)."""
  logits = rng.normal(0.0, 3.0, (num_tasks, num_query, num_classes))
  truth = np.exp(logits / true_temperature)
  truth /= truth.sum(-1, keepdims=True)
  labels = (rng.random((num_tasks, num_query, 1)) > np.cumsum(truth, -1)).sum(-1)
  probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  return probabilities, np.minimum(labels, num_classes - 1)


@pytest.mark.parametrize("true_temperature", [1.0, 2.0, 0.5])
def test_a_known_temperature_is_recovered_and_a_calibrated_one_stays_one(true_temperature):
  probabilities, labels = _class_tasks(np.random.default_rng(3), true_temperature)
  fitted = maps.fit_temperature(probabilities, labels)
  assert fitted.method == "temperature"
  assert fitted.value == pytest.approx(true_temperature, rel=0.08)


def test_the_fit_is_refused_in_one_line_when_it_cannot_be_made():
  probabilities, labels = _class_tasks(np.random.default_rng(4), 1.0)
  with pytest.raises(vj.InputError, match=r"1 task is too few to fit a map \(at least 2"):
    maps.fit_temperature(probabilities[:1], labels[:1])
  with pytest.raises(vj.InputError, match=r"leading task axis and match"):
    maps.fit_temperature(probabilities, labels[:, :3])
  with pytest.raises(vj.InputError, match="not finite"):
    maps.fit_temperature(np.where(probabilities > 0.5, np.nan, probabilities), labels)
  # Targets on the draws exactly: the NLL falls without end as the spread shrinks.
  draws = np.zeros((3, 2, 4, 1))
  with pytest.raises(vj.InputError, match=r"keeps falling towards a variance scale of 0.0001"):
    maps.fit_variance_scale(draws, draws[:, 0], 0.3)


# -- The maps on a task's outputs ---------------------------------------------------------------


def test_a_temperature_moves_the_draws_mean_to_the_tempered_predictive():
  logits = 3.0 * jax.random.normal(jax.random.key(0), (6, 20, 5))  # [draws, query, classes]
  mean = jnp.mean(jax.nn.softmax(logits), axis=0)
  for temperature in (0.3, 1.0, 2.5):
    calibration = maps.Calibration("temperature", temperature, 2, 0.0, 0.0)
    draws = jax.nn.softmax(maps.calibrate_outputs(calibration, logits))
    tempered = jax.nn.softmax(jnp.log(mean) / temperature)
    np.testing.assert_allclose(jnp.mean(draws, 0), tempered, atol=2e-6)
    np.testing.assert_allclose(jnp.sum(draws, -1), 1.0, atol=1e-6)
    assert jnp.all(draws >= 0) and jnp.all(jnp.argmax(tempered, -1) == jnp.argmax(mean, -1))
  one = maps.Calibration("temperature", 1.0, 2, 0.0, 0.0)
  np.testing.assert_allclose(
    jax.nn.softmax(maps.calibrate_outputs(one, logits)), jax.nn.softmax(logits), atol=2e-6
  )


def test_a_variance_scale_scales_the_predictive_variance_about_its_mean():
  outputs = jax.random.normal(jax.random.key(1), (7, 9, 1))
  calibration = maps.Calibration("variance_scale", 2.7, 2, 0.0, 0.0)
  raw = vj.predictive_distribution(outputs, vj.gaussian_nll(0.3))
  scaled = vj.predictive_distribution(
    maps.calibrate_outputs(calibration, outputs),
    vj.gaussian_nll(maps.calibrated_noise_std(calibration, 0.3)),
  )
  np.testing.assert_allclose(scaled.mean(), raw.mean(), atol=1e-6)
  np.testing.assert_allclose(scaled.variance(), 2.7 * raw.variance(), rtol=1e-5)


# -- A run, recalibrated ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
  """An untrained VAMPIRE regression `vj.Run` (its record as training writes it), and tasks."""
  return untrained_regression_run(tmp_path_factory.mktemp("run"), 6)


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


# -- Saved with a trained run; the loop's numbers -----------------------------------------------


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


# -- Saved where it does no harm (issue 71) -----------------------------------------------------

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
