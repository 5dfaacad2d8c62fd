"""Figures: reliability diagrams with their confidence histograms, risk-coverage
curves, quantile calibration, training curves, regression fits. Each
function writes one image file; `run_figures` draws a finished run's.

matplotlib is imported inside the functions, never at import time, and the
figures are drawn on an Agg canvas without pyplot, so nothing here changes
the global backend or leaves figures open (safe from a notebook, too).
"""

import math
import os
import textwrap
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from vampire_jax import QuantileCalibration, ReliabilityBins, RiskCoverage, metrics
from vampire_jax.runs import config_records, kinds, reporting

PathLike = Union[str, os.PathLike]


def _new_figure(num_panels: int, panel_size: float = 4.0, max_cols: int = 4):
  """An Agg-backed figure with `num_panels` axes in a grid; returns (fig, axes)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  rows = math.ceil(num_panels / max_cols)
  cols = math.ceil(num_panels / rows)  # balanced: 4 panels are 2 x 2, not 3 + 1 of 2 x 3
  fig = Figure(figsize=(panel_size * cols, panel_size * rows), layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
  for ax in axes[num_panels:]:
    ax.set_visible(False)
  return fig, axes[:num_panels]


def _new_grid(
  num_columns: int,
  height_ratios: Sequence[float],
  column_width: float = 4.0,
  height: Optional[float] = None,
):
  """An Agg figure with `num_columns` columns of stacked axes; returns (fig, columns)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  height = column_width * 1.3 if height is None else height
  fig = Figure(figsize=(column_width * num_columns, height), layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(
    len(height_ratios),
    num_columns,
    squeeze=False,
    sharex="col",
    gridspec_kw={"height_ratios": list(height_ratios)},
  )
  return fig, [tuple(axes[:, c]) for c in range(num_columns)]


def _save(fig, path: PathLike, title: Optional[str]) -> PathLike:
  """Writes `fig` to `path` whole or not at all (`run_folder.write_atomic`: a full disk
  keeps the previous image and is a one-line `StorageError` naming the file)."""
  from vampire_jax.runs import run_folder

  if title:
    fig.suptitle(title)
  image_format = Path(path).suffix.lstrip(".") or "png"
  run_folder.write_atomic(path, lambda f: fig.savefig(f, dpi=120, format=image_format))
  return path


def _draw_reliability(ax, b: ReliabilityBins, title: str) -> None:
  edges = np.asarray(b.edges)
  width = np.diff(edges)
  count = np.asarray(b.count)
  accuracy, confidence = np.asarray(b.accuracy), np.asarray(b.confidence)
  readable = count >= b.min_count
  # The gap is a hatch with no fill: a translucent fill drawn over the accuracy bar (an
  # under-confident bin) mixed with the blue and no longer matched its legend entry, and an
  # opaque one hid the top of the accuracy bar. The hatch is the same over any background.
  for shown, colour, edge_colour, label, gap_label in (
    (readable, "tab:blue", "tab:red", "Accuracy", "Gap to the bin's mean confidence"),
    (
      (count > 0) & ~readable,
      "lightgrey",
      "dimgrey",
      f"Accuracy, bin of < {b.min_count} predictions",
      None,
    ),
  ):
    if not np.any(shown):
      continue
    ax.bar(
      edges[:-1][shown],
      accuracy[shown],
      width=width[shown],
      align="edge",
      color=colour,
      edgecolor="black",
      linewidth=0.6,
      label=label,
    )
    # The gap: a bar from accuracy up (or down) to the bin's mean confidence.
    ax.bar(
      edges[:-1][shown],
      (confidence - accuracy)[shown],
      bottom=accuracy[shown],
      width=width[shown],
      align="edge",
      facecolor="none",
      edgecolor=edge_colour,
      hatch="//",
      linewidth=0.6,
      label=gap_label,
    )
  ax.plot([0, 1], [0, 1], "k--", linewidth=1.0, label="Perfect calibration")
  # The bin that sets the paper's MCE, outlined, with its count.
  worst = b.mce_bin
  ax.bar(
    edges[worst],
    confidence[worst] - accuracy[worst],
    bottom=accuracy[worst],
    width=width[worst],
    align="edge",
    fill=False,
    edgecolor="black",
    linewidth=2.0,
  )
  centre, bottom = edges[worst] + width[worst] / 2, min(accuracy[worst], confidence[worst])
  # The label sits in the lower right corner; the legend is beside the diagram.
  ax.annotate(
    f"MCE bin: n = {int(count[worst])}",
    xy=(centre, bottom),
    xytext=(0.97, 0.04),
    textcoords="axes fraction",
    fontsize="small",
    ha="right",
    va="bottom",
    bbox=dict(boxstyle="round", facecolor="white", alpha=0.9),
    arrowprops=dict(arrowstyle="->", linewidth=0.8),
  )
  extra = f"none holds {b.min_count}" if math.isnan(b.mce_min_count) else f"{b.mce_min_count:.3f}"
  ax.plot(
    [],
    [],
    " ",
    label=f"ECE = {b.ece:.3f}\nMCE = {b.mce:.3f} (bin of {int(count[worst])})\n"
    f"MCE over bins of ≥ {b.min_count}: {extra}",
  )
  ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="Accuracy", title=title)
  ax.tick_params(labelbottom=False)


