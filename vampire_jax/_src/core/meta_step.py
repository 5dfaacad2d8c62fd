"""Meta-training steps: the meta-gradient, the optimiser, and steps that sample their own tasks.

`make_meta_step(learner, optimizer)` is Alg. 1, lines 3-11, for a batch of
tasks given to it. `make_train_step(learner, optimizer, sample_tasks, ...)`
also draws the tasks, inside the same jitted program, and runs
`steps_per_call` meta-steps per call with `lax.scan`, so that Python and
dispatch overhead vanish between steps. Step n always draws its tasks and
Monte-Carlo noise from `fold_in(key, n)`: the result is the same whatever
`steps_per_call`, and a resumed run continues the same stream.

The host-chunked steps for CPUs (one unrolled chunk of tasks jitted, the chunks
looped in Python) are in `host_chunked`.
"""

from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from vampire_jax._src.core import batching, sharding
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.learners import MetaLearner, query_loss
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


def meta_lr_schedule(
  learning_rate: float = 1e-3,
  *,
  tasks_per_step: int,
  decay_rate: float = 0.99,
  decay_every_tasks: int = 10_000,
) -> optax.Schedule:
  """The paper's meta learning rate: x `decay_rate` after every `decay_every_tasks` tasks.

  Raises:
    InputError: (a ValueError) a rate that is not a finite positive number, a
      `decay_rate` outside (0, 1], or a `tasks_per_step` that is not an integer >= 1.
  """
  where = "meta_lr_schedule"
  checks.rate(where, "learning_rate", learning_rate, positive=True)
  checks.step_count(where, "tasks_per_step", tasks_per_step, 1)
  checks.rate(where, "decay_rate", decay_rate, positive=True)
  if decay_rate > 1:
    raise InputError(f"{where}: decay_rate must be in (0, 1], got {decay_rate!r}")
  checks.rate(where, "decay_every_tasks", decay_every_tasks, positive=True)
  return optax.exponential_decay(
    learning_rate,
    transition_steps=decay_every_tasks / tasks_per_step,
    decay_rate=decay_rate,
    staircase=True,
  )


def log_std_mask(meta_params: PyTree) -> PyTree:
  """True at every log-std of `meta_params`, False elsewhere (a tree of bools).

  A log-std is a leaf under a field whose name starts with `log_std`:
  VAMPIRE's and ABML's prior (`Gaussian.log_std`), PLATIPUS's prior and
  inference spreads (`log_std`, `log_std_q`). Point estimates (MAML) and
  BMAML's particles have none.
  """

  def is_log_std(path, leaf) -> bool:
    del leaf
    return any(
      isinstance(k, jax.tree_util.GetAttrKey) and k.name.startswith("log_std") for k in path
    )

  return jax.tree_util.tree_map_with_path(is_log_std, meta_params)


def _not_log_std(meta_params: PyTree) -> PyTree:
  return jax.tree_util.tree_map(lambda is_log_std: not is_log_std, log_std_mask(meta_params))


class MetaOptimizer(optax.GradientTransformationExtraArgs):
  """`meta_optimizer`'s result: an optax transformation that knows its `tasks_per_step`.

  It is an ordinary `optax.GradientTransformation` (`init`, `update`), and
  `make_train_step` reads `tasks_per_step` from it, so a user states T once.
  """

  def __new__(cls, init, update, tasks_per_step: Optional[int] = None):
    self = super().__new__(cls, init, update)
    self.tasks_per_step = tasks_per_step
    return self


