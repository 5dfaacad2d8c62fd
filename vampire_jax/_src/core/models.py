"""The paper's networks, as flax.linen modules applied as pure functions.

`apply_fn(params, x)` takes any weight tree of the module's structure, so a
weight sample from a `Gaussian` runs through the same code as a point
estimate.

Batch norm: `BatchStatNorm` normalises with the statistics of the batch in
hand and keeps no running averages, as MAML does; at test time a task's
query set is normalised with its own statistics. By default it has a scale
and an offset, ordinary weights to which VAMPIRE gives a distribution like
every other weight; `Conv4(batch_norm_affine=False)` is the authors'
network, whose batch norm has neither (`affine=False` in PyTorch).

`module_spec(module)` / `module_from_spec(spec)` write a module's class and
fields as JSON and build it again, so a trained run can be loaded without
the code that trained it.

Mixed precision: `mixed_precision(apply_fn)` runs a network's matmuls and
convolutions in bfloat16 while the weight distributions, the losses and the
batch-norm statistics stay in float32.
"""

import dataclasses
import functools
import importlib
import math
import sys
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src import deprecations
from vampire_jax._src.core import backend_defaults, convolution
from vampire_jax._src.core import input_checks as checks

# Kernels (the means, for VAMPIRE) start Xavier-normal with gain sqrt(2): variance
# gain^2 * 2 / (fan_in + fan_out) = 4 / (fan_in + fan_out); biases start at zero. The
# authors' 2019 code used gain 1 (`kernel_init_gain=1.0`), their current code He-normal.
DEFAULT_KERNEL_INIT_GAIN = math.sqrt(2.0)


def xavier_normal(gain: float = DEFAULT_KERNEL_INIT_GAIN) -> Callable:
  """Xavier (Glorot) normal initialisation with `gain`: std = gain * sqrt(2 / (fan_in + fan_out))."""
  return nn.initializers.variance_scaling(gain**2, "fan_avg", "normal")


kernel_init = xavier_normal()


class BatchStatNorm(nn.Module):
  """Batch norm with batch statistics only: y = scale * (x - mean) / std + offset.

  Statistics are taken in float32 (or wider) whatever the input's precision;
  the output has the input's dtype. `use_scale_offset=False` drops the
  scale and offset (y = (x - mean) / std). `gradient_rule=True`: the
  gradient is `batch_stat_norm`'s closed-form rule, which keeps only the
  normalised input (reverse mode only: `Conv4` takes it with its loop-safe
  convolution, itself reverse mode only); False, autodiff of the formula, in
  either mode.
  """

  epsilon: float = 1e-5
  use_scale_offset: bool = True
  gradient_rule: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = offset = None
    if self.use_scale_offset:
      features = x.shape[-1]
      scale = self.param("scale", nn.initializers.ones, (features,))
      offset = self.param("offset", nn.initializers.zeros, (features,))
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if self.gradient_rule:
      return batch_stat_norm(wide, scale, offset, self.epsilon).astype(x.dtype)
    return _batch_stat_norm_forward(wide, scale, offset, self.epsilon)[0].astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_stat_norm(x, scale, offset, epsilon: float):
  """Normalises each channel (last axis) of `x` by its batch mean and std, then scales
  and offsets it (`scale` and `offset` `[channels]`, or both None for neither).

  Its gradient is the closed form, from the normalised input x_hat alone:
  dx = (g - mean(g) - x_hat * mean(g * x_hat)) / std, g the cotangent of x_hat,
  dscale = sum(dy * x_hat), doffset = sum(dy); autodiff of the forward would keep
  x - mean and its square as well, and take more passes over them (docs/performance.md,
  "Batch norm's own gradient"). The rule is written in differentiable operations,
  so the second-order meta-gradient differentiates it as autodiff would. Reverse mode
  only (a `custom_vjp`; `jax.jvp` raises): as a `custom_jvp`, whose linear map JAX
  transposes, the same rule made MAML's Omniglot step 8 % slower.
  """
  return _batch_stat_norm_forward(x, scale, offset, epsilon)[0]


