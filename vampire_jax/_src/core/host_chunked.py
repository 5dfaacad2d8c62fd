"""Meta-steps for CPUs: one jitted, unrolled chunk of tasks, the chunks looped on the host.

`make_host_chunked_train_step` jits one unrolled chunk of tasks and loops over
the chunks in Python: a loop-free program, for XLA:CPU's slow convolution
gradients inside loops with XLA's own convolution. With `loop_safe`
convolutions (the CPU default) `meta_step.make_train_step` with tasks in
`lax.map` is faster and compiles sooner (docs/performance.md). Each equals its
`meta_step` counterpart for the same key, up to float rounding.
"""

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.learners import MetaLearner, check_step_tasks
from vampire_jax._src.core.meta_step import (
  MetaState,
  MetricsFn,
  TaskSampler,
  _stack_one,
  _StepTasks,
  apply_meta_gradient,
  draw_tasks,
  make_meta_gradient,
  step_keys,
  with_health,
  with_log_std,
)
from vampire_jax._src.core.tasks import Task, check_task_batch

PyTree = Any


def make_host_chunked_meta_step(
  learner: MetaLearner,
  optimizer: optax.GradientTransformation,
  *,
  chunk_size: int,
  metrics_fn: Optional[MetricsFn] = None,
):
  """The meta-step for CPUs: jitted, unrolled chunks of tasks, looped on the host.

  XLA:CPU runs convolutions inside loops (`lax.map`, `lax.scan`) several
  times slower than at the top level, and vmapped per-task weights become
  slow grouped convolutions; unrolling every task is fastest but its compile
  time grows with the number of tasks. This step compiles one unrolled chunk
  of `chunk_size` tasks and runs the chunks from Python, so compile time is
  bounded and each task runs at unrolled speed. It gives the same result as
  `make_meta_step` with the same key.

  Do not wrap the returned function in `jax.jit`: it jits its own pieces.
  """
  chunk_gradient = jax.jit(
    make_meta_gradient(learner, task_batching="unroll", metrics_fn=metrics_fn)
  )
  split_keys = jax.jit(jax.random.split, static_argnums=1)

  @functools.partial(jax.jit, static_argnums=3)  # traced again for another task count
  def finish(state, grads, metrics, num_tasks):
    metrics = with_health(metrics, grads)
    described = (
      f"make_host_chunked_meta_step: the step was given {num_tasks} tasks (tasks' leading axis)"
    )
    return apply_meta_gradient(optimizer, state, grads, _StepTasks(num_tasks, described)), metrics

  def meta_step(state: MetaState, tasks: Task, key: jax.Array):
    num_tasks = check_task_batch(tasks, "meta_step")
    if chunk_size < 1 or num_tasks % chunk_size:
      raise ValueError(f"chunk_size={chunk_size} must be >= 1 and divide the {num_tasks} tasks")
    check_step_tasks(
      learner,
      num_tasks,
      f"make_host_chunked_meta_step: the step was given {num_tasks} tasks (tasks' leading axis)",
    )
    task_keys = split_keys(key, num_tasks)
    total = None
    for start in range(0, num_tasks, chunk_size):
      chunk = jax.tree_util.tree_map(lambda x: x[start : start + chunk_size], tasks)
      result = chunk_gradient(state.meta_params, chunk, task_keys[start : start + chunk_size])
      total = result if total is None else jax.tree_util.tree_map(jnp.add, total, result)
    num_chunks = num_tasks // chunk_size
    grads, metrics = jax.tree_util.tree_map(lambda t: t / num_chunks, total)
    return finish(state, grads, metrics, num_tasks)

  return meta_step


def make_host_chunked_train_step(
  learner: MetaLearner,
  optimizer: optax.GradientTransformation,
  sample_tasks: TaskSampler,
  *,
  tasks_per_step: int,
  chunk_size: int,
  metrics_fn: Optional[MetricsFn] = None,
):
  """`make_train_step` for CPUs: `train_step(state, data, key)`, one meta-step per call.

  Each chunk of `chunk_size` tasks is sampled, adapted and differentiated in
  one jitted, unrolled program that adds its gradient to a running sum (see
  `make_host_chunked_meta_step`). The result equals `make_train_step`'s for
  the same key, up to float rounding. Do not wrap it in `jax.jit`.
  """
  checks.step_count("make_host_chunked_train_step", "tasks_per_step", tasks_per_step, 1)
  check_step_tasks(
    learner, tasks_per_step, f"make_host_chunked_train_step: tasks_per_step={tasks_per_step}"
  )
  if chunk_size < 1 or tasks_per_step % chunk_size:
    raise ValueError(f"chunk_size={chunk_size} must be >= 1 and divide the {tasks_per_step} tasks")
  gradient = make_meta_gradient(learner, task_batching="unroll", metrics_fn=metrics_fn)
  num_chunks = tasks_per_step // chunk_size
  step_tasks = _StepTasks(
    tasks_per_step, f"make_host_chunked_train_step: tasks_per_step={tasks_per_step}"
  )

  def chunk_result(meta_params, data, task_keys, adapt_keys):
    return gradient(meta_params, draw_tasks(sample_tasks, data, task_keys), adapt_keys)

  @jax.jit
  def zero_total(meta_params, data, task_keys, adapt_keys):  # traced, never run, by eval_shape
    shapes = jax.eval_shape(chunk_result, meta_params, data, task_keys, adapt_keys)
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  @functools.partial(jax.jit, donate_argnums=1)
  def add_chunk(meta_params, total, data, task_keys, adapt_keys):
    result = chunk_result(meta_params, data, task_keys, adapt_keys)
    return jax.tree_util.tree_map(jnp.add, total, result)

  @jax.jit
  def keys_of(key, step):
    keys = step_keys(key, step, tasks_per_step)
    return jax.tree_util.tree_map(lambda k: k.reshape((num_chunks, chunk_size) + k.shape[1:]), keys)

  @jax.jit
  def finish(state, total):
    grads, metrics = jax.tree_util.tree_map(lambda t: t / num_chunks, total)
    metrics = with_log_std(with_health(metrics, grads), state.meta_params)
    return apply_meta_gradient(optimizer, state, grads, step_tasks), _stack_one(metrics)

  def train_step(state: MetaState, data: PyTree, key: jax.Array):
    checks.prng_key("train_step", "key", key)
    task_keys, adapt_keys = keys_of(key, state.step)
    total = zero_total(state.meta_params, data, task_keys[0], adapt_keys[0])
    for chunk in range(num_chunks):
      total = add_chunk(state.meta_params, total, data, task_keys[chunk], adapt_keys[chunk])
    return finish(state, total)

  return train_step
