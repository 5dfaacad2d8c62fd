"""How independent items (tasks, Monte-Carlo samples) are batched.

Per-task weights make `vmap` turn every convolution into a grouped
convolution, which XLA runs well on GPUs and slowly on CPUs; `lax.map` runs
one item at a time with a loop; `remat_map` is `lax.map` whose items keep no
intermediate values for the backward pass (`jax.checkpoint`): each item's
forward pass runs again when it is differentiated, so nothing is stacked
across items (a CPU step is limited by moving such stacks, not by
arithmetic: BUILD_NOTES.md, "Speed"); unrolling gives the fastest CPU code but the
compile time grows with the number of items. The chunked strategies bound
the compile time: `lax.map` over chunks, each chunk unrolled (or vmapped).
`benchmarks/meta_step.py` measures them; `default_task_batching()` gives the
measured best per backend, as `backend_defaults` decides it.
"""

from typing import Callable, Literal, TypeVar

import jax
import jax.numpy as jnp

from vampire_jax import backend_defaults

Batching = Literal["vmap", "map", "remat_map", "unroll", "chunked_unroll", "chunked_vmap"]
BATCHING_STRATEGIES = ("vmap", "map", "remat_map", "unroll", "chunked_unroll", "chunked_vmap")
MAPPED_STRATEGIES = backend_defaults.MAPPED_STRATEGIES  # those that loop over the items

T = TypeVar("T")


def default_task_batching() -> tuple[Batching, int]:
  """The fastest task batching measured on the default backend (`backend_defaults` decides).

  Returns:
    `(strategy, chunk_size)`; see BUILD_NOTES.md for the measurements.
  """
  return backend_defaults.default_task_batching()


def _unrolled(fn: Callable, xs, size: int):
  outputs = [fn(jax.tree_util.tree_map(lambda x, i=i: x[i], xs)) for i in range(size)]
  return jax.tree_util.tree_map(lambda *ys: jnp.stack(ys), *outputs)


def batched_map(fn: Callable[..., T], xs, *, strategy: Batching = "vmap", chunk_size: int = 1) -> T:
  """Maps `fn` over the leading axis of every leaf of `xs`.

  All strategies compute the same thing; they differ only in speed, memory
  and compile time.

  Args:
    fn: function of one item (a tree of arrays without the leading axis).
    xs: tree of arrays that share a leading axis of size n.
    strategy: one of BATCHING_STRATEGIES.
    chunk_size: items per chunk for the chunked strategies; must divide n.

  Returns:
    The outputs of `fn`, stacked along a new leading axis of size n.
  """
  leaves = jax.tree_util.tree_leaves(xs)
  if not leaves:
    raise ValueError("batched_map needs at least one array to map over")
  size = jnp.shape(leaves[0])[0]
  if strategy == "vmap":
    return jax.vmap(fn)(xs)
  if strategy == "map":
    return jax.lax.map(fn, xs)
  if strategy == "remat_map":  # each item's residuals recomputed, not stacked
    return jax.lax.map(jax.checkpoint(fn), xs)
  if strategy == "unroll":
    return _unrolled(fn, xs, size)
  if strategy not in ("chunked_unroll", "chunked_vmap"):
    raise ValueError(
      f"unknown batching strategy {strategy!r}; expected one of {BATCHING_STRATEGIES}"
    )
  if chunk_size < 1 or size % chunk_size:
    raise ValueError(f"chunk_size={chunk_size} must be >= 1 and divide the batch size {size}")
  chunks = jax.tree_util.tree_map(
    lambda x: x.reshape((size // chunk_size, chunk_size) + x.shape[1:]), xs
  )
  if strategy == "chunked_vmap":
    per_chunk = jax.vmap(fn)
  else:
    per_chunk = lambda chunk: _unrolled(fn, chunk, chunk_size)  # noqa: E731
  out = jax.lax.map(per_chunk, chunks)
  return jax.tree_util.tree_map(lambda y: y.reshape((size,) + y.shape[2:]), out)