def _draw_confidence_histogram(ax, b: ReliabilityBins) -> None:
  """How many predictions fall in each bin: a bin of few predictions explains a large MCE."""
  edges, count = np.asarray(b.edges), np.asarray(b.count)
  colours = np.where(count >= b.min_count, "tab:gray", "lightgrey")
  ax.bar(
    edges[:-1],
    count,
    width=np.diff(edges),
    align="edge",
    color=colours,
    edgecolor="black",
    linewidth=0.5,
  )
  ax.axhline(b.min_count, color="black", linestyle=":", linewidth=0.8)
  ax.text(0.01, b.min_count, f" {b.min_count}", va="bottom", fontsize="x-small")
  ax.set_yscale("log")
  ax.set(xlim=(0, 1), xlabel="Confidence", ylabel="Predictions")


def plot_reliability_diagram(
  bins: Union[ReliabilityBins, dict[str, ReliabilityBins]],
  path: PathLike,
  title: Optional[str] = None,
) -> PathLike:
  """Reliability diagram(s) over their confidence histograms.

  Bars show each bin's accuracy; the shaded bars between accuracy and mean
  confidence show the miscalibration gap (red above the bar: over-confident).
  Under each diagram, the number of predictions per bin (log scale). Bins
  of fewer than `bins.min_count` predictions are grey: their accuracy is
  too noisy to read. The bin that sets the paper's MCE is outlined and
  labelled with its count. The legend gives ECE, the paper's MCE and, as
  an extra, the MCE over the bins of at least `min_count` predictions. With a dict, one column per method, side by
  side, as in the paper's Fig. 3; `title` goes on the figure then, on the
  single panel otherwise.

  Args:
    bins: from `calibration.classification_calibration`, or `{method: bins}`.
    path: output file; PNG unless its suffix names another format.
    title: optional title.

  Returns:
    `path`.
  """
  return _save(reliability_figure(bins, title), path, None)


def reliability_figure(
  bins: Union[ReliabilityBins, dict[str, ReliabilityBins]], title: Optional[str] = None
):
  """The figure `plot_reliability_diagram` saves (one title: the panel's, or the figure's)."""
  panels = {"": bins} if isinstance(bins, ReliabilityBins) else dict(bins)
  if not panels:
    raise ValueError("bins must be a ReliabilityBins or a non-empty dict of them")
  fig, columns = _new_grid(len(panels), [3, 1], height=7.2)
  for (top, bottom), (name, b) in zip(columns, panels.items()):
    _draw_reliability(top, b, name or (title or ""))
    _draw_confidence_histogram(bottom, b)
    # Under the histogram, not on the diagram: there it covered the bars of middle confidence.
    bottom.legend(
      *top.get_legend_handles_labels(),
      loc="upper center",
      bbox_to_anchor=(0.5, -0.45),
      fontsize="x-small",
    )
  if len(panels) > 1 and title:
    fig.suptitle(title)
  return fig


