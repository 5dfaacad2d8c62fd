"""Calibration metrics: hand-worked bins, synthetic (mis)calibrated predictors,
closed forms for the Gaussian case, the paper's regression metric and the
risk-coverage curve by hand, records, and the figures."""

import json
import math

import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import _synthetic_classifier
from vampire_jax._src.metrics import calibration as cal


def test_calibrated_classifier_has_small_ece():
  rng = np.random.default_rng(0)
  confidence = rng.uniform(0.2, 1.0, size=200_000)
  probs, labels = _synthetic_classifier(rng, confidence.size, 5, confidence, confidence)
  bins = cal.classification_calibration(probs, labels)
  assert bins.ece < 0.01
  filled = bins.count > 0
  np.testing.assert_allclose(bins.accuracy[filled], bins.confidence[filled], atol=0.02)


def test_overconfident_classifier():
  n = 10_000
  confidence = np.full(n, 0.99)
  probs, _ = _synthetic_classifier(np.random.default_rng(1), n, 3, confidence, confidence)
  predicted = probs.argmax(-1)
  labels = np.where(np.arange(n) % 2 == 0, predicted, (predicted + 1) % 3)  # exactly half right
  bins = cal.classification_calibration(probs, labels, num_bins=15)
  assert bins.ece == pytest.approx(0.49, abs=1e-9)
  assert bins.mce == pytest.approx(0.49, abs=1e-9)
  assert bins.count[-1] == n and bins.count.sum() == n
  assert np.isnan(bins.accuracy[:-1]).all() and np.isnan(bins.confidence[:-1]).all()


def test_hand_worked_example():
  probs = np.array(
    [
      [0.40, 0.30, 0.30],  # conf 0.40, predicts 0, label 1: wrong
      [0.20, 0.45, 0.35],  # conf 0.45, predicts 1, label 1: right
      [0.90, 0.05, 0.05],  # conf 0.90, predicts 0, label 0: right
      [0.10, 0.10, 0.80],
    ]
  )  # conf 0.80, predicts 2, label 0: wrong
  labels = np.array([1, 1, 0, 0])
  # Two bins (0, .5], (.5, 1]: low bin conf (.4+.45)/2 = .425, acc 1/2 -> gap .075;
  # high bin conf (.9+.8)/2 = .85, acc 1/2 -> gap .35.
  expected_ece = 0.5 * 0.075 + 0.5 * 0.35
  bins = cal.classification_calibration(probs, labels, num_bins=2)
  np.testing.assert_allclose(bins.edges, [0.0, 0.5, 1.0])
  np.testing.assert_array_equal(bins.count, [2, 2])
  np.testing.assert_allclose(bins.confidence, [0.425, 0.85])
  np.testing.assert_allclose(bins.accuracy, [0.5, 0.5])
  assert bins.ece == pytest.approx(expected_ece) and bins.ece == pytest.approx(0.2125)
  assert bins.mce == pytest.approx(0.35)

  # Three bins: the first (0, 1/3] is empty (NaN) and counts in neither error.
  bins = cal.classification_calibration(probs, labels, num_bins=3)
  np.testing.assert_array_equal(bins.count, [0, 2, 2])
  assert np.isnan(bins.confidence[0]) and np.isnan(bins.accuracy[0])
  assert bins.ece == pytest.approx(0.2125) and bins.mce == pytest.approx(0.35)


def test_bin_edges_are_right_closed_and_one_goes_in_the_last_bin():
  probs = np.array([[1.0, 0.0], [0.5, 0.5], [0.75, 0.25], [0.7500001, 0.2499999]])
  labels = np.array([0, 0, 1, 0])
  bins = cal.classification_calibration(probs, labels, num_bins=4)
  # 0.5 -> (0.25, 0.5]; 0.75 -> (0.5, 0.75]; 0.7500001 and 1.0 -> (0.75, 1].
  np.testing.assert_array_equal(bins.count, [0, 1, 1, 2])
  np.testing.assert_allclose(bins.accuracy[1:], [1.0, 0.0, 1.0])


def test_counts_sum_to_n_and_task_axis_is_pooled():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(7, 15, 5)) * 3
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  labels = rng.integers(5, size=(7, 15))
  by_task = cal.classification_calibration(probs, labels, num_bins=10)
  flat = cal.classification_calibration(probs.reshape(-1, 5), labels.reshape(-1), num_bins=10)
  assert by_task.count.sum() == 7 * 15
  assert by_task.ece == flat.ece and by_task.mce == flat.mce
  np.testing.assert_array_equal(by_task.count, flat.count)
  # ECE is the count-weighted mean gap; MCE bounds every gap.
  filled = by_task.count > 0
  gaps = np.abs(by_task.accuracy - by_task.confidence)[filled]
  assert by_task.ece == pytest.approx(np.sum(gaps * by_task.count[filled]) / 105)
  assert by_task.mce == pytest.approx(gaps.max()) and by_task.ece <= by_task.mce


