import errno
import json
import os

import matplotlib.text
import numpy as np
import pytest

from experiments import plots
from tests.conftest import REPO
from tests.helpers import _synthetic_classifier, _two_component_problem
from vampire_jax._src.core.errors import StorageError
from vampire_jax._src.metrics import calibration as cal


def _is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == b"\x89PNG\r\n\x1a\n"


def _inside(box, fig) -> bool:
  return box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height


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


def test_a_full_disk_while_a_figure_is_written_keeps_the_old_image(tmp_path, monkeypatch):
  """A full disk while a figure is written is one StorageError naming the file; the old
  image stays whole and no temporary file is left."""
  from matplotlib.figure import Figure

  path = tmp_path / "reliability.png"

  def figure():
    fig, [ax] = plots._new_figure(1)
    ax.plot(np.arange(5.0))
    return fig

  plots._save(figure(), path, "a figure")
  before = path.read_bytes()
  assert before.startswith(b"\x89PNG")
  savefig = Figure.savefig

  def full_disk(self, target, *args, **kwargs):
    if isinstance(target, (str, os.PathLike)):  # savefig(path) opens the file itself
      with open(target, "wb") as f:
        f.write(b"\x89PNG\r\n")
    else:
      target.write(b"\x89PNG\r\n")  # a few bytes, then the disk is full
    raise OSError(errno.ENOSPC, "No space left on device", str(path))

  monkeypatch.setattr(Figure, "savefig", full_disk)
  with pytest.raises(StorageError, match=f"no space left on device writing {path}"):
    plots._save(figure(), path, "a figure")
  assert path.read_bytes() == before
  assert [p.name for p in tmp_path.iterdir()] == ["reliability.png"]  # no temporary file left
  monkeypatch.setattr(Figure, "savefig", savefig)


def test_the_regression_calibration_figure_is_named_by_its_metric():
  """Its MAML at 0.132 is the PIT calibration of the time; today's `ece`, the paper's, puts
  MAML at its 0.274 floor: the text beside the figure says which is which."""
  text = (REPO / "docs" / "fidelity.md").read_text()
  start = text.index("`docs/regression_calibration.png`")
  beside = " ".join(text[start : start + 900].split())
  assert "`pit_ece`; MAML 0.132 in the figure" in beside and "3/11" in beside
  assert "vj.paper_quantile_calibration" in beside and "0.274" in beside
