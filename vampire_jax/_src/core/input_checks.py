"""Checks of arguments where they enter the library, at trace time.

Shapes and dtypes are static under `jit`, so these checks run once, while a
function is traced, and cost nothing when the compiled program runs. Values
(NaN, label ranges, probabilities that sum to 1) can only be checked where
they are concrete: called outside `jit`, a function checks them on the host
(`concrete` says whether it can); under `jit` the value is a tracer, the
check is skipped, and the function's docstring says what catches a bad value
instead (e.g. an out-of-range label makes the loss NaN, which a meta-step's
`metrics["finite"]` flags). `check_finite` does the host-side check for
functions that take concrete arrays (`Run.predict`, the evaluators' host
loop). Every failure is an `InputError` (a `ValueError`) whose message names
the function, the argument, what it wants and what it got.
"""

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core.errors import InputError

PyTree = Any


def fail(where: str, argument: str, wanted: str, got: str) -> InputError:
  """The error for `argument` of `where`: `where: argument must be WANTED, got GOT`."""
  return InputError(f"{where}: {argument} must be {wanted}, got {got}")


def describe(x: Any) -> str:
  """`float32[5, 1]`: an array's dtype and shape, as the messages show them.

  What is not an array is named for what it is: `a distribution (distrax
  Categorical of batch shape (6,))`, `None`, `a str`, never the class of an
  array's implementation.
  """
  if x is None:
    return "None"
  if isinstance(x, str):
    return f"a str {x!r}"
  if hasattr(x, "log_prob") and hasattr(x, "batch_shape"):
    module = type(x).__module__.split(".")[0]
    return f"a distribution ({module} {type(x).__name__} of batch shape {tuple(x.batch_shape)})"
  array_like = (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(
    x, (bool, int, float, complex, np.generic, list, tuple)
  )
  if not array_like:
    return f"a {type(x).__name__}"
  try:
    shape = ", ".join(str(d) for d in jnp.shape(x))
    return f"{jnp.result_type(x)}[{shape}]"
  except (TypeError, ValueError):  # a ragged list, a tuple of trees
    return f"a {type(x).__name__}"


def concrete(x: Any) -> bool:
  """Whether `x` holds values (not a tracer under `jit`/`grad`/`vmap`), so they can be checked."""
  return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def array(where: str, name: str, x: Any) -> None:
  """Refuses anything but an array (a Python list would be traced element by element)."""
  if not (hasattr(x, "shape") and hasattr(x, "dtype")):
    raise fail(where, name, "an array (wrap a list in jnp.asarray)", type(x).__name__)


def not_a_distribution(where: str, name: str, wanted: str, x: Any) -> None:
  """Refuses a distribution (`vj.predictive`'s) where arrays of draws are wanted."""
  if hasattr(x, "log_prob") and hasattr(x, "batch_shape"):
    raise fail(where, name, wanted, describe(x))


def prng_key(where: str, name: str, key: Any) -> None:
  """Refuses anything but one PRNG key: `jax.random.key(seed)` (or a raw `uint32[2]` key)."""
  wanted = "a PRNG key, jax.random.key(seed)"
  if not (hasattr(key, "shape") and hasattr(key, "dtype")):
    raise fail(where, name, wanted, type(key).__name__ if key is not None else "None")
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise fail(where, name, f"one {wanted} (split it for several)", describe_key(key))
    return
  if key.dtype != jnp.uint32 or key.shape != (2,):
    raise fail(where, name, wanted, describe(key))


def prng_keys(where: str, name: str, keys: Any, count: int) -> None:
  """Refuses anything but `count` PRNG keys, `jax.random.split(key, count)` (or `uint32[count, 2]`)."""
  wanted = f"{count} PRNG keys, one per task: jax.random.split(key, {count})"
  if not (hasattr(keys, "shape") and hasattr(keys, "dtype")):
    raise fail(where, name, wanted, type(keys).__name__ if keys is not None else "None")
  typed = jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key)
  shape = (count,) if typed else (count, 2)
  if keys.shape != shape or not (typed or keys.dtype == jnp.uint32):
    raise fail(where, name, wanted, describe_key(keys))


def describe_key(key: Any) -> str:
  return f"{key.dtype}[{', '.join(str(d) for d in key.shape)}]"


