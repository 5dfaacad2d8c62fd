"""The batch a meta-learner sees: a few-shot task, as a NamedTuple of arrays."""

from typing import NamedTuple

import jax
import jax.numpy as jnp


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


def check_task_batch(tasks: Task) -> int:
  """Raises ValueError unless every field shares a leading task axis; returns it."""
  sizes = {name: jnp.shape(value)[0] if jnp.ndim(value) else None
           for name, value in tasks._asdict().items()}
  if len(set(sizes.values())) != 1 or None in sizes.values():
    raise ValueError(f"all Task fields need the same leading [tasks] axis; got {sizes}")
  shapes = {k: jnp.shape(v) for k, v in tasks._asdict().items()}
  if shapes["support_x"][1] != shapes["support_y"][1] or shapes["query_x"][1] != shapes["query_y"][1]:
    raise ValueError(f"x and y must have the same number of examples per task; got {shapes}")
  return sizes["support_x"]
