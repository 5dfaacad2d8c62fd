"""The batch a meta-learner sees: a few-shot task, as a NamedTuple of arrays."""

from typing import NamedTuple

import jax


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
