"""Sums over items (tasks) in one order, whatever the batching or the number of devices.

The pairwise sum of items 0..n-1 adds the sum of the first p items to the sum of the
rest, p the largest power of two below n, each part summed so again: for n = 8,
((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)). A loop reaches the same sum with a
binary counter (`batching.batched_map_sum`): slot l holds the sum of the last whole block
of 2^l items, and each new item is added to the full slots below its first empty one. A
block of 2^k items is a subtree of the sum, so devices that each hold 2^k tasks sum them
on their own and the per-device sums are added as the items would be
(`sharding.sum_over_task_shards`): bit for bit the one-device sum, with memory that does
not grow with the number of items.
"""

import jax


def is_power_of_two(n: int) -> bool:
  """n is 1, 2, 4, 8, ..."""
  return n >= 1 and n & (n - 1) == 0


def pairwise_sum(stacked):
  """The pairwise sum over the leading axis of every leaf of `stacked` (the order above).

  XLA may fuse the operation that made a value with its first addition (a product and a
  sum fused are one fused multiply-add, rounded once): to add stored values only, pass
  values a loop stored (`batching.batched_map_sum`'s loops do) or gathered.
  """
  return jax.tree_util.tree_map(_pairwise_sum_array, stacked)


def _pairwise_sum_array(x: jax.Array) -> jax.Array:
  n = x.shape[0]
  if is_power_of_two(n):  # adjacent pairs, level by level
    while x.shape[0] > 1:
      pairs = x.reshape((x.shape[0] // 2, 2) + x.shape[1:])
      x = pairs[:, 0] + pairs[:, 1]
    return x[0]
  first = 1 << ((n - 1).bit_length() - 1)  # the largest power of two below n
  return _pairwise_sum_array(x[:first]) + _pairwise_sum_array(x[first:])
