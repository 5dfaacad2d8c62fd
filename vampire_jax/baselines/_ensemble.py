"""Helpers shared by the baselines whose task parameters are an ensemble.

PLATIPUS (one adapted network per weight draw) and BMAML (one per particle)
hold their task parameters as a stacked weight tree: every leaf has a
leading `[members]` axis. Predictions stack the members' outputs on the
leading axis, the `[num_samples, batch, ...]` the evaluators expect.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp

from vampire_jax._src.core import batching

PyTree = Any


def num_members(stacked: PyTree) -> int:
  """Size of the leading `[members]` axis shared by every leaf."""
  sizes = {jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(stacked)}
  if len(sizes) != 1:
    raise ValueError(f"stacked weight trees need one leading [members] axis; got sizes {sizes}")
  return sizes.pop()


def map_members(fn: Callable, stacked: PyTree, strategy: batching.Batching = "vmap") -> Any:
  """`fn` on each member of a stacked tree, outputs stacked on a new leading axis.

  A single member runs without batching, which keeps convolutions ungrouped
  (as `adaptation.expected_nll` does for one weight draw).
  """
  size = num_members(stacked)
  if size == 1:
    return jax.tree_util.tree_map(
      lambda y: y[None], fn(jax.tree_util.tree_map(lambda w: w[0], stacked))
    )
  return batching.batched_map(fn, stacked, strategy=strategy, chunk_size=size)


def apply_members(
  apply_fn: Callable, stacked: PyTree, x: jax.Array, strategy: batching.Batching = "vmap"
) -> jax.Array:
  """Outputs `[members, batch, ...]` of the network under each member's weights."""
  return map_members(lambda params: apply_fn(params, x), stacked, strategy)


def mean_member_nll(nll: Callable, outputs: jax.Array, y: jax.Array) -> jax.Array:
  """The likelihood's loss averaged over members; outputs `[members, batch, ...]`."""
  return jnp.mean(jax.vmap(nll, in_axes=(0, None))(outputs, y))


def concat_examples(a: jax.Array, b: jax.Array) -> jax.Array:
  """Two example sets as one, e.g. support ∪ query: `[n_a + n_b, ...]`."""
  return jnp.concatenate([a, b], axis=0)
