"""One definition per problem kind: every kind is complete, and the loop reads nothing else."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from conftest import tiny_regression_config
from vampire_jax.runs import kinds
from vampire_jax._src.core.errors import ConfigError, InputError


def test_an_unknown_kind_is_refused_naming_the_choices():
  with pytest.raises(ConfigError, match="classification, regression"):
    kinds.get("ranking")


def test_which_score_is_better():
  assert kinds.CLASSIFICATION.better(0.9, 0.8) and not kinds.CLASSIFICATION.better(0.7, 0.8)
  assert kinds.REGRESSION.better(1.0, 2.0) and not kinds.REGRESSION.better(3.0, 2.0)
  assert all(kind.better(0.0, None) for kind in kinds.KINDS.values())


def test_predictive_outputs():
  logits = jnp.log(jnp.array([[[0.9, 0.1]], [[0.1, 0.9]]]))  # [draws 2, query 1, classes 2]
  draws = kinds.CLASSIFICATION.draws(logits)
  np.testing.assert_allclose(draws, [[[0.9, 0.1]], [[0.1, 0.9]]], rtol=1e-6)
  np.testing.assert_allclose(kinds.CLASSIFICATION.predictive(draws), [[0.5, 0.5]], rtol=1e-6)
  samples = jnp.arange(6.0).reshape(3, 2, 1)
  np.testing.assert_array_equal(
    kinds.REGRESSION.predictive(kinds.REGRESSION.draws(samples)), samples
  )


def test_support_targets_each_kind_accepts():
  kinds.CLASSIFICATION.check_support_y("f", np.array([1, 0, 2]), 3, 3)
  with pytest.raises(InputError, match="covering every class 0..2"):
    kinds.CLASSIFICATION.check_support_y("f", np.array([1, 0, 1]), 3, 3)
  kinds.REGRESSION.check_support_y("f", np.zeros((3, 1), np.float32), 3, 1)
  with pytest.raises(InputError, match=r"support_y must be \[3, 1\] targets"):
    kinds.REGRESSION.check_support_y("f", np.zeros(3, np.float32), 3, 1)


def test_a_new_kind_is_one_definition(tmp_path, monkeypatch):
  """A kind defined here, registered once, trains, validates and tests through the loop."""
  from experiments import regression

  absolute = kinds.REGRESSION._replace(
    name="absolute_error",
    score="mae",
    summarise=lambda per_task, num_bins, noise_std: (
      {
        "mae": float(np.mean(np.abs(per_task["predictions"].mean(1) - per_task["targets"]))),
        "mae_ci95": 0.0,
      },
      {},
    ),
    make_evaluator=lambda learner, noise_std, **kw: _with_mae(
      vj.make_regression_evaluator(learner, noise_std, **kw)
    ),
    summary_line=lambda test: f"test MAE {test['mae']:.3f}",
    columns=(("MAE", "mae", 1.0),),
  )
  monkeypatch.setitem(kinds.KINDS, "absolute_error", absolute)
  config = tiny_regression_config("maml", num_meta_steps=2, hidden_sizes=(8,))
  problem = regression.make_problem(config)._replace(kind="absolute_error")
  results = vj.train_and_evaluate(
    problem, config, tmp_path, progress=False, print_fn=lambda m: None
  )
  assert results["kind"] == "absolute_error" and results["best_validation"]["metric"] == "mae"
  assert kinds.test_summary_line(results["test"], results["kind"]).startswith("test MAE ")
  assert "'absolute_error'" in results["recalibration"]["skipped"]  # no map for a new kind


def _with_mae(evaluate):
  def with_mae(meta_params, tasks, keys):
    result = evaluate(meta_params, tasks, keys)
    mae = jnp.mean(jnp.abs(jnp.mean(result.predictions, axis=1) - tasks.query_y), axis=(1, 2))
    return _MaeEval(*result, mae)

  return with_mae


class _MaeEval(NamedTuple):
  mse: jax.Array
  predictive_mean_mse: jax.Array
  nll: jax.Array
  predictions: jax.Array
  mae: jax.Array  # [tasks], the new kind's score


def _regression_tasks(predictions: np.ndarray, targets: np.ndarray) -> dict:
  """Per-task results of point predictions `[tasks, query]` against `targets` `[tasks, query]`."""
  squared = np.square(predictions - targets)
  return dict(
    mse=squared.mean(axis=1),
    predictive_mean_mse=squared.mean(axis=1),
    nll=np.mean(0.5 * squared / 0.09 + np.log(0.3 * np.sqrt(2 * np.pi)), axis=1),  # noise 0.3
    predictions=predictions[:, None, :, None],
  )


def test_a_regression_summary_counts_tasks_that_ran_away_and_gives_the_median():
  """A regression summary counts the tasks that ran away and gives the median beside the mean
  (here one task at 1e14).

  Targets span [-2, 3], so predictions within their range score at most 5^2 = 25: a task
  above that (or not finite) ran away. Task 1 is off by 4 everywhere (16, within the
  bound), task 2 by 1e7.
  """
  targets = np.array([[-2.0, 0.0, 3.0], [1.0, 1.0, 1.0], [0.0, 2.0, 1.0], [0.5, 0.5, 0.5]])
  predictions = targets + np.array([[1.0], [4.0], [1e7], [0.0]])
  per_task = _regression_tasks(predictions, targets)
  summary = vj.summarise("regression", per_task, targets[..., None], noise_std=0.3)
  assert summary.metrics["num_ran_away"] == 1
  assert summary.metrics["mse_median"] == pytest.approx(np.median([1.0, 16.0, 1e14, 0.0]))
  assert summary.metrics["mse"] == pytest.approx(np.mean([1.0, 16.0, 1e14, 0.0]))
  line = kinds.test_summary_line(summary.metrics, "regression")
  assert line.startswith("test MSE 25000000000004.250 +- ") and "(median 8.500; 1 ran away)" in line
  # A task at the bound does not count, one just above it does.
  for offset, ran_away in ((5.0, 0), (5.01, 1)):
    per_task = _regression_tasks(targets + np.array([[offset], [1.0], [2.0], [0.0]]), targets)
    edge = vj.summarise("regression", per_task, targets[..., None], noise_std=0.3)
    assert edge.metrics["num_ran_away"] == ran_away
  # A task whose predictions are not finite is no mean's: the summary names it.
  per_task = _regression_tasks(targets + np.array([[1.0], [1.0], [np.nan], [0.0]]), targets)
  with pytest.raises(vj.InputError, match=r"must be finite, .*tasks \[2\]"):
    vj.summarise("regression", per_task, targets[..., None], noise_std=0.3)
  # Results written before issue 50 still print their line.
  old = {k: v for k, v in summary.metrics.items() if k not in ("mse_median", "num_ran_away")}
  assert kinds.test_summary_line(old, "regression").startswith("test MSE 25000000000004.250 +- ")