@pytest.mark.parametrize(
  "probs_shape, labels_shape, kwargs",
  [
    ((10,), (10,), {}),  # no class axis
    ((10, 3), (9,), {}),  # labels do not match
    ((2, 5, 3), (10,), {}),  # task axis in probs only
    ((10, 3), (10,), {"num_bins": 0}),
    ((0, 3), (0,), {}),  # nothing to score
  ],
)
def test_classification_shape_errors(probs_shape, labels_shape, kwargs):
  with pytest.raises(ValueError):
    cal.classification_calibration(np.full(probs_shape, 0.3), np.zeros(labels_shape, int), **kwargs)


def test_classification_value_errors():
  probs = np.full((4, 3), 1 / 3)
  with pytest.raises(ValueError, match="labels"):
    cal.classification_calibration(probs, np.array([0, 1, 2, 3]))  # label out of range
  with pytest.raises(ValueError, match="integers"):
    cal.classification_calibration(probs, np.array([0, 1.5, 2, 0]))
  with pytest.raises(ValueError, match="logits"):
    cal.classification_calibration(probs * 5 - 2, np.zeros(4, int))


def test_mean_confidence_interval_by_hand():
  values = [0.9, 0.8, 1.0, 0.7]
  # mean .85; population variance (.05^2 + .05^2 + .15^2 + .15^2) / 4 = .0125.
  mean, half_width = cal.mean_confidence_interval(values)
  assert mean == pytest.approx(0.85)
  assert half_width == pytest.approx(1.959963984540054 * math.sqrt(0.0125) / 2, rel=1e-12)
  assert half_width == pytest.approx(1.96 * np.std(values) / np.sqrt(4), rel=1e-4)
  _, wider = cal.mean_confidence_interval(values, confidence=0.99)
  assert wider == pytest.approx(2.5758293035489 * math.sqrt(0.0125) / 2, rel=1e-10)
  mean, half_width = cal.mean_confidence_interval([0.5])  # one task: no interval (issue 40)
  assert mean == 0.5 and math.isnan(half_width)
  with pytest.raises(ValueError):
    cal.mean_confidence_interval([])
  with pytest.raises(ValueError):
    cal.mean_confidence_interval(values, confidence=1.0)


def test_risk_coverage_by_hand():
  # Confidences 0.9, 0.8, 0.7, 0.6; correct, wrong, correct, wrong. Keeping the
  # k most confident: accuracy 1, 1/2, 2/3, 1/2; AURC = mean(0, 1/2, 1/3, 1/2).
  probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
  labels = np.array([0, 0, 0, 0])
  result = cal.risk_coverage(probs, labels)
  np.testing.assert_allclose(result.coverage, [0.25, 0.5, 0.75, 1.0])
  np.testing.assert_allclose(result.accuracy, [1.0, 0.5, 2 / 3, 0.5])
  np.testing.assert_allclose(result.aurc, np.mean([0, 0.5, 1 / 3, 0.5]))
  assert result.accuracy_at(0.5) == 0.5 and result.accuracy_at(0.3) == 0.5
  assert result.accuracy_at(0.25) == 1.0
  # A confidence that ranks every error last has the lowest AURC possible.
  ranked = cal.risk_coverage(np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]]), labels)
  assert ranked.aurc < result.aurc


def test_risk_and_the_reference_lines_by_hand():
  # The curve above: errors at ranks 2 and 4, error rate 1/2. Risk = 1 - accuracy.
  # The best ordering keeps the 2 correct first: risk 0, 0, then 1 of 3, 2 of 4.
  probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
  result = cal.risk_coverage(probs, np.array([0, 0, 0, 0]))
  np.testing.assert_allclose(result.risk, [0.0, 0.5, 1 / 3, 0.5])
  assert result.error_rate == 0.5
  np.testing.assert_allclose(result.oracle_risk, [0.0, 0.0, 1 / 3, 0.5])
  # Integral of max(0, 1 - 0.5 / c) over [0.5, 1] = 0.5 - 0.5 log 2.
  assert result.oracle_aurc == pytest.approx(0.5 + 0.5 * math.log(0.5), abs=1e-12)
  # The oracle line is the curve of a confidence that ranks every error last,
  # and its AURC is the limit of that curve's mean over k: 1 error in 4, N = 4000.
  correct = np.arange(4000) % 4 != 0
  confidence = np.where(correct, 0.9, 0.6) - np.arange(4000) * 1e-6
  probs = np.stack([confidence, 1 - confidence], axis=-1)
  ranked = cal.risk_coverage(probs, np.where(correct, 0, 1))
  assert ranked.error_rate == pytest.approx(0.25)
  np.testing.assert_allclose(ranked.risk, ranked.oracle_risk, atol=1e-12)
  assert ranked.aurc == pytest.approx(ranked.oracle_aurc, abs=1e-3)
  assert ranked.oracle_aurc == pytest.approx(0.25 + 0.75 * math.log(0.75), abs=1e-12)
  # From a results.json record (101 coverages) the references are the same lines.
  back = cal.from_record(json.loads(json.dumps(cal.to_record(ranked))))
  assert back.error_rate == ranked.error_rate and back.oracle_aurc == ranked.oracle_aurc
  assert cal.risk_coverage(probs, np.ones(4000, int)).oracle_aurc == 1.0  # all wrong