def plot_risk_coverage(
  curves: Union[RiskCoverage, dict[str, RiskCoverage]], path: PathLike, title: Optional[str] = None
) -> PathLike:
  """Selective prediction: the risk (error rate) of the most confident predictions
  against coverage.

  One line per method, its AURC (the area under it, lower is better) in the
  legend, with two references in the same colour: random (a dotted line at
  the overall error rate: an ordering that knows nothing keeps it at every
  coverage) and oracle (dashed: every error ranked last, the lowest curve
  this error rate allows; its area, `oracle_aurc`, in the legend).
  """
  return _save(risk_coverage_figure(curves, title), path, None)


def risk_coverage_figure(
  curves: Union[RiskCoverage, dict[str, RiskCoverage]], title: Optional[str] = None
):
  """The figure `plot_risk_coverage` saves."""
  curves = {"": curves} if isinstance(curves, RiskCoverage) else dict(curves)
  if not curves:
    raise ValueError("curves must be a RiskCoverage or a non-empty dict of them")
  fig, (ax,) = _new_figure(1, panel_size=4.5)
  fig.set_size_inches(4.5, 4.5 + 0.2 * 3 * len(curves))  # room for the legend underneath
  colours = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink"]
  for i, (name, c) in enumerate(curves.items()):
    colour = colours[i % len(colours)]
    prefix = f"{name}: " if name else ""
    # The references are orderings of this method's own predictions, not methods: with
    # one curve they need no name, with several they say whose errors they order.
    whose = f" of {name}'s errors" if name and len(curves) > 1 else ""
    ax.plot(c.coverage, c.risk, color=colour, linewidth=1.5, label=f"{prefix}AURC {c.aurc:.4f}")
    ax.plot(
      [0, 1],
      [c.error_rate, c.error_rate],
      ":",
      color=colour,
      linewidth=1.0,
      label=f"random order{whose} (AURC {c.error_rate:.4f})",
    )
    coverage = np.linspace(1e-3, 1.0, 500)
    ax.plot(
      coverage,
      metrics.oracle_risk(coverage, c.error_rate),
      "--",
      color=colour,
      linewidth=1.0,
      label=f"oracle order{whose}, errors last (AURC {c.oracle_aurc:.4f})",
    )
  ax.set(
    xlim=(0, 1),
    ylim=(0, None),
    xlabel="Coverage (fraction kept, most confident first)",
    ylabel="Risk (error rate of the kept predictions)",
    title=title or "",
  )
  ax.grid(alpha=0.3)
  # Under the axes: at the upper left it covered the random-order line and the first points.
  fig.legend(loc="outside lower center", fontsize="small")
  return fig


def plot_quantile_calibration(
  results: Union[QuantileCalibration, dict[str, QuantileCalibration]],
  path: PathLike,
  title: Optional[str] = None,
  point_estimates: Sequence[str] = (),
) -> PathLike:
  """Observed against expected quantile levels, one line per method (Fig. 2c).

  A method named in `point_estimates` (one prediction per input, MAML) has
  the same quantile at every level, so the fraction below it is the same
  at every level: it is drawn as those markers only, a flat row, unjoined.
  (The paper joins its value at 0.5 to (0, 0) and (1, 1), a line that
  looks calibrated whatever the ECE; this figure does not.)

  Args:
    results: from `calibration.paper_quantile_calibration` (or the PIT
      variant), or `{method: result}`.
    path: output file; PNG unless its suffix names another format.
    title: optional axes title.
    point_estimates: names of the methods that predict one value per input,
      drawn as unjoined markers.

  Returns:
    `path`.
  """
  return _save(quantile_calibration_figure(results, title, point_estimates), path, None)


