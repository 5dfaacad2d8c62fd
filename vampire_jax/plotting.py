"""Figures for calibration and training: reliability diagrams, quantile
calibration curves, training curves. Each function writes one image file.

matplotlib is imported inside the functions, never at import time, and the
figures are drawn on an Agg canvas without pyplot, so nothing here changes
the global backend or leaves figures open (safe from a notebook, too).
"""

import math
import os
from typing import Optional, Sequence, Union

import numpy as np

from vampire_jax.calibration import QuantileCalibration, ReliabilityBins

PathLike = Union[str, os.PathLike]


def _new_figure(num_panels: int, panel_size: float = 4.0, max_cols: int = 4):
  """An Agg-backed figure with `num_panels` axes in a grid; returns (fig, axes)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  cols = min(num_panels, max_cols)
  rows = math.ceil(num_panels / cols)
  fig = Figure(figsize=(panel_size * cols, panel_size * rows), layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
  for ax in axes[num_panels:]:
    ax.set_visible(False)
  return fig, axes[:num_panels]


def _save(fig, path: PathLike, title: Optional[str]) -> PathLike:
  if title:
    fig.suptitle(title)
  fig.savefig(path, dpi=120)
  return path


def plot_reliability_diagram(bins: Union[ReliabilityBins, dict[str, ReliabilityBins]],
                             path: PathLike, title: Optional[str] = None) -> PathLike:
  """Reliability diagram(s): accuracy per confidence bin against the diagonal.

  Bars show each bin's accuracy; the shaded bars between accuracy and mean
  confidence show the miscalibration gap (red above the bar: over-confident).
  ECE and MCE are given in the legend. With a dict, one panel per method,
  side by side, as in the paper's Fig. 3.

  Args:
    bins: from `calibration.classification_calibration`, or `{method: bins}`.
    path: output file; PNG unless its suffix names another format.
    title: optional figure title.

  Returns:
    `path`.
  """
  panels = {"": bins} if isinstance(bins, ReliabilityBins) else dict(bins)
  if not panels:
    raise ValueError("bins must be a ReliabilityBins or a non-empty dict of them")
  fig, axes = _new_figure(len(panels))
  for ax, (name, b) in zip(axes, panels.items()):
    edges = np.asarray(b.edges)
    width = np.diff(edges)
    filled = np.asarray(b.count) > 0
    left = edges[:-1][filled]
    accuracy = np.asarray(b.accuracy)[filled]
    confidence = np.asarray(b.confidence)[filled]
    ax.bar(left, accuracy, width=width[filled], align="edge", color="tab:blue",
           edgecolor="black", linewidth=0.6, label="Accuracy")
    # The gap: a bar from accuracy up (or down) to the bin's mean confidence.
    ax.bar(left, confidence - accuracy, bottom=accuracy, width=width[filled], align="edge",
           color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//", linewidth=0.6, label="Gap")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1.0, label="Perfect calibration")
    ax.plot([], [], " ", label=f"ECE = {b.ece:.3f}\nMCE = {b.mce:.3f}")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="Confidence", ylabel="Accuracy", aspect="equal")
    if name:
      ax.set_title(name)
    ax.legend(loc="upper left", fontsize="small")
  return _save(fig, path, title)


def plot_quantile_calibration(results: Union[QuantileCalibration, dict[str, QuantileCalibration]],
                              path: PathLike, title: Optional[str] = None) -> PathLike:
  """Observed against expected quantile levels, one line per method (Fig. 2).

  Args:
    results: from `calibration.regression_quantile_calibration`, or
      `{method: result}`.
    path: output file; PNG unless its suffix names another format.
    title: optional axes title.

  Returns:
    `path`.
  """
  results = {"": results} if isinstance(results, QuantileCalibration) else dict(results)
  if not results:
    raise ValueError("results must be a QuantileCalibration or a non-empty dict of them")
  fig, (ax,) = _new_figure(1, panel_size=5.0)
  ax.plot([0, 1], [0, 1], "k--", linewidth=1.0, label="Perfect calibration")
  for name, r in results.items():
    prefix = f"{name}: " if name else ""
    ax.plot(r.levels, r.observed, "o-", markersize=4,
            label=f"{prefix}ECE {r.ece:.3f}, MCE {r.mce:.3f}")
  ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xlabel="Expected quantile level p",
         ylabel="Observed fraction of targets <= p-quantile")
  ax.legend(loc="upper left", fontsize="small")
  return _save(fig, path, title)


def plot_training_curves(history: dict[str, Sequence[float]], steps: Sequence[int],
                         path: PathLike, title: Optional[str] = None) -> PathLike:
  """Logged metrics against the meta-training step, one panel per metric.

  Args:
    history: `{metric name: values}`, each as long as `steps`.
    steps: the steps at which the values were logged.
    path: output file; PNG unless its suffix names another format.
    title: optional figure title.

  Returns:
    `path`.
  """
  if not history:
    raise ValueError("history must hold at least one metric")
  for name, values in history.items():
    if len(values) != len(steps):
      raise ValueError(f"metric {name!r} has {len(values)} values for {len(steps)} steps")
  fig, axes = _new_figure(len(history), panel_size=3.5, max_cols=3)
  for ax, (name, values) in zip(axes, history.items()):
    ax.plot(steps, values, linewidth=1.2)
    ax.set(title=name, xlabel="step")
    ax.grid(alpha=0.3)
  return _save(fig, path, title)


def plot_regression_predictions(grid_x: np.ndarray, truth: np.ndarray, support_x: np.ndarray,
                                support_y: np.ndarray, predictions: dict[str, np.ndarray],
                                noise_std: float, path: PathLike,
                                title: Optional[str] = None) -> PathLike:
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
  grid_x, truth = np.asarray(grid_x), np.asarray(truth)
  num_tasks = truth.shape[0]
  for name, p in predictions.items():
    if np.shape(p)[0] != num_tasks or np.shape(p)[2] != grid_x.shape[0]:
      raise ValueError(f"predictions[{name!r}] has shape {np.shape(p)}; expected "
                       f"[{num_tasks}, num_samples, {grid_x.shape[0]}]")
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
      std = np.sqrt(p.var(axis=0) + noise_std ** 2)
      ax.plot(grid_x, mean, color=colour, linewidth=1.4, label=f"{name} mean")
      ax.fill_between(grid_x, mean - 2 * std, mean + 2 * std, color=colour, alpha=0.15,
                      linewidth=0, label=f"{name} ±2σ")
      ax.fill_between(grid_x, mean - std, mean + std, color=colour, alpha=0.3, linewidth=0,
                      label=f"{name} ±1σ")
    ax.plot(support_x[i], support_y[i], "o", color="red", markersize=5, label="support")
    ax.set(xlabel="x", ylabel="y")
    ax.grid(alpha=0.3)
  axes[0].legend(loc="best", fontsize="x-small")
  return _save(fig, path, title)


def plot_calibration_bars(errors: dict[str, tuple[float, float]], path: PathLike,
                          title: Optional[str] = None) -> PathLike:
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
  for offset, column, label, colour in ((-0.2, 0, "ECE", "tab:blue"), (0.2, 1, "MCE", "tab:orange")):
    bars = ax.bar(positions + offset, values[:, column], width=0.4, label=label, color=colour)
    ax.bar_label(bars, fmt="%.3f", fontsize="x-small")
  ax.set_xticks(positions, names)
  ax.set(ylabel="calibration error", ylim=(0, max(1e-3, values.max()) * 1.2))
  ax.legend(fontsize="small")
  ax.grid(axis="y", alpha=0.3)
  return _save(fig, path, title)