def _batch_stat_norm_forward(x, scale, offset, epsilon):  # the output, and the rule's residuals
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axis=axes, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
  inv_std = jax.lax.rsqrt(var + epsilon)
  normalised = (x - mean) * inv_std
  y = normalised if scale is None else normalised * scale + offset
  return y, (normalised, inv_std, scale)


def _batch_stat_norm_bwd(epsilon, residuals, dy):
  normalised, inv_std, scale = residuals
  axes = tuple(range(dy.ndim - 1))
  if scale is None:
    g, dscale, doffset = dy, None, None
  else:
    g = dy * scale
    dscale = jnp.sum(dy * normalised, axis=axes)
    doffset = jnp.sum(dy, axis=axes)
  mean_g = jnp.mean(g, axis=axes, keepdims=True)
  mean_g_normalised = jnp.mean(g * normalised, axis=axes, keepdims=True)
  dx = (g - mean_g - normalised * mean_g_normalised) * inv_std
  return dx, dscale, doffset


batch_stat_norm.defvjp(_batch_stat_norm_forward, _batch_stat_norm_bwd)


class PatchConv(nn.Module):
  """A 2-D convolution computed as image patches times a matrix (im2col).

  Same parameters ('kernel' `[kh, kw, in, out]`, 'bias') and outputs as
  `nn.Conv`. Under `vmap` with per-task weights it becomes one batched matrix
  product, where `nn.Conv` becomes a grouped convolution that XLA runs
  slowly on CPUs.
  """

  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: int = 1
  kernel_init_gain: float = DEFAULT_KERNEL_INIT_GAIN
  padding: str = "same"  # see `PADDINGS`

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    in_features = x.shape[-1]
    kernel = self.param(
      "kernel",
      xavier_normal(self.kernel_init_gain),
      self.kernel_size + (in_features, self.features),
    )
    bias = self.param("bias", nn.initializers.zeros, (self.features,))
    # Patch features come out ordered (in_channel, kh, kw).
    patches = jax.lax.conv_general_dilated_patches(
      x,
      self.kernel_size,
      (self.strides, self.strides),
      conv_padding(self.padding, self.kernel_size),
      dimension_numbers=("NHWC", "OIHW", "NHWC"),
    )
    matrix = jnp.transpose(kernel, (2, 0, 1, 3)).reshape(-1, self.features)
    return jnp.einsum("bhwk,ko->bhwo", patches, matrix) + bias


class LoopSafeConv(nn.Module):
  """`nn.Conv` (a stride, `PADDINGS`) whose gradients run fast inside loops on a CPU.

  Same parameters ('kernel' `[kh, kw, in, out]`, 'bias') and outputs as
  `nn.Conv`; the convolution is `convolution.conv2d`, whose gradients are
  forward convolutions and matrix products (see that module). A three-channel
  (RGB) input gets a fourth channel: XLA:CPU convolves 75 images of 84x84x4
  in 48 ms against 75 ms at 84x84x3 (docs/performance.md, "What limits the
  84×84 step"). That channel is ones, with the bias on the kernel's centre tap,
  where that tap reads the image at every output position
  (`convolution.centre_tap_inside`: 'SAME' at stride 1, mini-ImageNet's): the
  bias is summed inside the convolution and its gradient comes out of the
  filter gradient's product, a mini-ImageNet step 7 % shorter than with a zero
  channel and the bias added after. Elsewhere the channel is zeros, the
  kernel's slice for it zeros, and the bias is added after.
  """

  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: int = 1
  kernel_init_gain: float = DEFAULT_KERNEL_INIT_GAIN
  padding: str = "same"  # see `PADDINGS`

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param(
      "kernel",
      xavier_normal(self.kernel_init_gain),
      self.kernel_size + (x.shape[-1], self.features),
    )
    bias = self.param("bias", nn.initializers.zeros, (self.features,))
    padding = conv_padding(self.padding, self.kernel_size)
    if padding == "SAME":
      padding = convolution.same_padding(x.shape[1], x.shape[2], self.kernel_size, self.strides)
    kernel = kernel.astype(x.dtype)
    if x.shape[-1] == 3:  # a fourth channel: XLA:CPU convolves four channels faster than three
      if convolution.centre_tap_inside(x.shape[1:3], self.kernel_size, self.strides, padding):
        # ones, the bias on the kernel's centre tap: the bias and its gradient ride along
        x, kernel = convolution.with_bias_channel(x, kernel, bias.astype(x.dtype))
        return convolution.conv2d(x, kernel, self.strides, padding)
      x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, 1)))  # zeros: the same sums
      kernel = jnp.pad(kernel, ((0, 0), (0, 0), (0, 1), (0, 0)))
    y = convolution.conv2d(x, kernel, self.strides, padding)
    return y + bias.astype(y.dtype)


