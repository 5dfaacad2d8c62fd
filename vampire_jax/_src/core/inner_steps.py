"""Inner-loop steps: the plain gradient step, and the opt-in guarded step (not the paper's).

`sgd_step` is every inner loop's step (`adapt`, `maml_adapt`). `backtracking_step` is
the guard that `backtracking=True` turns on: a step that would raise the support loss,
or make it non-finite, is not taken (the user guide, "A guard against runaway tasks").
"""

from typing import Callable

import jax
import jax.numpy as jnp

from vampire_jax._src.core.losses import PyTree


def sgd_step(params: PyTree, grads: PyTree, inner_lr: float, first_order: bool) -> PyTree:
  if first_order:
    grads = jax.lax.stop_gradient(grads)
  return jax.tree_util.tree_map(lambda p, g: p - inner_lr * g, params, grads)


def backtracking_step(gradient: Callable, loss: Callable, inner_lr, first_order: bool):
  """A guarded inner step: `step((params, scale), key) -> ((params, scale), None)`.

  The step is `-inner_lr * scale * gradient(params, key)`. It is taken only where it does
  not raise `loss(params, key)` (for VAMPIRE the sampled VFE, on the step's own weight
  draws) and keeps it finite; otherwise the parameters stay, and `scale` halves for the
  steps after. A stable step lowers the loss it descends, so the guard changes nothing
  there; on a task whose curvature lambda makes inner_lr * lambda > 2 (a support clustered
  at large |x|), it stops the loop from running away (the user guide, "A guard against runaway tasks").
  """

  def step(carry, key):
    params, scale = carry
    candidate = sgd_step(params, gradient(params, key), inner_lr * scale, first_order)
    # Which step to take is a decision, not a value to differentiate.
    before, after = (loss(jax.lax.stop_gradient(p), key) for p in (params, candidate))
    taken = jnp.isfinite(after) & (after <= before)
    params = jax.tree_util.tree_map(lambda new, old: jnp.where(taken, new, old), candidate, params)
    return (params, jnp.where(taken, scale, scale / 2)), None

  return step


def first_scale(params: PyTree, support_x: jax.Array) -> jax.Array:
  """1.0, the guard's first step scale, typed as values made from `params` and `support_x`.

  Under `shard_map` a loop's carry must vary over the same devices in and out: the scale
  comes out of the loop made from the task's data, so it goes in made from them too.
  """
  first = jnp.ravel(jax.tree_util.tree_leaves(params)[0])[0]
  return jnp.where(jnp.isnan(first) & jnp.isnan(jnp.ravel(support_x)[0]), 1.0, 1.0).astype(
    jnp.float32
  )
