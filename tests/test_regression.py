"""The sine/line task family, the regression experiment's summary, and short runs that must learn."""

import json
import math

import jax
import jax.numpy as jnp
import chex
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax.runs import algorithms as algorithms_lib
from vampire_jax.runs import problem as problem_lib
from experiments import cli, regression
from vampire_jax._src.metrics import calibration, summary_inputs
from vampire_jax.runs import config_records, kinds
from vampire_jax.data import sine_line
from vampire_jax._src.core.errors import ConfigError


def test_task_generator_ranges_and_mixture():
  tasks, functions = sine_line.sample_tasks_and_functions(
    jax.random.key(0), 20_000, num_support=5, num_query=7, noise_std=0.3
  )
  assert tasks.support_x.shape == tasks.support_y.shape == (20_000, 5, 1)
  assert tasks.query_x.shape == tasks.query_y.shape == (20_000, 7, 1)
  f = jax.tree_util.tree_map(np.asarray, functions)
  assert 0.1 <= f.amplitude.min() and f.amplitude.max() <= 5.0
  assert 0.0 <= f.phase.min() and f.phase.max() <= math.pi
  for v in (f.slope, f.intercept):
    assert -3.0 <= v.min() and v.max() <= 3.0 and v.max() - v.min() > 5.9
  x = np.concatenate([tasks.support_x, tasks.query_x], axis=1)
  assert -5.0 <= x.min() and x.max() <= 5.0 and x.max() - x.min() > 9.9
  # Half sinusoids, half lines: 20 000 Bernoulli(1/2) draws, 5 sigma = 0.018.
  assert abs(f.is_sine.mean() - 0.5) < 0.018
  # The noise: residuals about the true functions have mean 0 and std 0.3.
  y = np.concatenate([tasks.support_y, tasks.query_y], axis=1)
  residual = y - np.asarray(sine_line.evaluate_functions(functions, x))
  assert abs(residual.mean()) < 0.003 and abs(residual.std() - 0.3) < 0.003
  # Uniform amplitudes: mean (0.1 + 5) / 2.
  assert abs(f.amplitude.mean() - 2.55) < 0.03


def test_functions_by_hand_and_determinism():
  functions = sine_line.TaskFunctions(
    is_sine=jnp.array([True, False]),
    amplitude=jnp.array([2.0, 9.0]),
    phase=jnp.array([0.5, 9.0]),
    slope=jnp.array([9.0, -1.5]),
    intercept=jnp.array([9.0, 2.0]),
  )
  x = jnp.array([[[0.0], [1.0]], [[0.0], [4.0]]])
  np.testing.assert_allclose(
    sine_line.evaluate_functions(functions, x)[..., 0],
    [[2 * math.sin(0.5), 2 * math.sin(1.5)], [2.0, -4.0]],
    rtol=1e-6,
  )
  a = sine_line.sample_tasks(jax.random.key(3), 4)
  b = jax.jit(sine_line.sample_tasks, static_argnums=1)(jax.random.key(3), 4)
  c = sine_line.sample_tasks(jax.random.key(4), 4)
  for u, v, w in zip(a, b, c):
    np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-6)  # jit may round sin differently
    assert not np.allclose(u, w)
  with pytest.raises(ValueError, match="num_support"):
    sine_line.sample_tasks(jax.random.key(0), 4, num_support=0)


def test_splits_draw_different_tasks_and_the_truth_matches_the_queries():
  config = regression.get_config("quick", "maml")
  problem = regression.make_problem(config)
  key = jax.random.key(0)
  train = problem_lib.draw_tasks(problem, "train", key, 3)
  test = problem_lib.draw_tasks(problem, "test", key, 3)
  assert not np.allclose(train.support_x, test.support_x)
  # The noiseless truth of the sampled tasks: the targets are it plus N(0, 0.3^2) noise.
  keys = jax.random.split(jax.random.key(1), 2000)
  tasks = problem.sample_tasks(problem.splits["val"], keys)
  truth = problem.query_truth(problem.splits["val"], keys)
  residual = np.asarray(tasks.query_y - truth)
  assert abs(residual.mean()) < 0.01 and abs(residual.std() - config.noise_std) < 0.01


