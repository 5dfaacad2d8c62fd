"""Class combinations (the calibration protocol) and classes of unequal size (one task sampler)."""

import itertools

import jax
import numpy as np
import pytest

from vampire_jax import data


def test_combinations_follow_itertools_order():
  ids = data.combination_ids(20, 5)
  assert len(ids) == data.num_combinations(20, 5) == 15504
  np.testing.assert_array_equal(
    data.class_combinations(ids, 20, 5), np.array(list(itertools.combinations(range(20), 5)))
  )
  assert data.combination_at(7, 20, 5) == (0, 1, 2, 3, 11)
  for n, k in ((7, 3), (9, 1), (6, 6)):
    assert [data.combination_at(i, n, k) for i in range(data.num_combinations(n, k))] == list(
      itertools.combinations(range(n), k)
    )
  # tiered-ImageNet's 160 test classes: 8.2e8 combinations, unranked without listing them.
  total = data.num_combinations(160, 5)
  assert total == 820_384_032
  assert data.combination_at(0, 160, 5) == (0, 1, 2, 3, 4)
  assert data.combination_at(total - 1, 160, 5) == tuple(range(155, 160))
  assert data.combination_at(data.num_combinations(159, 4), 160, 5) == (1, 2, 3, 4, 5)
  with pytest.raises(ValueError, match="index must be in"):
    data.combination_at(15504, 20, 5)


def test_random_subsets_are_sorted_distinct_and_seeded():
  subset = data.combination_ids(20, 5, 100, seed=3)
  assert len(subset) == 100 and np.all(np.diff(subset) > 0) and subset.max() < 15504
  np.testing.assert_array_equal(subset, data.combination_ids(20, 5, 100, seed=3))
  assert not np.array_equal(subset, data.combination_ids(20, 5, 100, seed=4))
  assert len(data.combination_ids(20, 5, 20_000)) == 15504  # more than exist: all
  big = data.combination_ids(160, 5, 50)
  assert len(set(big.tolist())) == 50 and big.max() < data.num_combinations(160, 5)


def test_combination_tasks_use_the_combination_and_do_not_depend_on_batching():
  # Noise images: each (class, example) image is unique, so it can be traced back.
  images = np.random.default_rng(0).integers(0, 256, (20, 8, 4, 4, 3), dtype=np.uint8)
  source = {images[c, e].tobytes(): (c, e) for c in range(20) for e in range(8)}
  key = jax.random.key(0)
  tasks = data.combination_tasks(
    key, jax.device_put(images), [7, 15503, 100], num_classes=20, ways=5, shots=2, query=3
  )
  alone = data.combination_tasks(
    key, jax.device_put(images), [15503], num_classes=20, ways=5, shots=2, query=3
  )
  np.testing.assert_array_equal(tasks.query_x[1], alone.query_x[0])
  np.testing.assert_array_equal(tasks.support_x[1], alone.support_x[0])
  all_combinations = list(itertools.combinations(range(20), 5))
  for row, index in enumerate([7, 15503, 100]):
    x = np.concatenate([tasks.support_x[row], tasks.query_x[row]])
    y = np.concatenate([tasks.support_y[row], tasks.query_y[row]])
    drawn = [source[np.round(np.asarray(image) * 255).astype(np.uint8).tobytes()] for image in x]
    # Label j is the j-th class of the combination; no image twice in a task.
    assert [all_combinations[index][label] for label in y.tolist()] == [c for c, _ in drawn]
    assert len(set(drawn)) == len(drawn)
  np.testing.assert_array_equal(tasks.support_y[0], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
  with pytest.raises(ValueError, match="classes"):
    data.combination_tasks(
      key, jax.device_put(images), [0], num_classes=21, ways=5, shots=1, query=1
    )


def test_ragged_episodes_draw_only_real_rows():
  counts = np.array([6, 9, 7, 12, 6], np.int32)
  # Row value = 100 * class + index + 1; padding is -1 and must never appear.
  values = np.full((5, 12, 1), -1.0, np.float32)
  for c, n in enumerate(counts):
    values[c, :n, 0] = 100 * c + np.arange(n) + 1
  tasks = data.sample_tasks(
    jax.random.key(0),
    values,
    num_tasks=200,
    ways=3,
    shots=2,
    query=4,
    rotate=False,
    class_counts=counts,
  )
  assert tasks.support_x.shape == (200, 6, 1) and tasks.query_x.shape == (200, 12, 1)
  support = np.asarray(tasks.support_x[..., 0]).reshape(200, 3, 2)
  query = np.asarray(tasks.query_x[..., 0]).reshape(200, 3, 4)
  drawn = np.concatenate([support, query], axis=2)  # [tasks, ways, shots+query]
  assert np.all(drawn > 0)
  classes, index = drawn // 100, drawn % 100 - 1
  assert np.all(classes == classes[..., :1])  # a label is one class
  assert all(len(set(t[:, 0].tolist())) == 3 for t in classes)  # distinct classes
  assert np.all(index < counts[classes.astype(int)])
  assert all(len(set(row.tolist())) == 6 for row in drawn.reshape(-1, 6))  # distinct rows
  np.testing.assert_array_equal(tasks.support_y[0], [0, 0, 1, 1, 2, 2])
  # Every real row of the small classes is drawn sometimes: uniform over the class.
  for c in (0, 4):
    assert set(index[classes == c].astype(int).tolist()) == set(range(counts[c]))
  again = data.sample_tasks(
    jax.random.key(0),
    values,
    num_tasks=200,
    ways=3,
    shots=2,
    query=4,
    rotate=False,
    class_counts=counts,
  )
  np.testing.assert_array_equal(again.query_x, tasks.query_x)
  with pytest.raises(ValueError, match="smallest class"):
    data.check_class_counts(counts, ways=3, shots=2, query=5)
