"""Calibration metrics: hand-worked bins, synthetic (mis)calibrated predictors,
closed forms for the Gaussian case, the paper's regression metric and the
risk-coverage curve by hand, records, and the figures."""

import json
import math
import statistics

import matplotlib.text
import numpy as np
import pytest

from vampire_jax._src.metrics import calibration as cal
from experiments import plots

LEVELS = np.linspace(0.1, 0.9, 9)


# -- Classification ------------------------------------------------------------


def _synthetic_classifier(rng, n, num_classes, confidence, accuracy_given_confidence):
  """Probabilities whose max is `confidence`, correct with the given probability."""
  probs = np.tile(((1 - confidence) / (num_classes - 1))[:, None], (1, num_classes))
  predicted = rng.integers(num_classes, size=n)
  probs[np.arange(n), predicted] = confidence
  correct = rng.random(n) < accuracy_given_confidence
  # A wrong label is any other class.
  wrong = (predicted + rng.integers(1, num_classes, size=n)) % num_classes
  return probs, np.where(correct, predicted, wrong)


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


# -- Regression ----------------------------------------------------------------


def test_normal_cdf_matches_erfc():
  x = np.linspace(-30, 30, 6001)
  reference = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
  got = cal.mixture_cdf(x, np.zeros((1, 1)), 1.0)
  np.testing.assert_allclose(got, reference, rtol=1e-12, atol=1e-300)


def test_mixture_cdf_is_the_average_of_component_cdfs():
  means = np.array([[-1.0, 0.0], [2.0, 0.5], [0.3, 4.0]])  # [3 samples, 2 points]
  y = np.array([0.7, 1.1])
  expected = [
    np.mean([statistics.NormalDist(m, 0.4).cdf(v) for m in means[:, i]]) for i, v in enumerate(y)
  ]
  np.testing.assert_allclose(cal.mixture_cdf(y, means, 0.4), expected, rtol=1e-12)


def test_single_gaussian_quantile_matches_normal_dist():
  means = np.array([[-2.0, 0.0, 3.5]])
  got = cal.mixture_quantile(LEVELS, means, 0.3)  # [9, 3]
  expected = [[statistics.NormalDist(m, 0.3).inv_cdf(p) for m in means[0]] for p in LEVELS]
  np.testing.assert_allclose(got, expected, atol=1e-9)


def test_bisection_quantile_of_a_mixture():
  rng = np.random.default_rng(3)
  means = rng.normal(size=(4, 50)) * 2  # [4 components, 50 points]
  q = cal.mixture_quantile(LEVELS, means, 0.3)
  # F(q) = p to within tol times the largest density, checked with NormalDist.
  for i in (0, 17, 49):
    for p, qp in zip(LEVELS, q[:, i]):
      f = np.mean([statistics.NormalDist(m, 0.3).cdf(qp) for m in means[:, i]])
      assert f == pytest.approx(p, abs=2e-6)
  # A symmetric two-component mixture has its median at the centre.
  centre = cal.mixture_quantile(0.5, np.array([[-1.0], [3.0]]), 0.5)
  assert centre.shape == (1,) and centre[0] == pytest.approx(1.0, abs=1e-6)
  # Quantiles increase with the level.
  assert np.all(np.diff(q, axis=0) > 0)


def _two_component_problem(rng, n, true_std, noise_std=0.3):
  """Predicted means [2, n] and targets drawn from the mixture with `true_std`."""
  centre = rng.uniform(-3, 3, size=n)
  means = np.stack([centre - 0.5, centre + rng.uniform(0, 1.5, size=n)])
  component = rng.integers(2, size=n)
  targets = means[component, np.arange(n)] + true_std * rng.normal(size=n)
  return means, targets


