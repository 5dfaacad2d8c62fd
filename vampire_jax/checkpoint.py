"""A run folder's checkpoints (orbax): the latest training state and the best meta-parameters.

    checkpoints/     the full `MetaState` of the last two saves (resumed from)
    best/            the meta-parameters with the best validation score
    best_score.json  {"step", "score", "metric"} of `best/`
    train_time.json  training seconds up to each saved step, summed over resumes

Orbax writes each checkpoint to a temporary folder and renames it when
complete, so a run killed at any moment resumes from its last whole save.
"""

import json
import os
from pathlib import Path
from typing import Any, Optional

import orbax.checkpoint as ocp

PyTree = Any


def _manager(folder: Path, max_to_keep: int, create: bool) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(folder.absolute(), options=ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=create))


class RunCheckpoints:
  """The checkpoints of one run folder.

  Args:
    workdir: the run folder.
    create: create the folders (training); False only reads (loading a run).
  """

  def __init__(self, workdir: str | os.PathLike, *, create: bool = True):
    self.workdir = Path(workdir)
    self._latest = _manager(self.workdir / "checkpoints", 2, create)
    self._best = _manager(self.workdir / "best", 1, create)
    self._best_path = self.workdir / "best_score.json"
    self._time_path = self.workdir / "train_time.json"
    self._train_seconds = (json.loads(self._time_path.read_text())
                           if self._time_path.exists() else {})

  def latest_step(self) -> Optional[int]:
    """The step of the newest training-state checkpoint, or None."""
    return self._latest.latest_step()

  def restore_latest(self, template: PyTree) -> PyTree:
    """The newest saved state, with `template`'s structure, shapes and shardings."""
    return self._latest.restore(self._latest.latest_step(),
                                args=ocp.args.StandardRestore(template))

  def save(self, step: int, state: PyTree, train_seconds: float, *, write_files: bool) -> None:
    """Saves the training state of `step`, and the training time up to it."""
    self._latest.save(step, args=ocp.args.StandardSave(state), force=True)
    self._train_seconds[str(step)] = train_seconds
    if write_files:
      self._time_path.write_text(json.dumps(self._train_seconds))

  def train_seconds(self, step: int) -> float:
    """Training seconds recorded up to the checkpoint of `step` (0 if none)."""
    return float(self._train_seconds.get(str(step), 0.0))

  def best_record(self) -> Optional[dict]:
    """`{"step", "score", "metric"}` of the best validation so far, or None."""
    return json.loads(self._best_path.read_text()) if self._best_path.exists() else None

  def save_best(self, meta_params: PyTree, record: dict, *, write_files: bool) -> None:
    """Keeps `meta_params` as the best, with its validation record."""
    self._best.save(record["step"], args=ocp.args.StandardSave(meta_params), force=True)
    self._best.wait_until_finished()
    if write_files:
      self._best_path.write_text(json.dumps(record))

  def restore_best(self, template: PyTree) -> Optional[PyTree]:
    """The best meta-parameters, or None if no validation has saved any."""
    step = self._best.latest_step()
    if step is None:
      return None
    return self._best.restore(step, args=ocp.args.StandardRestore(template))

  def restore_meta_params(self, template_state: PyTree) -> PyTree:
    """The best validated meta-parameters, else the latest state's.

    Args:
      template_state: a `MetaState` of the run's structure.

    Raises:
      FileNotFoundError: the folder holds no checkpoint.
    """
    best = self.restore_best(template_state.meta_params)
    if best is not None:
      return best
    if self.latest_step() is None:
      raise FileNotFoundError(f"no checkpoint in {self.workdir} (expected best/ or "
                              "checkpoints/ from a training run)")
    return self.restore_latest(template_state).meta_params

  def wait(self) -> None:
    """Blocks until every save in flight is written."""
    self._latest.wait_until_finished()
    self._best.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self._latest.close()
    self._best.close()
