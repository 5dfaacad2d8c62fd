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

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.losses import ApplyFn

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

  Examples:
    >>> from flax import nnx
    >>> params, apply_fn = vj.from_nnx(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> jax.tree.map(jnp.shape, params)
    {'bias': (2,), 'kernel': (3, 2)}
    >>> apply_fn(params, jnp.ones((4, 3))).shape
    (4, 2)
    >>> prior = vj.gaussian_from_params(params, jax.random.key(1))  # a distribution over them
  """
  from flax import nnx

  for path, layer in nnx.iter_modules(module):
    training = (isinstance(layer, nnx.BatchNorm) and not layer.use_running_average) or (
      isinstance(layer, nnx.Dropout) and not layer.deterministic and layer.rate > 0
    )
    if training:
      where = ".".join(map(str, path)) or "the module"
      raise InputError(
        f"from_nnx: {where} is an nnx.{type(layer).__name__} in training mode, whose state "
        "a pure apply_fn cannot update; call model.eval() before vj.from_nnx(model) "
        "(or write the network without it)"
      )
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
    _check_same_shapes("from_nnx: apply_fn", params, weights)
    state = jax.tree_util.tree_unflatten(state_def, leaves)
    return _call_or_say("from_nnx: apply_fn", nnx.merge(graphdef, state, rest), x)

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
  checks.flag("from_equinox", "per_example", per_example)
  try:
    import equinox as eqx
  except ImportError as error:  # an optional dependency
    raise ImportError("vj.from_equinox needs Equinox: pip install equinox") from error

  stateful = (eqx.nn.BatchNorm, eqx.nn.StateIndex, eqx.nn.Dropout)
  found = jax.tree_util.tree_flatten_with_path(module, is_leaf=lambda x: isinstance(x, stateful))
  for path, layer in found[0]:
    where = jax.tree_util.keystr(path) or "the module"
    if isinstance(layer, (eqx.nn.BatchNorm, eqx.nn.StateIndex)):
      raise InputError(
        f"from_equinox: {where} is an eqx.nn.{type(layer).__name__}, a stateful layer that "
        "needs an eqx.nn.State, which apply_fn(params, x) has no place for; write the network "
        "without it (eqx.nn.LayerNorm or GroupNorm normalise without state)"
      )
    if isinstance(layer, eqx.nn.Dropout) and not layer.inference and layer.p > 0:
      raise InputError(
        f"from_equinox: {where} is an eqx.nn.Dropout in training mode, which needs a key per "
        "call; convert eqx.nn.inference_mode(model) instead (or write it without dropout)"
      )
  params, static = eqx.partition(module, eqx.is_inexact_array)

  def apply_fn(weights: PyTree, x: jax.Array) -> jax.Array:
    checks.floating("from_equinox: apply_fn", "x", x)
    _check_same_shapes("from_equinox: apply_fn", params, weights)
    model = eqx.combine(weights, static)
    return _call_or_say("from_equinox: apply_fn", jax.vmap(model) if per_example else model, x)

  return params, apply_fn


def _check_same_shapes(where: str, params: PyTree, weights: PyTree) -> None:
  """InputError naming the first leaf of `weights` whose structure or shape is not `params`'."""
  expected = jax.tree_util.tree_leaves_with_path(params)
  got = jax.tree_util.tree_leaves(weights)
  if len(got) == len(expected):
    for (path, want), have in zip(expected, got):
      if jax.numpy.shape(want) != jax.numpy.shape(have):
        raise InputError(
          f"{where}: params{jax.tree_util.keystr(path)} has shape {jax.numpy.shape(have)}, "
          f"the module's has {jax.numpy.shape(want)} (another module's weights?)"
        )
  if jax.tree_util.tree_structure(weights) != jax.tree_util.tree_structure(params):
    raise InputError(
      f"{where}: params has {len(got)} leaves in another structure than the converted "
      f"module's {len(expected)}; pass the params returned with apply_fn (or a tree "
      "shaped like them)"
    )


def _call_or_say(where: str, model, x: jax.Array) -> jax.Array:
  """`model(x)`; an x that does not fit is one line naming x's shape."""
  try:
    return model(x)
  except TypeError as error:  # JAX's shape errors (dot_general, conv) are TypeErrors
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    raise InputError(
      f"{where}: x {checks.describe(x)} does not fit the module ({first}); pass "
      "[batch, ...] inputs of the size the module was built for"
    ) from None