def test_targets_from_the_predictive_lie_on_the_diagonal():
  means, targets = _two_component_problem(np.random.default_rng(4), 100_000, true_std=0.3)
  result = cal.regression_quantile_calibration(means, targets, noise_std=0.3)
  np.testing.assert_allclose(result.levels, LEVELS)
  np.testing.assert_allclose(result.observed, LEVELS, atol=0.01)
  assert result.ece < 0.005 and result.mce < 0.01


def test_observed_equals_counting_targets_below_bisected_quantiles():
  means, targets = _two_component_problem(np.random.default_rng(5), 20_000, true_std=0.5)
  result = cal.regression_quantile_calibration(means, targets, noise_std=0.3)
  quantiles = cal.mixture_quantile(LEVELS, means, 0.3)  # [9, N]
  # Targets within the bisection tolerance of a quantile may flip: allow 1 in N.
  np.testing.assert_allclose(
    result.observed, np.mean(targets <= quantiles, axis=1), atol=1.5 / 20_000
  )


def test_too_narrow_predictive_is_overconfident():
  rng = np.random.default_rng(6)
  n, noise_std, true_std = 100_000, 0.3, 0.6
  means = rng.normal(size=(1, n))
  targets = means[0] + true_std * rng.normal(size=n)
  result = cal.regression_quantile_calibration(means, targets, noise_std)
  low, high = LEVELS < 0.5, LEVELS > 0.5
  assert np.all(result.observed[high] < LEVELS[high])
  assert np.all(result.observed[low] > LEVELS[low])
  # Closed form: P(y <= m + s z_p) = Phi(s z_p / true_std).
  expected = [
    statistics.NormalDist().cdf(noise_std / true_std * statistics.NormalDist().inv_cdf(p))
    for p in LEVELS
  ]
  np.testing.assert_allclose(result.observed, expected, atol=0.01)


def test_single_sample_matches_gaussian_closed_form():
  rng = np.random.default_rng(7)
  means = rng.normal(size=(1, 2000))
  targets = means[0] + 0.4 * rng.normal(size=2000)
  result = cal.regression_quantile_calibration(means, targets, noise_std=0.3)
  gauss = statistics.NormalDist()
  pit = np.array([gauss.cdf((y - m) / 0.3) for y, m in zip(targets, means[0])])
  expected = [np.mean(pit <= p) for p in LEVELS]
  np.testing.assert_array_equal(result.observed, expected)
  gap = np.abs(np.array(expected) - LEVELS)
  assert result.ece == pytest.approx(gap.mean()) and result.mce == pytest.approx(gap.max())


def test_task_axis_is_pooled():
  rng = np.random.default_rng(8)
  means = rng.normal(size=(6, 3, 10))  # [tasks, samples, query]
  targets = rng.normal(size=(6, 10))  # [tasks, query]
  pooled = cal.regression_quantile_calibration(
    np.moveaxis(means, 1, 0).reshape(3, 60), targets.reshape(60), 0.3
  )
  by_task = cal.regression_quantile_calibration(means, targets, 0.3)
  evaluator_shaped = cal.regression_quantile_calibration(means[..., None], targets[..., None], 0.3)
  for result in (by_task, evaluator_shaped):
    np.testing.assert_array_equal(result.observed, pooled.observed)
    assert result.ece == pooled.ece and result.mce == pooled.mce


@pytest.mark.parametrize(
  "means_shape, targets_shape",
  [
    ((5,), (5,)),  # no sample axis
    ((2, 5), (4,)),  # points differ
    ((2, 3, 5), (2, 4)),  # query differs
    ((2, 3, 5), (3, 5)),  # tasks differ
    ((2, 3, 5, 2), (2, 5, 2)),
    ((0, 5), (5,)),  # no samples
  ],
)
def test_regression_shape_errors(means_shape, targets_shape):
  with pytest.raises(ValueError):
    cal.regression_quantile_calibration(np.zeros(means_shape), np.zeros(targets_shape), 0.3)


