"""Tasks from chosen classes: class combinations and classes of unequal size.

`sample_tasks` (episodes.py) draws the classes of each task at random from
classes that all have the same number of examples. This module covers the
two other cases:

- The calibration protocol of the paper scores a model on every 5-class
  combination of mini-ImageNet's 20 test classes, C(20, 5) = 15 504 tasks.
  Combination i is the i-th of `itertools.combinations(range(20), 5)`;
  `combination_at` computes it without listing the others, so a random
  subset of a huge set of combinations is cheap too.
- tiered-ImageNet's classes have 732 to 1300 images. Classes are stored
  padded to the largest, with the true count per class;
  `sample_tasks_with_counts` draws examples only among a class's own.

  ids = combination_ids(num_classes=20, ways=5)           # all 15 504, in order
  tasks = combination_tasks(key, test_images, ids[:20], num_classes=20,
                            ways=5, shots=1, query=15)     # 20 tasks
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax.data.episodes import check_episode_spec
from vampire_jax.tasks import Task


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
    raise ValueError(f'index must be in [0, C({num_classes}, {ways}) = '
                     f'{total}), got {index}.')
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
    raise ValueError(f'num_tasks must be at least 1, got {num_tasks}.')
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(total, size=num_tasks, replace=False))


def class_combinations(ids: np.ndarray, num_classes: int,
                       ways: int) -> np.ndarray:
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
    `Task` as `sample_tasks_with_counts` returns.
  """
  if class_images.shape[0] != num_classes:
    raise ValueError(f'class_images has {class_images.shape[0]} classes, '
                     f'the combinations choose from {num_classes}.')
  ids = np.asarray(ids, np.int64)
  if ids.size and ids.max() >= 2**32:
    raise ValueError('Combination ids must fit in 32 bits (they key the '
                     'tasks); choose a subset with ids below 2**32.')
  classes = jnp.asarray(class_combinations(ids, num_classes, ways))
  keys = jax.vmap(jax.random.fold_in, (None, 0))(
      key, jnp.asarray(ids, jnp.uint32))
  return tasks_for_classes(keys, class_images, classes, shots=shots,
                           query=query, class_counts=class_counts)


@functools.partial(jax.jit, static_argnames=('shots', 'query'))
def tasks_for_classes(
    keys: jax.Array,
    class_images: jax.Array,
    classes: jax.Array,
    *,
    shots: int,
    query: int,
    class_counts: Optional[jax.Array] = None,
) -> Task:
  """Tasks of the given classes, examples drawn at random (jitted).

  Args:
    keys: `[tasks]` PRNG keys, one per task.
    class_images: `[C, E, ...]`; uint8 is scaled to [0, 1], floats are kept.
    classes: int `[tasks, ways]` distinct classes of each task; class
      `classes[t, j]` gets label j.
    shots: support examples per class.
    query: query examples per class (distinct from the support ones).
    class_counts: int `[C]`, how many of the E slots of each class hold
      examples (the first ones); None if all do. Each count must be at least
      `shots + query` (checked by the callers that know the counts).

  Returns:
    `Task` with support_x `[tasks, ways*shots, ...]` float32, support_y int32
    `[tasks, ways*shots]` (`[0]*shots + [1]*shots + ...`), query_x
    `[tasks, ways*query, ...]`, query_y `[tasks, ways*query]`.
  """
  num_classes, num_slots = class_images.shape[:2]
  ways = classes.shape[1]
  check_episode_spec(num_classes, num_slots, ways=ways, shots=shots,
                     query=query)
  if class_counts is None:
    class_counts = jnp.full((num_classes,), num_slots, jnp.int32)

  def one_task(key, task_classes):
    examples = jax.vmap(
        lambda k, count: _random_subset_below(k, num_slots, count,
                                              shots + query))(
            jax.random.split(key, ways), class_counts[task_classes])
    images = class_images[task_classes[:, None], examples]  # [ways, s+q, ...]
    scale = 255 if images.dtype == jnp.uint8 else 1
    images = images.astype(jnp.float32) / scale
    example_shape = images.shape[2:]
    labels = jnp.arange(ways, dtype=jnp.int32)
    return Task(
        support_x=images[:, :shots].reshape(ways * shots, *example_shape),
        support_y=jnp.repeat(labels, shots),
        query_x=images[:, shots:].reshape(ways * query, *example_shape),
        query_y=jnp.repeat(labels, query))

  return jax.vmap(one_task)(keys, classes)


@functools.partial(
    jax.jit, static_argnames=('num_tasks', 'ways', 'shots', 'query'))
def sample_tasks_with_counts(
    key: jax.Array,
    class_images: jax.Array,
    class_counts: jax.Array,
    *,
    num_tasks: int,
    ways: int,
    shots: int,
    query: int,
) -> Task:
  """`sample_tasks` without rotations, for classes of unequal size (jitted).

  Per task: `ways` distinct classes drawn uniformly, then `shots + query`
  distinct examples of each, drawn uniformly among that class's
  `class_counts[c]` examples.

  Args:
    key: PRNG key; the same key gives the same tasks.
    class_images: `[C, E, ...]`, class c's examples in its first
      `class_counts[c]` slots (the rest is padding, never drawn).
    class_counts: int `[C]`, each at least `shots + query` (not checked here,
      the counts being traced; `check_class_counts` does it on the host).
    num_tasks: tasks in the meta-batch.
    ways: classes per task.
    shots: support examples per class.
    query: query examples per class.

  Returns:
    `Task` as `tasks_for_classes` returns.
  """
  num_classes = class_images.shape[0]
  check_episode_spec(num_classes, class_images.shape[1], ways=ways,
                     shots=shots, query=query)
  if num_tasks < 1:
    raise ValueError(f'num_tasks must be at least 1, got {num_tasks}.')
  key_classes, key_examples = jax.random.split(key)
  classes = jax.vmap(lambda k: _random_subset_below(
      k, num_classes, num_classes, ways))(
          jax.random.split(key_classes, num_tasks))
  return tasks_for_classes(jax.random.split(key_examples, num_tasks),
                           class_images, classes, shots=shots, query=query,
                           class_counts=class_counts)


def check_class_counts(class_counts: np.ndarray, *, ways: int, shots: int,
                       query: int) -> None:
  """Raises ValueError unless every class can give `shots + query` examples."""
  class_counts = np.asarray(class_counts)
  check_episode_spec(len(class_counts), int(class_counts.max(initial=0)),
                     ways=ways, shots=shots, query=query)
  smallest = int(class_counts.min())
  if smallest < shots + query:
    raise ValueError(
        f'shots + query = {shots} + {query} = {shots + query} distinct '
        f'examples per class are needed, but the smallest class has only '
        f'{smallest}.')


def _random_subset_below(key: jax.Array, size: int, count: jax.Array,
                         k: int) -> jax.Array:
  """`k` distinct ints from `range(count)` (count <= size), uniformly, in
  random order: the top-k of iid uniform noise, slots >= count set below."""
  noise = jax.random.uniform(key, (size,))
  noise = jnp.where(jnp.arange(size) < count, noise, -1.0)
  return jax.lax.top_k(noise, k)[1]
