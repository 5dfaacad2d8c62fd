"""What a training run writes and prints: metrics files and progress lines.

`MetricWriter` appends every logged value to `metrics.jsonl` (a torn last
line from a kill is cut off first; `run_folder` owns the file) and, when
tensorboardX is installed, to TensorBoard event files beside it (without
it, the JSON lines alone; nothing else changes). After the test, the
config goes in as hyperparameters with the test metrics (TensorBoard's
HPARAMS tab; `write_test`), and `write_figures` adds the run's PNGs
(IMAGES tab). `tensorboard --logdir runs/` shows them; TensorBoard itself
is a separate install (`pip install tensorboard`).

`Progress` shows a progress bar on a terminal and, when the output goes to
a file or pipe, one line per logging interval: a log stays short and every
line in it is one a reader wants.
"""

import contextlib
import os
import struct
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Union

from vampire_jax.runs import run_folder
from vampire_jax.runs.run_folder import read_metrics  # noqa: F401  (kept here: public before)


class MetricWriter:
  """Scalars to `workdir/metrics.jsonl` and, if tensorboardX imports, TensorBoard."""

  def __init__(self, workdir: Path, *, enabled: bool = True, resumed_from: Optional[int] = None):
    """`resumed_from`: the step a resumed run starts from. Rows after it were logged by
    the interrupted process past its last checkpoint; they are dropped (the run logs
    them again), so that `metrics.jsonl` holds one row per logged step, and
    TensorBoard is told to purge them too."""
    self._enabled = enabled
    self._path = Path(workdir) / run_folder.METRICS_FILE
    if enabled and resumed_from is not None:
      run_folder.drop_rows_after(self._path, resumed_from)
    self._jsonl = run_folder.open_log(self._path) if enabled else None
    self._tensorboard = None
    if enabled:
      try:
        from tensorboardX import SummaryWriter
      except ImportError:  # optional (the experiments extra): metrics.jsonl only
        pass
      else:
        purge = None if resumed_from is None else resumed_from + 1
        self._tensorboard = SummaryWriter(str(workdir), purge_step=purge)

  def write(self, step: int, metrics: dict) -> None:
    if not self._enabled:
      return
    values = {k: float(v) for k, v in metrics.items()}
    run_folder.append_line(self._jsonl, self._path, {"step": step, **values})
    if self._tensorboard is not None:
      for name, value in values.items():
        self._tensorboard.add_scalar(name, value, step)

  def write_test(self, step: int, config: dict, metrics: dict) -> None:
    """The test metrics and the config, for TensorBoard (results.json is their record).

    Each numeric test metric is a scalar `test/<name>` at `step`; the config
    goes in as hyperparameters (lists and None as text) with those metrics,
    in the sub-run `hparams/`, so that the HPARAMS tab sets runs side by side.
    Without tensorboardX, nothing.

    Args:
      step: the meta-step the tested parameters come from (the run's last).
      config: the config by field name (`RunConfig.flat()`).
      metrics: the test split's metrics; entries that are not numbers are skipped.
    """
    if self._tensorboard is None:
      return
    numbers = {
      f"test/{k}": float(v)
      for k, v in metrics.items()
      if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    for name, value in numbers.items():
      self._tensorboard.add_scalar(name, value, step)
    self._tensorboard.add_hparams(hparam_values(config), numbers, name="hparams", global_step=step)

  def close(self) -> None:
    if self._tensorboard is not None:
      try:
        self._tensorboard.close()
      except OSError:  # a full disk: the events are a view; metrics.jsonl is the record
        _abandon(self._tensorboard)
    if self._jsonl is not None:
      with run_folder.writing(self._path):
        self._jsonl.close()


def _abandon(tensorboard) -> None:
  """Stops a SummaryWriter whose close failed (a full disk) without a word at exit.

  tensorboardX marks a writer closed only once its last flush succeeds; else
  its `atexit` cleanup flushes again at exit ("Exception ignored in atexit
  callback") and its worker thread dies on the closed queue ("Exception in
  thread"). The run already said what failed, in one line.
  """
  writers = list(getattr(tensorboard, "all_writers", {}).values())
  writers += [getattr(tensorboard, "file_writer", None)]
  for writer in {id(w): w for w in writers if w is not None}.values():
    events = getattr(writer, "event_writer", None)
    if events is None:
      continue
    worker = getattr(events, "_worker", None)
    if worker is not None:
      with contextlib.suppress(Exception):
        worker.stop()
    events._closed = True


def hparam_values(config: dict) -> dict:
  """A config dict as TensorBoard hyperparameters: bool, int, float and str as they are,
  anything else (a tuple, a list, None) as its text."""
  return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in config.items()}


