"""Networks written in Flax NNX or Equinox, as the `(params, apply_fn)` pair the library takes.

Everything in `vampire_jax` works on a weight pytree and a pure function
`apply_fn(params, x) -> outputs`: `vj.adapt` and `vj.predict`, the learner
factories, `vj.make_train_step`. Linen modules give that pair through
`vj.init_params` and `vj.pure_apply`; a stateful `nnx.Module` or an
`eqx.Module` gives it through one call here:

    params, apply_fn = vj.from_nnx(model)        # flax.nnx
    params, apply_fn = vj.from_equinox(model)    # equinox (if installed)
    learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3))
    state = vj.init_meta_state(learner, vj.meta_optimizer(1e-3), params, key)

The module is applied as a pure function of its weights: its other state
(batch statistics, RNG counters) is read as it was when converted, and any
update the call makes to it is dropped. Put a module with dropout or batch
norm in its evaluation mode (`model.eval()` in NNX, `eqx.nn.inference_mode`)
before converting it, or write it without them, as the library's own
networks are.
"""

from typing import Any

import jax

from vampire_jax import checks
from vampire_jax.losses import ApplyFn

PyTree = Any


def from_nnx(module: Any) -> tuple[PyTree, ApplyFn]:
  """A Flax NNX module as `(params, apply_fn)`.

  Args:
    module: an `nnx.Module` whose `__call__(x)` maps a batch `[batch, ...]`
      to outputs `[batch, ...]` (NNX layers take batches).

  Returns:
    `params`: the module's `nnx.Param` values as a plain nested dict of
    arrays (`nnx.to_pure_dict`), e.g. `{"layers": {0: {"bias": ..., "kernel":
    ...}, ...}}`; and `apply_fn(params, x)`, the module called on `x` with
    those weights. `jax.grad`, `vmap`, `Gaussian(mean, log_std)` and optax
    work on `params` as on a linen module's.

  Raises:
    InputError: from `apply_fn`, for integer inputs or a weight tree whose
      structure is not `params`'.
  """
  from flax import nnx

  graphdef, param_state, rest = nnx.split(module, nnx.Param, ...)
  params = nnx.to_pure_dict(param_state)
  state_def = jax.tree_util.tree_structure(param_state)
  params_def = jax.tree_util.tree_structure(params)

  def apply_fn(weights: PyTree, x: jax.Array) -> jax.Array:
    checks.floating("from_nnx: apply_fn", "x", x)
    leaves, weights_def = jax.tree_util.tree_flatten(weights)
    if weights_def != params_def:
      raise checks.fail(
        "from_nnx: apply_fn", "params", f"a tree shaped {params_def}", str(weights_def)
      )
    state = jax.tree_util.tree_unflatten(state_def, leaves)
    return nnx.merge(graphdef, state, rest)(x)

  return params, apply_fn


def from_equinox(module: Any, *, per_example: bool = True) -> tuple[PyTree, ApplyFn]:
  """An Equinox module as `(params, apply_fn)`. Needs `pip install equinox`.

  Args:
    module: an `eqx.Module`.
    per_example: the module maps one example, as Equinox's layers do
      (`eqx.nn.MLP` takes `[in_size]`); `apply_fn` maps it over the batch's
      leading axis with `jax.vmap`. False: the module takes batches itself.

  Returns:
    `params`: the module's floating-point arrays (`eqx.partition(module,
    eqx.is_inexact_array)`: the module's own pytree, with `None` where the
    rest was); and `apply_fn(params, x)`, the module rebuilt with those
    weights (`eqx.combine`) called on the batch `x` `[batch, ...]`.

  Raises:
    ImportError: Equinox is not installed.
    InputError: from `apply_fn`, for integer inputs.
  """
  try:
    import equinox as eqx
  except ImportError as error:  # an optional dependency
    raise ImportError("vj.from_equinox needs Equinox: pip install equinox") from error

  params, static = eqx.partition(module, eqx.is_inexact_array)

  def apply_fn(weights: PyTree, x: jax.Array) -> jax.Array:
    checks.floating("from_equinox: apply_fn", "x", x)
    model = eqx.combine(weights, static)
    return jax.vmap(model)(x) if per_example else model(x)

  return params, apply_fn
