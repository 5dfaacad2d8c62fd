"""N-way k-shot tasks drawn on device from a stack of class examples: the one task sampler.

The whole stack `[C, E, ...]` (C classes, E examples each) lives on the
accelerator; tasks are drawn with `jax.random` inside `jit`, each from its
own key (vmap over tasks), so task i of a batch depends on its key alone.
For example::

  train = jax.device_put(make_split(load_omniglot(), 'original')['train'])
  tasks = sample_tasks(key, train, num_tasks=32, ways=5, shots=1, query=15)
  tasks.support_x  # [32, 5, 28, 28, 1] float32 in [0, 1]

Rotations (Omniglot): turning a character by 90, 180 or 270 degrees makes
a new class. `class_sampling` says how a task's classes are drawn:

- 'character' (MAML's protocol, the default): `ways` distinct characters,
  each turned by its own random multiple of 90 degrees;
- 'class': `ways` distinct (character, turn) pairs out of `4 C`, so a task
  may hold one character twice, in two rotations (about 16 % of 20-way
  tasks on Omniglot's 813 training characters).

Classes of unequal size (tiered-ImageNet) are stored padded to the largest,
with `class_counts`; examples are drawn among a class's own.
`tasks_for_classes` draws the examples of given classes (the calibration
protocol's class combinations use it too).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core.tasks import Task

NUM_ROTATIONS = 4  # Quarter turns: 0, 90, 180, 270 degrees.
CLASS_SAMPLING = ("character", "class")


def check_episode_spec(
  num_classes: int,
  examples_per_class: int,
  *,
  ways: int,
  shots: int,
  query: int,
) -> None:
  """Raises ValueError unless `ways`-way tasks can be drawn from the pool.

  Args:
    num_classes: classes to choose from (characters x rotations).
    examples_per_class: examples of each class (20 for Omniglot).
    ways: classes per task.
    shots: support examples per class.
    query: query examples per class (distinct from the support ones).
  """
  sizes = dict(
    num_classes=num_classes,
    examples_per_class=examples_per_class,
    ways=ways,
    shots=shots,
    query=query,
  )
  for name, value in sizes.items():
    if value < 1:
      raise ValueError(f"{name} must be at least 1, got {value}.")
  if ways > num_classes:
    raise ValueError(
      f"A {ways}-way task needs {ways} distinct classes, but the pool has only {num_classes}."
    )
  if shots + query > examples_per_class:
    raise ValueError(
      f"shots + query = {shots} + {query} = {shots + query} distinct "
      f"examples per class are needed, but each class has only "
      f"{examples_per_class}."
    )


def num_classes_available(
  num_characters: int, *, rotate: bool, class_sampling: str = "character"
) -> int:
  """How many distinct classes a task can draw `ways` from."""
  if class_sampling not in CLASS_SAMPLING:
    raise ValueError(f"class_sampling must be one of {CLASS_SAMPLING}, got {class_sampling!r}.")
  if rotate and class_sampling == "class":
    return num_characters * NUM_ROTATIONS
  return num_characters


def to_unit_range(images: jax.Array) -> jax.Array:
  """uint8 `[0, 255]` -> float32 `[0, 1]`; float arrays are taken as already scaled."""
  if images.dtype == jnp.uint8:
    return images.astype(jnp.float32) / 255.0
  return images.astype(jnp.float32)


def sample_tasks(
  key: jax.Array,
  class_images: jax.Array,
  *,
  num_tasks: int,
  ways: int,
  shots: int,
  query: int,
  rotate: bool = True,
  class_sampling: str = "character",
  class_counts: Optional[jax.Array] = None,
) -> Task:
  """`num_tasks` tasks from one key: `tasks_from_keys(split(key, num_tasks), ...)`."""
  if num_tasks < 1:
    raise ValueError(f"num_tasks must be at least 1, got {num_tasks}.")
  return tasks_from_keys(
    jax.random.split(key, num_tasks),
    class_images,
    ways=ways,
    shots=shots,
    query=query,
    rotate=rotate,
    class_sampling=class_sampling,
    class_counts=class_counts,
  )


@functools.partial(jax.jit, static_argnames=("ways", "shots", "query", "rotate", "class_sampling"))
def tasks_from_keys(
  task_keys: jax.Array,
  class_images: jax.Array,
  *,
  ways: int,
  shots: int,
  query: int,
  rotate: bool = True,
  class_sampling: str = "character",
  class_counts: Optional[jax.Array] = None,
) -> Task:
  """One N-way k-shot task per key (jitted; sizes are static).

  Per task: `ways` distinct classes drawn uniformly (see the module
  docstring for rotations), class j labelled j, so the class behind each
  label is random per task; for each class `shots + query` distinct
  examples, the first `shots` in the support set. Both sets are grouped by
  label: `support_y` is `[0]*shots + [1]*shots + ...`. Rotation is
  counter-clockwise, as `np.rot90` on the `(H, W)` axes.

  Pass `class_images` as a device array (`jax.device_put`), not numpy, so it
  is not copied to the device on every call.

  Args:
    task_keys: `[num_tasks]` PRNG keys; task i depends on key i alone.
    class_images: `[C, E, ...]`: uint8 images `[C, E, H, W]` or
      `[C, E, H, W, ch]` (scaled to [0, 1]), or float features used as is.
      `H == W` if `rotate`.
    ways: classes per task.
    shots: support examples per class.
    query: query examples per class.
    rotate: whether rotations make new classes (images only).
    class_sampling: 'character' or 'class' (rotations only).
    class_counts: int `[C]`, how many of the E slots of each class hold
      examples (the first ones); None if all do. Each must be at least
      `shots + query` (`check_class_counts` checks it on the host).

  Returns:
    `Task` with support_x `[num_tasks, ways*shots, ...]` float32 (images get
    a channel axis: `[..., H, W, ch]`), support_y int32
    `[num_tasks, ways*shots]`, query_x `[num_tasks, ways*query, ...]`,
    query_y int32 `[num_tasks, ways*query]`.

  Raises:
    ValueError: at trace time, for an impossible spec (see
      `check_episode_spec`), non-square images with `rotate`, or a bad rank.
  """
  class_images = _check_class_images(class_images, rotate)
  num_characters, num_examples = class_images.shape[:2]
  check_episode_spec(
    num_classes_available(num_characters, rotate=rotate, class_sampling=class_sampling),
    num_examples,
    ways=ways,
    shots=shots,
    query=query,
  )
  example_keys, classes, turns = jax.vmap(
    lambda key: _draw_classes(key, num_characters, ways, 0, rotate, class_sampling)
  )(task_keys)
  return tasks_for_classes(
    example_keys,
    class_images,
    classes,
    shots=shots,
    query=query,
    class_counts=class_counts,
    turns=turns,
  )


def _check_class_images(class_images: jax.Array, rotate: bool) -> jax.Array:
  if class_images.ndim == 4:  # grey images: a channel axis
    class_images = class_images[..., None]
  if rotate:
    if class_images.ndim != 5 or class_images.shape[2] != class_images.shape[3]:
      raise ValueError(
        "Rotation needs square images [C, E, H, H] or [C, E, H, H, ch], "
        f"got shape {class_images.shape}."
      )
  return class_images


def _draw_classes(
  key: jax.Array, num_characters: int, ways: int, extra: int, rotate: bool, class_sampling: str
):
  """`(example_key, classes [ways + extra], turns [ways + extra] or None)` of one task.

  The first `ways` classes (and turns) do not depend on `extra`: the classes
  are the top of one draw of noise, and the extra classes' turns come from
  a key of their own. So a task with `extra` more classes holds the task
  drawn without them.
  """
  class_key, turn_key, example_key = jax.random.split(key, 3)
  if rotate and class_sampling == "class":  # class c: character c // 4, turned c % 4
    classes = _random_subset(class_key, num_characters * NUM_ROTATIONS, ways + extra)
    return example_key, classes // NUM_ROTATIONS, classes % NUM_ROTATIONS
  characters = _random_subset(class_key, num_characters, ways + extra)
  if not rotate:
    return example_key, characters, None
  turns = jax.random.randint(turn_key, (ways,), 0, NUM_ROTATIONS)
  if extra:
    extra_turns = jax.random.randint(jax.random.fold_in(turn_key, 1), (extra,), 0, NUM_ROTATIONS)
    turns = jnp.concatenate([turns, extra_turns])
  return example_key, characters, turns


UNKNOWN_LABEL = -1  # the label of an open-set query: from none of the task's classes


@functools.partial(
  jax.jit, static_argnames=("ways", "shots", "query", "num_unknown", "rotate", "class_sampling")
)
def open_set_tasks_from_keys(
  task_keys: jax.Array,
  class_images: jax.Array,
  *,
  ways: int,
  shots: int,
  query: int,
  num_unknown: int,
  rotate: bool = True,
  class_sampling: str = "character",
  class_counts: Optional[jax.Array] = None,
) -> Task:
  """`tasks_from_keys`' tasks, each with `query` extra queries of `num_unknown` other classes.

  Task i is `tasks_from_keys`' task i (same support set, same known queries,
  first in `query_x`), followed by `num_unknown * query` queries from
  `num_unknown` classes of the same pool that are not among the task's
  `ways` (drawn from the same noise, so distinct from them; in 'class'
  sampling a known character in another rotation is another class). Their
  label is `UNKNOWN_LABEL` (-1). Arguments as `tasks_from_keys`.

  Returns:
    `Task`: support as `tasks_from_keys`; query_x `[num_tasks, (ways +
    num_unknown) * query, ...]`, query_y int32 with -1 for the unknown queries.

  Raises:
    ValueError: at trace time, if the pool has fewer than `ways +
      num_unknown` classes, or `num_unknown < 1`.
  """
  if num_unknown < 1:
    raise ValueError(f"num_unknown must be at least 1, got {num_unknown}.")
  class_images = _check_class_images(class_images, rotate)
  num_characters, num_examples = class_images.shape[:2]
  available = num_classes_available(num_characters, rotate=rotate, class_sampling=class_sampling)
  check_episode_spec(available, num_examples, ways=ways, shots=shots, query=query)
  if ways + num_unknown > available:
    raise ValueError(
      f"An open-set {ways}-way task with {num_unknown} unknown classes needs "
      f"{ways + num_unknown} distinct classes, but the pool has only {available}."
    )
  example_keys, classes, turns = jax.vmap(
    lambda key: _draw_classes(key, num_characters, ways, num_unknown, rotate, class_sampling)
  )(task_keys)
  known_turns = None if turns is None else turns[:, :ways]
  tasks = tasks_for_classes(
    example_keys,
    class_images,
    classes[:, :ways],
    shots=shots,
    query=query,
    class_counts=class_counts,
    turns=known_turns,
  )
  unknown_keys = jax.vmap(jax.random.fold_in, (0, None))(example_keys, 1)
  unknown_turns = None if turns is None else turns[:, ways:]
  # Drawn as a task of the unknown classes; only its query examples are kept.
  unknown = tasks_for_classes(
    unknown_keys,
    class_images,
    classes[:, ways:],
    shots=shots,
    query=query,
    class_counts=class_counts,
    turns=unknown_turns,
  )
  return tasks._replace(
    query_x=jnp.concatenate([tasks.query_x, unknown.query_x], axis=1),
    query_y=jnp.concatenate([tasks.query_y, jnp.full_like(unknown.query_y, UNKNOWN_LABEL)], axis=1),
  )


@functools.partial(jax.jit, static_argnames=("shots", "query"))
def tasks_for_classes(
  keys: jax.Array,
  class_images: jax.Array,
  classes: jax.Array,
  *,
  shots: int,
  query: int,
  class_counts: Optional[jax.Array] = None,
  turns: Optional[jax.Array] = None,
) -> Task:
  """Tasks of the given classes, examples drawn at random (jitted).

  Args:
    keys: `[tasks]` PRNG keys, one per task.
    class_images: `[C, E, ...]`; uint8 is scaled to [0, 1], floats are kept.
    classes: int `[tasks, ways]` distinct classes of each task; class
      `classes[t, j]` gets label j.
    shots: support examples per class.
    query: query examples per class (distinct from the support ones).
    class_counts: int `[C]` examples per class (the first slots); None if
      all E are used.
    turns: int `[tasks, ways]` quarter turns of each class's images
      (`class_images` `[C, E, H, H, ch]`), or None.

  Returns:
    `Task` as `tasks_from_keys` returns.
  """
  num_classes, num_slots = class_images.shape[:2]
  # The classes are given (a character may appear twice, turned): check the examples only.
  check_episode_spec(classes.shape[1], num_slots, ways=classes.shape[1], shots=shots, query=query)
  if class_counts is None:
    class_counts = jnp.full((num_classes,), num_slots, jnp.int32)

  def one_task(key, task_classes, task_turns):
    ways = task_classes.shape[0]
    examples = jax.vmap(lambda k, count: _random_subset(k, num_slots, shots + query, count))(
      jax.random.split(key, ways), class_counts[task_classes]
    )
    images = class_images[task_classes[:, None], examples]  # [ways, s+q, ...]
    if task_turns is not None:
      images = _rotate(images, task_turns)
    images = to_unit_range(images)
    example_shape = images.shape[2:]
    labels = jnp.arange(ways, dtype=jnp.int32)
    return Task(
      support_x=images[:, :shots].reshape(ways * shots, *example_shape),
      support_y=jnp.repeat(labels, shots),
      query_x=images[:, shots:].reshape(ways * query, *example_shape),
      query_y=jnp.repeat(labels, query),
    )

  return jax.vmap(one_task)(keys, classes, turns)


def check_class_counts(class_counts, *, ways: int, shots: int, query: int) -> None:
  """Raises ValueError unless every class can give `shots + query` examples (on the host)."""
  class_counts = np.asarray(class_counts)
  check_episode_spec(
    len(class_counts), int(class_counts.max(initial=0)), ways=ways, shots=shots, query=query
  )
  smallest = int(class_counts.min())
  if smallest < shots + query:
    raise ValueError(
      f"shots + query = {shots} + {query} = {shots + query} distinct "
      f"examples per class are needed, but the smallest class has only "
      f"{smallest}."
    )


def _random_subset(key: jax.Array, n: int, k: int, count: Optional[jax.Array] = None) -> jax.Array:
  """`k` distinct ints from `range(count)` (default `n`), uniformly, in random order.

  The top-k of iid uniform noise (`lax.top_k` is much faster on CPU than the
  sort behind `random.choice`); slots from `count` on get noise below 0.
  """
  noise = jax.random.uniform(key, (n,))
  if count is not None:
    noise = jnp.where(jnp.arange(n) < count, noise, -1.0)
  return jax.lax.top_k(noise, k)[1]


def _rotate(images: jax.Array, turns: jax.Array) -> jax.Array:
  """Turns `images[i]` (`[ways, n, H, H, ch]`) by `turns[i]` quarter turns."""
  all_turns = jnp.stack([jnp.rot90(images, k, axes=(2, 3)) for k in range(NUM_ROTATIONS)])
  return all_turns[turns, jnp.arange(images.shape[0])]