def write_figures(workdir: Union[str, os.PathLike], figures: dict, step: int) -> int:
  """Adds a finished run's PNG figures to its TensorBoard events (the IMAGES tab).

  The encoded PNG bytes go in as they are (nothing decoded or re-encoded).
  Without tensorboardX, nothing.

  Args:
    workdir: the run folder (TensorBoard's log folder of the run).
    figures: `{name: path}`, e.g. results.json's "plots"; files that are not PNG are skipped.
    step: the step to file them under (the run's last).

  Returns:
    How many figures were written.
  """
  try:
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary
  except ImportError:  # optional (the experiments extra)
    return 0
  images = []
  for name, path in figures.items():
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
      continue
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    images.append(
      Summary.Value(
        tag=f"figures/{name}",
        image=Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data),
      )
    )
  if images:
    writer = SummaryWriter(str(workdir))
    try:
      writer.file_writer.add_summary(Summary(value=images), step)
    finally:
      with contextlib.suppress(OSError):
        writer.close()
  return len(images)


def format_duration(seconds: float) -> str:
  """`1:02:03` or `2:03`."""
  seconds = int(round(max(seconds, 0.0)))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Progress:
  """Meta-training progress: a tqdm bar on a terminal (when tqdm is installed), else a line
  per log interval.

  Args:
    total: the last step.
    first: the step training starts (or resumes) from.
    enabled: False prints nothing at all.
    print_fn: where lines go.
    interactive: draw a bar (default: when stdout is a terminal).
  """

  def __init__(
    self,
    total: int,
    first: int,
    *,
    enabled: bool = True,
    print_fn: Callable[[str], None] = print,
    interactive: Optional[bool] = None,
  ):
    self.total, self._step, self._enabled = total, first, enabled
    self._print = print_fn
    self._interactive = sys.stdout.isatty() if interactive is None else interactive
    self._bar = None
    self._rate_start: Optional[tuple[float, int]] = None  # (time, step) after the first call
    self._excluded = 0.0  # seconds of evaluation and checkpointing, not training

  def start_timing(self, step: int) -> None:
    """Step rates count from here (after compilation)."""
    self._rate_start = (time.perf_counter(), step)
    if self._enabled and self._interactive and self._bar is None:
      try:
        from tqdm import tqdm  # optional (the experiments extra): else a line per interval
      except ImportError:
        self._interactive = False
        return
      self._bar = tqdm(total=self.total, initial=step, unit="step", dynamic_ncols=True, leave=False)

  def advance(self, step: int) -> None:
    if self._bar is not None:
      self._bar.update(step - self._step)
    self._step = step

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` (spent validating, saving) out of the step rate."""
    self._excluded += seconds

  def rate(self) -> Optional[float]:
    """Meta-steps per second of training since `start_timing`, or None before any step."""
    if self._rate_start is None or self._step <= self._rate_start[1]:
      return None
    seconds = time.perf_counter() - self._rate_start[0] - self._excluded
    return (self._step - self._rate_start[1]) / max(seconds, 1e-9)

  def log(self, step: int, metrics: dict) -> None:
    """One line: the step, the metrics, the speed and the time left."""
    if not self._enabled:
      return
    shown = "  ".join(f"{name} {value:.4g}" for name, value in metrics.items())
    rate = self.rate()
    speed = (
      ""
      if rate is None
      else (f"  | {rate:.2f} steps/s, {format_duration((self.total - step) / rate)} left")
    )
    if self._bar is not None:
      self._bar.set_postfix_str(shown)
      return
    self._print(f"step {step:>{len(str(self.total))}}/{self.total}  {shown}{speed}")

  def warn(self, text: str) -> None:
    """A warning line, printed even when progress is off (above the bar, if one is shown)."""
    if self._bar is not None:
      self._bar.write(f"warning: {text}")
    else:
      self._print(f"warning: {text}")

  def message(self, text: str) -> None:
    """A line that stays (above the bar, on a terminal)."""
    if not self._enabled:
      return
    if self._bar is not None:
      self._bar.write(text)
    else:
      self._print(text)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None
