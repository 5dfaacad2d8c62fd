"""Epistemic uncertainty, AUROC, open-set episodes, the regression variance split, and the
Omniglot training set without held-out alphabets (issue 23)."""

import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.conftest import needs_omniglot
from vampire_jax._src.metrics import predictive_uncertainty


def _h(p):  # binary entropy in nats
  return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def _brute_force_auroc(scores, positives):
  pairs = [(p, n) for p, n in itertools.product(scores[positives], scores[~positives])]
  return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])


def test_uncertainty_hand_example():
  draws = jnp.array([[[0.9, 0.1]], [[0.1, 0.9]]])  # [2 draws, 1 query, 2 ways]
  u = vj.uncertainty(draws)
  np.testing.assert_allclose(u.total, [math.log(2)], rtol=1e-6)
  np.testing.assert_allclose(u.aleatoric, [_h(0.9)], rtol=1e-6)
  np.testing.assert_allclose(u.epistemic, [math.log(2) - _h(0.9)], rtol=1e-5)
  assert u.epistemic.shape == (1,)


def test_a_point_estimate_has_zero_epistemic_uncertainty():
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (1, 7, 5)), axis=-1)
  u = vj.uncertainty(probs)
  np.testing.assert_allclose(u.epistemic, np.zeros(7), atol=1e-7)
  np.testing.assert_allclose(u.total, u.aleatoric, rtol=1e-6)
  # Identical draws are a point estimate too.
  np.testing.assert_allclose(
    vj.uncertainty(jnp.repeat(probs, 4, axis=0)).epistemic, np.zeros(7), atol=1e-6
  )


def test_uncertainty_is_finite_at_probabilities_zero():
  draws = jnp.array([[[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]]])
  u = vj.uncertainty(draws)
  np.testing.assert_allclose(u.total, [math.log(2)], rtol=1e-6)
  np.testing.assert_allclose(u.aleatoric, [0.0], atol=0)
  np.testing.assert_allclose(u.epistemic, [math.log(2)], rtol=1e-6)
  grad = jax.grad(lambda d: jnp.sum(vj.uncertainty(d).epistemic))(draws)
  assert np.all(np.isfinite(grad))


def test_uncertainty_refuses_a_mean_without_its_draws():
  with pytest.raises(vj.InputError, match="draws must be"):
    vj.uncertainty(jnp.full((4, 5), 0.2))


def test_regression_uncertainty_is_the_law_of_total_variance():
  draws = jnp.array([[[1.0], [0.0]], [[3.0], [0.0]]])  # [2 draws, 2 queries, 1]
  u = vj.regression_uncertainty(draws, noise_std=0.5)
  np.testing.assert_allclose(u.epistemic, [1.0, 0.0])
  np.testing.assert_allclose(u.aleatoric, [0.25, 0.25])
  np.testing.assert_allclose(u.total, [1.25, 0.25])


def test_auroc_hand_example():
  # Pairs (positive, negative): (0.35, 0.1) yes, (0.35, 0.4) no, (0.8, .) yes twice: 3/4.
  assert vj.auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
  # A tie counts one half.
  assert vj.auroc([1.0, 1.0, 0.0], [True, False, False]) == 0.75
  assert vj.auroc(np.zeros(6), [True, False] * 3) == 0.5
  assert math.isnan(vj.auroc([0.1, 0.2], [True, True]))


def test_auroc_equals_brute_force_over_all_pairs_with_ties():
  rng = np.random.default_rng(0)
  for _ in range(20):
    n = int(rng.integers(2, 40))
    scores = rng.integers(0, 5, n).astype(float)  # many ties
    positives = rng.random(n) < 0.4
    if positives.all() or not positives.any():
      continue
    assert vj.auroc(scores, positives) == pytest.approx(_brute_force_auroc(scores, positives))
    # The trapezoidal area under the ROC curve is the same number.
    fpr, tpr = vj.roc_curve(scores, positives)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(vj.auroc(scores, positives))