def meta_optimizer(
  learning_rate: float = 1e-3,
  *,
  tasks_per_step: int,
  decay_rate: float = 0.99,
  decay_every_tasks: int = 10_000,
  clip_norm: Optional[float] = None,
  clip_separately: bool = False,
  log_std_weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  """Adam with the paper's schedule: lr x `decay_rate` every `decay_every_tasks` tasks.

  In order: clip the meta-gradient, add the log-std weight decay, Adam. That
  is what the authors' 2019 code did with PyTorch's Adam (`weight_decay` in
  its parameter group of log-stds: coupled L2, added to the clipped gradient
  before the moments).

  Args:
    learning_rate: gamma.
    tasks_per_step: T, tasks per meta-update (sets the decay's step count);
      `make_train_step` takes it from here.
    decay_rate: multiplicative decay (1: none, as the authors' code).
    decay_every_tasks: tasks between decays.
    clip_norm: if set, clip the meta-gradient's global norm first (the
      authors' code clips at 10).
    clip_separately: clip the means' part and the log-stds' part each to
      `clip_norm` (the authors' VAMPIRE), instead of the whole gradient.
    log_std_weight_decay: lambda: every log-std rho (`log_std_mask`) gets
      `lambda * rho` added to its gradient, which pulls it toward 0 (a wider
      prior, sigma = 1); means and point estimates are left alone. The
      authors' VAMPIRE: 1e-3.

  Returns:
    A `MetaOptimizer`: the optax transformation, with `tasks_per_step`.

  Raises:
    InputError: (a ValueError) a setting that is not a finite number in its range.
  """
  where = "meta_optimizer"
  if clip_norm is not None:
    checks.rate(where, "clip_norm", clip_norm, positive=True)
  checks.rate(where, "log_std_weight_decay", log_std_weight_decay, positive=False)
  transforms = []
  if clip_norm is not None and clip_separately:
    clip = optax.clip_by_global_norm(clip_norm)
    transforms += [optax.masked(clip, _not_log_std), optax.masked(clip, log_std_mask)]
  elif clip_norm is not None:
    transforms.append(optax.clip_by_global_norm(clip_norm))
  if log_std_weight_decay:
    transforms.append(optax.add_decayed_weights(log_std_weight_decay, mask=log_std_mask))
  adam = optax.adam(
    meta_lr_schedule(
      learning_rate,
      tasks_per_step=tasks_per_step,
      decay_rate=decay_rate,
      decay_every_tasks=decay_every_tasks,
    )
  )
  # Adam alone is not chained: its state keeps the structure of earlier runs' checkpoints.
  optimizer = optax.chain(*transforms, adam) if transforms else adam
  return MetaOptimizer(*optimizer, tasks_per_step=tasks_per_step)


def _tasks_per_step(optimizer: optax.GradientTransformation, tasks_per_step: Optional[int]) -> int:
  """T from `make_train_step`'s argument or its `MetaOptimizer`; both given must agree."""
  known = getattr(optimizer, "tasks_per_step", None)
  if tasks_per_step is None and known is None:
    raise InputError(
      "make_train_step: tasks_per_step is required with an optimizer not built by "
      "vj.meta_optimizer(..., tasks_per_step=T)"
    )
  if tasks_per_step is not None and known is not None and tasks_per_step != known:
    raise InputError(
      f"make_train_step: tasks_per_step={tasks_per_step!r} differs from the "
      f"{known} tasks per step the optimizer's schedule counts in (vj.meta_optimizer); "
      "give it once, to vj.meta_optimizer"
    )
  return known if tasks_per_step is None else tasks_per_step


def init_meta_state(
  learner: MetaLearner, optimizer: optax.GradientTransformation, params: PyTree, key: jax.Array
) -> MetaState:
  """Meta-parameters from initial network weights, and a fresh optimiser state."""
  meta_params = learner.init(params, key)
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


def classification_metrics(outputs: jax.Array, labels: jax.Array) -> dict:
  """Accuracy of the sample-averaged softmax; outputs `[samples, batch, classes]`."""
  probs = jnp.mean(jax.nn.softmax(outputs, axis=-1), axis=0)
  return {"accuracy": jnp.mean(jnp.argmax(probs, axis=-1) == labels)}


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
  loss_and_grad = jax.value_and_grad(
    lambda meta_params, task, key: query_loss(learner, meta_params, task, key), has_aux=True
  )

  def one_task(meta_params, task, key):
    (loss, outputs), grads = loss_and_grad(meta_params, task, key)
    metrics = {"loss": loss}
    if metrics_fn is not None:
      metrics.update(metrics_fn(outputs, task.query_y))
    return grads, metrics

  def per_task(meta_params, tasks: Task, task_keys: jax.Array):
    return batching.batched_map(
      lambda args: one_task(meta_params, *args),
      (tasks, task_keys),
      strategy=task_batching,
      chunk_size=chunk_size,
      any_count_exact=True,  # a task's numbers do not depend on its device's share
    )

  def meta_gradient(meta_params, tasks: Task, task_keys: jax.Array):
    num_tasks = check_task_batch(tasks, "meta_gradient")
    if mesh is None:
      results = per_task(meta_params, tasks, task_keys)
    else:
      sharding.check_divisible(num_tasks, mesh, "meta_gradient: tasks")
      results = sharding.gather_over_task_shards(per_task, mesh)(meta_params, tasks, task_keys)
    # The mean of the [tasks, ...] results, reduced alike on any number of devices.
    return jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), results)

  return meta_gradient


