"""Tasks of chosen classes: every N-class combination (the paper's calibration protocol).

The calibration protocol of the paper scores a model on every 5-class
combination of mini-ImageNet's 20 test classes, C(20, 5) = 15 504 tasks.
Combination i is the i-th of `itertools.combinations(range(20), 5)`;
`combination_at` computes it without listing the others, so a random subset
of a huge set of combinations is cheap too. The examples of each task are
drawn by the task sampler's `episodes.tasks_for_classes`. For example::

  ids = combination_ids(num_classes=20, ways=5)           # all 15 504, in order
  tasks = combination_tasks(key, test_images, ids[:20], num_classes=20,
                            ways=5, shots=1, query=15)     # 20 tasks
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core.tasks import Task
from vampire_jax.data.episodes import tasks_for_classes


def num_combinations(num_classes: int, ways: int) -> int:
  """C(num_classes, ways): how many `ways`-class tasks the classes allow."""
  return math.comb(num_classes, ways)


def combination_at(index: int, num_classes: int, ways: int) -> tuple[int, ...]:
  """The `index`-th of `itertools.combinations(range(num_classes), ways)`.

  Lexicographic unranking: the combinations whose smallest class is c number
  C(num_classes - c - 1, ways - 1), so skip whole blocks of them until
  `index` falls inside one, then do the same for the remaining slots.
  """
  total = num_combinations(num_classes, ways)
  if not 0 <= index < total:
    raise ValueError(f"index must be in [0, C({num_classes}, {ways}) = {total}), got {index}.")
  combination, next_class = [], 0
  for slot in range(ways):
    while True:
      block = math.comb(num_classes - next_class - 1, ways - slot - 1)
      if index < block:
        break
      index -= block
      next_class += 1
    combination.append(next_class)
    next_class += 1
  return tuple(combination)


def combination_ids(
  num_classes: int,
  ways: int,
  num_tasks: Optional[int] = None,
  *,
  seed: int = 0,
) -> np.ndarray:
  """Indices of the combinations to evaluate, in increasing order.

  Args:
    num_classes: classes to choose from (20 for mini-ImageNet's test set).
    ways: classes per task.
    num_tasks: None (or at least the number of combinations) for all of
      them, otherwise a uniformly random subset of this size, drawn without
      replacement with `np.random.default_rng(seed)`.
    seed: seed of the subset.

  Returns:
    int64 `[num_tasks]`, sorted, each in [0, C(num_classes, ways)).
  """
  total = num_combinations(num_classes, ways)
  if num_tasks is None or num_tasks >= total:
    return np.arange(total, dtype=np.int64)
  if num_tasks < 1:
    raise ValueError(f"num_tasks must be at least 1, got {num_tasks}.")
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(total, size=num_tasks, replace=False))


def class_combinations(ids: np.ndarray, num_classes: int, ways: int) -> np.ndarray:
  """int32 `[len(ids), ways]`: row r is `combination_at(ids[r], ...)`."""
  rows = [combination_at(int(i), num_classes, ways) for i in ids]
  return np.array(rows, np.int32).reshape(len(rows), ways)


def combination_tasks(
  key: jax.Array,
  class_images: jax.Array,
  ids: np.ndarray,
  *,
  num_classes: int,
  ways: int,
  shots: int,
  query: int,
  class_counts: Optional[jax.Array] = None,
) -> Task:
  """One task per combination id, the same whatever else is in the batch.

  The classes of task r are `combination_at(ids[r])`, class j of them has
  label j. Its examples are drawn with the key `fold_in(key, ids[r])`, so a
  combination gets the same task however the ids are batched.

  Args:
    key: PRNG key of the whole evaluation.
    class_images: `[C, E, ...]` (uint8 images, or float data used as is).
    ids: combination indices, each below C(num_classes, ways) and 2**32.
    num_classes: C, the number of classes the combinations choose from.
    ways: classes per task.
    shots: support examples per class.
    query: query examples per class.
    class_counts: int `[C]`, examples of each class (the first ones along
      axis 1); None if all E are used.

  Returns:
    `Task` as `episodes.tasks_from_keys` returns.
  """
  if class_images.shape[0] != num_classes:
    raise ValueError(
      f"class_images has {class_images.shape[0]} classes, "
      f"the combinations choose from {num_classes}."
    )
  ids = np.asarray(ids, np.int64)
  if ids.size and ids.max() >= 2**32:
    raise ValueError(
      "Combination ids must fit in 32 bits (they key the "
      "tasks); choose a subset with ids below 2**32."
    )
  classes = jnp.asarray(class_combinations(ids, num_classes, ways))
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.asarray(ids, jnp.uint32))
  return tasks_for_classes(
    keys, class_images, classes, shots=shots, query=query, class_counts=class_counts
  )
