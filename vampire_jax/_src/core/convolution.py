"""A convolution whose gradients are themselves forward convolutions and matrix products.

XLA:CPU runs the gradient of a convolution (its input- and filter-gradient
convolutions) 5 to 130 times slower inside a loop (`lax.scan`, `lax.map`)
than at the top level of a program, while forward convolutions and matrix
products run at full speed in both (`python -m benchmarks.conv_gradients`). An
inner loop in `lax.scan`, and the Monte-Carlo draws in `lax.map`, put every
convolution gradient of the meta-gradient inside a loop.

`conv2d` computes the same convolution as `lax.conv_general_dilated` (NHWC
input, HWIO kernel, explicit padding, a stride) with a custom gradient:

  d kernel[i, j] = sum over (n, h, w) of the input window at tap (i, j),
                   strided, times the output gradient: the input's patches and
                   the output gradient, one matrix product (`filter_gradient`);
  d input        = a stride-1, unpadded forward convolution of the output
                   gradient, dilated by the stride and padded by the kernel
                   size less one, with the kernel flipped and its channels
                   swapped (`input_gradient`); at strides above 1, one matrix
                   product for every tap's window, laid back on the input and
                   summed, which skips the dilation's zeros.

Both gradients are bilinear, and each has its own rule: its gradients are
`conv2d`, `filter_gradient` and `input_gradient` again. So the gradient of
the gradient (the meta-gradient's second-order terms), and every order past
it, is these three operations, never autodiff of slices and pads. The values
equal XLA's up to float rounding, tested to the third derivative
(`tests/core/test_convolution.py`).

Reverse mode only: `conv2d` is a `jax.custom_vjp`, which JAX cannot
differentiate forward, so `jax.jvp`, `jax.jacfwd`, `jax.hessian` and
`jax.linearize` of anything that runs it raise "TypeError: can't apply
forward-mode autodiff (jvp) to a custom_vjp function". It runs in
`Conv4(conv_impl="loop_safe")`, what the experiments' `conv_impl="auto"`
picks on a CPU (`backend_defaults.conv_impl`). Use
`conv_impl="xla"` for forward mode, or differentiate in reverse twice:
`jax.jacrev(jax.jacrev(f))` is a Hessian. (A forward-mode rule would need a
`custom_jvp`, and JAX would then transpose its tangent map with XLA's own
gradient convolutions, the slow ones this module avoids.)
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

Padding = tuple[tuple[int, int], tuple[int, int]]
_DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def same_padding(height: int, width: int, kernel: tuple[int, int], stride: int) -> Padding:
  """The (low, high) padding of 'SAME' for an input of `height` x `width`, as XLA pads."""
  return tuple(lax.padtype_to_pads((height, width), kernel, (stride, stride), "SAME"))


def centre_tap_inside(
  in_size: tuple[int, int], kernel_size: tuple[int, int], stride: int, padding: Padding
) -> bool:
  """Whether the kernel's tap (k // 2, k // 2) reads a pixel of the input, never padding, at
  every output position: 3x3 kernels padded 'SAME' at stride 1, and Conv4's at stride 2, do."""
  for size, k, (low, high) in zip(in_size, kernel_size, padding):
    outputs = (size + low + high - k) // stride + 1
    first, last = k // 2 - low, (outputs - 1) * stride + k // 2 - low
    if first < 0 or last > size - 1:
      return False
  return True