CONV_IMPLS = ("xla", "patches", "loop_safe")

# How Conv4 pads its 3x3 convolutions. "same": XLA's 'SAME', what the output size needs with
# an odd total's extra row after: a stride-2 layer on an even size pads 0 before and 1 after
# (28 -> 14, 14 -> 7, 4 -> 2), on an odd size 1 on each side (7 -> 4). "symmetric": k // 2 on
# each side, PyTorch's `padding=1`, as the authors' `CommonModels.CNN` pads: the same sizes,
# on an even size every window one pixel earlier. With stride 1 they are the same.
PADDINGS = ("same", "symmetric")


def conv_padding(padding: str, kernel_size: tuple[int, int]):
  """`lax`'s padding of a `padding` (`PADDINGS`) convolution: 'SAME', or `((lo, hi), (lo, hi))`."""
  if padding == "same":
    return "SAME"
  if padding == "symmetric":
    return tuple((k // 2, k // 2) for k in kernel_size)
  raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")


def max_pool_2x2(x: jax.Array) -> jax.Array:
  """`nn.max_pool(x, (2, 2), strides=(2, 2), padding='VALID')` as a maximum of four strided views.

  The same values, and an odd last row or column is dropped as 'VALID' drops
  it (84 -> 42 -> 21 -> 10 -> 5). The gradient of a window goes to its
  maximum; where k entries tie for the maximum, each gets 1/k of it (XLA's
  select-and-scatter, under `nn.max_pool`, gives it all to one). That differs
  only for tied maxima, and after a ReLU those are zeros, whose gradient the
  ReLU stops. XLA:CPU runs this gradient faster than select-and-scatter
  (`python -m benchmarks.conv_gradients`). The earlier form, a max over a
  reshaped [.., 2, .., 2, ..] window, had XLA:CPU miscompile its gradient
  under `vmap` and in second-order meta-gradients (docs/history.md, "A
  miscompiled max-pool gradient"). Tested against `nn.max_pool` and under
  `vmap` in tests/core/test_models.py.
  """
  _, height, width, _ = x.shape
  x = x[:, : height // 2 * 2, : width // 2 * 2]  # VALID: an odd last row/column is dropped
  return _max_of_four(x[:, 0::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 0::2], x[:, 1::2, 1::2])


@jax.custom_jvp
def _max_of_four(a, b, c, d):
  """The element-wise maximum of four arrays; its derivative splits ties equally."""
  return jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))


@_max_of_four.defjvp
def _max_of_four_jvp(primals, tangents):
  # d max = sum_i [x_i = max] dx_i / #{i : x_i = max}, as XLA's reduce-max
  # derivative; written on the four strided views, never as a reduction over
  # a reshaped window, whose vmapped gradient XLA:CPU miscompiled.
  maximum = _max_of_four(*primals)
  hits = [(x == maximum).astype(maximum.dtype) for x in primals]
  tangent = sum(hit * dx for hit, dx in zip(hits, tangents)) / sum(hits)
  return maximum, tangent


def auto_conv_impl(*, task_batching: str, inner_steps_unrolled: bool, draws_mapped: bool) -> str:
  """The fastest measured convolution for a meta-step's loop structure on this backend.

  `backend_defaults.conv_impl` decides: where a loop runs around a
  convolution gradient, 'loop_safe' on a CPU and 'patches' on a GPU; XLA's
  elsewhere.
  """
  return backend_defaults.conv_impl(
    task_batching=task_batching,
    inner_steps_unrolled=inner_steps_unrolled,
    draws_mapped=draws_mapped,
  )


class Conv4(nn.Module):
  """Four [conv 3x3 -> batch norm -> ReLU] blocks and a dense head.

  Omniglot (the default): 64 filters, stride-2 convolutions, 28x28x1 input.
  mini-ImageNet: `num_filters=32, max_pool=True`: stride-1 convolutions each
  followed by 2x2 max-pooling, 84x84x3 input. `batch_norm_affine=False`:
  batch norm without scale and offset, as in the authors' code.
  `padding`: "same" (XLA's 'SAME', the default: a stride-2 layer on an even size pads 0
  before and 1 after) or "symmetric" (1 on each side, as the authors' `CommonModels.CNN`);
  see `PADDINGS`.
  `kernel_init_gain`: the kernels' Xavier-normal gain (the authors' 2019 code: 1).
  `batch_norm_epsilon`: added to the batch variance (the authors' 2019 code: 0).
  `num_classes=None`: no dense head, the flattened features are the output
  (ProtoNet's embedding, as the authors' `CNN(dim_output=None)`).

  Input `[batch, height, width, channels]`, output logits `[batch, num_classes]`
  (`[batch, features]` without a head).
  """

  num_classes: Optional[int]
  num_filters: int = 64
  max_pool: bool = False
  conv_impl: str = "xla"  # "xla" (nn.Conv), "patches" (PatchConv) or "loop_safe" (LoopSafeConv)
  batch_norm_affine: bool = True
  kernel_init_gain: float = DEFAULT_KERNEL_INIT_GAIN
  batch_norm_epsilon: float = 1e-5
  padding: str = "same"  # a run recorded before the field existed had this padding

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    checks.floating("Conv4", "x", x, checks.IMAGE_HINT)
    if x.ndim != 4:
      raise checks.fail("Conv4", "x", "[batch, height, width, channels]", checks.describe(x))
    for block in range(4):
      stride = 1 if self.max_pool else 2
      gain = self.kernel_init_gain
      conv = dict(strides=stride, kernel_init_gain=gain, padding=self.padding, name=f"conv{block}")
      if self.conv_impl == "patches":
        x = PatchConv(self.num_filters, **conv)(x)
      elif self.conv_impl == "loop_safe":
        x = LoopSafeConv(self.num_filters, **conv)(x)
      elif self.conv_impl == "xla":
        x = nn.Conv(
          self.num_filters,
          (3, 3),
          strides=stride,
          padding=conv_padding(self.padding, (3, 3)),
          kernel_init=xavier_normal(gain),
          name=f"conv{block}",
        )(x)
      else:
        raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {self.conv_impl!r}")
      x = BatchStatNorm(
        epsilon=self.batch_norm_epsilon,
        use_scale_offset=self.batch_norm_affine,
        gradient_rule=self.conv_impl == "loop_safe",  # both reverse mode only
        name=f"norm{block}",
      )(x)
      x = nn.relu(x)
      if self.max_pool:
        x = max_pool_2x2(x)
    x = x.reshape((x.shape[0], -1))
    if self.num_classes is None:  # an embedding (ProtoNet): the features, no head
      return x
    return nn.Dense(
      self.num_classes, kernel_init=xavier_normal(self.kernel_init_gain), name="head"
    )(x)


class MLP(nn.Module):
  """Fully connected ReLU network: `hidden_sizes` then a linear output layer.

  Regression uses `MLP((100, 100, 100), 1)`; pre-extracted features use
  `MLP((128, 32), num_classes)`. `kernel_init_gain`: the kernels' Xavier-normal
  gain (the authors' 2019 code: 1). Input `[batch, features]`: a leading task
  axis is refused (it would pool the tasks' examples); vmap over tasks.
  `num_outputs=None`: no output layer, the last hidden layer's ReLU units are
  the output (ProtoNet's embedding).
  """

  hidden_sizes: Sequence[int]
  num_outputs: Optional[int]
  kernel_init_gain: float = DEFAULT_KERNEL_INIT_GAIN

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    checks.floating("MLP", "x", x)
    if x.ndim != 2:  # a task axis in front would pool the tasks' examples
      raise checks.fail(
        "MLP", "x", "[batch, features] (one task; vmap over a task axis)", checks.describe(x)
      )
    init = xavier_normal(self.kernel_init_gain)
    for width in self.hidden_sizes:
      x = nn.relu(nn.Dense(width, kernel_init=init)(x))
    if self.num_outputs is None:  # an embedding (ProtoNet): the last hidden units
      return x
    return nn.Dense(self.num_outputs, kernel_init=init)(x)


def conv4_omniglot(num_classes: int) -> Conv4:
  return Conv4(num_classes=num_classes, num_filters=64, max_pool=False)


def conv4_mini_imagenet(num_classes: int) -> Conv4:
  return Conv4(num_classes=num_classes, num_filters=32, max_pool=True)


def mixed_precision(
  apply_fn: Callable[[dict, jax.Array], jax.Array], compute_dtype=jnp.bfloat16
) -> Callable[[dict, jax.Array], jax.Array]:
  """`apply_fn` computing in `compute_dtype`, with float32 weights in and outputs out.

  Floating-point weights and inputs are cast to `compute_dtype` on the way in
  (so matmuls and convolutions run at that precision) and the outputs back
  to float32, so the likelihood, the KL and the weight distributions stay in
  float32; the gradients reaching the float32 weights are float32.
  """

  def cast(x):
    return x.astype(compute_dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x

  def apply(params, x):
    outputs = apply_fn(jax.tree_util.tree_map(cast, params), cast(x))
    return jax.tree_util.tree_map(lambda y: y.astype(jnp.float32), outputs)

  return apply


def pure_apply(module: nn.Module) -> Callable[[dict, jax.Array], jax.Array]:
  """`apply_fn(params, x)` for a module whose only collection is 'params'."""

  def apply_fn(params, x):
    return module.apply({"params": params}, x)

  return apply_fn


def init_params(module: nn.Module, key: jax.Array, input_shape: Sequence[int]) -> dict:
  """The module's initial 'params' tree for inputs of shape `[batch, ...]`.

  Jitted: run op by op, a network's initialisation compiles every small
  operation on its own, which takes seconds on a CPU.
  """
  shape = tuple(input_shape)
  return jax.jit(lambda k: module.init(k, jnp.zeros(shape, jnp.float32))["params"])(key)


def module_spec(module: nn.Module) -> dict[str, Any]:
  """`{"class": "package.module.Class", "fields": {...}}`: what rebuilds `module`.

  Fields are the module's dataclass fields (not `parent`, `name`); they must
  be JSON values (tuples come back as lists and are turned back into tuples).
  """
  cls = type(module)
  fields = {
    f.name: getattr(module, f.name)
    for f in dataclasses.fields(module)
    if f.name not in ("parent", "name")
  }
  return {"class": f"{cls.__module__}.{cls.__qualname__}", "fields": fields}


def module_from_spec(spec: dict[str, Any], cls: type | None = None) -> nn.Module:
  """The module `module_spec` described: its class imported (or `cls`), its fields set."""
  if cls is None:
    # A run recorded before issue 43 names `vampire_jax.models.<Class>`: read it where it is now.
    module_name, _, class_name = deprecations.current_path(spec["class"]).rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
  if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
    raise TypeError(f"{spec['class']} is not a flax.linen.Module")
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["fields"].items()}
  return cls(**fields)


def _json_value(value) -> bool:
  """Whether `value` survives `run.json` (JSON, tuples as lists, numpy scalars as numbers)."""
  if value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating)):
    return True
  if isinstance(value, (list, tuple)):
    return all(_json_value(v) for v in value)
  if isinstance(value, dict):
    return all(isinstance(k, str) and _json_value(v) for k, v in value.items())
  return False