def step_count(where: str, name: str, value: Any, lowest: int = 0) -> None:
  """A count that sets a loop's length: a static Python (or numpy) integer >= `lowest`."""
  if isinstance(value, jax.core.Tracer):
    raise fail(
      where,
      name,
      f"a static integer >= {lowest} (it sets a loop's length: under jit, close over it "
      "or mark it static)",
      f"a traced {describe(value)}",
    )
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
    raise fail(where, name, f"an integer >= {lowest}", repr(value))


def flag(where: str, name: str, value: Any) -> None:
  """A switch: True or False (numpy's bools too); a string, a number or None is refused.

  `if value:` would take the string "False" as true and 0 or None as false, silently.
  """
  if isinstance(value, (bool, np.bool_)):
    return
  if value is None:
    got = "None"
  else:
    kind = type(value).__name__
    got = f"{value!r} ({'an' if kind[:1] in 'aeiou' else 'a'} {kind})"
  raise fail(where, name, "True or False", got)


def flags(where: str, **values: Any) -> None:
  """`flag` for each of `values` (name=value), in order."""
  for name, value in values.items():
    flag(where, name, value)


def rate(where: str, name: str, value: Any, *, positive: bool) -> None:
  """A step size (> 0) or weight (>= 0): finite, of the right sign, where it is concrete."""
  if not concrete(value):
    return  # a traced rate: the caller's metrics (finite) catch a bad one
  if isinstance(value, (str, bytes)):  # float("0.3") would pass, and fail later elsewhere
    raise fail(where, name, "a number, not a string", repr(value))
  if isinstance(value, (bool, np.bool_)):  # True would be taken as 1.0
    raise fail(where, name, "a number, not a bool", repr(value))
  try:
    number = float(np.asarray(value))
  except (TypeError, ValueError):
    raise fail(where, name, "a number", type(value).__name__) from None
  if np.ndim(value) != 0:
    raise fail(where, name, "a number (a scalar)", describe(value))
  if not math.isfinite(number) or number < 0 or (positive and number == 0):
    raise fail(where, name, "a finite number " + ("> 0" if positive else ">= 0"), repr(number))


def labels_in_range(where: str, name: str, labels: Any, num_classes: int) -> None:
  """Where `labels` are concrete, refuses any outside `[0, num_classes)` (-1 would wrap)."""
  if not concrete(labels):
    return
  values = np.asarray(labels)
  bad = (values < 0) | (values >= num_classes)
  if np.any(bad):
    shown = sorted(set(values[bad].tolist()))[:5]
    raise fail(
      where,
      name,
      f"class indices in [0, {num_classes}) for {num_classes} outputs",
      f"{int(bad.sum())} outside it: {shown}",
    )


def probabilities(where: str, name: str, p: Any, hint: str, atol: float = 1e-3) -> None:
  """Where `p` is concrete: non-negative, summing to 1 over the last axis (within `atol`)."""
  if not concrete(p):
    return
  values = np.asarray(p, dtype=np.float64)
  if not np.all(np.isfinite(values)):
    raise fail(where, name, f"probabilities ({hint})", "NaN or infinite values")
  if np.any(values < 0):
    raise fail(where, name, f"probabilities ({hint})", f"negative values (min {values.min():.3g})")
  sums = values.sum(axis=-1)
  worst = float(np.max(np.abs(sums - 1.0))) if sums.size else 0.0
  if worst > atol:
    raise fail(
      where,
      name,
      f"probabilities summing to 1 over the last axis ({hint})",
      f"sums off by up to {worst:.3g}",
    )


def examples(where: str, names: tuple[str, str], x: Any, y: Any) -> int:
  """Checks that `x` and `y` hold the same number (>= 1) of examples; returns it."""
  x_name, y_name = names
  for name, value in ((x_name, x), (y_name, y)):
    if jnp.ndim(value) < 1:
      raise fail(where, name, "an array with a leading [examples] axis", describe(value))
  num = jnp.shape(x)[0]
  if num < 1:
    raise fail(where, x_name, "at least one example", describe(x))
  if jnp.shape(y)[0] != num:
    raise fail(where, y_name, f"[{num}, ...], one entry per example of {x_name}", describe(y))
  return num


IMAGE_HINT = (
  "preprocessed as in training (images as floats in [0, 1]: "
  "vj.data.preprocess_omniglot / vj.data.preprocess_mini_imagenet)"
)


