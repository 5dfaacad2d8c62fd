"""How independent items (tasks, Monte-Carlo samples) are batched.

Per-task weights make `vmap` turn every convolution into a grouped
convolution, which XLA runs well on GPUs and slowly on CPUs; `lax.map` runs
one item at a time with a loop; `remat_map` is `lax.map` whose items keep no
intermediate values for the backward pass (`jax.checkpoint`): each item's
forward pass runs again when it is differentiated, so nothing is stacked
across items (a CPU step is limited by moving such stacks, not by
arithmetic: docs/performance.md); unrolling gives the fastest CPU code but the
compile time grows with the number of items. The chunked strategies bound
the compile time: `lax.map` over chunks, each chunk unrolled (or vmapped).
`map_mean` is the mean of a loss over items in `lax.map` whose gradient is
taken item by item as the items run: nothing stacked, nothing run twice.
`benchmarks/meta_step.py` measures them; `default_task_batching()` gives the
measured best per backend, as `backend_defaults` decides it.
"""

import functools
from typing import Callable, Literal, TypeVar

import jax
import jax.numpy as jnp

from vampire_jax._src.core import backend_defaults

Batching = Literal["vmap", "map", "remat_map", "unroll", "chunked_unroll", "chunked_vmap"]
BATCHING_STRATEGIES = ("vmap", "map", "remat_map", "unroll", "chunked_unroll", "chunked_vmap")
MAPPED_STRATEGIES = backend_defaults.MAPPED_STRATEGIES  # those that loop over the items

T = TypeVar("T")


def default_task_batching() -> tuple[Batching, int]:
  """The fastest task batching measured on the default backend (`backend_defaults` decides).

  Returns:
    `(strategy, chunk_size)`; docs/performance.md has the measurements.
  """
  return backend_defaults.default_task_batching()


def _unrolled(fn: Callable, xs, size: int):
  outputs = [fn(jax.tree_util.tree_map(lambda x, i=i: x[i], xs)) for i in range(size)]
  return jax.tree_util.tree_map(lambda *ys: jnp.stack(ys), *outputs)


def _like_varying(buffer: jax.Array, item: jax.ShapeDtypeStruct) -> jax.Array:
  """`buffer`, varying over the mesh axes `item` varies over (inside `shard_map`), so
  that a loop's carry has the type of what its body writes into it."""
  axes = getattr(item, "vma", None)
  if axes is None:  # JAX 0.10 names it manual_axis_type.varying
    axes = getattr(getattr(item, "manual_axis_type", None), "varying", None)
  return jax.lax.pcast(buffer, tuple(sorted(axes)), to="varying") if axes else buffer


def loop_map(fn: Callable[..., T], xs) -> T:
  """`lax.map(fn, xs)` whose loop body compiles alike for any number of items.

  XLA removes a loop that it can see runs once and merges its body into the
  program around it, where it is fused (and so rounded) differently: with
  `lax.map`, a device that holds one task computes it differently from a
  device that holds several. Here the trip count passes through an
  `optimization_barrier`, so XLA cannot see it, and the body is the same
  program for 1 item or 100: on one device, an item's result is the same
  to the last bit whatever the count. Split over devices, XLA still compiles
  the body in the context of the whole program, which a large network's last
  bits can show (a Conv4-64 step of 8 tasks on 4 devices differed from one
  device's); the regression MLP's meta-steps on 1, 2 and 8 devices give the
  same numbers. The loop is a `while_loop`, so it is not
  differentiable in reverse mode (differentiate inside `fn`, as the meta-
  gradient and the evaluators do).
  """
  leaves = jax.tree_util.tree_leaves(xs)
  size = jnp.shape(leaves[0])[0]
  # One item: XLA would turn the slice of a length-1 axis into a plain copy and
  # fuse the body with it differently. Two rows (the second never read) keep the
  # slices, and so the body, as they are for any other count.
  rows = max(size, 2)
  if rows > size:
    xs = jax.tree_util.tree_map(lambda x: jnp.concatenate([x, x]), xs)
  item_shapes = jax.eval_shape(fn, jax.tree_util.tree_map(lambda x: x[0], xs))
  outputs = jax.tree_util.tree_map(
    lambda s: _like_varying(jnp.zeros((rows,) + s.shape, s.dtype), s), item_shapes
  )
  num_items = jax.lax.optimization_barrier(jnp.int32(size))

  def body(carry):
    index, outputs = carry
    item = jax.tree_util.tree_map(
      lambda x: jax.lax.dynamic_index_in_dim(x, index, keepdims=False), xs
    )
    outputs = jax.tree_util.tree_map(
      lambda buffer, y: jax.lax.dynamic_update_index_in_dim(buffer, y, index, 0),
      outputs,
      fn(item),
    )
    return index + 1, outputs

  _, outputs = jax.lax.while_loop(lambda carry: carry[0] < num_items, body, (jnp.int32(0), outputs))
  return jax.tree_util.tree_map(lambda y: y[:size], outputs)