def test_regression_value_errors():
  means, targets = np.zeros((1, 4)), np.zeros(4)
  with pytest.raises(ValueError, match="noise_std"):
    cal.regression_quantile_calibration(means, targets, 0.0)
  with pytest.raises(ValueError, match="levels"):
    cal.regression_quantile_calibration(means, targets, 0.3, levels=[0.0, 0.5])
  with pytest.raises(ValueError, match="levels"):
    cal.mixture_quantile(1.0, means, 0.3)


# -- Plots -----------------------------------------------------------------------


def _is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_write_png_files(tmp_path):
  rng = np.random.default_rng(9)
  confidence = rng.uniform(0.2, 1.0, size=5000)
  probs, labels = _synthetic_classifier(rng, 5000, 5, confidence, confidence**2)
  bins = cal.classification_calibration(probs, labels)
  means, targets = _two_component_problem(rng, 5000, true_std=0.5)
  quantiles = {
    "VAMPIRE": cal.regression_quantile_calibration(means, targets, 0.3),
    "MAML": cal.regression_quantile_calibration(means[:1], targets, 0.3),
  }
  paths = [
    plots.plot_reliability_diagram(bins, tmp_path / "single.png", title="one"),
    plots.plot_reliability_diagram({"MAML": bins, "VAMPIRE": bins}, tmp_path / "two.png"),
    plots.plot_quantile_calibration(
      quantiles, tmp_path / "quantiles.png", title="sine+line", point_estimates=["MAML"]
    ),
    plots.plot_risk_coverage({"A": cal.risk_coverage(probs, labels)}, tmp_path / "risk.png"),
    plots.plot_training_curves(
      {"loss": [3.0, 2.0, 1.5], "accuracy": [0.2, 0.5, 0.7]}, [0, 100, 200], tmp_path / "curves.png"
    ),
  ]
  for path in paths:
    assert path.stat().st_size > 1000 and _is_png(path)
  with pytest.raises(ValueError):
    plots.plot_training_curves({"loss": [1.0]}, [0, 1], tmp_path / "bad.png")


def test_reliability_figure_has_one_title_and_a_histogram_of_the_bin_counts():
  probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.55, 0.45], [0.6, 0.4]])
  bins = cal.classification_calibration(probs, np.array([0, 1, 0, 0]), num_bins=5)
  fig = plots.reliability_figure(bins, title="VAMPIRE: 4 test tasks")
  titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
  assert titles == ["VAMPIRE: 4 test tasks"] and fig._suptitle is None
  histogram = fig.axes[1]  # under the diagram: one bar per bin, heights = the counts
  np.testing.assert_array_equal([p.get_height() for p in histogram.patches], bins.count)
  two = plots.reliability_figure({"MAML": bins, "VAMPIRE": bins}, title="both")
  assert two._suptitle.get_text() == "both"
  assert sorted(ax.get_title() for ax in two.axes if ax.get_title()) == ["MAML", "VAMPIRE"]


def test_training_curves_show_validation_and_readable_step_labels():
  steps = list(range(0, 15001, 500))
  fig = plots.training_curves_figure(
    {"loss": [1.0] * len(steps), "accuracy": [0.5] * len(steps)},
    steps,
    validation={"accuracy": ([5000, 10000, 15000], [0.6, 0.7, 0.8])},
  )
  fig.canvas.draw()
  accuracy = fig.axes[1]
  assert [line.get_label() for line in accuracy.get_lines()] == ["training", "validation"]
  labels = [t.get_text() for t in accuracy.get_xticklabels() if t.get_text()]
  assert 2 <= len(labels) <= 6 and all(len(text) <= 4 for text in labels), labels  # e.g. '10k'


