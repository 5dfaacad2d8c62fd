"""Tasks spread over devices and hosts with JAX's own sharding.

Tasks in a meta-batch are independent, so the task axis is split over a
one-axis device mesh (`task_mesh`) and everything else is replicated. Inside
the jitted meta-step, `jax.shard_map` gives each device its slice of tasks;
each device computes its tasks' gradients, they are gathered in task order
onto every device, and each device takes their mean: the same array reduced
in the same order as on one device. Where XLA compiles each device's loop of
tasks alike, the meta-gradient is the one-device one bit for bit (the
regression MLP on 1, 2 and 8 devices, the README's Omniglot run on 1 and 2);
at full optimisation XLA compiles that loop in the context of the whole
program, and a large network's last bits can then depend on the device
count (a Conv4-64 step of 8 tasks on 4 devices differed from one device's).

One CPU: XLA gives a CPU one device unless told otherwise, and a CPU step
is a long stream of small operations that leaves cores idle. Call
`use_all_cpu_cores()` first thing (the experiments and benchmarks do): XLA
then has one CPU device per core, the tasks are sharded over them, and each
core runs its own stream; the results stay the same as on one device (bit
for bit where measured, above).

Several hosts: call `initialize_multihost()` before anything else touches
JAX. `jax.devices()` then lists every host's devices, so `task_mesh()` spans
them all; each process samples its own slice of tasks and `shard_tasks`
joins the slices into one global array.
"""

import os
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.tasks import Task, check_task_batch

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