def unloadable_reason(module: nn.Module) -> str | None:
  """Why a run of `module` could never be loaded from its folder (`module_spec`), or None.

  A run folder names the network's class by its import path and records its
  fields as JSON. A class defined inside a function has no import path; a
  field that is not a JSON value (a function, a dtype, a submodule) would be
  recorded as its text.
  """
  if not isinstance(module, nn.Module):
    return None  # not a network at all: refused as such where it is checked
  cls = type(module)
  name = f"{cls.__module__}.{cls.__qualname__}"
  if "<locals>" in cls.__qualname__:
    return (
      f"its class {name} is defined inside a function, so no other process can import it: "
      f"define {cls.__name__} at the top level of a module (or of the script)"
    )
  if cls.__module__ != "__main__" and cls.__module__ in sys.modules:
    found = sys.modules[cls.__module__]
    for part in cls.__qualname__.split("."):
      found = getattr(found, part, None)
    if not isinstance(found, type):
      return (
        f"its class {name} cannot be found by that name in its module (made at run time?): "
        f"define {cls.__name__} at the top level of {cls.__module__}"
      )
  if dataclasses.is_dataclass(module):
    for field in dataclasses.fields(module):
      value = getattr(module, field.name, None)
      if field.name not in ("parent", "name") and not _json_value(value):
        name = getattr(value, "__name__", None)
        shown = f"{name} (a {type(value).__name__})" if name else repr(value)[:80]
        return (
          f"its field {field.name} is {shown}, which run.json cannot record (it records "
          "the fields as JSON: numbers, strings, booleans, lists, dicts, None): make it such "
          "a value (e.g. a dtype's name) and build the object inside the module"
        )
  return None