def test_open_set_summary_by_hand():
  # One task, 2 ways x 2 queries known, then 1 unknown class x 2 queries.
  targets = np.array([[0, 0, 1, 1, -1, -1]])
  per_task = {
    "targets": targets,
    "max_prob": np.array([[0.9, 0.8, 0.7, 0.95, 0.6, 0.5]]),
    "entropy": np.array([[0.1, 0.2, 0.3, 0.05, 0.4, 0.5]]),
    "mutual_information": np.zeros((1, 6)),  # a point estimate
    "correct": np.array([[True, True, False, True, False, False]]),
  }
  summary = vj.open_set_summary(per_task)
  # Issue 59: a point estimate's MI is 0 for every query; it ranks none, so its AUROC is
  # not applicable (None, named in `not_applicable`), not 0.5, "at chance".
  assert summary["auroc"] == {"max_prob": 1.0, "entropy": 1.0, "mutual_information": None}
  assert list(summary["not_applicable"]) == ["mutual_information"]
  # Known queries: the one mistake (0.7) is the least confident.
  assert summary["misclassification_auroc"]["max_prob"] == 1.0
  assert summary["misclassification_auroc"]["mutual_information"] is None
  assert (
    summary["num_unknown_classes"],
    summary["num_known_queries"],
    summary["num_unknown_queries"],
    summary["known_accuracy"],
  ) == (1, 4, 2, 0.75)
  roc = summary["roc"]["mutual_information"]
  np.testing.assert_allclose(roc["true_positive_rate"], roc["false_positive_rate"])
  # Mean uncertainty per group, in nats: a point estimate has no epistemic part.
  assert summary["uncertainty"]["known"] == pytest.approx(
    {"total": 0.1625, "epistemic": 0.0, "aleatoric": 0.1625}
  )
  assert summary["uncertainty"]["unknown"]["total"] == pytest.approx(0.45)
  per_task["mutual_information"] = np.array([[0.05, 0.1, 0.1, 0.0, 0.3, 0.2]])
  varied = vj.open_set_summary(per_task)
  assert varied["not_applicable"] == {} and varied["auroc"]["mutual_information"] == 1.0
  split = varied["uncertainty"]
  assert split["unknown"] == pytest.approx({"total": 0.45, "epistemic": 0.25, "aleatoric": 0.2})
  json.dumps(summary)  # JSON-ready


def test_open_set_evaluator_scores_each_query():
  # A fixed 'network' whose logits are the input's first pixel times a matrix: the
  # evaluator's max_prob and MI are those of the draws' softmax.
  def apply_fn(params, x):
    return x.reshape(x.shape[0], -1)[:, :1] * params["w"]

  learner = vj.maml(apply_fn, vj.categorical_nll, num_inner_steps=0)
  params = {"w": jnp.array([[1.0, -1.0, 0.5]])}
  task = vj.Task(
    jnp.ones((1, 3, 2)),
    jnp.zeros((1, 3), jnp.int32),
    jnp.array([[[0.0, 0], [2.0, 0]]]),
    jnp.array([[0, -1]]),
  )
  result = jax.jit(vj.make_open_set_evaluator(learner))(params, task, jax.random.key(0))
  probs = jax.nn.softmax(jnp.array([[0.0, 0, 0], [2.0, -2.0, 1.0]]), axis=-1)
  np.testing.assert_allclose(result.max_prob[0], probs.max(axis=-1), rtol=1e-6)
  np.testing.assert_allclose(result.entropy[0], predictive_uncertainty.entropy(probs), rtol=1e-6)
  np.testing.assert_allclose(result.mutual_information, 0.0, atol=1e-6)
  np.testing.assert_array_equal(result.correct, [[True, False]])


@needs_omniglot
def test_a_classification_run_reports_open_set_aurocs(tiny_omniglot_run):
  workdir, config, results = tiny_omniglot_run
  open_set = results["test"]["open_set"]
  for group in ("auroc", "misclassification_auroc", "roc"):
    assert set(open_set[group]) == {"max_prob", "entropy", "mutual_information"}
  # As many unknown classes as ways (the default), `query` queries each, on every test task.
  assert open_set["num_unknown_classes"] == config.ways
  assert (
    open_set["num_unknown_queries"]
    == open_set["num_known_queries"]
    == config.evaluation.num_test_tasks * config.ways * config.query
  )
  # The numbers are those of the saved per-query scores.
  per_task = np.load(workdir / "test_per_task.npz")
  unknown = per_task["open_set_targets"] < 0
  assert open_set["auroc"]["entropy"] == pytest.approx(
    vj.auroc(per_task["open_set_entropy"], unknown)
  )
  assert open_set["auroc"]["max_prob"] == pytest.approx(
    vj.auroc(-per_task["open_set_max_prob"], unknown)
  )
  saved = json.loads((workdir / "results.json").read_text())
  assert saved["test"]["open_set"]["auroc"] == open_set["auroc"]
