"""One definition per problem kind: every kind is complete, and the loop reads nothing else."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from conftest import tiny_regression_config
from vampire_jax._src.runs import kinds
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