def test_summary_of_a_perfectly_calibrated_regressor_is_the_diagonal():
  # Draws of the true function plus the true noise: the paper's metric (the
  # outputs' quantiles under the true distribution) is on the diagonal; so is
  # the PIT of the exact Gaussian predictive (one draw of the truth, noise added).
  rng = np.random.default_rng(0)
  tasks, functions = sine_line.sample_tasks_and_functions(jax.random.key(1), 400, num_query=10)
  truth = np.asarray(sine_line.evaluate_functions(functions, tasks.query_x))  # [400, 10, 1]
  outputs = truth[:, None] + 0.3 * rng.normal(size=(400, 500, 10, 1))
  targets = np.asarray(tasks.query_y)
  per_task = {  # the evaluator's scores of these predictions, which summarise checks
    **summary_inputs.regression_scores(outputs, targets, 0.3),
    "predictions": outputs,
    "targets": targets,
    "truth": truth,
  }
  summary = kinds.summarise("regression", per_task, noise_std=0.3)
  paper = summary.calibration["quantile_calibration"]
  np.testing.assert_allclose(paper.levels, np.linspace(0, 1, 11))
  # Inner levels within 0.01; the ends (min and max of 500 draws) near 0 and 1.
  np.testing.assert_allclose(paper.observed[1:-1], paper.levels[1:-1], atol=0.01)
  assert paper.observed[0] < 0.01 and paper.observed[-1] > 0.99
  exact = dict(per_task, predictions=truth[:, None])
  exact.update(summary_inputs.regression_scores(truth[:, None], targets, 0.3))
  pit = kinds.summarise("regression", exact, noise_std=0.3).calibration["pit_calibration"]
  np.testing.assert_allclose(pit.observed, pit.levels, atol=0.025)  # 4000 points: 3 sigma
  record = json.loads(json.dumps(calibration.to_record(paper)))
  np.testing.assert_array_equal(calibration.from_record(record).observed, paper.observed)


def test_short_run_of_both_methods_learns_and_writes_results(tmp_path):
  # 200 meta-steps of MAML and of VAMPIRE (2 draws) on an MLP 1-40-40-40-1.
  # Predicting zero scores an MSE of about 16 on this family (4.25 for
  # sinusoids, 28 for lines); both must get well below it on 100 test tasks.
  argv = [
    "--preset",
    "quick",
    "--workdir",
    str(tmp_path),
    "--no-progress",
    "--algorithms",
    "maml,vampire",
    "--num-meta-steps",
    "200",
    "--num-mc-train",
    "2",
    "--num-mc-query",
    "2",
    "--num-mc-test",
    "4",
    "--hidden-sizes",
    "40",
    "40",
    "40",
    "--num-test-tasks",
    "100",
    "--num-val-tasks",
    "20",
    "--eval-batch-tasks",
    "20",
    "--eval-every",
    "100",
    "--log-every",
    "20",
  ]
  results = regression.main(argv)
  maml, vampire = results["methods"]["maml"], results["methods"]["vampire"]
  print({k: (maml[k], vampire[k]) for k in ("mse", "mse_ci95", "nll", "ece", "mce")})
  assert maml["mse"] < 7.0 and vampire["mse"] < 10.0
  for method in (maml, vampire):
    assert method["num_tasks"] == 100 and np.isfinite(method["nll"])
  # Each method's config, as recorded (by part): MAML has no draws nor KL term.
  assert vampire["config"]["algorithm"]["num_mc_test"] == 4
  assert not {"num_mc_test", "kl_weight"} & set(config_records.flat(maml["config"]))
  # The paper's calibration curve: a point estimate has one quantile, so one
  # observed value at every level; VAMPIRE's quantiles rise with the level.
  maml_curve = calibration.from_record(maml["calibration"]["quantile_calibration"])
  vampire_curve = calibration.from_record(vampire["calibration"]["quantile_calibration"])
  np.testing.assert_allclose(maml_curve.observed, maml_curve.observed[0])
  assert np.all(np.diff(vampire_curve.observed) >= 0) and np.ptp(vampire_curve.observed) > 0.01
  # With one draw the paper's MSE is the predictive mean's.
  np.testing.assert_allclose(maml["mse"], maml["predictive_mean_mse"], rtol=1e-6)
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["methods"]["vampire"]["mse"] == vampire["mse"]
  for name in (
    "tasks.png",
    "quantile_calibration.png",
    "vampire/results.json",
    "maml/quantile_calibration.png",
  ):
    assert (tmp_path / name).stat().st_size > 1000, name
  # Running the finished command again resumes at the end: nothing is retrained,
  # the test is repeated, and the training time reported is the original run's.
  again = regression.main([a if a != "maml,vampire" else "maml" for a in argv])["methods"]["maml"]
  assert again["mse"] == maml["mse"]
  assert again["wall_time_s"]["train"] == pytest.approx(maml["wall_time_s"]["train"], rel=1e-6)
  assert maml["wall_time_s"]["train"] > 0.5


def test_cli_rejects_unknown_algorithms():
  with pytest.raises(ConfigError, match="nonsense"):
    regression.main(["--algorithms", "vampire,nonsense"])
  with pytest.raises(ConfigError, match="preset"):
    regression.get_config("nonsense")