def floating(where: str, name: str, x: Any, hint: str = "") -> None:
  """Refuses integer or boolean arrays where floats are wanted (never read 0-255 as floats)."""
  if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    raise fail(where, name, "floating point" + (f", {hint}" if hint else ""), describe(x))


def float_leaves(where: str, name: str, tree: PyTree) -> None:
  """Refuses a tree with an integer or boolean leaf, naming it: such a leaf cannot take a step."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
      raise InputError(
        f"{where}: {name}{jax.tree_util.keystr(path)} is {jnp.result_type(leaf)}; it must "
        "hold floats (cast with .astype(jnp.float32))"
      )


def _first_line(error: BaseException) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  return text.split(" (https://flax.readthedocs")[0].rstrip(".")


def network_fits(where: str, names: tuple[str, str], apply_fn: Callable, params: PyTree, x: Any):
  """Traces `apply_fn(params, x)` (no computation); returns the outputs' shape and dtype.

  A network refuses inputs it cannot take (`Conv4` 3-D images), and flax
  refuses parameters that do not fit the inputs (another network's, or
  channels-first or 84x84 images into a 28x28 network): either is re-raised
  in one line naming the caller's arguments.
  """
  params_name, x_name = names
  import flax.errors  # flax is imported by the models anyway

  try:
    return jax.eval_shape(apply_fn, params, x)
  except InputError as error:
    raise InputError(f"{where}: {x_name} {describe(x)} does not fit the network: {error}") from None
  except flax.errors.ScopeParamNotFoundError as error:
    raise InputError(
      f"{where}: {params_name} does not hold this network's parameters ({_first_line(error)})"
    ) from None
  except flax.errors.FlaxError as error:
    raise InputError(
      f"{where}: {params_name} and {x_name} {describe(x)} do not fit together (another "
      f"network's parameters, or inputs of another shape: channels last, the training "
      f"image size?): {_first_line(error)}"
    ) from None


def loss_fits(
  where: str,
  names: tuple[str, str],
  loss_fn: Callable,
  params: PyTree,
  x: Any,
  y: Any,
  params_name: str = "params",
) -> None:
  """Traces `loss_fn(params, x, y)` (no computation) and checks it gives a scalar.

  With a `loss_fn` of `losses.loss_from_apply` the network is traced on `x`
  first (`network_fits`), so that an input it refuses is blamed on `x`; the
  likelihood then refuses targets that do not fit the network's outputs, and
  where the targets are concrete, values it cannot score (a label outside
  the classes): re-raised naming the caller's `y` argument.
  """
  x_name, y_name = names
  apply_fn, nll = getattr(loss_fn, "apply_fn", None), getattr(loss_fn, "nll", None)
  if apply_fn is not None:
    outputs = network_fits(where, (params_name, x_name), apply_fn, params, x)
    check_values = getattr(nll, "check_targets", None)
    if check_values is not None and concrete(y):
      try:
        check_values(outputs, y)
      except InputError as error:
        raise InputError(f"{where}: {y_name} cannot be scored: {error}") from None
  import flax.errors

  try:
    out = jax.eval_shape(loss_fn, params, x, y)
  except InputError as error:
    raise InputError(
      f"{where}: {y_name} does not fit the network's outputs on {x_name}: {error}"
    ) from None
  except flax.errors.FlaxError as error:
    raise InputError(
      f"{where}: {params_name} and {x_name} {describe(x)} do not fit together (another "
      f"network's parameters, or inputs of another shape?): {_first_line(error)}"
    ) from None
  if jnp.shape(out) != ():
    raise InputError(
      f"{where}: loss_fn must return a scalar (the mean NLL of the batch), got "
      f"shape {jnp.shape(out)} for {x_name} {describe(x)} and {y_name} "
      f"{describe(y)}"
    )


def check_finite(where: str, arrays: dict) -> None:
  """Host-side: refuses NaN or infinite values in any of `arrays` (name -> array)."""
  for name, value in arrays.items():
    value = np.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.floating):  # bfloat16 too (not a numpy floating type)
      value = value.astype(np.float32) if value.dtype.itemsize < 4 else value
    if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
      bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
      raise fail(where, name, "finite", f"{bad} NaN or infinite values of {value.size}")