def quantile_calibration_figure(
  results: Union[QuantileCalibration, dict[str, QuantileCalibration]],
  title: Optional[str] = None,
  point_estimates: Sequence[str] = (),
):
  """The figure `plot_quantile_calibration` saves."""
  results = {"": results} if isinstance(results, QuantileCalibration) else dict(results)
  if not results:
    raise ValueError("results must be a QuantileCalibration or a non-empty dict of them")
  fig, (ax,) = _new_figure(1, panel_size=5.0)
  ax.plot([0, 1], [0, 1], "k--", linewidth=1.0, label="Perfect calibration")
  for name, r in results.items():
    label = f"{name + ': ' if name else ''}ECE {r.ece:.3f}, MCE {r.mce:.3f}"
    if name in point_estimates:
      ax.plot(
        r.levels,
        r.observed,
        "s",
        markersize=6,
        linestyle="none",
        label=f"{label}\n(point estimate: one quantile for every level)",
      )
    else:
      ax.plot(r.levels, r.observed, "o-", markersize=4, label=label)
  ax.set(
    xlim=(0, 1),
    ylim=(0, 1),
    aspect="equal",
    xlabel="Expected quantile level p",
    ylabel="Observed fraction below the predicted p-quantile",
  )
  # Wrapped to the panel's width (a long title was cut at the figure's edge), and the
  # legend under the axes, where it covers no line.
  ax.set_title(textwrap.fill(title or "", 48), fontsize="medium")
  fig.legend(loc="outside lower center", fontsize="small")
  return fig


def plot_training_curves(
  history: dict[str, Sequence[float]],
  steps: Sequence[int],
  path: PathLike,
  title: Optional[str] = None,
  validation: Optional[dict[str, tuple[Sequence[int], Sequence[float]]]] = None,
  best: Optional[dict] = None,
) -> PathLike:
  """Logged metrics against the meta-training step, one panel per metric.

  Args:
    history: `{metric name: values}`, each as long as `steps` (training).
    steps: the steps at which the values were logged.
    path: output file; PNG unless its suffix names another format.
    title: optional figure title.
    validation: `{metric name: (steps, values)}` drawn as markers on the
      panel of the same name (e.g. validation accuracy over training
      accuracy), or on a panel of their own if training logs no such metric.
    best: results.json's `best_validation` (`{"step", "score", "metric"}`):
      the checkpoint kept and tested, a star on its metric's panel and a
      dotted line at its step on every panel.

  Returns:
    `path`.
  """
  return _save(training_curves_figure(history, steps, validation, best), path, title)


_Y_LABELS = {
  "loss": "meta-training loss (per task)",
  "accuracy": "query accuracy",
  "mse": "query MSE",
  "nll": "query NLL",
  "mae": "query MAE",
  "log_std": "mean log-std of the prior",
  "ece": "calibration error (ECE)",
}


# The smallest y-range a panel shows, centred on its values: a prior's mean log-std that
# moved by 0.002 (0.2 % in sigma) filled its panel as if it had doubled.
_MIN_Y_RANGE = {"log_std": 0.1}


_TITLES = {
  "loss": "Meta-training loss",
  "accuracy": "Accuracy",
  "mse": "MSE",
  "nll": "NLL",
  "mae": "MAE",
  "log_std": "Prior's log-std",
  "ece": "Calibration (ECE)",
}