# The XLA flag that sets the number of CPU devices (the older way; `jax_num_cpu_devices` is the newer).
FORCED_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def cpu_core_count() -> int:
  """The cores this process may run on (its CPU affinity; `os.cpu_count()` where none is known)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def user_set_cpu_devices() -> bool:
  """Whether the number of CPU devices was chosen already: by `XLA_FLAGS`'s
  `--xla_force_host_platform_device_count`, `JAX_NUM_CPU_DEVICES`, or a call to
  `jax.config.update("jax_num_cpu_devices", n)`."""
  return FORCED_DEVICE_COUNT_FLAG in os.environ.get("XLA_FLAGS", "") or (
    jax.config.jax_num_cpu_devices != -1
  )


def use_all_cpu_cores(num_devices: Optional[int] = None) -> None:
  """Gives XLA:CPU one device per core, so that tasks are sharded over the cores.

  Call it right after `import jax`, before anything runs: JAX fixes its
  devices when the first computation starts. A choice made already wins
  (`user_set_cpu_devices`): to keep one device, run with
  `JAX_NUM_CPU_DEVICES=1`. On a GPU or TPU machine it changes nothing that
  runs there (JAX's CPU devices stay idle).

  With several devices, the training loop (`shard_tasks="auto"`) and
  `make_meta_step(..., mesh=vj.task_mesh())` split each batch of tasks over
  them; the meta-gradient and every score equal the one-device ones bit for
  bit (`gather_over_task_shards`).

  Args:
    num_devices: the number of CPU devices (default: `cpu_core_count()`).

  Raises:
    InputError: (a ValueError) `num_devices` is not an integer >= 1.
    RuntimeError: JAX has started already with another number of CPU devices.
  """
  if num_devices is not None:  # checked even where a choice made already wins
    checks.step_count("use_all_cpu_cores", "num_devices", num_devices, 1)
  if user_set_cpu_devices():
    return
  count = cpu_core_count() if num_devices is None else int(num_devices)
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    if len(jax.devices("cpu")) != count:
      raise RuntimeError(
        f"use_all_cpu_cores: JAX has started already, with {len(jax.devices('cpu'))} CPU "
        "device(s); call it right after `import jax`, before any JAX computation"
      ) from None


def default_to_all_cpu_cores() -> None:
  """`use_all_cpu_cores()` for a command's entry point: nothing if JAX has started already.

  The experiments and benchmarks call it first. Called again in a process
  whose JAX has started (a test, a notebook), it leaves the devices as they are.
  """
  try:
    use_all_cpu_cores()
  except RuntimeError:
    pass


def task_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A one-axis mesh named 'tasks' over `devices` (default: all, of every host).

  Raises:
    InputError: (a ValueError) `devices` is not a sequence of distinct devices (`jax.Device`).
  """
  wanted = "a list of distinct jax devices (e.g. jax.devices()[:2])"
  if devices is None:
    devices = jax.devices()
  elif isinstance(devices, jax.Device):
    raise checks.fail("task_mesh", "devices", wanted, f"one device, {devices} (use [device])")
  else:
    try:
      devices = list(devices)
    except TypeError:
      raise checks.fail("task_mesh", "devices", wanted, type(devices).__name__) from None
  if not devices:
    raise checks.fail("task_mesh", "devices", wanted, "none")
  for device in devices:
    if not isinstance(device, jax.Device):
      raise checks.fail("task_mesh", "devices", wanted, f"{type(device).__name__} {device!r}")
  twice = sorted({str(d) for d in devices if devices.count(d) > 1})
  if twice:
    raise checks.fail(
      "task_mesh", "devices", wanted, f"{', '.join(twice)} more than once (each device once)"
    )
  return Mesh(np.asarray(devices), (TASK_AXIS,))


def check_mesh(where: str, mesh: Mesh, *, task_axis: bool = True) -> None:
  """Refuses, in one line, a `mesh` that is not a `Mesh` (with a 'tasks' axis, by default)."""
  wanted = "a device mesh, vj.task_mesh(devices)"
  if not isinstance(mesh, Mesh):
    raise checks.fail(where, "mesh", wanted, "None" if mesh is None else type(mesh).__name__)
  if task_axis and TASK_AXIS not in mesh.axis_names:
    raise checks.fail(
      where, "mesh", f"{wanted} (an axis named {TASK_AXIS!r})", f"axes {mesh.axis_names}"
    )


def task_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (task) axis split over the mesh, other axes whole."""
  return NamedSharding(mesh, PartitionSpec(TASK_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """A full copy on every device of the mesh."""
  return NamedSharding(mesh, PartitionSpec())


def check_divisible(num_tasks: int, mesh: Mesh, what: str = "tasks") -> None:
  """Raises InputError (a ValueError) unless the mesh's devices share `num_tasks` equally.

  Args:
    num_tasks: the number of tasks to split.
    mesh: the device mesh.
    what: what the count is called where it was given (named in the message).
  """
  if num_tasks % mesh.size:
    fewer = max(n for n in range(1, mesh.size + 1) if num_tasks % n == 0)
    raise InputError(
      f"{what}: {num_tasks} tasks cannot be split evenly over {mesh.size} devices; use a "
      f"task count divisible by {mesh.size} (e.g. tasks_per_step), a mesh of {fewer} "
      f"device(s) (vj.task_mesh(jax.devices()[:{fewer}]); a run's shard_tasks='auto' "
      "picks it), or no sharding (shard_tasks='off', JAX_NUM_CPU_DEVICES=1)"
    )


def _global_array(sharding: NamedSharding, local: jax.Array) -> jax.Array:
  if jax.process_count() == 1:
    return jax.device_put(local, sharding)
  return jax.make_array_from_process_local_data(sharding, np.asarray(local))


def _check_task_axis(where: str, tasks: PyTree, mesh: Mesh, num_processes: int = 1) -> None:
  """Raises InputError unless every leaf's task axis splits evenly over the mesh.

  A `Task` must be a batch (`check_task_batch`): one task without its leading axis would
  read its 5 support points as 5 tasks. In any other tree every leaf has the same count.
  """
  if isinstance(tasks, Task):
    check_task_batch(tasks, where)
  counts = {np.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(tasks) if np.ndim(leaf)}
  if len(counts) > 1:
    shapes = jax.tree_util.tree_map(lambda leaf: tuple(np.shape(leaf)), tasks)
    raise checks.fail(
      where,
      "tasks",
      "a tree of [tasks, ...] arrays with one leading task count",
      f"leading axes {sorted(counts)} ({shapes}; one task without its leading axis? add "
      "one: jax.tree.map(lambda v: v[None], task))",
    )
  for path, leaf in jax.tree_util.tree_leaves_with_path(tasks):
    num_tasks = np.shape(leaf)[0] * num_processes if np.ndim(leaf) else None
    if num_tasks is None:
      raise InputError(f"{where}: tasks{jax.tree_util.keystr(path)} has no task axis (a scalar)")
    check_divisible(num_tasks, mesh, f"{where}: tasks{jax.tree_util.keystr(path)}")


def shard_tasks(tasks: PyTree, mesh: Mesh) -> PyTree:
  """Places a tree of `[tasks, ...]` arrays with the task axis split over the mesh.

  With one process `tasks` holds all tasks. With several, each process
  passes its own `num_tasks / process_count` tasks and gets back global
  arrays of all of them.
  """
  check_mesh("shard_tasks", mesh)
  _check_task_axis("shard_tasks", tasks, mesh, jax.process_count())
  sharding = task_sharding(mesh)
  return jax.tree_util.tree_map(lambda x: _global_array(sharding, x), tasks)


def distribute(tasks: PyTree, mesh: Mesh) -> PyTree:
  """Places a tree of `[tasks, ...]` arrays, split over the mesh, when every process holds all.

  Unlike `shard_tasks`, each process passes the whole batch (computed the
  same way on every process) and contributes the slices its devices hold.
  """
  check_mesh("distribute", mesh)
  _check_task_axis("distribute", tasks, mesh)
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
  check_mesh("replicate", mesh, task_axis=False)
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


def gather_over_task_shards(fn: Callable, mesh: Mesh) -> Callable:
  """`fn(shared, tasks, keys) -> tree of [tasks, ...]`, run per device, gathered whole.

  Returns a function of the same arguments (call it inside `jit`) that gives
  each device its slice of `tasks` and `keys` and `shared` whole, runs `fn`
  there, and gathers the per-task results, in task order, onto every device.
  A mean over tasks taken after it reduces the same `[tasks, ...]` array in
  the same order as one device does, so the result does not depend on the
  number of devices, bit for bit (a `pmean` of per-device means rounds
  differently, and Adam's first steps turn such rounding in near-zero
  gradient entries into differences of the learning rate's size).
  """

  def per_device(shared, tasks, keys):
    return jax.lax.all_gather(fn(_per_device_copy(shared), tasks, keys), TASK_AXIS, tiled=True)

  task_spec = PartitionSpec(TASK_AXIS)
  # The gathered results are the same on every device; the replication check cannot
  # tell (the public all_gather's result is typed as varying), so it is off here.
  return jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(PartitionSpec(), task_spec, task_spec),
    out_specs=PartitionSpec(),
    check_vma=False,
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