def local_reparameterization(dist, x: jax.Array, key: jax.Array, num_samples: int) -> jax.Array:
  """`MLP` outputs under `num_samples` draws of its weights, drawn layer by layer.

  The local reparameterisation trick (Kingma, Salimans & Welling, 2015): for a
  dense layer h = a W + b with independent W_ij ~ N(mu_ij, s_ij^2), b_j ~
  N(m_j, t_j^2), each pre-activation is Gaussian given the layer's input a:
  h_j ~ N(sum_i a_i mu_ij + m_j, sum_i a_i^2 s_ij^2 + t_j^2). Drawing h per
  example, layer after layer, gives each example's outputs exactly the
  distribution a weight draw gives them; different examples' draws are
  independent (with one weight draw they would be correlated). Expected
  losses that are means over examples are unchanged, with less variance, and
  it draws L x examples x units normals instead of L x weights.

  Args:
    dist: a `Gaussian` over a `vj.MLP`'s parameters (`Dense_0` ... `Dense_n`,
      each `kernel` [in, out] and `bias` [out]; ReLU between the layers).
    x: `[batch, in]` inputs.
    key: PRNG key.
    num_samples: L, the number of draws.

  Returns:
    `[num_samples, batch, out]`.
  """
  layers = [f"Dense_{i}" for i in range(len(dist.mean))]
  if (
    not layers
    or set(dist.mean) != set(layers)
    or any(set(dist.mean[name]) != {"kernel", "bias"} for name in layers)
  ):
    raise checks.fail(
      "local_reparameterization",
      "dist",
      "a Gaussian over a vj.MLP's parameters (Dense_0 ... Dense_n, each kernel and bias)",
      f"parameters {sorted(dist.mean)}",
    )
  keys = jax.random.split(key, len(layers))
  h = jnp.broadcast_to(x, (num_samples,) + jnp.shape(x))
  for i, (name, layer_key) in enumerate(zip(layers, keys)):
    mean, log_std = dist.mean[name], dist.log_std[name]
    mu = h @ mean["kernel"] + mean["bias"]
    var = jnp.square(h) @ jnp.exp(2 * log_std["kernel"]) + jnp.exp(2 * log_std["bias"])
    h = mu + jnp.sqrt(var) * jax.random.normal(layer_key, mu.shape, mu.dtype)
    if i < len(layers) - 1:
      h = nn.relu(h)
  return h