def test_reliability_figure_greys_low_count_bins_and_marks_the_mce_bin():
  # The hand-worked bins above: the MCE (0.55) is set by bin 2, a single prediction.
  probs = np.array([[0.9, 0.1]] * 4 + [[0.7, 0.3]] * 2 + [[0.55, 0.45]])
  bins = cal.classification_calibration(
    probs, np.array([0, 0, 0, 1, 0, 0, 1]), num_bins=5, min_count=2
  )
  fig = plots.reliability_figure(bins, title="toy: 7 predictions")
  diagram, histogram = fig.axes[0], fig.axes[1]
  grey = [p for p in diagram.patches if np.allclose(p.get_facecolor()[:3], 211 / 255)]
  assert [round(p.get_x(), 6) for p in grey] == [0.4]  # only bin 2, (0.4, 0.6], is grey
  assert [t.get_text() for t in diagram.texts] == ["MCE bin: n = 1"]
  legend = [t.get_text() for t in histogram.get_legend().get_texts()]
  assert any("MCE = 0.550 (bin of 1)" in t and "MCE over bins of ≥ 2: 0.300" in t for t in legend)
  light = [p for p in histogram.patches if np.allclose(p.get_facecolor()[:3], 211 / 255)]
  assert [p.get_height() for p in light] == [0, 0, 1]  # empty and one-prediction bins


def test_risk_coverage_figure_draws_risk_and_its_reference_lines():
  probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
  curve = cal.risk_coverage(probs, np.array([0, 0, 0, 0]))
  fig = plots.risk_coverage_figure({"VAMPIRE": curve}, title="toy")
  (ax,) = fig.axes
  risk, random, oracle = ax.get_lines()
  np.testing.assert_allclose(risk.get_ydata(), [0.0, 0.5, 1 / 3, 0.5])  # risk, not accuracy
  np.testing.assert_allclose(random.get_ydata(), [0.5, 0.5])
  x, y = oracle.get_xdata(), oracle.get_ydata()
  np.testing.assert_allclose(y, np.maximum(0, 1 - 0.5 / x))
  assert risk.get_label() == f"VAMPIRE: AURC {curve.aurc:.4f}"
  # The references are orderings of VAMPIRE's predictions, not methods named "VAMPIRE: ...".
  assert random.get_label() == f"random order (AURC {curve.error_rate:.4f})"
  assert oracle.get_label() == f"oracle order, errors last (AURC {curve.oracle_aurc:.4f})"
  assert ax.get_ylabel().startswith("Risk")
  two = plots.risk_coverage_figure({"MAML": curve, "VAMPIRE": curve})
  labels = [line.get_label() for line in two.axes[0].get_lines()]
  assert labels[1] == f"random order of MAML's errors (AURC {curve.error_rate:.4f})"
  assert labels[5].startswith("oracle order of VAMPIRE's errors, errors last")


def test_reliability_legend_shows_the_gap_in_the_bars_colour_and_the_mce_label_clear_of_it():
  rng = np.random.default_rng(0)
  confidence = rng.uniform(0.3, 1.0, 400)
  probs = np.stack([confidence, 1 - confidence], 1)
  # Every label 0: above 0.5 the accuracy (1) tops the confidence, and the gap is drawn over
  # the accuracy bar, where a translucent red fill turned purple.
  labels = np.zeros(400, int)
  bins = cal.classification_calibration(probs, labels, num_bins=10)
  fig = plots.reliability_figure(bins, title="toy")
  diagram, histogram = fig.axes
  legend = histogram.get_legend()
  handles = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles))
  gap = handles["Gap to the bin's mean confidence"]
  gap_bars = [p for p in diagram.patches if p.get_hatch() == "//"]
  # A red hatch with no fill, in the legend and on every bar: over an accuracy bar the blue
  # shows through unmixed, and the bar's top is still the accuracy.
  assert gap_bars and gap.get_facecolor()[3] == 0.0
  for bar in gap_bars:
    assert bar.get_facecolor()[3] == 0.0 and bar.get_edgecolor() == gap.get_edgecolor()
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  (label,) = diagram.texts
  text = matplotlib.text.Text.get_window_extent(label, renderer)  # the text, not its arrow
  assert not text.overlaps(legend.get_window_extent(renderer))
  # The legend sits under the histogram, clear of the bars of both panels, inside the figure.
  box = legend.get_window_extent(renderer)
  for ax in (diagram, histogram):
    assert not box.overlaps(ax.get_window_extent(renderer))
  assert box.y0 >= 0 and box.x0 >= 0 and box.x1 <= fig.bbox.width


