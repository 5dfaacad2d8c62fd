"""Checks of arguments where they enter the library, at trace time.

Shapes and dtypes are static under `jit`, so these checks run once, while a
function is traced, and cost nothing when the compiled program runs. Values
(NaN, label ranges) can only be checked on the host: `check_finite` does
that for functions that take concrete arrays (`Run.predict`, the
evaluators' host loop). Every failure is an `InputError` (a `ValueError`)
whose message names the function, the argument, what it wants and what it got.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax.errors import InputError

PyTree = Any


def fail(where: str, argument: str, wanted: str, got: str) -> InputError:
  """The error for `argument` of `where`: `where: argument must be WANTED, got GOT`."""
  return InputError(f"{where}: {argument} must be {wanted}, got {got}")


def describe(x: Any) -> str:
  """`float32[5, 1]`: an array's dtype and shape, as the messages show them."""
  shape = ", ".join(str(d) for d in jnp.shape(x))
  return f"{jnp.result_type(x)}[{shape}]"


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


def loss_fits(
  where: str, names: tuple[str, str], loss_fn: Callable, params: PyTree, x: Any, y: Any
) -> None:
  """Traces `loss_fn(params, x, y)` (no computation) and checks it gives a scalar.

  A likelihood refuses targets that do not fit the network's outputs; this
  re-raises its message naming the caller's argument.
  """
  x_name, y_name = names
  try:
    out = jax.eval_shape(loss_fn, params, x, y)
  except InputError as error:
    raise InputError(
      f"{where}: {y_name} does not fit the network's outputs on {x_name}: {error}"
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
    if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
      bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
      raise fail(where, name, "finite", f"{bad} NaN or infinite values of {value.size}")
