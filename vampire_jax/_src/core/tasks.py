"""The batch a meta-learner sees: a few-shot task, as a NamedTuple of arrays."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from vampire_jax._src.core import input_checks as checks


class Task(NamedTuple):
  """One few-shot task (or a batch of them, with a leading task axis).

  Shapes are given for one Omniglot N-way k-shot task; a meta-batch adds a
  leading `[tasks]` axis to every field.

  Attributes:
    support_x: `[ways*shots, 28, 28, 1]` inputs the learner adapts on.
    support_y: `[ways*shots]` integer labels (or `[shots, 1]` targets).
    query_x: `[ways*query, 28, 28, 1]` inputs the adapted learner is scored on.
    query_y: `[ways*query]` integer labels (or `[query, 1]` targets).
  """

  support_x: jax.Array
  support_y: jax.Array
  query_x: jax.Array
  query_y: jax.Array


def check_task_batch(tasks: Task, where: str = "tasks") -> int:
  """Checks a batch of tasks at trace time; returns the number of tasks.

  Every field needs the same leading `[tasks]` axis, at least one support
  and one query example per task, and x and y the same number of examples.

  Raises:
    InputError: naming the field, what it wants and what it got.
  """
  if not isinstance(tasks, Task):
    raise checks.fail(
      where,
      "tasks",
      "a vampire_jax.Task(support_x, support_y, query_x, query_y)",
      type(tasks).__name__,
    )
  for name, value in tasks._asdict().items():
    if jnp.ndim(value) < 2:
      raise checks.fail(
        where,
        f"tasks.{name}",
        "[tasks, examples, ...] (a leading task axis)",
        checks.describe(value),
      )
  num_tasks = jnp.shape(tasks.support_x)[0]
  for name, value in tasks._asdict().items():
    if jnp.shape(value)[0] != num_tasks:
      looks_like_one_task = (
        jnp.shape(tasks.support_x)[0] == jnp.shape(tasks.support_y)[0]
        and jnp.shape(tasks.query_x)[0] == jnp.shape(tasks.query_y)[0]
      )
      hint = (
        " (one task without its leading task axis? add one: jax.tree.map(lambda v: v[None], task))"
        if looks_like_one_task
        else ""
      )
      raise checks.fail(
        where,
        f"tasks.{name}",
        f"{num_tasks} tasks, as tasks.support_x",
        checks.describe(value) + hint,
      )
  for x_name, y_name in (("support_x", "support_y"), ("query_x", "query_y")):
    x, y = getattr(tasks, x_name), getattr(tasks, y_name)
    if jnp.shape(x)[1] < 1:
      raise checks.fail(
        where, f"tasks.{x_name}", "at least one example per task", checks.describe(x)
      )
    if jnp.shape(y)[1] != jnp.shape(x)[1]:
      raise checks.fail(
        where,
        f"tasks.{y_name}",
        f"[tasks, {jnp.shape(x)[1]}, ...], one entry per example of tasks.{x_name}",
        checks.describe(y),
      )
  return num_tasks
