"""The pairwise sum over tasks: its order, and the same order in every batching strategy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vampire_jax._src.core import batching
from vampire_jax._src.core.summation import is_power_of_two, pairwise_sum


def _values(n: int, seed: int = 0) -> np.ndarray:
  # Float32 values of many magnitudes, so that the order of the additions shows in the bits.
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((n, 7)) * 10.0 ** rng.integers(-4, 5, (n, 7))).astype(np.float32)


def _in_order(x: np.ndarray) -> np.ndarray:
  """The documented order, in numpy's float32: the first p (the largest power of two below
  n) summed so, plus the rest summed so."""
  n = len(x)
  if n == 1:
    return x[0]
  first = 1 << ((n - 1).bit_length() - 1)
  return _in_order(x[:first]) + _in_order(x[first:])


def _left_to_right(x: np.ndarray) -> np.ndarray:
  total = x[0]
  for row in x[1:]:
    total = total + row
  return total


@pytest.mark.parametrize("n", range(1, 10))
def test_pairwise_sum_adds_in_the_documented_order(n):
  x = _values(n)
  np.testing.assert_array_equal(np.asarray(jax.jit(pairwise_sum)(x)), _in_order(x))


def test_the_order_shows_in_the_bits():
  # Else the test above could not tell one order from another.
  assert any(not np.array_equal(_in_order(_values(n)), _left_to_right(_values(n))) for n in (3, 8))


def test_is_power_of_two():
  assert [n for n in range(0, 17) if is_power_of_two(n)] == [1, 2, 4, 8, 16]


def _item(x):
  # Something to sum (a product: fused with an addition, it would be one fused
  # multiply-add) and something to keep per item.
  # Two leaves, summed as one vector.
  return {"all": x * 3.0, "head": x[:3] * 3.0}, {"first": x[0], "norm": jnp.sum(x * x)}


def _item_added(x):
  # No product to fuse: in one program with the sum (vmap, unroll, a chunk), XLA may
  # fuse a product with the first addition, rounding once.
  return {"all": x + 0.5, "head": x[:3] + 0.5}, {"first": x[0], "norm": jnp.sum(x * x)}


STRATEGIES = [
  ("vmap", 1),
  ("map", 1),
  ("remat_map", 1),
  ("unroll", 1),
  ("chunked_unroll", 2),
  ("chunked_vmap", 4),
  ("chunked_unroll", 3),  # not a power of two: the chunks are stacked, then summed
]


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("strategy,chunk_size", STRATEGIES)
def test_every_strategy_sums_in_the_pairwise_order_and_keeps_the_rest(strategy, chunk_size, exact):
  for n in (1, 6, 7, 12):
    if n % chunk_size:
      continue
    x = _values(n, seed=n)
    looping = strategy in ("map", "remat_map") or n == chunk_size == 1
    item, values = (_item, x * np.float32(3.0)) if looping else (_item_added, x + np.float32(0.5))
    summed, kept = jax.jit(
      lambda xs: batching.batched_map_sum(
        item, xs, strategy=strategy, chunk_size=chunk_size, any_count_exact=exact
      )
    )(x)
    np.testing.assert_array_equal(np.asarray(summed["all"]), _in_order(values), err_msg=n)
    np.testing.assert_array_equal(np.asarray(summed["head"]), _in_order(values[:, :3]))
    np.testing.assert_array_equal(np.asarray(kept["first"]), x[:, 0])
    assert kept["norm"].shape == (n,)


def test_a_loop_keeps_a_slot_per_bit_not_every_item():
  # The loop's carry holds log2(n) + 1 running sums, not n items' values.
  x = jnp.zeros((64, 1000), jnp.float32)
  lowered = jax.jit(
    lambda xs: batching.batched_map_sum(lambda v: (v, v[0]), xs, strategy="map")
  ).lower(x)
  temp = lowered.compile().memory_analysis().temp_size_in_bytes
  assert temp < 64 * 1000 * 4 / 2, temp  # the stack of 64 items would be 256 kB