def training_curves_figure(
  history: dict[str, Sequence[float]],
  steps: Sequence[int],
  validation: Optional[dict] = None,
  best: Optional[dict] = None,
):
  """The figure `plot_training_curves` saves."""
  from matplotlib.ticker import EngFormatter, MaxNLocator

  if not history:
    raise ValueError("history must hold at least one metric")
  for name, values in history.items():
    if len(values) != len(steps):
      raise ValueError(f"metric {name!r} has {len(values)} values for {len(steps)} steps")
  validation = validation or {}
  names = list(history) + [name for name in validation if name not in history]
  fig, axes = _new_figure(len(names), panel_size=3.5, max_cols=3)
  # Every panel spans the same steps, from 0 to the last logged or validated: a panel of
  # validation alone (ECE) started at the first validation and got other ticks.
  last_step = max([*steps, *(s for val_steps, _ in validation.values() for s in val_steps)])
  for ax, name in zip(axes, names):
    if name in history:
      ax.plot(steps, history[name], linewidth=1.2, label="training")
    if name in validation:
      val_steps, val_values = validation[name]
      ax.plot(val_steps, val_values, "o-", color="tab:orange", markersize=4, label="validation")
    if best is not None:
      ax.axvline(
        best["step"],
        color="tab:green",
        linestyle=":",
        linewidth=1.0,
        label=f"step of the best validation ({best['step']})",
      )
      if best.get("metric") == name:
        ax.plot(
          [best["step"]],
          [best["score"]],
          "*",
          color="tab:green",
          markersize=13,
          markeredgecolor="black",
          label=f"best checkpoint (step {best['step']}), the one tested",
        )
    ax.set_xlim(0, last_step * 1.04)  # a margin: the best step is often the last
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 12500 -> 12.5k
    if name in _MIN_Y_RANGE:
      low, high = ax.get_ylim()
      if high - low < _MIN_Y_RANGE[name]:
        middle = (low + high) / 2
        ax.set_ylim(middle - _MIN_Y_RANGE[name] / 2, middle + _MIN_Y_RANGE[name] / 2)
    ax.set(title=_TITLES.get(name, name), xlabel="meta-step", ylabel=_Y_LABELS.get(name, name))
    ax.grid(alpha=0.3)
  # One legend for every panel, below them: inside a panel it covered the first points.
  entries = {}
  for ax in axes[: len(names)]:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      entries.setdefault(label, handle)
  if entries:
    columns = _legend_columns(list(entries), fig.get_size_inches()[0], most=2)
    fig.legend(entries.values(), entries.keys(), loc="outside lower center", ncols=columns)
  return fig


def plot_regression_predictions(
  grid_x: np.ndarray,
  truth: np.ndarray,
  support_x: np.ndarray,
  support_y: np.ndarray,
  predictions: dict[str, np.ndarray],
  noise_std: float,
  path: PathLike,
  title: Optional[str] = None,
) -> PathLike:
  """Adapted predictions on a few tasks, one panel per task (the paper's Fig. 2a-b).

  A method with one weight draw (MAML) is drawn as a line. A method with
  several draws is drawn as the mean of its Monte-Carlo predictive mixture
  with bands at +-1 and +-2 predictive standard deviations, where the
  variance is the spread of the draws' outputs plus the noise variance.

  Args:
    grid_x: `[points]` inputs the predictions are made at.
    truth: `[tasks, points]` the noiseless function of each task.
    support_x, support_y: `[tasks, shots]` the points each task adapted on.
    predictions: `{method: [tasks, num_samples, points]}` network outputs.
    noise_std: the likelihood's noise standard deviation.
    path: output file; PNG unless its suffix names another format.
    title: optional figure title.

  Returns:
    `path`.
  """
  return _save(
    regression_predictions_figure(grid_x, truth, support_x, support_y, predictions, noise_std),
    path,
    title,
  )


