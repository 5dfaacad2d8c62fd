"""N-way k-shot tasks sampled on device from a stack of class images.

The whole image stack lives on the accelerator; `sample_tasks` draws a
meta-batch with `jax.random` inside `jit`, one task per key (vmap over tasks).
As in the paper and MAML, rotating a character by 90, 180 or 270 degrees
makes a new class, so `C` characters give `4 C` classes.

  train = jax.device_put(make_split(load_omniglot(), 'random')['train'])
  tasks = sample_tasks(key, train, num_tasks=32, ways=5, shots=1, query=15)
  tasks.support_x  # [32, 5, 28, 28, 1] float32 in [0, 1]
"""

import functools

import jax
import jax.numpy as jnp

from vampire_jax.tasks import Task

NUM_ROTATIONS = 4  # Quarter turns: 0, 90, 180, 270 degrees.


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
  sizes = dict(num_classes=num_classes, examples_per_class=examples_per_class,
               ways=ways, shots=shots, query=query)
  for name, value in sizes.items():
    if value < 1:
      raise ValueError(f'{name} must be at least 1, got {value}.')
  if ways > num_classes:
    raise ValueError(f'A {ways}-way task needs {ways} distinct classes, but '
                     f'the pool has only {num_classes}.')
  if shots + query > examples_per_class:
    raise ValueError(
        f'shots + query = {shots} + {query} = {shots + query} distinct '
        f'examples per class are needed, but each class has only '
        f'{examples_per_class}.')


@functools.partial(
    jax.jit, static_argnames=('num_tasks', 'ways', 'shots', 'query', 'rotate'))
def sample_tasks(
    key: jax.Array,
    class_images: jax.Array,
    *,
    num_tasks: int,
    ways: int,
    shots: int,
    query: int,
    rotate: bool = True,
) -> Task:
  """Samples a meta-batch of N-way k-shot tasks (jitted; sizes are static).

  Per task: `ways` distinct classes, drawn uniformly from the `C` characters
  (or the `4 C` (character, quarter turn) pairs if `rotate`); class j gets
  label j, so the class behind each label is random per task. For each class,
  `shots + query` distinct examples, the first `shots` in the support set.
  Both sets are grouped by label: `support_y` is `[0]*shots + [1]*shots +
  ...`. Rotation is counter-clockwise, as `np.rot90` on the `(H, W)` axes.

  Pass `class_images` as a device array (`jax.device_put`), not numpy, so it
  is not copied to the device on every call.

  Args:
    key: PRNG key; the same key gives the same tasks.
    class_images: uint8 `[C, E, H, W]` or `[C, E, H, W, ch]` (a float array
      is taken to be in [0, 1] already). `H == W` if `rotate`.
    num_tasks: tasks in the meta-batch.
    ways: classes per task.
    shots: support examples per class.
    query: query examples per class.
    rotate: whether rotations make new classes.

  Returns:
    `Task` with support_x `[num_tasks, ways*shots, H, W, ch]` float32 in
    [0, 1] (ch = 1 for 4-d input), support_y int32 `[num_tasks, ways*shots]`,
    query_x `[num_tasks, ways*query, H, W, ch]`, query_y int32
    `[num_tasks, ways*query]`.

  Raises:
    ValueError: at trace time, for an impossible spec (see
      `check_episode_spec`), non-square images with `rotate`, or a bad rank.
  """
  if class_images.ndim == 4:
    class_images = class_images[..., None]
  if class_images.ndim != 5:
    raise ValueError('class_images must be [C, E, H, W] or [C, E, H, W, ch], '
                     f'got shape {class_images.shape}.')
  num_characters, num_examples, height, width, _ = class_images.shape
  if rotate and height != width:
    raise ValueError(f'Rotation needs square images, got {height}x{width}.')
  num_classes = num_characters * (NUM_ROTATIONS if rotate else 1)
  check_episode_spec(num_classes, num_examples, ways=ways, shots=shots,
                     query=query)
  if num_tasks < 1:
    raise ValueError(f'num_tasks must be at least 1, got {num_tasks}.')

  sample_one = functools.partial(
      _sample_task, class_images=class_images, ways=ways, shots=shots,
      query=query, rotate=rotate)
  return jax.vmap(sample_one)(jax.random.split(key, num_tasks))


def _sample_task(key, class_images, ways, shots, query, rotate) -> Task:
  """One task; `class_images` is `[C, E, H, W, ch]`."""
  num_characters, num_examples = class_images.shape[:2]
  key_classes, key_examples = jax.random.split(key)

  # A uniformly random ordered subset: the top-k of iid uniform noise
  # (`lax.top_k` is much faster on CPU than the sort behind `random.choice`).
  # Class c is character c // 4 turned c % 4 quarter turns.
  num_classes = num_characters * (NUM_ROTATIONS if rotate else 1)
  classes = _random_subset(key_classes, num_classes, ways)
  character, turns = ((classes // NUM_ROTATIONS, classes % NUM_ROTATIONS)
                      if rotate else (classes, None))
  examples = jax.vmap(
      lambda k: _random_subset(k, num_examples, shots + query))(
          jax.random.split(key_examples, ways))  # [ways, shots+query]

  images = class_images[character[:, None], examples]  # [ways, s+q, H, W, ch]
  if rotate:
    images = _rotate(images, turns)
  is_uint8 = images.dtype == jnp.uint8
  images = images.astype(jnp.float32) / (255 if is_uint8 else 1)

  image_shape = images.shape[2:]
  labels = jnp.arange(ways, dtype=jnp.int32)
  return Task(
      support_x=images[:, :shots].reshape(ways * shots, *image_shape),
      support_y=jnp.repeat(labels, shots),
      query_x=images[:, shots:].reshape(ways * query, *image_shape),
      query_y=jnp.repeat(labels, query))


def _random_subset(key: jax.Array, n: int, k: int) -> jax.Array:
  """`k` distinct ints from `range(n)`, uniformly, in random order."""
  return jax.lax.top_k(jax.random.uniform(key, (n,)), k)[1]


def _rotate(images: jax.Array, turns: jax.Array) -> jax.Array:
  """Turns `images[i]` (`[ways, n, H, H, ch]`) by `turns[i]` quarter turns."""
  all_turns = jnp.stack(
      [jnp.rot90(images, k, axes=(2, 3)) for k in range(NUM_ROTATIONS)])
  return all_turns[turns, jnp.arange(images.shape[0])]