def map_tasks(
  fn: Callable[..., T], shared, tasks, keys, *, strategy: Batching, chunk_size: int = 1
) -> T:
  """`fn(shared, task, key)` of each task, stacked `[tasks, ...]` in task order.

  `tasks` and `keys` share a leading task axis; `shared` (e.g. the meta-parameters) goes
  whole to every task. Batched by `strategy`, each task's numbers independent of how many
  tasks its device holds (`batched_map(..., any_count_exact=True)`).
  """
  return batched_map(
    lambda args: fn(shared, *args),
    (tasks, keys),
    strategy=strategy,
    chunk_size=chunk_size,
    any_count_exact=True,
  )


def batched_map(
  fn: Callable[..., T],
  xs,
  *,
  strategy: Batching = "vmap",
  chunk_size: int = 1,
  any_count_exact: bool = False,
) -> T:
  """Maps `fn` over the leading axis of every leaf of `xs`.

  All strategies compute the same thing; they differ only in speed, memory
  and compile time.

  Args:
    fn: function of one item (a tree of arrays without the leading axis).
    xs: tree of arrays that share a leading axis of size n.
    strategy: one of BATCHING_STRATEGIES.
    chunk_size: items per chunk for the chunked strategies; must divide n.
    any_count_exact: the looping strategies loop with `loop_map`, so that an
      item's result does not depend on n (tasks split over any number of
      devices); the map is then not differentiable in reverse mode. `vmap`
      and `unroll` compile a program per n, so their rounding may depend on n.

  Returns:
    The outputs of `fn`, stacked along a new leading axis of size n.
  """
  leaves = jax.tree_util.tree_leaves(xs)
  if not leaves:
    raise ValueError("batched_map needs at least one array to map over")
  size = jnp.shape(leaves[0])[0]
  map_fn = loop_map if any_count_exact else jax.lax.map
  if strategy == "vmap":
    return jax.vmap(fn)(xs)
  if strategy == "map":
    return map_fn(fn, xs)
  if strategy == "remat_map":  # each item's residuals recomputed, not stacked
    return map_fn(jax.checkpoint(fn), xs)
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
  out = map_fn(per_chunk, chunks)
  return jax.tree_util.tree_map(lambda y: y.reshape((size,) + y.shape[2:]), out)


def _value_of(primal):
  return primal.value


def _is_primal(leaf) -> bool:
  return hasattr(leaf, "perturbed")


