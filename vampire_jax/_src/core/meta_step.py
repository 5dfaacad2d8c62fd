"""Meta-training steps: the meta-gradient, its optimiser step, and steps that sample their tasks.

`make_meta_step(learner, optimizer)` is Alg. 1, lines 3-11, for a batch of
tasks given to it. `make_train_step(learner, optimizer, sample_tasks, ...)`
also draws the tasks, inside the same jitted program, and runs
`steps_per_call` meta-steps per call with `lax.scan`, so that Python and
dispatch overhead vanish between steps. Step n always draws its tasks and
Monte-Carlo noise from `fold_in(key, n)`: the result is the same whatever
`steps_per_call`, and a resumed run continues the same stream.

The host-chunked steps for CPUs (one unrolled chunk of tasks jitted, the chunks
looped in Python) are in `host_chunked`; the meta-optimiser and its schedule in
`meta_optimizer`.
"""

import contextlib
import functools
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from vampire_jax._src import deprecations
from vampire_jax._src.core import batching, sharding
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.learners import (
  MetaLearner,
  check_meta_params_kind,
  check_step_tasks,
  query_loss,
)
from vampire_jax._src.core.meta_optimizer import (  # the optimizer's names, where they were
  MetaOptimizer as MetaOptimizer,
  _StepTasks,
  _tasks_per_step,
  log_std_mask as log_std_mask,
  meta_lr_schedule as meta_lr_schedule,
  meta_optimizer as meta_optimizer,
  tasks_in_step,
)
from vampire_jax._src.core.tasks import Task, check_task_batch

PyTree = Any
# The one task-sampler convention (make_train_step, the training loop, the notebooks):
# `sample_tasks(data, task_keys [n]) -> Task` with a leading [n] axis, task i from key i
# alone. `data` (e.g. a split's images; None for generated tasks) is an argument, not a
# closure: jit would embed a closed-over array in the program as a constant.
TaskSampler = Callable[[PyTree, jax.Array], Task]


class MetaState(NamedTuple):
  """Everything a meta-training run carries between steps."""

  step: jax.Array  # [] int32, meta-updates done
  meta_params: PyTree  # Gaussian (VAMPIRE) or a weight tree (MAML)
  opt_state: optax.OptState  # the meta-optimizer's state (optax)


def _own_copy(leaf):
  """A concrete JAX array copied (same dtype and sharding); a traced or other leaf as it is."""
  if isinstance(leaf, jax.Array) and checks.concrete(leaf):
    return jnp.array(leaf, copy=True)
  return leaf


def init_meta_state(
  learner: MetaLearner, optimizer: optax.GradientTransformation, params: PyTree, key: jax.Array
) -> MetaState:
  """Meta-parameters from initial network weights, and a fresh optimiser state.

  The state holds copies, never the caller's arrays (`learner.init` may return
  `params` itself, as the Gaussian's means or MAML's weights): a step jitted with
  `donate_argnums=0` consumes the state's buffers, and `params` stays usable.
  """
  meta_params = jax.tree_util.tree_map(_own_copy, learner.init(params, key))
  return MetaState(jnp.zeros((), jnp.int32), meta_params, optimizer.init(meta_params))


MetricsFn = Callable[[jax.Array, jax.Array], dict]


def with_health(metrics: dict, grads: PyTree) -> dict:
  """`metrics` with the meta-gradient's norm and `finite`: loss and gradient both finite.

  A user's loop checks `metrics["finite"]` (an array of bools, one per step)
  and stops before a NaN reaches the meta-parameters' next use.
  """
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
  return dict(metrics, grad_norm=grad_norm, finite=finite)


def with_log_std(metrics: dict, meta_params: PyTree) -> dict:
  """`metrics` with `log_std`: the mean of every log-std of `meta_params` (`log_std_mask`).

  The prior's width as training goes (the log-std weight decay widens it); nothing
  is added for meta-parameters without log-stds (MAML, BMAML).
  """
  leaves = [
    leaf
    for leaf, is_log_std in zip(
      jax.tree_util.tree_leaves(meta_params), jax.tree_util.tree_leaves(log_std_mask(meta_params))
    )
    if is_log_std
  ]
  if not leaves:
    return metrics
  total = sum(jnp.sum(leaf) for leaf in leaves)
  return dict(metrics, log_std=total / sum(leaf.size for leaf in leaves))