def regression_predictions_figure(
  grid_x: np.ndarray,
  truth: np.ndarray,
  support_x: np.ndarray,
  support_y: np.ndarray,
  predictions: dict[str, np.ndarray],
  noise_std: float,
):
  """The figure `plot_regression_predictions` saves."""
  grid_x, truth = np.asarray(grid_x), np.asarray(truth)
  num_tasks = truth.shape[0]
  for name, p in predictions.items():
    if np.shape(p)[0] != num_tasks or np.shape(p)[2] != grid_x.shape[0]:
      raise ValueError(
        f"predictions[{name!r}] has shape {np.shape(p)}; expected "
        f"[{num_tasks}, num_samples, {grid_x.shape[0]}]"
      )
  fig, axes = _new_figure(num_tasks, panel_size=3.6)
  colours = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink"]
  for i, ax in enumerate(axes):
    ax.plot(grid_x, truth[i], "k-", linewidth=1.2, label="truth")
    for colour, (name, p) in zip(colours, predictions.items()):
      p = np.asarray(p[i], dtype=np.float64)
      mean = p.mean(axis=0)
      if p.shape[0] == 1:
        ax.plot(grid_x, mean, "--", color=colour, linewidth=1.4, label=name)
        continue
      std = np.sqrt(p.var(axis=0) + noise_std**2)
      ax.plot(grid_x, mean, color=colour, linewidth=1.4, label=f"{name} mean")
      ax.fill_between(
        grid_x,
        mean - 2 * std,
        mean + 2 * std,
        color=colour,
        alpha=0.15,
        linewidth=0,
        label=f"{name} ±2σ",
      )
      ax.fill_between(
        grid_x, mean - std, mean + std, color=colour, alpha=0.3, linewidth=0, label=f"{name} ±1σ"
      )
    ax.plot(support_x[i], support_y[i], "o", color="red", markersize=5, label="support")
    ax.set(xlabel="x", ylabel="y")
    ax.grid(alpha=0.3)
  # One legend for every panel, under them: inside the first panel it covered data. As many
  # columns as the figure's width holds (about 1.8 inches an entry): six under one panel
  # ran past both of its edges.
  handles, labels = axes[0].get_legend_handles_labels()
  width = fig.get_size_inches()[0]
  fig.legend(handles, labels, loc="outside lower center", ncols=_legend_columns(labels, width))
  return fig