def test_likelihood_std_is_the_noise_the_learner_trains_and_adapts_with():
  # --likelihood-std 0.7071 (the authors' MSE up to a constant) changes the learner's
  # likelihood only: the same learner as one built for data of that noise.
  config = regression.get_config("quick", "vampire").replace(hidden_sizes=(8, 8))
  model = vj.MLP(tuple(config.hidden_sizes), 1)
  config = config.replace(num_mc_train=2, num_mc_query=2)
  as_mse = algorithms_lib.make_learner(
    model, "regression", 0.3, config.replace(likelihood_std=0.7071)
  )
  noisier = algorithms_lib.make_learner(model, "regression", 0.7071, config)
  default = algorithms_lib.make_learner(model, "regression", 0.3, config)
  outputs, targets = jnp.array([[0.5], [1.0]]), jnp.array([[1.5], [-1.0]])
  expected = np.mean(
    0.5 * ((outputs - targets) / 0.7071) ** 2 + np.log(0.7071 * np.sqrt(2 * np.pi))
  )
  np.testing.assert_allclose(as_mse.nll(outputs, targets), expected, rtol=1e-5)
  np.testing.assert_allclose(noisier.nll(outputs, targets), expected, rtol=1e-5)
  assert abs(float(default.nll(outputs, targets)) - expected) > 1.0
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  meta = as_mse.init(params, jax.random.key(1))
  x, y = jnp.linspace(-1, 1, 5)[:, None], jnp.sin(jnp.linspace(-1, 1, 5))[:, None]
  adapted = [learner.adapt(meta, x, y, jax.random.key(2)) for learner in (as_mse, noisier)]
  chex.assert_trees_all_close(adapted[0], adapted[1])
  for bad in (0.0, float("inf"), float("nan")):
    with pytest.raises(ConfigError, match="likelihood_std must be > 0") as refused:
      config.replace(likelihood_std=bad).validate()
    # A command says it in its flags.
    assert str(cli.as_flags(refused.value)).startswith("--likelihood-std must be > 0")
  with pytest.raises(ConfigError, match="noise_std must be > 0 and finite") as refused:
    config.replace(noise_std=float("inf")).validate()
  assert str(cli.as_flags(refused.value)).startswith("--noise-std must be > 0 and finite")


@pytest.mark.parametrize("preset", regression.PRESETS)
def test_regression_presets_train_abml_with_the_flat_hyper_prior(preset):
  # The paper trained ABML for regression with a uniform hyper-posterior: weight 0.
  assert regression.get_config(preset, "abml").algorithm.hyper_prior_weight == 0.0
  assert vj.specs.Abml().hyper_prior_weight > 0.0  # the factory's default
  # VAMPIRE has no hyper-prior: its spec takes no such option.
  assert "hyper_prior_weight" not in regression.get_config(preset, "vampire").flat()


def test_inner_loop_stability_measures_curvature_against_the_supports_spread():
  """experiments.inner_loop_stability, on a linear model: its support loss
  0.5/sigma^2 * mean((w x + b - y)^2) has the Hessian [[m2, m1], [m1, 1]] / sigma^2 in
  (w, b), m_k the support's mean x^k, so lambda is known in closed form and grows with x^2."""
  from types import SimpleNamespace

  from experiments import inner_loop_stability as stability

  model = vj.MLP((), 1)  # y = w x + b
  params = jax.tree_util.tree_map(jnp.zeros_like, vj.init_params(model, jax.random.key(0), (1, 1)))
  learner = vj.maml(vj.pure_apply(model), vj.gaussian_nll(0.3), inner_lr=0.05, num_inner_steps=3)
  run = SimpleNamespace(learner=learner, meta_params=params, config=SimpleNamespace(num_mc_test=1))
  x = jnp.array([[0.1, 0.2, 0.3, 0.4, 0.5], [4.6, 4.7, 4.8, 4.9, 5.0]])[..., None]
  tasks = vj.Task(x, 2 * x, x, 2 * x)
  m = stability.task_measures(run, tasks, jax.random.key(1))
  m1, m2 = np.mean(np.asarray(x)[..., 0], axis=1), np.mean(np.asarray(x)[..., 0] ** 2, axis=1)
  largest = ((m2 + 1) + np.sqrt((m2 - 1) ** 2 + 4 * m1**2)) / 2 / 0.09
  np.testing.assert_allclose(m["curvature"], largest, rtol=1e-4)
  np.testing.assert_allclose(m["mean_x2"], m2, rtol=1e-6)
  np.testing.assert_allclose(m["step_factor"], 0.05 * largest, rtol=1e-4)
  # alpha * lambda: 0.6 near 0 (the loss falls), 13.5 near 5 (it rises and the task runs away).
  assert list(m["loss_rose"]) == [False, True] and list(m["ran_away"]) == [False, True]
  rows = stability.table(m)
  assert [(r["mean_x2"], r["tasks"], r["step_factor_above_2"]) for r in rows] == [
    ("[0, 2)", 1, 0),
    ("[15, 25)", 1, 1),
  ]