def with_bias_channel(x: jax.Array, kernel: jax.Array, bias: jax.Array):
  """`x` with a channel of ones appended, `kernel` with `bias` on that channel's tap
  (k // 2, k // 2), its centre for odd sizes.

  Where `centre_tap_inside`, conv2d of the pair is conv2d(x, kernel) + bias with the
  bias summed inside the convolution (so its last bits differ), and its gradient
  (the ones channel's centre tap in the filter gradient) comes out of the filter
  gradient's product, not out of a pass of its own over the output gradient.
  """
  kh, kw = kernel.shape[:2]
  centre = jnp.zeros((kh, kw, 1, 1), kernel.dtype).at[kh // 2, kw // 2].set(1)
  ones = jnp.ones(x.shape[:-1] + (1,), x.dtype)
  return jnp.concatenate([x, ones], -1), jnp.concatenate([kernel, centre * bias], 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv2d(x: jax.Array, kernel: jax.Array, stride: int, padding: Padding) -> jax.Array:
  """`lax.conv_general_dilated(x, kernel, (stride, stride), padding)`, NHWC / HWIO.

  Args:
    x: `[batch, height, width, in]`.
    kernel: `[kh, kw, in, out]`.
    stride: the same in both spatial dimensions.
    padding: `((low, high), (low, high))` for height and width.

  Returns:
    `[batch, out_height, out_width, out]`.

  Reverse-mode differentiable to any order; not forward mode (`jax.jvp`,
  `jax.jacfwd`, `jax.hessian` raise a TypeError; see the module docstring).
  """
  return lax.conv_general_dilated(
    x, kernel, (stride, stride), padding, dimension_numbers=_DIMENSIONS
  )


def _keeping_inputs(fn):
  """The forward rule of a custom-VJP `fn(a, b, *static)`: its value, with `(a, b)` kept."""
  return lambda a, b, *static: (fn(a, b, *static), (a, b))


_forward = _keeping_inputs(conv2d)


def kernel_taps(padded, kernel_size: tuple[int, int], out_size: tuple[int, int], stride: int):
  """The window of `padded` (`[n, h, w, in]`) each kernel tap sees, tap by tap (row-major):
  from (i, j) on, every `stride`-th pixel, `out_size` of them; each `[n, out_h, out_w, in]`."""
  (kh, kw), (out_h, out_w) = kernel_size, out_size
  return [
    lax.slice(
      padded,
      (0, i, j, 0),
      (
        padded.shape[0],
        i + (out_h - 1) * stride + 1,
        j + (out_w - 1) * stride + 1,
        padded.shape[3],
      ),
      (1, stride, stride, 1),
    )
    for i in range(kh)
    for j in range(kw)
  ]


def _backward(stride, padding, residuals, grad):
  x, kernel = residuals
  return (
    input_gradient(kernel, grad, x.shape, stride, padding),
    filter_gradient(x, grad, kernel.shape, stride, padding),
  )


# The two gradients are bilinear, so each one's own gradient is a convolution, the other
# gradient, or both: with c a cotangent of the result,
#   filter_gradient(x, g):  d/dx <c, .> = input_gradient(c, g),   d/dg = conv2d(x, c);
#   input_gradient(K, g):   d/dK <c, .> = filter_gradient(c, g),  d/dg = conv2d(c, K).
# Written as rules, every order of the meta-gradient is these three operations. Left to
# autodiff, the second order differentiated the taps' slices (a padded copy of the input
# per tap, summed) and the dilated gradient: 45 % of a MAML step (docs/performance.md).


# A filter gradient whose patches would take more than `PATCH_CHUNKING_ABOVE_BYTES` makes
# and multiplies them a chunk of images at a time, each chunk's patches at most
# `PATCH_CHUNK_BYTES`, so that they are read back from the processor's cache, not from
# memory: mini-ImageNet's second layer has 152 MB of patches for 75 query images (2 MB an
# image). The chunks are fixed by the shapes alone, so a run's numbers never depend on the
# machine's load. Smaller patches (every Omniglot layer, every support set of 5 images) keep
# the one product (docs/performance.md, "The filter gradient's patches, a chunk at a time").
PATCH_CHUNK_BYTES = 4 * 2**20
PATCH_CHUNKING_ABOVE_BYTES = 16 * 2**20


def patch_chunk(batch: int, bytes_per_image: int) -> int:
  """The images per chunk of `filter_gradient`'s patches (`batch`: no chunks).

  As many images as fit in `PATCH_CHUNK_BYTES` (at least one); a divisor of
  `batch` where one is at least half that many, so that no zero images are added.
  """
  if batch * bytes_per_image <= PATCH_CHUNKING_ABOVE_BYTES:
    return batch
  chunk = max(1, min(batch, PATCH_CHUNK_BYTES // bytes_per_image))
  divisor = max(d for d in range(1, chunk + 1) if batch % d == 0)
  return divisor if 2 * divisor >= chunk else chunk


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def filter_gradient(x, grad, kernel_shape, stride: int, padding: Padding) -> jax.Array:
  """d kernel of `conv2d(x, kernel, stride, padding)` at output cotangent `grad`.

  d kernel[i, j] = sum over (n, h, w) of the input window at tap (i, j),
  strided, times `grad`: the input's patches (a row per output pixel, the
  taps' windows side by side) and `grad` (a row per output pixel), one
  matrix product contracting their rows. Where the patches would be large
  (`patch_chunk`), a chunk of images at a time, the products summed.
  """
  kh, kw, channels_in, channels_out = kernel_shape
  (low_h, high_h), (low_w, high_w) = padding
  batch, out_h, out_w, _ = grad.shape
  # The longer side of the result goes as its columns: measured faster both ways round
  # (Conv4's first layer: 9 taps x 1 channel against 64; the others: 576 against 64).
  by_output = kh * kw * channels_in > channels_out
  chunk = patch_chunk(batch, out_h * out_w * kh * kw * channels_in * x.dtype.itemsize)
  extra = -batch % chunk  # zero images to fill the last chunk (none where chunk == batch)
  padded = jnp.pad(x, ((0, extra), (low_h, high_h), (low_w, high_w), (0, 0)))
  if chunk == batch:
    product = _patches_product(padded, grad, (kh, kw), stride, by_output)
  else:
    chunks = (batch + extra) // chunk
    grad = jnp.pad(grad, ((0, extra), (0, 0), (0, 0), (0, 0)))  # zeros: they add nothing
    wide = jnp.promote_types(grad.dtype, jnp.float32)  # bfloat16 chunks summed in float32

    def add_chunk(total, chunk_inputs):
      chunk_x, chunk_grad = chunk_inputs
      return total + _patches_product(chunk_x, chunk_grad, (kh, kw), stride, by_output, wide), None

    taps_in = kh * kw * channels_in
    total = jnp.zeros((channels_out, taps_in) if by_output else (taps_in, channels_out), wide)
    in_chunks = (
      padded.reshape((chunks, chunk) + padded.shape[1:]),
      grad.reshape((chunks, chunk) + grad.shape[1:]),
    )
    product = lax.scan(add_chunk, total, in_chunks)[0].astype(grad.dtype)
  if by_output:
    return product.reshape(channels_out, kh, kw, channels_in).transpose(1, 2, 3, 0)
  return product.reshape(kh, kw, channels_in, channels_out)


def _patches_product(padded, grad, kernel_size, stride: int, by_output: bool, dtype=None):
  """`grad`'s rows against the patches of `padded`: `[out, taps*in]` if `by_output`, else
  `[taps*in, out]`; in `dtype` where given."""
  taps = kernel_taps(padded, kernel_size, grad.shape[1:3], stride)
  patches = jnp.stack(taps, axis=3).reshape(-1, len(taps) * padded.shape[3])  # [n*oh*ow, taps*in]
  grad_rows = grad.reshape(-1, grad.shape[3])  # [n*oh*ow, out]
  # One matrix product for all taps, both operands contracted on their rows, so that no
  # transposed copy of the patches is made (the taps stacked in front of the pixels, as
  # before, took one: 8-33 % slower alone, and a further copy of the patches).
  # Nine products stacked (one per tap) gave a wrong second-order meta-gradient under jit
  # on XLA:CPU (its algebraic simplifier; correct op by op), and were slower.
  if dtype is None:  # the one product as before: `lax.dot_general` changed its last bits
    return grad_rows.T @ patches if by_output else patches.T @ grad_rows
  operands = (grad_rows, patches) if by_output else (patches, grad_rows)
  return lax.dot_general(*operands, (((0,), (0,)), ((), ())), preferred_element_type=dtype)


def _filter_gradient_backward(kernel_shape, stride, padding, residuals, cotangent):
  x, grad = residuals
  return (
    input_gradient(cotangent, grad, x.shape, stride, padding),
    conv2d(x, cotangent, stride, padding),
  )


filter_gradient.defvjp(_keeping_inputs(filter_gradient), _filter_gradient_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def input_gradient(kernel, grad, x_shape, stride: int, padding: Padding) -> jax.Array:
  """d x of `conv2d(x, kernel, stride, padding)` (x of shape `x_shape`) at output cotangent `grad`.

  The full correlation of the stride-dilated `grad` with the flipped kernel,
  its channels swapped: a stride-1 forward convolution. At strides above 1 the
  same values by one matrix product per tap (`_input_gradient_by_taps`).
  """
  if stride > 1:
    return _input_gradient_by_taps(kernel, grad, x_shape, stride, padding)
  kh, kw = kernel.shape[:2]
  (low_h, high_h), (low_w, high_w) = padding
  padded_h, padded_w = x_shape[1] + low_h + high_h, x_shape[2] + low_w + high_w
  dilated = lax.pad(
    grad,
    jnp.zeros((), grad.dtype),
    ((0, 0, 0), (kh - 1, kh - 1, stride - 1), (kw - 1, kw - 1, stride - 1), (0, 0, 0)),
  )
  flipped = jnp.flip(kernel, (0, 1)).swapaxes(2, 3)
  # `conv2d`, not XLA's convolution: the same values, and differentiated without this
  # rule (`input_gradient.fun`, as `benchmarks.filter_gradient_cost`'s `autodiff`) it
  # still never runs XLA's gradient convolutions.
  d_padded = conv2d(dilated, flipped, 1, ((0, 0), (0, 0)))
  # Padded rows past the last window get no gradient; then drop the padding.
  d_padded = jnp.pad(
    d_padded,
    (
      (0, 0),
      (0, padded_h - d_padded.shape[1]),
      (0, padded_w - d_padded.shape[2]),
      (0, 0),
    ),
  )
  return d_padded[:, low_h : low_h + x_shape[1], low_w : low_w + x_shape[2]]


def _input_gradient_by_taps(kernel, grad, x_shape, stride: int, padding: Padding) -> jax.Array:
  """`input_gradient` of a strided convolution: what each tap sends back, then added up.

  One matrix product gives every output pixel's gradient for every tap's window
  (`grad` `[n*oh*ow, out]` contracted with the kernel `[taps*in, out]` on `out`); each
  tap's `[n, oh, ow, in]` then lands on its strided window of the padded input
  (`lax.pad` with stride - 1 zeros between pixels), and the nine are summed. The
  dilated gradient's convolution multiplies (stride^2 - 1) / stride^2 zeros; this
  does only the product's work. At Omniglot's stride 2 it ran 1.5-6x faster per
  gradient for 75 images, level for 5; at stride 1 it is 2x slower, so stride 1
  keeps the convolution (docs/performance.md, "The strided input gradient by taps").
  """
  batch, out_h, out_w, channels_out = grad.shape
  kh, kw, channels_in, _ = kernel.shape
  (low_h, high_h), (low_w, high_w) = padding
  padded_h, padded_w = x_shape[1] + low_h + high_h, x_shape[2] + low_w + high_w
  by_tap = lax.dot_general(  # [n*oh*ow, taps*in]
    grad.reshape(-1, channels_out),
    kernel.reshape(kh * kw * channels_in, channels_out),
    (((1,), (1,)), ((), ())),
  ).reshape(batch, out_h, out_w, kh * kw, channels_in)
  zero = jnp.zeros((), grad.dtype)
  d_padded = None
  for tap in range(kh * kw):
    i, j = divmod(tap, kw)
    window = lax.pad(  # tap (i, j)'s window: from (i, j) on, every `stride`-th pixel
      by_tap[:, :, :, tap],
      zero,
      (
        (0, 0, 0),
        (i, padded_h - i - (stride * (out_h - 1) + 1), stride - 1),
        (j, padded_w - j - (stride * (out_w - 1) + 1), stride - 1),
        (0, 0, 0),
      ),
    )
    d_padded = window if d_padded is None else d_padded + window
  return d_padded[:, low_h : low_h + x_shape[1], low_w : low_w + x_shape[2]]


def _input_gradient_backward(x_shape, stride, padding, residuals, cotangent):
  kernel, grad = residuals
  # <c, input_gradient(K, g)> = <conv2d(c, K), g>: the adjoint of the convolution.
  return (
    filter_gradient(cotangent, grad, kernel.shape, stride, padding),
    conv2d(cotangent, kernel, stride, padding),
  )


input_gradient.defvjp(_keeping_inputs(input_gradient), _input_gradient_backward)


conv2d.defvjp(_forward, _backward)