def test_a_point_estimate_is_drawn_as_its_markers_not_as_a_calibrated_looking_line():
  maml = cal.paper_quantile_calibration(np.array([[0.3]]), np.array([0.0]), 0.3)  # Phi(1) = 0.84
  fig = plots.quantile_calibration_figure({"MAML": maml}, point_estimates=["MAML"])
  (ax,) = fig.axes
  _, line = ax.get_lines()
  assert line.get_linestyle() == "None"
  np.testing.assert_allclose(line.get_xdata(), maml.levels)
  np.testing.assert_allclose(line.get_ydata(), maml.observed)  # flat at 0.84, not (0,0)..(1,1)


def test_training_curves_have_y_labels_and_mark_the_best_checkpoint():
  steps = list(range(0, 201, 5))
  fig = plots.training_curves_figure(
    {"loss": [1.0] * len(steps)},
    steps,
    validation={"mse": ([50, 100, 150, 200], [0.9, 0.5, 0.6, 0.7])},
    best={"step": 100, "score": 0.5, "metric": "mse"},
  )
  loss, mse = fig.axes  # the validation-only metric gets a panel of its own
  assert loss.get_ylabel() and mse.get_ylabel() == "query MSE"
  star = [line for line in mse.get_lines() if line.get_marker() == "*"]
  assert (
    len(star) == 1 and list(star[0].get_xdata()) == [100] and list(star[0].get_ydata()) == [0.5]
  )
  assert star[0].get_label() == "best checkpoint (step 100), the one tested"
  (legend,) = fig.legends  # one for every panel, below them
  names = {t.get_text() for t in legend.get_texts()}
  for ax in (loss, mse):  # a dotted line at the best step on every panel, in the legend
    (line,) = [line for line in ax.get_lines() if list(line.get_xdata()) == [100, 100]]
    assert line.get_label() == "step of the best validation (100)"
    # Every line drawn is named in the legend (matplotlib names unlabelled ones "_...").
    assert {line.get_label() for line in ax.get_lines()} <= names
    assert ax.get_legend() is None


def test_training_curves_fill_a_balanced_grid_with_readable_titles_and_a_legend_clear_of_data():
  """4 panels fill a 2 x 2 grid, with readable titles, and one legend clear of every panel."""
  steps = list(range(0, 201, 10))
  history = {name: [1.0] * len(steps) for name in ("loss", "accuracy", "log_std")}
  validation = {"accuracy": ([100, 200], [0.5, 0.6]), "ece": ([100, 200], [0.1, 0.2])}
  fig = plots.training_curves_figure(history, steps, validation)
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  visible = [ax for ax in fig.axes if ax.get_visible()]
  assert len(fig.axes) == len(visible) == 4  # 2 x 2, no empty panel
  assert [ax.get_title() for ax in visible] == [
    "Meta-training loss",
    "Accuracy",
    "Prior's log-std",
    "Calibration (ECE)",
  ]
  (legend,) = fig.legends
  box = legend.get_window_extent(renderer)
  assert all(not box.overlaps(ax.get_window_extent(renderer)) for ax in visible)
  assert box.x0 >= 0 and box.x1 <= fig.bbox.width


# -- The paper's regression metric and selective prediction --------------------------


