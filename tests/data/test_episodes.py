"""Tests for vampire_jax.data.episodes: on-device N-way k-shot sampling.

The class images are random noise, so every (character, example, rotation)
image is unique and each sampled image can be traced back to its source.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vampire_jax import data
from vampire_jax._src.core.tasks import Task
from vampire_jax.data import check_episode_spec, sample_tasks


def _labelled_images(num_classes=12, examples=6, size=4):
  """uint8 [C, E, size, size]: every image of class c is the constant c + 1 (rotation-proof)."""
  values = np.arange(1, num_classes + 1, dtype=np.uint8)[:, None, None, None]
  return jnp.asarray(np.broadcast_to(values, (num_classes, examples, size, size)).copy())


def _noise_images(num_characters=6, num_examples=20, size=8, channels=None, seed=0):
  """uint8 `[C, E, size, size(, channels)]` random images."""
  shape = (num_characters, num_examples, size, size)
  shape += (channels,) if channels else ()
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _source_table(images):
  """Bytes of each rotated image -> (character, example, quarter turns)."""
  table = {}
  for c in range(images.shape[0]):
    for e in range(images.shape[1]):
      for k in range(4):
        table[np.rot90(images[c, e], k).tobytes()] = (c, e, k)
  assert len(table) == images.shape[0] * images.shape[1] * 4  # All distinct.
  return table


def _to_uint8(x):
  """Float images in [0, 1] back to the uint8 they came from."""
  scaled = np.asarray(x, np.float64) * 255
  np.testing.assert_allclose(scaled, np.round(scaled), atol=1e-4)
  return np.round(scaled).astype(np.uint8)


def _sources(x, table, squeeze_channel=True):
  """float `[n, H, W, ch]` in [0, 1] -> [(character, example, turns)] * n."""
  raw = _to_uint8(x)
  if squeeze_channel:
    raw = raw[..., 0]
  return [table[image.tobytes()] for image in raw]


@pytest.mark.parametrize("class_sampling", ["character", "class"])
def test_open_set_episode_is_the_task_plus_unknown_queries(class_sampling):
  images = _labelled_images()
  keys = jax.random.split(jax.random.key(3), 8)
  spec = dict(ways=3, shots=1, query=2, rotate=True, class_sampling=class_sampling)
  tasks = data.tasks_from_keys(keys, images, **spec)
  open_set = data.open_set_tasks_from_keys(keys, images, **spec, num_unknown=4)
  # The known part is exactly the closed-set task: same support, same known queries.
  np.testing.assert_array_equal(open_set.support_x, tasks.support_x)
  np.testing.assert_array_equal(open_set.support_y, tasks.support_y)
  np.testing.assert_array_equal(open_set.query_x[:, :6], tasks.query_x)
  np.testing.assert_array_equal(open_set.query_y[:, :6], tasks.query_y)
  np.testing.assert_array_equal(open_set.query_y[:, 6:], data.UNKNOWN_LABEL)
  assert open_set.query_x.shape[1] == (3 + 4) * 2
  class_of = np.round(np.asarray(open_set.query_x)[..., 0, 0, 0] * 255).astype(int)
  for t in range(8):
    known = set(np.round(np.asarray(tasks.support_x)[t, :, 0, 0, 0] * 255).astype(int))
    unknown = class_of[t, 6:]
    values, counts = np.unique(unknown, return_counts=True)
    if class_sampling == "character":  # other characters, `query` queries each
      assert not known & set(values.tolist()) and len(values) == 4 and set(counts) == {2}
    else:  # other (character, turn) classes: 4 x 2 unknown queries
      assert len(unknown) == 8


def test_open_set_episode_needs_enough_classes():
  with pytest.raises(ValueError, match="needs 13 distinct classes"):
    data.open_set_tasks_from_keys(
      jax.random.split(jax.random.key(0), 2),
      _labelled_images(),
      ways=5,
      shots=1,
      query=2,
      num_unknown=8,
    )


def test_shapes_dtypes_and_values():
  images = _noise_images()
  tasks = sample_tasks(
    jax.random.key(0), jax.device_put(images), num_tasks=3, ways=5, shots=2, query=4
  )
  assert isinstance(tasks, Task)
  assert tasks.support_x.shape == (3, 10, 8, 8, 1)
  assert tasks.query_x.shape == (3, 20, 8, 8, 1)
  assert tasks.support_y.shape == (3, 10) and tasks.query_y.shape == (3, 20)
  assert tasks.support_x.dtype == np.float32
  assert tasks.support_y.dtype == np.int32
  # The uint8 values over 255 (to float32 rounding), from the right images.
  table = _source_table(images)
  for x in (tasks.support_x, tasks.query_x):
    assert 0 <= np.min(x) and np.max(x) <= 1
    for t in range(3):
      for image, (c, e, k) in zip(np.asarray(x[t]), _sources(x[t], table)):
        np.testing.assert_allclose(image[..., 0], np.rot90(images[c, e], k) / 255, rtol=1e-6)


def test_channels_are_kept():
  images = _noise_images(channels=3)
  tasks = sample_tasks(jax.random.key(0), images, num_tasks=2, ways=3, shots=1, query=2)
  assert tasks.support_x.shape == (2, 3, 8, 8, 3)
  table = _source_table(images)
  sources = _sources(tasks.query_x[0], table, squeeze_channel=False)
  assert len(set(sources)) == 6


@pytest.mark.parametrize(
  "rotate, class_sampling", [(True, "character"), (True, "class"), (False, "character")]
)
def test_tasks_are_valid_episodes(rotate, class_sampling):
  ways, shots, query, num_tasks = 5, 3, 4, 64
  images = _noise_images(num_characters=6)
  table = _source_table(images)
  tasks = sample_tasks(
    jax.random.key(1),
    images,
    num_tasks=num_tasks,
    ways=ways,
    shots=shots,
    query=query,
    rotate=rotate,
    class_sampling=class_sampling,
  )
  turns_seen, repeated_characters = set(), 0
  for t in range(num_tasks):
    # Labels grouped: each of 0..ways-1 exactly shots (query) times.
    np.testing.assert_array_equal(tasks.support_y[t], np.repeat(np.arange(ways), shots))
    np.testing.assert_array_equal(tasks.query_y[t], np.repeat(np.arange(ways), query))
    support = _sources(tasks.support_x[t], table)
    queries = _sources(tasks.query_x[t], table)
    # No example repeats within a task, across support and query.
    assert len(set(support + queries)) == ways * (shots + query)
    classes = []
    for label in range(ways):
      members = [s for s, y in zip(support, tasks.support_y[t]) if y == label] + [
        s for s, y in zip(queries, tasks.query_y[t]) if y == label
      ]
      # One (character, rotation) per label.
      assert len({(c, k) for c, _, k in members}) == 1
      classes.append(members[0][::2])
      turns_seen.add(members[0][2])
    assert len(set(classes)) == ways  # Distinct classes.
    repeated_characters += len({c for c, _ in classes}) < ways
  assert turns_seen == ({0, 1, 2, 3} if rotate else {0})
  if class_sampling == "character":
    assert repeated_characters == 0  # MAML's protocol: N distinct characters
  else:  # 5 of 24 (character, turn) classes: most tasks repeat a character
    assert repeated_characters > num_tasks // 4


def test_character_sampling_turns_each_class_uniformly_and_independently():
  images = np.zeros((10, 20, 2, 2), np.uint8)
  images[:, :, 0, 1] = 255  # a marker that shows the quarter turn
  tasks = sample_tasks(jax.random.key(9), images, num_tasks=2000, ways=5, shots=1, query=1)
  x = _to_uint8(tasks.support_x)[..., 0]  # [tasks, ways, 2, 2]
  corner = {(0, 1): 0, (0, 0): 1, (1, 0): 2, (1, 1): 3}  # np.rot90 of the top-right pixel
  turns = np.array([[corner[tuple(np.argwhere(image > 0)[0])] for image in task] for task in x])
  counts = np.bincount(turns.ravel(), minlength=4)
  sigma = np.sqrt(turns.size * 0.25 * 0.75)
  assert np.all(np.abs(counts - turns.size / 4) < 5 * sigma), counts
  # Independent per class: two labels of a task share their turn 1/4 of the time.
  same = np.mean(turns[:, 0] == turns[:, 1])
  assert abs(same - 0.25) < 5 * np.sqrt(0.25 * 0.75 / len(turns)), same


def test_rotation_is_np_rot90():
  # One character: a 4-way task must use it at all four rotations.
  images = _noise_images(num_characters=1)
  tasks = sample_tasks(
    jax.random.key(2),
    images,
    num_tasks=8,
    ways=4,
    shots=2,
    query=3,
    rotate=True,
    class_sampling="class",
  )
  x = _to_uint8(tasks.support_x)[..., 0]
  for t in range(8):
    turns = []
    for label in range(4):
      first = x[t, 2 * label]
      matches = [
        (e, k)
        for e in range(20)
        for k in range(4)
        if np.array_equal(first, np.rot90(images[0, e], k))
      ]
      assert len(matches) == 1
      turns.append(matches[0][1])
      # The second support image of the class has the same rotation.
      assert any(
        np.array_equal(x[t, 2 * label + 1], np.rot90(images[0, e], turns[-1])) for e in range(20)
      )
    assert sorted(turns) == [0, 1, 2, 3]
  # Counter-clockwise, as np.rot90: the top-right pixel goes to top-left.
  dot = np.zeros((1, 20, 3, 3), np.uint8)
  dot[0, :, 0, 2] = 255
  tasks = sample_tasks(
    jax.random.key(3),
    dot,
    num_tasks=1,
    ways=4,
    shots=1,
    query=1,
    rotate=True,
    class_sampling="class",
  )
  corners = {tuple(np.argwhere(np.asarray(x)[..., 0] > 0.5)[0]) for x in tasks.support_x[0]}
  assert corners == {(0, 2), (0, 0), (2, 0), (2, 2)}


def test_pool_counts_rotations():
  # 2 characters x 4 rotations = 8 classes: an 8-way task uses them all.
  images = _noise_images(num_characters=2)
  tasks = sample_tasks(
    jax.random.key(4),
    images,
    num_tasks=4,
    ways=8,
    shots=1,
    query=1,
    rotate=True,
    class_sampling="class",
  )
  table = _source_table(images)
  for t in range(4):
    classes = {(c, k) for c, _, k in _sources(tasks.support_x[t], table)}
    assert classes == {(c, k) for c in range(2) for k in range(4)}


def test_same_key_same_tasks_other_key_other_tasks():
  images = jax.device_put(_noise_images())
  spec = dict(num_tasks=4, ways=3, shots=1, query=2)
  a = sample_tasks(jax.random.key(5), images, **spec)
  b = sample_tasks(jax.random.key(5), images, **spec)
  c = sample_tasks(jax.random.key(6), images, **spec)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.support_x, c.support_x)
  # The tasks of one meta-batch differ from each other too.
  assert not np.array_equal(a.support_x[0], a.support_x[1])


def test_classes_labels_and_examples_are_uniform():
  # Pixel (0, 0) holds the character, pixel (0, 1) the example.
  num_characters, num_examples, num_tasks, ways = 10, 20, 4000, 5
  images = np.zeros((num_characters, num_examples, 2, 2), np.uint8)
  images[:, :, 0, 0] = np.arange(num_characters)[:, None]
  images[:, :, 0, 1] = np.arange(num_examples)[None, :]
  tasks = sample_tasks(
    jax.random.key(7), images, num_tasks=num_tasks, ways=ways, shots=1, query=1, rotate=False
  )
  raw = _to_uint8(tasks.support_x)[..., 0].astype(int)
  characters, examples = raw[:, :, 0, 0], raw[:, :, 0, 1]  # [tasks, ways]

  def within_5_sigma(counts, p):
    sigma = np.sqrt(num_tasks * p * (1 - p))
    return np.all(np.abs(counts - num_tasks * p) < 5 * sigma)

  # Each character is in a task with probability ways / C.
  in_task = np.bincount(characters.ravel(), minlength=num_characters)
  assert within_5_sigma(in_task, ways / num_characters)
  # Label 0 goes to each character with probability 1 / C.
  label0 = np.bincount(characters[:, 0], minlength=num_characters)
  assert within_5_sigma(label0, 1 / num_characters)
  # The support example of label 0 is uniform over the 20.
  example0 = np.bincount(examples[:, 0], minlength=num_examples)
  assert within_5_sigma(example0, 1 / num_examples)


def test_float_images_pass_through():
  images = _noise_images(num_characters=2).astype(np.float32) / 255
  tasks = sample_tasks(
    jax.random.key(8), images, num_tasks=1, ways=2, shots=1, query=1, rotate=False
  )
  x = np.asarray(tasks.support_x)[0, :, :, :, 0]
  assert any(np.array_equal(x[0], images[c, e]) for c in range(2) for e in range(20))


@pytest.mark.parametrize(
  "sizes, message",
  [
    (
      dict(num_classes=4, examples_per_class=20, ways=5, shots=1, query=1),
      "5-way task needs 5 distinct classes, but the pool has only 4",
    ),
    (
      dict(num_classes=10, examples_per_class=20, ways=5, shots=5, query=16),
      r"shots \+ query = 5 \+ 16 = 21 .* only 20",
    ),
    (
      dict(num_classes=10, examples_per_class=20, ways=5, shots=1, query=0),
      "query must be at least 1, got 0",
    ),
    (
      dict(num_classes=10, examples_per_class=20, ways=0, shots=1, query=1),
      "ways must be at least 1",
    ),
    (
      dict(num_classes=10, examples_per_class=20, ways=2, shots=-1, query=1),
      "shots must be at least 1",
    ),
    (
      dict(num_classes=0, examples_per_class=20, ways=1, shots=1, query=1),
      "num_classes must be at least 1",
    ),
  ],
)
def test_check_episode_spec_errors(sizes, message):
  num_classes = sizes.pop("num_classes")
  examples = sizes.pop("examples_per_class")
  with pytest.raises(ValueError, match=message):
    check_episode_spec(num_classes, examples, **sizes)


def test_check_episode_spec_accepts_edge_cases():
  check_episode_spec(5, 20, ways=5, shots=1, query=19)  # Uses everything.


def test_sample_tasks_errors():
  images = _noise_images(num_characters=2)
  key = jax.random.key(0)
  # 2 characters: 8 (character, turn) classes; 2 characters to draw from by default.
  sample_tasks(key, images, num_tasks=1, ways=8, shots=1, query=1, class_sampling="class")
  with pytest.raises(ValueError, match="pool has only 8"):
    sample_tasks(key, images, num_tasks=1, ways=9, shots=1, query=1, class_sampling="class")
  with pytest.raises(ValueError, match="pool has only 2"):
    sample_tasks(key, images, num_tasks=1, ways=3, shots=1, query=1)
  with pytest.raises(ValueError, match="class_sampling"):
    sample_tasks(key, images, num_tasks=1, ways=2, shots=1, query=1, class_sampling="drawer")
  with pytest.raises(ValueError, match="pool has only 2"):
    sample_tasks(key, images, num_tasks=1, ways=3, shots=1, query=1, rotate=False)
  with pytest.raises(ValueError, match="only 20"):
    sample_tasks(key, images, num_tasks=1, ways=2, shots=10, query=11)
  with pytest.raises(ValueError, match="num_tasks must be at least 1"):
    sample_tasks(key, images, num_tasks=0, ways=2, shots=1, query=1)
  with pytest.raises(ValueError, match="square"):
    sample_tasks(key, images[:, :, :, :5], num_tasks=1, ways=2, shots=1, query=1)
  with pytest.raises(ValueError, match=r"\[C, E, H, H\]"):
    sample_tasks(key, images[0], num_tasks=1, ways=2, shots=1, query=1)