def _legend_columns(labels: Sequence[str], width_inches: float, most: int = 6) -> int:
  """How many legend columns of `labels` fit side by side in `width_inches`."""
  entry = 0.6 + 0.085 * max(len(label) for label in labels)  # the marker and the text
  return max(1, min(len(labels), most, int(width_inches // entry)))


def plot_calibration_bars(
  errors: dict[str, tuple[float, float]], path: PathLike, title: Optional[str] = None
) -> PathLike:
  """ECE and MCE side by side for each method (the paper's Fig. 2d).

  Args:
    errors: `{method: (ece, mce)}`.
    path: output file; PNG unless its suffix names another format.
    title: optional axes title.

  Returns:
    `path`.
  """
  if not errors:
    raise ValueError("errors must name at least one method")
  names = list(errors)
  values = np.asarray([errors[n] for n in names], dtype=float)  # [methods, 2]
  fig, (ax,) = _new_figure(1, panel_size=max(4.0, 1.1 * len(names)))
  positions = np.arange(len(names))
  for offset, column, label, colour in (
    (-0.2, 0, "ECE", "tab:blue"),
    (0.2, 1, "MCE", "tab:orange"),
  ):
    bars = ax.bar(positions + offset, values[:, column], width=0.4, label=label, color=colour)
    ax.bar_label(bars, fmt="%.3f", fontsize="x-small")
  ax.set_xticks(positions, names)
  ax.set(ylabel="calibration error", ylim=(0, max(1e-3, values.max()) * 1.2))
  ax.legend(fontsize="small")
  ax.grid(axis="y", alpha=0.3)
  return _save(fig, path, title)


def plot_variant_bars(
  table: dict[str, dict[str, list[dict]]],
  metric: str,
  path: PathLike,
  title: Optional[str] = None,
  ylabel: Optional[str] = None,
) -> PathLike:
  """One metric of several methods under several variants: a group of bars per method.

  Args:
    table: `{variant label: {method: [metrics of each seed]}}` (`experiments.variants`).
    metric: the metric drawn, e.g. 'ece'.
    path: output file; PNG unless its suffix names another format.
    title: optional figure title.
    ylabel: the axis label (default: the metric's name).

  Each bar is the mean over the seeds, each seed a black dot on it; a method
  missing from a variant (or diverged there) has no bar in its group. With one
  method, each variant is a horizontal bar named on the axis (`ylabel` then labels
  the metric's axis).
  """
  labels = list(table)
  methods = list(dict.fromkeys(m for variant in table.values() for m in variant))
  if not labels or not methods:
    raise ValueError("table must hold at least one variant with one method")
  if len(methods) == 1:
    return _plot_variant_rows(table, methods[0], metric, path, title, ylabel)
  fig, (ax,) = _new_figure(1, panel_size=max(5.0, 1.3 * len(methods)))
  width = 0.8 / len(labels)
  positions = np.arange(len(methods))
  for i, label in enumerate(labels):
    x = positions - 0.4 + width * (i + 0.5)
    seeds = [[s[metric] for s in table[label].get(m, []) if metric in s] for m in methods]
    means = np.asarray([np.mean(v) if v else np.nan for v in seeds])
    bars = ax.bar(x, np.nan_to_num(means), width=width * 0.95, label=label)
    ax.bar_label(bars, labels=["" if np.isnan(v) else f"{v:.3f}" for v in means], fontsize=7)
    for xi, values in zip(x, seeds):
      ax.plot([xi] * len(values), values, "o", color="black", markersize=3)
  ax.plot([], [], "o", color="black", markersize=3, label="one seed")
  ax.set_xticks(positions, [m.upper() for m in methods])
  ax.set(ylabel=ylabel or metric)
  ax.legend(fontsize="small")
  ax.grid(axis="y", alpha=0.3)
  return _save(fig, path, title)


def _plot_variant_rows(table, method, metric, path, title, xlabel):
  """One method under many variants: a horizontal bar per variant, named on the axis."""
  labels = list(table)
  seeds = [[s[metric] for s in table[label].get(method, []) if metric in s] for label in labels]
  means = np.asarray([np.mean(v) if v else np.nan for v in seeds])
  fig, (ax,) = _new_figure(1, panel_size=max(4.0, 0.45 * len(labels) + 1.5))
  fig.set_figwidth(max(8.0, fig.get_figwidth()))
  rows = np.arange(len(labels))
  bars = ax.barh(rows, np.nan_to_num(means), height=0.7, color="tab:blue")
  ax.bar_label(
    bars,
    labels=["" if np.isnan(v) else f"{v:.3f}" for v in means],
    label_type="center",
    color="white",
    fontsize=9,
  )
  for row, values in zip(rows, seeds):
    ax.plot(values, [row] * len(values), "o", color="black", markersize=3)
  ax.plot([], [], "o", color="black", markersize=3, label="one seed")
  ax.set_yticks(rows, labels)
  ax.invert_yaxis()  # the first variant on top
  ax.set(xlabel=xlabel or metric, title=method.upper())
  ax.legend(fontsize="small", loc="lower right")
  ax.grid(axis="x", alpha=0.3)
  return _save(fig, path, title)


_OPEN_SET_LABELS = {
  "max_prob": "max prob",
  "entropy": "entropy",
  "mutual_information": "MI (epistemic)",
}


def plot_open_set_roc(
  open_set: dict[str, dict],
  path: PathLike,
  title: Optional[str] = None,
  point_estimates: Sequence[str] = (),
) -> PathLike:
  """ROC curves of telling unknown-class queries from known ones: a panel per method.

  Args:
    open_set: `{method: results['test']['open_set']}` (its `roc` and `auroc`).
    path: output file.
    title: the figure's title.
    point_estimates: methods with one weight draw: their mutual information is
      0 for every query, a diagonal ROC (AUROC 0.5), drawn and labelled so.

  Returns:
    `path`.
  """
  if not open_set:
    raise ValueError("open_set must name at least one method")
  fig, axes = _new_figure(len(open_set), panel_size=4.0)
  for ax, (name, record) in zip(axes, open_set.items()):
    for score, label in _OPEN_SET_LABELS.items():
      curve, auroc = record["roc"][score], record["auroc"][score]
      shown = "–" if auroc is None else f"{auroc:.3f}"
      shown = "n/a" if score in record.get("not_applicable", {}) else shown
      if score == "mutual_information" and name in point_estimates:
        label = "MI = 0 (point estimate)"
      ax.plot(
        curve["false_positive_rate"],
        curve["true_positive_rate"],
        linewidth=1.5,
        label=f"{label}: {shown}",
      )
    ax.plot([0, 1], [0, 1], "k:", linewidth=0.8)
    ax.set(
      xlim=(0, 1),
      ylim=(0, 1.01),
      xlabel="known queries flagged (FPR)",
      ylabel="unknown queries flagged (TPR)",
      title=name,
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="x-small", title="AUROC", title_fontsize="x-small")
  return _save(fig, path, title)


def run_figures(
  workdir: PathLike, results: dict, label: str, setting: Optional[str] = None
) -> dict[str, str]:
  """The figures of a finished run, from its results.json record and metrics.jsonl.

  Classification: `reliability.png` (with the confidence histogram) and
  `risk_coverage.png`; regression: `quantile_calibration.png` (the paper's
  metric, or the PIT one if the run has no noiseless targets). Both:
  `training_curves.png` with the validation score and the best checkpoint.

  Args:
    workdir: the run folder.
    results: its results.json record.
    label: the method, e.g. "VAMPIRE".
    setting: the data set and setting for the titles, e.g. "Omniglot 5-way
      1-shot" (`experiments.train.setting_name`); without it, the titles
      name the method and the test tasks only.

  Returns:
    `{figure name: path}`.
  """
  workdir = Path(workdir)
  curves = {
    name: metrics.calibration_from_record(record) for name, record in results["calibration"].items()
  }
  # How long it trained, on every figure: a 200-step quick run's diagram is not a paper run's.
  tested = f"{_training_length(results)}, {results['test']['num_tasks']} test tasks"
  where = f"{label}, {setting}" if setting else label
  plots = {}
  if "reliability" in curves:
    plots["reliability"] = plot_reliability_diagram(
      curves["reliability"], workdir / "reliability.png", title=f"{where}\n{tested}"
    )
    plots["risk_coverage"] = plot_risk_coverage(
      {label: curves["risk_coverage"]},
      workdir / "risk_coverage.png",
      title=f"Selective prediction: {setting or label}\n{tested}",
    )
  else:
    name = "quantile_calibration" if "quantile_calibration" in curves else "pit_calibration"
    config = config_records.flat_or_as_is(results["config"])
    point = (
      [label]
      if config.get("num_mc_test", 1) == 1 or config["algorithm"] in ("maml", "fomaml")
      else []
    )
    plots["quantile_calibration"] = plot_quantile_calibration(
      {label: curves[name]},
      workdir / "quantile_calibration.png",
      title=f"{where}\n{tested}",
      point_estimates=point,
    )
  rows = reporting.read_metrics(workdir)
  train = [r for r in rows if "train/loss" in r]
  if train:
    names = [k for k in ("loss", "accuracy", "log_std") if f"train/{k}" in train[0]]
    score = kinds.of_results(results).score
    validation = {}
    for name in (score, "ece"):  # the score that picks the best, and calibration
      val = [r for r in rows if f"val/{name}" in r]
      if val:
        validation[name] = ([r["step"] for r in val], [r[f"val/{name}"] for r in val])
    plots["training_curves"] = plot_training_curves(
      {k: [r[f"train/{k}"] for r in train] for k in names},
      [r["step"] for r in train],
      workdir / "training_curves.png",
      title=f"{where}: meta-training, {_training_length(results)}",
      validation=validation,
      best=results.get("best_validation"),
    )
  return {name: str(path) for name, path in plots.items()}


def _training_length(results: dict) -> str:
  """'200 meta-steps of 8 tasks': how long the run of `results` (results.json) trained."""
  config = config_records.flat_or_as_is(results["config"])
  steps = results.get("meta_steps", config.get("num_meta_steps"))
  return f"{steps} meta-steps of {config.get('tasks_per_step', '?')} tasks"


def add_run_figures(
  workdir: PathLike, results: dict, label: str, setting: Optional[str] = None
) -> dict:
  """Draws `run_figures` and records them under 'plots' in results.json."""
  from vampire_jax.runs import run_folder

  results["plots"] = run_figures(workdir, results, label, setting)
  run_folder.write_results(workdir, results)
  return results