def accuracy(probs: jax.Array, labels: jax.Array) -> jax.Array:
  """The fraction of `[batch, classes]` predictions whose argmax is the label; NaN where any
  probability is NaN (an argmax of NaN is 0, which would count as a prediction)."""
  correct = jnp.mean(jnp.argmax(probs, axis=-1) == labels)
  return jnp.where(jnp.any(jnp.isnan(probs)), jnp.nan, correct)


def classification_metrics(outputs: jax.Array, labels: jax.Array) -> dict:
  """Accuracy of the sample-averaged softmax; outputs `[samples, batch, classes]`."""
  probs = jnp.mean(jax.nn.softmax(outputs, axis=-1), axis=0)
  return {"accuracy": accuracy(probs, labels)}


def _one_task_gradient(learner: MetaLearner, metrics_fn: Optional[MetricsFn]) -> Callable:
  """`one_task(meta_params, task, key) -> (grads, metrics)`: one task's query loss, its
  gradient w.r.t. the meta-parameters, and `metrics_fn`'s values."""
  loss_and_grad = jax.value_and_grad(
    lambda meta_params, task, key: query_loss(learner, meta_params, task, key), has_aux=True
  )

  def one_task(meta_params, task, key):
    (loss, outputs), grads = loss_and_grad(meta_params, task, key)
    metrics = {"loss": loss}
    if metrics_fn is not None:
      metrics.update(metrics_fn(outputs, task.query_y))
    return grads, metrics

  return one_task


def _mean_over_tasks(
  fn: Callable, *, task_batching: batching.Batching, chunk_size: int, mesh: Optional[Mesh]
) -> Callable:
  """`mean(shared, tasks, keys)`: `fn(shared, task, key)` of each task, batched by
  `task_batching`, gathered in task order over the mesh's devices, averaged over tasks."""
  per_task = functools.partial(
    batching.map_tasks, fn, strategy=task_batching, chunk_size=chunk_size
  )

  def mean(shared, tasks, keys):
    if mesh is None:
      results = per_task(shared, tasks, keys)
    else:
      results = sharding.gather_over_task_shards(per_task, mesh)(shared, tasks, keys)
    # The mean of the [tasks, ...] results, reduced alike on any number of devices.
    return jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), results)

  return mean


def make_meta_gradient(
  learner: MetaLearner,
  *,
  task_batching: batching.Batching = "vmap",
  chunk_size: int = 1,
  metrics_fn: Optional[MetricsFn] = None,
  mesh: Optional[Mesh] = None,
):
  """Builds `meta_gradient(meta_params, tasks, task_keys) -> (grads, metrics)`.

  Each task's query loss and its gradient w.r.t. the meta-parameters are
  computed per task, batched by `task_batching`, and averaged over tasks.

  Args:
    learner: the algorithm (`vampire(...)`, `maml(...)`).
    task_batching: how tasks are batched: "vmap", "map", "remat_map", "unroll",
      "chunked_unroll" or "chunked_vmap" (the same computation; speed and memory differ); with
      a mesh, how each device batches its own tasks.
    chunk_size: tasks per chunk for the chunked strategies.
    metrics_fn: optional `metrics_fn(query_outputs, query_y) -> dict` of
      per-task scalars to average and report (e.g. `classification_metrics`).
    mesh: optional `vj.task_mesh(...)`: split the tasks over its
      devices; their per-task results are gathered and averaged in task
      order, so the result equals the one-device result bit for bit. The
      number of tasks must divide evenly.

  Returns:
    A pure function; `tasks` has a leading `[tasks]` axis and `task_keys`
    holds one PRNG key per task.
  """
  if mesh is not None:
    sharding.check_mesh("make_meta_gradient", mesh)
  mean_over_tasks = _mean_over_tasks(
    _one_task_gradient(learner, metrics_fn),
    task_batching=task_batching,
    chunk_size=chunk_size,
    mesh=mesh,
  )

  def meta_gradient(meta_params, tasks: Task, task_keys: jax.Array):
    num_tasks = check_task_batch(tasks, "meta_gradient")
    checks.prng_keys("meta_gradient", "task_keys", task_keys, num_tasks)
    if mesh is not None:
      sharding.check_divisible(num_tasks, mesh, "meta_gradient: tasks")
    return mean_over_tasks(meta_params, tasks, task_keys)

  return meta_gradient


