import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from tests.helpers import _tiny_regression_config
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.metrics.evaluation import evaluate_split
from vampire_jax.runs import loop as training


def test_classification_evaluator_numbers():
  # A fixed "network" whose logits ignore the weights: check accuracy/NLL/probs.
  logits = jnp.log(jnp.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
  learner = vj.MetaLearner(
    init=lambda p, k: p,
    adapt=lambda p, x, y, k: p,
    predict=lambda p, x, k: jnp.broadcast_to(logits, (2,) + logits.shape),
    nll=vj.categorical_nll,
  )
  tasks = vj.Task(
    jnp.zeros((1, 2, 1)), jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2, 1)), jnp.array([[0, 1]])
  )
  result = vj.make_classification_evaluator(learner)({}, tasks, jax.random.key(0))
  np.testing.assert_allclose(result.accuracy, [0.5])
  np.testing.assert_allclose(result.nll, [-(np.log(0.7) + np.log(0.3)) / 2], rtol=1e-5)
  np.testing.assert_allclose(result.probabilities[0], jnp.exp(logits), rtol=1e-5)


def test_regression_evaluator_mixture_nll_is_exact_for_one_sample():
  learner = vj.MetaLearner(
    init=lambda p, k: p,
    adapt=lambda p, x, y, k: p,
    predict=lambda p, x, k: x[None],
    nll=vj.gaussian_nll(0.5),
  )
  x = jnp.array([[[1.0], [2.0]]])
  y = jnp.array([[[1.5], [2.0]]])  # noqa: E702
  result = vj.make_regression_evaluator(learner, 0.5)({}, vj.Task(x, y, x, y), jax.random.key(0))
  np.testing.assert_allclose(result.mse, [0.125])
  np.testing.assert_allclose(result.predictive_mean_mse, [0.125])  # one draw: the same
  expected_nll = np.mean([0.5 * (0.5 / 0.5) ** 2, 0.0]) + np.log(0.5) + 0.5 * np.log(2 * np.pi)
  np.testing.assert_allclose(result.nll, [expected_nll], rtol=1e-5)


def test_regression_evaluator_mse_definitions_by_hand():
  # Two draws, 0 and 2, around a target of 1. The paper's MSE averages the
  # squared error over the draws: (1 + 1) / 2 = 1. The predictive mean (1) is
  # exact: its MSE is 0; the spread is in the NLL.
  draws = jnp.array([0.0, 2.0])[:, None, None]
  learner = vj.MetaLearner(
    init=lambda p, k: p,
    adapt=lambda p, x, y, k: p,
    predict=lambda p, x, k: draws + 0 * x[None],
    nll=vj.gaussian_nll(1.0),
  )
  x = jnp.zeros((1, 1, 1))
  y = jnp.ones((1, 1, 1))  # noqa: E702
  result = vj.make_regression_evaluator(learner, 1.0)({}, vj.Task(x, y, x, y), jax.random.key(0))
  np.testing.assert_allclose(result.mse, [1.0])
  np.testing.assert_allclose(result.predictive_mean_mse, [0.0])
  # NLL of the two-component mixture at distance 1 from each: 0.5 + log sqrt(2 pi).
  np.testing.assert_allclose(result.nll, [0.5 + 0.5 * np.log(2 * np.pi)], rtol=1e-5)


def test_validation_with_a_non_finite_task_is_never_the_best_and_training_goes_on(
  tmp_path, monkeypatch
):
  # One validation task's result overflows at the first validation (as one adapted
  # weight draw of PLATIPUS did at the cpu preset): the loop names it, does not keep
  # those meta-parameters, trains on and tests the best of the later validations.
  evaluate_split, calls = training.evaluation.evaluate_split, []

  def first_validation_overflows(*args, refuse_non_finite=True, **kwargs):
    results = evaluate_split(*args, refuse_non_finite=refuse_non_finite, **kwargs)
    if not refuse_non_finite:  # the loop's validation
      calls.append(len(calls))
      if len(calls) == 1:
        results["mse"][1] = np.nan  # a mean of NaN would never be beaten
    return results

  monkeypatch.setattr(training.evaluation, "evaluate_split", first_validation_overflows)
  config = _tiny_regression_config(num_meta_steps=4, log_every=2, eval_every=2, checkpoint_every=2)
  lines = []
  results = regression.run_experiment(config, tmp_path, progress=False, print_fn=lines.append)
  assert len(calls) == 3  # the validations at steps 2 and 4, then the recalibration's fit
  assert any(
    "step 2: validation: 1 of" in line and "tasks [1]" in line and "not kept" in line
    for line in lines
  ), lines
  assert results["best_validation"]["step"] == 4
  assert np.isfinite(results["test"]["mse"])


def test_evaluate_split_refuses_non_finite_results_naming_the_tasks():
  def evaluate_indices(meta_params, key, indices):
    values = jnp.where(indices == 3, jnp.nan, 1.0)
    return {"nll": values, "labels": jnp.zeros_like(indices)}

  with pytest.raises(
    FloatingPointError, match=r"1 of 5 tasks gave non-finite results \(tasks \[3\]"
  ):
    evaluate_split(evaluate_indices, None, jax.random.key(0), num_tasks=5, batch_tasks=2)
  ok = evaluate_split(lambda p, k, i: {"nll": jnp.ones(len(i))}, None, jax.random.key(0), 5, 2)
  assert ok["nll"].shape == (5,)
  kept = evaluate_split(evaluate_indices, None, jax.random.key(0), 5, 2, refuse_non_finite=False)
  assert np.isnan(kept["nll"][3]) and evaluation.non_finite_tasks(kept).tolist() == [3]