def test_paper_quantile_calibration_by_hand():
  # Two draws at -1 and +1 around a truth of 0 with noise std 1: the outputs'
  # quantiles at levels 0, 0.5, 1 are -1, 0, 1, and the true N(0, 1) puts
  # Phi(-1), 1/2, Phi(1) of the observations below them.
  result = cal.paper_quantile_calibration(
    np.array([[-1.0], [1.0]]), np.array([0.0]), 1.0, levels=[0.0, 0.5, 1.0]
  )
  phi = statistics.NormalDist().cdf
  np.testing.assert_allclose(result.observed, [phi(-1), 0.5, phi(1)], atol=1e-12)
  gaps = [phi(-1), 0.0, 1 - phi(1)]
  np.testing.assert_allclose(result.ece, np.mean(gaps), atol=1e-12)
  np.testing.assert_allclose(result.mce, max(gaps), atol=1e-12)
  # A point estimate (one draw) has one observed value at all 11 default levels.
  single = cal.paper_quantile_calibration(np.array([[0.3]]), np.array([0.0]), 0.3)
  np.testing.assert_allclose(single.observed, phi(1.0) * np.ones(11), atol=1e-12)
  assert len(single.levels) == 11 and single.levels[0] == 0 and single.levels[-1] == 1


def test_paper_quantile_calibration_is_perfect_when_the_outputs_are_the_noise():
  # Outputs drawn from the true distribution N(y0, sigma^2): on the diagonal.
  rng = np.random.default_rng(3)
  truth = rng.normal(size=400)
  outputs = truth[None] + 0.3 * rng.normal(size=(4000, 400))
  result = cal.paper_quantile_calibration(outputs, truth, 0.3)
  np.testing.assert_allclose(result.observed, result.levels, atol=0.01)
  assert result.ece < 0.005


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


def test_regression_figures_keep_titles_inside_and_legends_off_the_data():
  """The calibration figure's title fits inside the figure, and its legend and the
  predictions figure's lie outside the panels."""
  levels = np.linspace(0.05, 0.95, 10)
  result = cal.QuantileCalibration(levels, levels, 0.0, 0.0)
  title = "sine/line, quantile calibration of the predictive: VAMPIRE against BMAML and MAML"
  fig = plots.quantile_calibration_figure({"VAMPIRE": result, "MAML": result}, title, ["MAML"])
  renderer = fig.canvas.get_renderer()
  fig.draw(renderer)
  (ax,) = fig.axes
  figure_box = fig.bbox
  title_box = ax.title.get_window_extent(renderer)
  assert figure_box.x0 <= title_box.x0 and title_box.x1 <= figure_box.x1
  assert ax.get_legend() is None
  (legend,) = fig.legends
  assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))

  grid = np.linspace(-5, 5, 50)
  predictions = {"VAMPIRE": np.zeros((2, 4, 50)), "MAML": np.zeros((2, 1, 50))}
  fig = plots.regression_predictions_figure(
    grid, np.zeros((2, 50)), np.zeros((2, 5)), np.zeros((2, 5)), predictions, 0.3
  )
  (first, _) = fig.axes
  assert first.get_legend() is None
  (legend,) = fig.legends  # one for both panels, under them
  names = {t.get_text() for t in legend.get_texts()}
  assert {"truth", "support", "MAML", "VAMPIRE mean", "VAMPIRE ±2σ"} <= names
  fig.draw(fig.canvas.get_renderer())
  for ax in fig.axes:
    assert not legend.get_window_extent().overlaps(ax.get_window_extent())


# -- Figures a newcomer read wrongly (issue 50) --------------------------------------------


def _inside(box, fig) -> bool:
  return box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height


def test_a_one_panel_regression_figure_keeps_its_legend_inside():
  """Notebook 01's own task: six legend columns under one panel ran past both its edges."""
  grid = np.linspace(-5, 5, 50)
  fig = plots.regression_predictions_figure(
    grid,
    np.zeros((1, 50)),
    np.zeros((1, 5)),
    np.zeros((1, 5)),
    {"VAMPIRE": np.zeros((1, 8, 50))},
    0.3,
  )
  fig.draw(fig.canvas.get_renderer())
  (legend,) = fig.legends
  assert _inside(legend.get_window_extent(), fig)
  assert {t.get_text() for t in legend.get_texts()} >= {"VAMPIRE mean", "VAMPIRE ±2σ", "support"}


