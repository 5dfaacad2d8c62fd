"""Tasks spread over devices and hosts with JAX's own sharding.

Tasks in a meta-batch are independent, so the task axis is split over a
one-axis device mesh (`task_mesh`) and everything else is replicated. Inside
the jitted meta-step, `jax.shard_map` gives each device its slice of tasks;
each device averages its per-task gradients and a `pmean` over the mesh makes
the meta-gradient, the mean over all tasks. With equal slices that is the
same mean as on one device, up to the order of the float additions.

Several hosts: call `initialize_multihost()` before anything else touches
JAX. `jax.devices()` then lists every host's devices, so `task_mesh()` spans
them all; each process samples its own slice of tasks and `shard_tasks`
joins the slices into one global array.
"""

from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PyTree = Any

TASK_AXIS = "tasks"


def initialize_multihost(
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
) -> None:
  """`jax.distributed.initialize`; must run before any other JAX call.

  Without arguments JAX finds them in the cluster's environment (SLURM,
  Open MPI, Kubernetes, Cloud TPU) or in `JAX_COORDINATOR_ADDRESS`,
  `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`.
  """
  jax.distributed.initialize(
    coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
  )


def task_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A one-axis mesh named 'tasks' over `devices` (default: all, of every host)."""
  devices = jax.devices() if devices is None else list(devices)
  if not devices:
    raise ValueError("task_mesh needs at least one device")
  return Mesh(np.asarray(devices), (TASK_AXIS,))


def task_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (task) axis split over the mesh, other axes whole."""
  return NamedSharding(mesh, PartitionSpec(TASK_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """A full copy on every device of the mesh."""
  return NamedSharding(mesh, PartitionSpec())


def check_divisible(num_tasks: int, mesh: Mesh) -> None:
  """Raises ValueError unless the mesh's devices share `num_tasks` equally."""
  if num_tasks % mesh.size:
    raise ValueError(
      f"{num_tasks} tasks cannot be split evenly over {mesh.size} devices; use a task "
      f"count divisible by {mesh.size} (e.g. --tasks-per-step), fewer devices, or no "
      "sharding (--shard-tasks off)"
    )


def _global_array(sharding: NamedSharding, local: jax.Array) -> jax.Array:
  if jax.process_count() == 1:
    return jax.device_put(local, sharding)
  return jax.make_array_from_process_local_data(sharding, np.asarray(local))


def shard_tasks(tasks: PyTree, mesh: Mesh) -> PyTree:
  """Places a tree of `[tasks, ...]` arrays with the task axis split over the mesh.

  With one process `tasks` holds all tasks. With several, each process
  passes its own `num_tasks / process_count` tasks and gets back global
  arrays of all of them.
  """
  sharding = task_sharding(mesh)
  return jax.tree_util.tree_map(lambda x: _global_array(sharding, x), tasks)


def distribute(tasks: PyTree, mesh: Mesh) -> PyTree:
  """Places a tree of `[tasks, ...]` arrays, split over the mesh, when every process holds all.

  Unlike `shard_tasks`, each process passes the whole batch (computed the
  same way on every process) and contributes the slices its devices hold.
  """
  sharding = task_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(tasks, sharding)
  return jax.tree_util.tree_map(
    lambda x: jax.make_array_from_callback(x.shape, sharding, lambda index: x[index]), tasks
  )


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
  """Places every leaf of `tree` whole on every device of the mesh.

  With several processes each must pass the same values.
  """
  sharding = replicated_sharding(mesh)
  return jax.tree_util.tree_map(lambda x: _global_array(sharding, x), tree)


def gather(tree: PyTree) -> PyTree:
  """Numpy copies of (possibly multi-host) arrays, whole on every process."""
  if jax.process_count() == 1:
    return jax.tree_util.tree_map(np.asarray, tree)
  from jax.experimental import multihost_utils

  return multihost_utils.process_allgather(tree, tiled=True)


def _per_device_copy(shared: PyTree) -> PyTree:
  # Inside shard_map, a gradient with respect to a replicated value is summed
  # over the devices (the transpose of its broadcast). Per-task gradients,
  # such as the inner loop's, must stay per device: mark the copy varying.
  return jax.lax.pcast(shared, TASK_AXIS, to="varying")


def mean_over_task_shards(fn: Callable, mesh: Mesh) -> Callable:
  """`fn(shared, tasks, keys) -> tree of means over its tasks`, run per device.

  Returns a function of the same arguments (call it inside `jit`) that gives
  each device its slice of `tasks` and `keys` and `shared` whole, and
  returns the mean of the devices' means: the mean over all tasks, on every
  device.
  """

  def per_device(shared, tasks, keys):
    return jax.lax.pmean(fn(_per_device_copy(shared), tasks, keys), TASK_AXIS)

  task_spec = PartitionSpec(TASK_AXIS)
  return jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(PartitionSpec(), task_spec, task_spec),
    out_specs=PartitionSpec(),
  )


def map_over_task_shards(fn: Callable, mesh: Mesh) -> Callable:
  """`fn(shared, tasks, keys) -> tree of [tasks, ...]`, run per device.

  Returns a function of the same arguments (call it inside `jit`) whose
  outputs keep the task axis split over the mesh.
  """

  def per_device(shared, tasks, keys):
    return fn(_per_device_copy(shared), tasks, keys)

  task_spec = PartitionSpec(TASK_AXIS)
  return jax.shard_map(
    per_device, mesh=mesh, in_specs=(PartitionSpec(), task_spec, task_spec), out_specs=task_spec
  )
