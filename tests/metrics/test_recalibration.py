"""Issue 61: `vj.recalibrate`, a map fitted by NLL on held-out tasks, saved with the run.

The fits are checked on predictives with a known miscalibration (the fitted parameter must
recover it) and on calibrated ones (it must stay 1); the maps against their definitions;
a recalibrated run's predict, predict_draws, predictive and evaluator against each other
and against `recalibrated_per_task`; the file it saves; the loop's `test_recalibrated`.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.metrics import recalibration as maps


def _student_tasks(rng, num_tasks, num_query=25, df=3.0):
  """One draw (a Gaussian predictive N(f, 0.3^2)) and Student-t targets about it."""
  predictions = rng.normal(0.0, 2.0, (num_tasks, 1, num_query, 1))
  targets = predictions[:, 0] + 0.3 * rng.standard_t(df, (num_tasks, num_query, 1))
  return predictions, targets


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


def _class_tasks(rng, true_temperature, num_tasks=50, num_query=40, num_classes=5):
  """Probabilities softmax(z) and labels drawn from softmax(z / true_temperature)."""
  logits = rng.normal(0.0, 3.0, (num_tasks, num_query, num_classes))
  truth = np.exp(logits / true_temperature)
  truth /= truth.sum(-1, keepdims=True)
  labels = (rng.random((num_tasks, num_query, 1)) > np.cumsum(truth, -1)).sum(-1)
  probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  return probabilities, np.minimum(labels, num_classes - 1)


def test_a_wrong_shape_is_mended_by_the_quantile_map_not_by_the_variance_scale():
  rng = np.random.default_rng(1)
  fitting = _student_tasks(rng, 40)
  scale = maps.fit_variance_scale(*fitting, 0.3)
  quantile = maps.fit_quantile(*fitting, 0.3)
  assert quantile.method == "quantile" and quantile.value == scale.value
  assert quantile.quantile_map.num_bins == 20 and quantile.nll_after < scale.nll_after
  assert maps.fit("regression", {"predictions": fitting[0], "targets": fitting[1]}, 0.3, "x") == (
    quantile
  )  # the default, with 1000 targets

  predictions, targets = _student_tasks(rng, 40)  # new tasks of the same shape
  per_task = {"predictions": predictions, "targets": targets}
  scores = {}
  for fitted in (scale, quantile):
    noise = maps.calibrated_noise_std(fitted, 0.3)
    mapped = maps.recalibrated_per_task(fitted, per_task, 0.3)
    pit = maps.predictive_pit(mapped["predictions"], targets, noise, fitted.quantile_map)
    interval = maps.interval_metrics(mapped, noise, fitted.quantile_map)
    scores[fitted.method] = (float(np.mean(mapped["nll"])), interval["interval_90_coverage"], pit)
  for method, (_, coverage, pit) in scores.items():
    ece = np.mean(np.abs(np.mean(pit.reshape(-1)[None] <= np.linspace(0.1, 0.9, 9)[:, None], 1)
                         - np.linspace(0.1, 0.9, 9)))  # fmt: skip
    scores[method] += (ece,)
  assert scores["quantile"][0] < scores["variance_scale"][0]  # NLL on new tasks
  assert abs(scores["quantile"][1] - 0.9) < 0.025, scores  # the 90 % interval holds 90 %
  assert scores["quantile"][3] < 0.5 * scores["variance_scale"][3], scores  # PIT ECE


def test_a_quantile_map_is_refused_on_too_few_targets_and_for_a_classifier():
  predictions, targets = _student_tasks(np.random.default_rng(2), 3)  # 75 targets
  with pytest.raises(vj.InputError, match=r"x: 75 query targets are too few for a quantile map"):
    maps.fit("regression", {"predictions": predictions, "targets": targets}, 0.3, "x", "quantile")
  fitted = maps.fit("regression", {"predictions": predictions, "targets": targets}, 0.3, "x")
  assert fitted.method == "variance_scale"  # the default on fewer than 100 targets
  with pytest.raises(vj.InputError, match=r"method must be 'temperature' for a classification"):
    maps.check_method("x", "classification", "quantile")


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