def apply_meta_gradient(
  optimizer: optax.GradientTransformation,
  state: MetaState,
  grads: PyTree,
  tasks: Optional[_StepTasks] = None,
) -> MetaState:
  """One optimiser step on the meta-parameters (Alg. 1, line 11).

  `tasks`: optional `(count, described)`, the tasks the step adapted to; a
  `vj.meta_optimizer` of another `tasks_per_step`, bare or wrapped, is refused.
  """
  # An invariant of the meta-gradient (chunked, sharded or host-summed): a leaf of another
  # shape would broadcast into the update and change the parameters' shapes silently.
  chex.assert_trees_all_equal_shapes_and_dtypes(grads, state.meta_params)
  with contextlib.nullcontext() if tasks is None else tasks_in_step(*tasks):
    updates, opt_state = optimizer.update(grads, state.opt_state, state.meta_params)
  meta_params = optax.apply_updates(state.meta_params, updates)
  return MetaState(state.step + 1, meta_params, opt_state)


def _check_state(learner: MetaLearner, state: MetaState, where: str) -> None:
  """Refuses a state built for another learner (VAMPIRE's Gaussian in a MAML step), by name."""
  if isinstance(state, MetaState):
    check_meta_params_kind(
      where,
      "state.meta_params",
      learner,
      state.meta_params,
      "build the state for the learner the step trains, vj.init_meta_state(learner, optimizer, "
      "params, key)",
    )


def make_meta_step(
  learner: MetaLearner,
  optimizer: optax.GradientTransformation,
  *,
  task_batching: batching.Batching = "vmap",
  chunk_size: int = 1,
  metrics_fn: Optional[MetricsFn] = None,
  mesh: Optional[Mesh] = None,
):
  """Builds `meta_step(state, tasks, key) -> (state, metrics)` (Alg. 1, lines 3-11).

  A pure function: wrap it in `jax.jit`. Arguments as in `make_meta_gradient`;
  `tasks` is a `Task` with a leading `[tasks]` axis. The metrics are the
  task-averaged query loss (and `metrics_fn`'s values) and the meta-gradient
  norm. With a `mesh` the tasks are split over its devices and the state is
  replicated; the result equals the one-device step's bit for bit.
  """
  if mesh is not None:
    sharding.check_mesh("make_meta_step", mesh)
  meta_gradient = make_meta_gradient(
    learner, task_batching=task_batching, chunk_size=chunk_size, metrics_fn=metrics_fn, mesh=mesh
  )

  def meta_step(state: MetaState, tasks: Task, key: jax.Array):
    num_tasks = check_task_batch(tasks, "meta_step")
    _check_state(learner, state, "meta_step")
    task_keys = jax.random.split(key, num_tasks)
    described = f"make_meta_step: the step was given {num_tasks} tasks (tasks' leading axis)"
    check_step_tasks(learner, num_tasks, described)
    grads, metrics = meta_gradient(state.meta_params, tasks, task_keys)
    metrics = with_health(metrics, grads)
    return apply_meta_gradient(optimizer, state, grads, _StepTasks(num_tasks, described)), metrics

  return meta_step