def apply_meta_gradient(
  optimizer: optax.GradientTransformation, state: MetaState, grads: PyTree
) -> MetaState:
  """One optimiser step on the meta-parameters (Alg. 1, line 11)."""
  # An invariant of the meta-gradient (chunked, sharded or host-summed): a leaf of another
  # shape would broadcast into the update and change the parameters' shapes silently.
  chex.assert_trees_all_equal_shapes_and_dtypes(grads, state.meta_params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.meta_params)
  meta_params = optax.apply_updates(state.meta_params, updates)
  return MetaState(state.step + 1, meta_params, opt_state)


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
  meta_gradient = make_meta_gradient(
    learner, task_batching=task_batching, chunk_size=chunk_size, metrics_fn=metrics_fn, mesh=mesh
  )

  def meta_step(state: MetaState, tasks: Task, key: jax.Array):
    task_keys = jax.random.split(key, check_task_batch(tasks, "meta_step"))
    grads, metrics = meta_gradient(state.meta_params, tasks, task_keys)
    metrics = with_health(metrics, grads)
    return apply_meta_gradient(optimizer, state, grads), metrics

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
):
  """Builds `train_step(state, data, key) -> (state, metrics)`: `steps_per_call` meta-steps.

  Each meta-step samples its `tasks_per_step` tasks with
  `sample_tasks(data, task_keys)` inside the step (`step_keys(key,
  state.step, ...)`), so no tasks cross between host and device. Wrap it in
  `jax.jit(..., donate_argnums=0)`: the old state's buffers are then reused
  for the new one.

  Args:
    learner, optimizer: as in `make_meta_step`.
    sample_tasks: `sample_tasks(data, task_keys) -> Task`, jittable.
    tasks_per_step: T, the tasks each meta-step draws and adapts to; by
      default the `tasks_per_step` of a `vj.meta_optimizer` (needed with any
      other optimizer; given to both, they must agree).
    steps_per_call: meta-steps per call, run with `lax.scan`.
    task_batching, chunk_size, metrics_fn, mesh: as in `make_meta_gradient`.

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
  tasks_per_step = _tasks_per_step(optimizer, tasks_per_step)
  checks.step_count("make_train_step", "tasks_per_step", tasks_per_step, 1)
  checks.step_count("make_train_step", "steps_per_call", steps_per_call, 1)
  if mesh is not None:
    sharding.check_divisible(tasks_per_step, mesh, "make_train_step: tasks_per_step")
  meta_gradient = make_meta_gradient(
    learner, task_batching=task_batching, chunk_size=chunk_size, metrics_fn=metrics_fn, mesh=mesh
  )

  def one_step(state: MetaState, data: PyTree, key: jax.Array):
    task_keys, adapt_keys = step_keys(key, state.step, tasks_per_step)
    if mesh is not None:  # each device draws the tasks it adapts to
      task_keys, adapt_keys = jax.lax.with_sharding_constraint(
        (task_keys, adapt_keys), sharding.task_sharding(mesh)
      )
    tasks = draw_tasks(sample_tasks, data, task_keys)
    grads, metrics = meta_gradient(state.meta_params, tasks, adapt_keys)
    metrics = with_log_std(with_health(metrics, grads), state.meta_params)
    return apply_meta_gradient(optimizer, state, grads), metrics

  def train_step(state: MetaState, data: PyTree, key: jax.Array):
    checks.prng_key("train_step", "key", key)
    if steps_per_call == 1:
      state, metrics = one_step(state, data, key)
      return state, _stack_one(metrics)
    return jax.lax.scan(lambda s, _: one_step(s, data, key), state, None, length=steps_per_call)

  return train_step