def test_training_curve_panels_share_their_steps_and_a_log_std_panel_does_not_magnify_noise():
  """training_curves.png: the ECE panel (validation only) shares the others' x-range and
  ticks, and a log-std that moves by 0.002 gets a range of 0.1, not the whole panel."""
  steps = list(range(10, 201, 10))
  history = {
    "loss": list(np.linspace(1.6, 1.1, len(steps))),
    "log_std": list(np.linspace(-3.502, -3.500, len(steps))),
  }
  fig = plots.training_curves_figure(history, steps, {"ece": ([40, 120, 200], [0.07, 0.2, 0.2])})
  loss, log_std, ece = fig.axes
  assert loss.get_xlim() == log_std.get_xlim() == ece.get_xlim()
  assert loss.get_xlim()[0] == 0 and 200 < loss.get_xlim()[1] <= 210  # the last step inside
  assert list(loss.get_xticks()) == list(ece.get_xticks())
  low, high = log_std.get_ylim()
  assert high - low == pytest.approx(0.1) and low < -3.502 and high > -3.500
  assert loss.get_ylim()[1] - loss.get_ylim()[0] < 1  # other panels keep their own range


def test_risk_coverage_legend_is_under_the_axes():
  """Its legend sat at the upper left, on the random-order line and the first points."""
  confidence = np.linspace(0.3, 1.0, 200)
  probs = np.stack([confidence, 1 - confidence], 1)
  labels = (np.arange(200) % 3 == 0).astype(int)
  fig = plots.risk_coverage_figure({"VAMPIRE": cal.risk_coverage(probs, labels)})
  fig.draw(fig.canvas.get_renderer())
  (ax,) = fig.axes
  assert ax.get_legend() is None
  (legend,) = fig.legends
  box = legend.get_window_extent()
  assert not box.overlaps(ax.get_window_extent()) and _inside(box, fig)


def test_run_figures_say_how_long_the_run_trained(tmp_path, monkeypatch):
  """reliability.png of the 200-step quick run read like a paper run's."""
  titles = {}
  for name in ("plot_reliability_diagram", "plot_risk_coverage", "plot_training_curves"):
    monkeypatch.setattr(
      plots, name, lambda *args, _name=name, title=None, **kw: titles.setdefault(_name, title)
    )
  confidence = np.linspace(0.3, 1.0, 100)
  probs = np.stack([confidence, 1 - confidence], 1)
  labels = np.zeros(100, int)
  results = {
    "kind": "classification",
    "config": {"num_meta_steps": 200, "tasks_per_step": 8, "algorithm": "vampire"},
    "meta_steps": 200,
    "test": {"num_tasks": 200, "accuracy": 0.5},
    "calibration": {
      "reliability": cal.to_record(cal.classification_calibration(probs, labels)),
      "risk_coverage": cal.to_record(cal.risk_coverage(probs, labels)),
    },
  }
  (tmp_path / "metrics.jsonl").write_text(
    json.dumps({"step": 10, "train/loss": 1.0}) + "\n" + json.dumps({"step": 20, "train/loss": 0.9})
  )
  plots.run_figures(tmp_path, results, "VAMPIRE", "Omniglot 5-way 1-shot")
  assert titles["plot_reliability_diagram"] == (
    "VAMPIRE, Omniglot 5-way 1-shot\n200 meta-steps of 8 tasks, 200 test tasks"
  )
  assert "200 meta-steps of 8 tasks" in titles["plot_risk_coverage"]
  assert titles["plot_training_curves"].endswith("meta-training, 200 meta-steps of 8 tasks")
