"""The sine/line task family, the regression experiment's summary, and short runs that must learn."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, presets, regression
from vampire_jax._src.core.errors import ConfigError
from vampire_jax._src.metrics import calibration
from vampire_jax.runs import algorithms as algorithms_lib
from vampire_jax.runs import config_records


def test_data_noise_is_separate_from_the_metric_noise():
  config = presets.get_config("regression", "authors2019", "vampire").replace(num_query=400)
  problem = regression.make_problem(config)
  keys = jax.random.split(jax.random.key(0), 50)
  tasks = problem.sample_tasks(problem.splits["train"], keys)
  truth = problem.query_truth(problem.splits["train"], keys)
  residual = np.asarray(tasks.query_y - truth)
  assert abs(residual.std() - 0.09) < 0.005  # the data's noise: 0.3^2, as the authors' code
  assert problem.noise_std == 0.3  # what the metric assumes
  # Test tasks query the 100-point grid; training tasks their own 15 random points.
  test = problem.sample_tasks(problem.splits["test"], keys[:3])
  np.testing.assert_allclose(test.query_x[0, :, 0], np.linspace(-5, 5, 100), atol=1e-6)
  np.testing.assert_array_equal(test.query_x[0], test.query_x[2])
  train = problem.sample_tasks(problem.splits["train"], keys[:3])
  assert train.query_x.shape == (3, 400, 1) and not np.allclose(train.query_x[0], train.query_x[1])
  # The default (data_noise_std None) is the metric's noise, with the same tasks as before.
  plain = regression.make_problem(presets.get_config("regression", "cpu", "vampire"))
  tasks = plain.sample_tasks(plain.splits["train"], keys)
  before = vj.data.sine_line.tasks_from_keys(
    jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 0), num_support=5, num_query=10
  )
  np.testing.assert_array_equal(tasks.query_y, before.query_y)


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