def _mean_and_outputs(fn, items, shared):
  values, outputs = jax.lax.map(lambda item: fn(item, shared), items)
  return jnp.mean(values), outputs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def map_mean(fn: Callable, items, shared):
  """The mean over items of `fn(item, shared)`'s value, and its outputs stacked.

  `fn(item, shared)` returns `(value, output)`, `value` a scalar. The items
  run one after another (`lax.map`), as `batched_map`'s "map" strategy. The
  gradient of the mean is taken item by item as the items run: each item's
  backward pass follows its forward pass at once, so nothing is stacked
  across items (as "remat_map") and no forward pass runs twice (as
  "remat_map" does). Where the outputs themselves are differentiated (a loss
  of the outputs, not of the mean), their gradient is the map's own,
  recomputing each item as "remat_map" does: the same values, without the
  saving.

  Args:
    fn: `fn(item, shared) -> (value, output)`; a function of arrays only.
    items: a tree of arrays with a shared leading axis, one item per row.
    shared: a tree of arrays every item sees (inputs, targets).

  Returns:
    `(mean of the values, outputs stacked along a new leading axis)`.

  Examples:
    >>> def loss(item, x):  # a value and an output per item
    ...   return jnp.sum(item * x) ** 2, item @ x
    >>> items, x = jnp.arange(6.0).reshape(3, 2), jnp.ones(2)
    >>> mean, outputs = vj.backend.map_mean(loss, items, x)
    >>> float(mean), outputs.shape
    (35.666..., (3,))
    >>> jax.grad(lambda w: vj.backend.map_mean(loss, w, x)[0])(items)[0]  # 2 * 1 / 3 each
    Array([0.666..., 0.666...], dtype=float32)
  """
  return _mean_and_outputs(fn, items, shared)


def _map_mean_forward(fn, items, shared):
  items_value = jax.tree_util.tree_map(_value_of, items, is_leaf=_is_primal)
  leaves, treedef = jax.tree_util.tree_flatten(shared, is_leaf=_is_primal)
  perturbed = [leaf.perturbed for leaf in leaves]
  shared_leaves = [leaf.value for leaf in leaves]

  def fn_of(item, differentiated):  # fn, its perturbed shared arrays as an argument
    given = iter(differentiated)
    full = [next(given) if p else v for p, v in zip(perturbed, shared_leaves)]
    return fn(item, treedef.unflatten(full))

  differentiated = [v for p, v in zip(perturbed, shared_leaves) if p]

  def one_item(item):
    (value, output), grads = jax.value_and_grad(fn_of, (0, 1), has_aux=True)(item, differentiated)
    return value, output, grads

  values, outputs, (item_grads, shared_grads) = jax.lax.map(one_item, items_value)
  # Each item's gradient of a shared array, summed over the items; None where not perturbed.
  summed = iter([jnp.sum(g, axis=0) for g in shared_grads])
  shared_grads = treedef.unflatten([next(summed) if p else None for p in perturbed])
  residuals = (item_grads, shared_grads, items_value, treedef.unflatten(shared_leaves))
  return (jnp.mean(values), outputs), residuals


def _is_zero(cotangent) -> bool:
  return isinstance(cotangent, jax.custom_derivatives.SymbolicZero)


def _map_mean_backward(fn, residuals, cotangents):
  item_grads, shared_grads, items, shared = residuals
  mean_cotangent, output_cotangents = cotangents
  if not all(map(_is_zero, jax.tree_util.tree_leaves(output_cotangents, is_leaf=_is_zero))):
    # The outputs are differentiated: the map's own gradient, each item recomputed.
    like = jax.eval_shape(functools.partial(_mean_and_outputs, fn), items, shared)
    cotangents = jax.tree_util.tree_map(
      lambda c, x: jnp.zeros(x.shape, x.dtype) if _is_zero(c) else c,
      cotangents,
      like,
      is_leaf=_is_zero,
    )
    recomputing = functools.partial(_mean_and_outputs, jax.checkpoint(fn))
    return jax.vjp(recomputing, items, shared)[1](cotangents)
  if _is_zero(mean_cotangent):
    return None, None
  # d mean / d item = (1 / n) d value_item / d item, each taken in the forward pass.
  scale = mean_cotangent / jax.tree_util.tree_leaves(items)[0].shape[0]
  scaled = lambda g: g * scale.astype(g.dtype)  # noqa: E731
  return jax.tree_util.tree_map(scaled, item_grads), jax.tree_util.tree_map(scaled, shared_grads)


map_mean.defvjp(_map_mean_forward, _map_mean_backward, symbolic_zeros=True)