def step_keys(key: jax.Array, step: jax.Array, num_tasks: int) -> tuple[jax.Array, jax.Array]:
  """The keys of meta-step `step`: `(task_keys, adapt_keys)`, each `[num_tasks]`.

  Task i of the step is drawn with `task_keys[i]` and adapted with
  `adapt_keys[i]`; both depend only on `key` and `step`.
  """
  task_key, adapt_key = jax.random.split(jax.random.fold_in(key, step))
  return jax.random.split(task_key, num_tasks), jax.random.split(adapt_key, num_tasks)


def draw_tasks(sample_tasks: TaskSampler, data: PyTree, task_keys: jax.Array) -> Task:
  """`sample_tasks(data, task_keys)`, checked at trace time against the convention.

  Raises:
    InputError: the sampler does not take `(data, task_keys)` or does not
      return a `Task` of `len(task_keys)` tasks.
  """
  convention = (
    "the train step calls sample_tasks(data, task_keys) with task_keys [n] and "
    "wants a vj.Task with a leading [n] axis, task i drawn from task_keys[i] alone"
  )
  try:
    tasks = sample_tasks(data, task_keys)
  except (TypeError, ValueError, IndexError) as error:
    raise InputError(
      f"make_train_step: sample_tasks failed ({type(error).__name__}: {error}); {convention}"
    ) from error
  num_tasks = check_task_batch(tasks, "make_train_step: sample_tasks(data, task_keys)")
  if num_tasks != task_keys.shape[0]:
    raise InputError(
      f"make_train_step: sample_tasks(data, task_keys) returned {num_tasks} tasks "
      f"for {task_keys.shape[0]} keys; {convention}"
    )
  return tasks


def _stack_one(metrics: dict) -> dict:
  return {name: value[None] for name, value in metrics.items()}


