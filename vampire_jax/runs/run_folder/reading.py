"""Reading orbax checkpoints in this process: restore targets on its devices, a step's arrays
without a template, and what about the process (not the files) made a restore fail."""

import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
from vampire_jax.runs.run_folder.orbax_module import ocp

from vampire_jax._src.core.errors import RunFolderError
from vampire_jax.runs.run_folder.record import _step_folders

PyTree = Any


def restore_target(template: PyTree) -> PyTree:
  """`template` as a restore target on this process's devices, whatever wrote the checkpoint.

  Orbax places each restored array on the sharding its target names. A target
  without one (`jax.eval_shape`'s) makes it use the sharding saved with the
  checkpoint, which names the writer's devices: a run trained on 8 devices
  then fails to restore on 1 ("Topology mismatch"). So every leaf names a
  sharding of this process: its own (a training state placed on the current
  mesh), else this process's first device. Values do not depend on where
  they are placed, so a run restores to the same numbers on any device count.
  """
  import jax

  device = jax.local_devices()[0]

  def target(leaf):
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
      sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)

  return jax.tree_util.tree_map(target, template)


def read_checkpoint(folder: os.PathLike | str, step: Optional[int] = None) -> PyTree:
  """The arrays of one saved step of `folder` (`checkpoints/` or `best/`), without a template.

  For inspecting a run folder: the step's tree as saved (dicts of arrays), on this
  process's first device whatever devices wrote it. Default: the newest step.
  """
  import jax

  manager = ocp.CheckpointManager(
    Path(folder).absolute(),
    options=ocp.CheckpointManagerOptions(create=False),
    item_handlers=ocp.StandardCheckpointHandler(),
  )
  try:
    if step is None:
      steps = _step_folders(Path(folder))
      if not steps:
        raise RunFolderError(f"read_checkpoint: folder {folder} holds no complete checkpoint")
      step = steps[0]
    saved = manager.item_metadata(step)
    template = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)
    return manager.restore(step, args=ocp.args.StandardRestore(restore_target(template)))
  finally:
    manager.close()


# What orbax and JAX say when a checkpoint is whole but this process cannot take it.
_DEVICES = (
  "the checkpoint was placed on devices this process does not have ({error}); this is about "
  "the loading process (JAX's devices, JAX_NUM_CPU_DEVICES, XLA_FLAGS), not the files: please "
  "report it with `jax.devices()`"
)
_NETWORK = (
  "the network built here has other parameters than the checkpoint's ({error}): its class or "
  "fields changed since the run trained, or load_run's model= is another network; build the "
  "network the run trained"
)
_ENVIRONMENT_TEXTS = {
  "Topology mismatch": _DEVICES,
  "tree structures do not match": _NETWORK,
  "is not compatible with the stored shape": _NETWORK,
}


def environment_cause(error: BaseException) -> Optional[str]:
  """What about the loading process (not the files) made a restore fail, or None.

  A missing package, a device layout the checkpoint does not fit, or a
  network whose parameters are not the checkpoint's (its code changed since
  training) is the loading process's doing: the folder is intact and must
  not be treated as damaged.
  """
  if isinstance(error, ImportError):
    name = getattr(error, "name", None) or _first_line(error)
    return f"a package is missing in this environment ({name}): install it and load again"
  text = str(error)
  for marker, cause in _ENVIRONMENT_TEXTS.items():
    if marker in text:
      return cause.format(error=_first_line(error))
  return None


def _first_line(error: BaseException, limit: int = 160) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  text = f"{type(error).__name__}: {text}" if text else type(error).__name__
  return text if len(text) <= limit else text[: limit - 3] + "..."