def test_mce_bin_and_mce_over_bins_with_a_minimum_count_by_hand():
  # 5 bins of width 0.2. Bin (0.8, 1]: 4 predictions at 0.9, 3 correct: gap 0.15.
  # Bin (0.6, 0.8]: 2 at 0.7, both correct: gap 0.3. Bin (0.4, 0.6]: 1 at 0.55,
  # wrong: gap 0.55. The paper's MCE is the single prediction's 0.55; over
  # bins of at least 2 it is 0.3, of at least 4 it is 0.15.
  probs = np.array([[0.9, 0.1]] * 4 + [[0.7, 0.3]] * 2 + [[0.55, 0.45]])
  labels = np.array([0, 0, 0, 1, 0, 0, 1])
  bins = cal.classification_calibration(probs, labels, num_bins=5, min_count=2)
  np.testing.assert_array_equal(bins.count, [0, 0, 1, 2, 4])
  np.testing.assert_allclose(bins.gap[2:], [0.55, 0.3, 0.15], atol=1e-12)
  assert bins.mce == pytest.approx(0.55) and bins.mce_bin == 2 and bins.count[bins.mce_bin] == 1
  assert bins.mce_min_count == pytest.approx(0.3)
  four = cal.classification_calibration(probs, labels, num_bins=5, min_count=4)
  assert four.mce == bins.mce and four.ece == bins.ece
  assert four.mce_min_count == pytest.approx(0.15)
  assert math.isnan(
    cal.classification_calibration(probs, labels, num_bins=5, min_count=5).mce_min_count
  )
  assert cal.classification_calibration(probs, labels).min_count == cal.MIN_BIN_COUNT
  back = cal.from_record(json.loads(json.dumps(cal.to_record(bins))))
  assert back.min_count == 2 and back.mce_min_count == pytest.approx(0.3)
  old = {k: v for k, v in cal.to_record(bins).items() if k != "min_count"}  # before min_count
  assert cal.from_record(old).min_count == cal.MIN_BIN_COUNT
  with pytest.raises(ValueError, match="min_count"):
    cal.classification_calibration(probs, labels, min_count=0)


def test_records_round_trip():
  probs = np.random.default_rng(0).dirichlet(np.ones(5), size=1000)
  labels = np.random.default_rng(1).integers(5, size=1000)
  for result in (
    cal.classification_calibration(probs, labels),
    cal.paper_quantile_calibration(np.zeros((3, 4)), np.ones(4), 0.5),
  ):
    back = cal.from_record(json.loads(json.dumps(cal.to_record(result))))
    for a, b in zip(back, result):
      np.testing.assert_allclose(a, b)
  curve = cal.risk_coverage(probs, labels)
  back = cal.from_record(json.loads(json.dumps(cal.to_record(curve))))
  assert len(back.coverage) == 101 and back.aurc == curve.aurc
  np.testing.assert_allclose(back.accuracy[-1], curve.accuracy[-1])


def test_risk_coverage_refuses_labels_outside_the_classes_and_logits():
  """Label 7 of 3 classes is refused naming [0, 3), and logits as not probabilities; what it
  accepts, it scores (AURC = mean risk)."""
  probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
    vj.risk_coverage(probs, np.array([0, 7]))
  with pytest.raises(ValueError, match="not logits"):
    vj.risk_coverage(np.array([[3.0, -1.0, 0.5], [0.2, 2.5, -3.0]]), np.array([0, 1]))
  # What it accepts, it scores: the confident right answer first, AURC = mean risk.
  curve = vj.risk_coverage(probs, np.array([0, 2]))
  np.testing.assert_allclose(curve.accuracy, [0.0, 0.5])  # 0.8 (wrong) is the most confident
  assert curve.aurc == pytest.approx(np.mean([1.0, 0.5]))


def test_one_task_gives_no_interval_not_plus_minus_zero():
  """One task gives a NaN half-width (no interval), not +- 0: in mean_confidence_interval and
  in summarise's accuracy_ci95 and nll_ci95."""
  mean, half = vj.mean_confidence_interval([0.24])
  assert mean == pytest.approx(0.24) and math.isnan(half)
  mean, half = vj.mean_confidence_interval([0.2, 0.4])
  assert half == pytest.approx(1.959964 * 0.1 / math.sqrt(2), rel=1e-5)
  # One task of 5 queries, uniform over 5 classes: argmax is class 0, right once (accuracy
  # 0.2), and the NLL is -log 0.2 (summarise checks both against the probabilities).
  per_task = {
    "accuracy": np.array([0.2]),
    "nll": np.array([-math.log(0.2)]),
    "probabilities": np.full((1, 5, 5), 0.2),
    "targets": np.arange(5, dtype=np.int32)[None],
  }
  summary = vj.summarise("classification", per_task)
  assert math.isnan(summary.metrics["accuracy_ci95"]) and math.isnan(summary.metrics["nll_ci95"])
