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
                   strided, times the output gradient: the taps stacked, one
                   matrix product;
  d input        = a stride-1, unpadded forward convolution (`conv2d` again)
                   of the output gradient, dilated by the stride and padded by
                   the kernel size less one, with the kernel flipped and its
                   channels swapped.

Every gradient is built from `conv2d`, slices, pads and matrix products, so
the gradient of the gradient (the meta-gradient's second-order terms) is too.
The values equal XLA's up to float rounding, tested to the third derivative
(`tests/test_convolution.py`).

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


def _forward(x, kernel, stride, padding):
  return conv2d(x, kernel, stride, padding), (x, kernel)


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
  kh, kw = kernel.shape[:2]
  (low_h, high_h), (low_w, high_w) = padding
  padded = jnp.pad(x, ((0, 0), (low_h, high_h), (low_w, high_w), (0, 0)))
  out_h, out_w = grad.shape[1:3]
  taps = jnp.stack(kernel_taps(padded, (kh, kw), (out_h, out_w), stride))  # [kh*kw, n, oh, ow, in]
  # One matrix product for all taps. Nine products stacked (one per tap) gave a wrong
  # second-order meta-gradient under jit on XLA:CPU (its algebraic simplifier; correct
  # op by op): tests/test_convolution.py, `test_loop_safe_conv4_equals_xla_conv4`.
  d_kernel = jnp.einsum("tnhwc,nhwd->tcd", taps, grad).reshape(kernel.shape)
  # Full correlation of the stride-dilated gradient with the flipped kernel.
  dilated = lax.pad(
    grad,
    jnp.zeros((), grad.dtype),
    ((0, 0, 0), (kh - 1, kh - 1, stride - 1), (kw - 1, kw - 1, stride - 1), (0, 0, 0)),
  )
  flipped = jnp.flip(kernel, (0, 1)).swapaxes(2, 3)
  d_padded = conv2d(dilated, flipped, 1, ((0, 0), (0, 0)))
  # Padded rows past the last window get no gradient; then drop the padding.
  d_padded = jnp.pad(
    d_padded,
    (
      (0, 0),
      (0, padded.shape[1] - d_padded.shape[1]),
      (0, padded.shape[2] - d_padded.shape[2]),
      (0, 0),
    ),
  )
  d_x = d_padded[:, low_h : low_h + x.shape[1], low_w : low_w + x.shape[2]]
  return d_x, d_kernel


conv2d.defvjp(_forward, _backward)