def make_train_step(
  learner: MetaLearner,
  optimizer: optax.GradientTransformation,
  sample_tasks: TaskSampler,
  *,
  tasks_per_step: Optional[int] = None,
  steps_per_call: int = 1,
  task_batching: batching.Batching = "vmap",
  chunk_size: int = 1,
  metrics_fn: Optional[MetricsFn] = None,
  mesh: Optional[Mesh] = None,
  draw_per_task: bool = False,
):
  """Builds `train_step(state, data, key) -> (state, metrics)`: `steps_per_call` meta-steps.

  Each meta-step samples its `tasks_per_step` tasks with
  `sample_tasks(data, task_keys)` inside the step (`step_keys(key,
  state.step, ...)`), so no tasks cross between host and device. Wrap it in
  `jax.jit(..., donate_argnums=0)`: the old state's buffers are then reused
  for the new one (a donated state is consumed; the `params` given to
  `init_meta_state` are not, since the state holds copies).

  Args:
    learner, optimizer: as in `make_meta_step`.
    sample_tasks: `sample_tasks(data, task_keys) -> Task`, jittable.
    tasks_per_step: T, the tasks each meta-step draws and adapts to; by
      default the `tasks_per_step` of a `vj.meta_optimizer` (needed with any
      other optimizer; given to both, they must agree).
    steps_per_call: meta-steps per call, run with `lax.scan`.
    task_batching, chunk_size, metrics_fn, mesh: as in `make_meta_gradient`.
    draw_per_task: where tasks run one at a time (`task_batching` "map" or
      "remat_map"), draw each inside that loop, `sample_tasks(data,
      task_keys[i:i + 1])`, so that the loop holds one task's inputs, not the
      step's (Omniglot's 16 tasks a device: 3.8 MB). The same tasks bit for
      bit where a task's numbers do not depend on how many are drawn at once,
      as with `vj.data`'s samplers (gathers of images); a sampler that
      computes in floating point (a sine's values) may round differently one
      task at a time, so the default (False) draws the batch first. Batched
      strategies always draw the batch first.

  Returns:
    A pure function; `metrics` holds `[steps_per_call]` arrays, per step:
    `loss`, `grad_norm`, `finite` (`with_health`), `log_std` (the mean of the
    meta-parameters' log-stds, `with_log_std`; none for MAML or BMAML) and
    `metrics_fn`'s values.

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((16,), 1)
    >>> params = vj.init_params(model, jax.random.key(0), (1, 1))
    >>> learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_inner_steps=2)
    >>> optimizer = vj.meta_optimizer(1e-3, tasks_per_step=4)  # T, stated once
    >>> state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
    >>> def sample_tasks(data, task_keys):  # data: None for generated tasks
    ...   return sine_line.tasks_from_keys(task_keys)
    >>> train_step = jax.jit(
    ...   vj.make_train_step(learner, optimizer, sample_tasks, steps_per_call=10)
    ... )
    >>> state, metrics = train_step(state, None, jax.random.key(2))
    >>> int(state.step), metrics["loss"].shape, bool(metrics["finite"].all())
    (10, (10,), True)
  """
  given = tasks_per_step is not None
  tasks_per_step = _tasks_per_step(optimizer, tasks_per_step)
  checks.step_count("make_train_step", "tasks_per_step", tasks_per_step, 1)
  checks.step_count("make_train_step", "steps_per_call", steps_per_call, 1)
  checks.flag("make_train_step", "draw_per_task", draw_per_task)
  check_step_tasks(
    learner,
    tasks_per_step,
    f"make_train_step: tasks_per_step={tasks_per_step}"
    + (
      "" if given else " (the optimizer's, vj.meta_optimizer's or vj.baselines.simpa_optimizer's)"
    ),
  )
  if mesh is not None:
    sharding.check_mesh("make_train_step", mesh)
    sharding.check_divisible(tasks_per_step, mesh, "make_train_step: tasks_per_step")
  one_task = _one_task_gradient(learner, metrics_fn)
  draw_in_loop = draw_per_task and task_batching in batching.MAPPED_STRATEGIES

  def drawn_task(shared, task_key, adapt_key):
    meta_params, data = shared
    # Task i from task_keys[i] alone (the sampler's convention): the batch's task i. The
    # barrier keeps the sampler's last operations (the images' scaling) out of the learner's
    # fusions, which would round them otherwise than a drawn batch's.
    task = jax.tree_util.tree_map(lambda leaf: leaf[0], sample_tasks(data, task_key[None]))
    return one_task(meta_params, jax.lax.optimization_barrier(task), adapt_key)

  mean_over_tasks = _mean_over_tasks(
    drawn_task if draw_in_loop else one_task,
    task_batching=task_batching,
    chunk_size=chunk_size,
    mesh=mesh,
  )
  step_tasks = _StepTasks(tasks_per_step, f"make_train_step: tasks_per_step={tasks_per_step}")

  def one_step(state: MetaState, data: PyTree, key: jax.Array):
    task_keys, adapt_keys = step_keys(key, state.step, tasks_per_step)
    if mesh is not None:  # each device draws the tasks it adapts to
      task_keys, adapt_keys = jax.lax.with_sharding_constraint(
        (task_keys, adapt_keys), sharding.task_sharding(mesh)
      )
    if draw_in_loop:  # the sampler checked against the convention on the batch's shapes
      jax.eval_shape(functools.partial(draw_tasks, sample_tasks), data, task_keys)
      grads, metrics = mean_over_tasks((state.meta_params, data), task_keys, adapt_keys)
    else:
      tasks = draw_tasks(sample_tasks, data, task_keys)
      grads, metrics = mean_over_tasks(state.meta_params, tasks, adapt_keys)
    metrics = with_log_std(with_health(metrics, grads), state.meta_params)
    return apply_meta_gradient(optimizer, state, grads, step_tasks), metrics

  def train_step(state: MetaState, data: PyTree, key: jax.Array):
    checks.prng_key("train_step", "key", key)
    _check_state(learner, state, "train_step")
    if steps_per_call == 1:
      state, metrics = one_step(state, data, key)
      return state, _stack_one(metrics)
    return jax.lax.scan(lambda s, _: one_step(s, data, key), state, None, length=steps_per_call)

  return train_step


# Names an earlier version kept here (`deprecations.MOVED_OUT_OF_MODULES`): warn, then work.
__getattr__ = deprecations.module_getattr(__name__)
