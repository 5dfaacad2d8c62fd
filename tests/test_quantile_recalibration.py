"""Issue 61: quantile recalibration (Kuleshov et al. 2018), a map R of the predictive's CDF.

The map against its definition (the empirical CDF at its knots, a density that integrates
to one); a fit on predictives of a known wrong shape (a Gaussian for Student-t targets),
which the variance scale cannot mend and R must; the recalibrated predictive's CDF,
density, quantiles, interval, mean and variance against each other and numerical
integration; a run recalibrated by it: its predictive, samples and evaluator against
`recalibrated_per_task`, and its file.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import untrained_regression_run

import vampire_jax as vj
from vampire_jax._src.metrics import evaluation, predictive_distributions
from vampire_jax._src.metrics import quantile_map as qm
from vampire_jax._src.metrics import recalibration as maps
from vampire_jax.runs import recalibration

# -- The map -----------------------------------------------------------------------------------


def test_the_map_is_the_empirical_cdf_at_its_knots_and_its_slope_a_density():
  pit = np.random.default_rng(0).beta(0.4, 0.4, 1000)  # an overconfident predictive's PIT values
  fitted = qm.fit(pit, qm.num_bins(pit.size))
  assert fitted.num_bins == 20 and fitted.pit[0] == 0.0 and fitted.pit[-1] == 1.0
  for u, level in zip(fitted.pit[1:-1], fitted.level[1:-1]):
    assert np.mean(pit <= u) == pytest.approx(level, abs=1.5e-3)  # the empirical CDF there
  u = np.linspace(0.0, 1.0, 200_001)
  assert np.all(np.diff(fitted(u)) >= 0)
  # R' integrates to R(1) - R(0) = 1, and R^-1 undoes R.
  assert np.trapezoid(np.exp(fitted.log_slope(u)), u) == pytest.approx(1.0, abs=1e-3)
  np.testing.assert_allclose(fitted.inverse(fitted(u)), u, atol=1e-12)
  # Ties (targets far outside the predictive, PIT values that round to 1) stay apart.
  tied = qm.fit(np.r_[np.full(900, 1.0), np.linspace(0, 1, 100)], 20)
  assert np.all(np.diff(tied.pit) > 0) and np.all(np.isfinite(tied.log_slope(u)))
  assert qm.from_record(json.loads(json.dumps(qm.to_record(fitted)))) == fitted
  with pytest.raises(ValueError, match="increase strictly"):
    qm.from_record({"pit": [0.0, 0.7, 0.5, 1.0], "level": [0.0, 0.3, 0.6, 1.0]})


def _student_tasks(rng, num_tasks, num_query=25, df=3.0):
  """One draw (a Gaussian predictive N(f, 0.3^2)) and Student-t targets about it."""
  predictions = rng.normal(0.0, 2.0, (num_tasks, 1, num_query, 1))
  targets = predictions[:, 0] + 0.3 * rng.standard_t(df, (num_tasks, num_query, 1))
  return predictions, targets


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


# -- The recalibrated predictive ----------------------------------------------------------------


def _predictive(num_query=4, num_draws=16):
  rng = np.random.default_rng(3)
  nll = vj.gaussian_nll(0.3)
  nll.quantile_map = qm.fit(rng.beta(0.5, 0.5, 2000), 20)
  outputs = jnp.asarray(rng.normal(0.0, 1.0, (num_draws, num_query, 1)), jnp.float32)
  return vj.predictive_distribution(outputs, nll), outputs, nll


def test_the_recalibrated_density_cdf_quantiles_and_moments_agree():
  dist, outputs, nll = _predictive()
  assert isinstance(dist, predictive_distributions.RecalibratedPredictive)
  with pytest.raises(vj.InputError, match=r"value must be shaped \[4, 1\]"):
    dist.log_prob(jnp.zeros(4))
  y = jnp.linspace(-6.0, 6.0, 6001)[:, None, None] * jnp.ones((1, 4, 1))
  levels = jnp.array([[0.01], [0.3], [0.5], [0.99]])

  @jax.jit  # one program: each of these alone, eagerly, compiles its own loops
  def everything(outputs):
    dist = vj.predictive_distribution(outputs, nll)
    lower, upper = vj.predictive_interval(dist)
    samples = dist.sample(seed=jax.random.key(0), sample_shape=2000)
    return dict(
      density=jnp.exp(jax.vmap(dist.log_prob)(y)),
      cdf=jax.vmap(dist.cdf)(y)[..., 0],
      mean=dist.mean()[:, 0],
      variance=dist.variance()[:, 0],
      inverted=dist.cdf(dist.quantile(levels)),
      mass=dist.cdf(upper) - dist.cdf(lower),
      below=jnp.mean(samples <= upper, 0),
    )

  got = {name: np.asarray(value, np.float64) for name, value in everything(outputs).items()}
  grid, density = np.asarray(y[:, 0, 0], np.float64), got["density"]  # [grid, query]
  # The CDF is the density's integral, and that integral is one.
  steps = 0.5 * (density[1:] + density[:-1]) * np.diff(grid)[:, None]
  integral = np.concatenate([np.zeros((1, 4)), np.cumsum(steps, axis=0)])
  np.testing.assert_allclose(integral, got["cdf"] - got["cdf"][0], atol=1e-3)
  np.testing.assert_allclose(integral[-1], 1.0, atol=1e-3)
  mean = np.trapezoid(density * grid[:, None], grid, axis=0)
  variance = np.trapezoid(density * (grid[:, None] - mean) ** 2, grid, axis=0)
  np.testing.assert_allclose(got["mean"], mean, atol=2e-3)
  np.testing.assert_allclose(got["variance"], variance, rtol=5e-3)
  # The quantiles invert the CDF; the central 90 % interval holds 90 % of the mass, and of
  # the samples.
  np.testing.assert_allclose(got["inverted"], levels, atol=1e-5)
  np.testing.assert_allclose(got["mass"], 0.9, atol=1e-5)
  np.testing.assert_allclose(got["below"], 0.95, atol=0.025)


def test_the_recalibrated_predictive_jits_and_vmaps_over_tasks():
  _, outputs, nll = _predictive()
  tasks = jnp.stack([outputs, outputs + 1.0])  # [tasks, draws, query, 1]
  targets = jnp.zeros((2, 4, 1))

  def score(task_outputs, task_targets):
    dist = vj.predictive_distribution(task_outputs, nll)
    return dist.log_prob(task_targets), vj.predictive_interval(dist)[0]

  batched = jax.jit(jax.vmap(score))(tasks, targets)
  for i in range(2):
    one = score(tasks[i], targets[i])
    for got, wanted in zip(batched, one):
      np.testing.assert_allclose(got[i], wanted, rtol=1e-5, atol=1e-5)


# -- A run recalibrated by a quantile map --------------------------------------------------------


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
  """An untrained VAMPIRE regression `vj.Run` and 10 validation tasks (100 targets)."""
  return untrained_regression_run(tmp_path_factory.mktemp("run"), 10)


def test_a_run_recalibrated_by_a_quantile_map_predicts_and_scores_its_predictive(
  regression_run, tmp_path
):
  run, tasks = regression_run
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
