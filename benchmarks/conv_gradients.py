"""Times convolution and max-pool gradients at the top level of a program and inside a loop.

    python -m benchmarks.conv_gradients
    python -m benchmarks.conv_gradients --shape 75,84,84,32 --repeats 5

XLA:CPU runs the gradient convolutions of `lax.conv_general_dilated` many
times slower inside a `lax.scan` / `lax.map` body than at the top level of a
program; `backend.conv2d` (`conv_impl="loop_safe"`) builds its
gradients from forward convolutions and matrix products, which keep their
speed in loops. This prints, for one 3x3 'SAME' convolution layer of the
given input shape (NHWC; default: a mini-ImageNet query batch after the
first pool), the input and filter gradients of both implementations, and
the gradient of a 2x2 max-pool, once at the top level and once per trip of
a 3-trip `lax.scan`; then the processor it ran on, `processor: ...` (each row's
`processor`: `vampire_jax.backend.processor_record()`).
"""

import argparse
import time

import flax.linen as nn
import jax
from jax import lax

from benchmarks import suite
from vampire_jax import backend


def _milliseconds(fn, args, trips: int, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    jax.block_until_ready(fn(*args))
  return (time.perf_counter() - start) / (repeats * trips) * 1000


def _top_and_loop(grad_fn, args, repeats: int) -> tuple[float, float]:
  """ms per call of `grad_fn(*args)`: jitted alone, and per trip of a 3-trip scan."""
  trips = 3

  def looped(*args):
    # The carry enters the inputs so that the body is not hoisted out of the loop.
    body = lambda carry, _: (carry, grad_fn(args[0] + carry * 0, *args[1:]))  # noqa: E731
    return lax.scan(body, 0.0, None, length=trips)[1]

  return (
    _milliseconds(jax.jit(grad_fn), args, 1, repeats),
    _milliseconds(jax.jit(looped), args, trips, repeats),
  )


def measure(shape: tuple[int, int, int, int], features: int, repeats: int) -> list[dict]:
  """Rows `{operation, top_ms, loop_ms}` for one layer of input `shape`."""
  x = jax.random.normal(jax.random.key(0), shape)
  kernel = jax.random.normal(jax.random.key(1), (3, 3, shape[-1], features))
  padding = backend.same_padding(shape[1], shape[2], (3, 3), 1)
  convs = {
    "xla": lambda x, k: lax.conv_general_dilated(
      x, k, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    ),
    "loop_safe": lambda x, k: backend.conv2d(x, k, 1, padding),
  }
  out_grad = jax.random.normal(jax.random.key(2), shape[:3] + (features,))
  rows = []
  for name, conv in convs.items():
    for which, index in (("input", 0), ("filter", 1)):
      grad_fn = lambda x, k, g, conv=conv, index=index: jax.vjp(conv, x, k)[1](g)[index]  # noqa: E731
      top, loop = _top_and_loop(grad_fn, (x, kernel, out_grad), repeats)
      rows.append({"operation": f"{name} conv, {which} gradient", "top_ms": top, "loop_ms": loop})
  pool = lambda x: nn.max_pool(x, (2, 2), strides=(2, 2))  # noqa: E731
  pooled_grad = jax.random.normal(jax.random.key(3), pool(x).shape)
  top, loop = _top_and_loop(lambda x, g: jax.vjp(pool, x)[1](g)[0], (x, pooled_grad), repeats)
  rows.append({"operation": "2x2 max-pool gradient", "top_ms": top, "loop_ms": loop})
  return rows


def main(argv=None) -> list[dict]:
  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--shape", default="75,42,42,32", help="N,H,W,C of the layer's input")
  parser.add_argument("--features", type=int, default=32, help="output channels")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  shape = tuple(int(v) for v in args.shape.split(","))
  if len(shape) != 4 or min(shape) < 1:
    parser.error(f"--shape takes four positive sizes N,H,W,C, got {args.shape!r}")
  processor = backend.processor_record()
  rows = [dict(row, processor=processor) for row in measure(shape, args.features, args.repeats)]
  print(
    f"backend {jax.default_backend()}, jax {jax.__version__}, input {shape}, "
    f"{args.features} filters\n"
  )
  print("| operation | top level (ms) | inside a scan (ms per trip) |\n|---|---|---|")
  for row in rows:
    print(f"| {row['operation']} | {row['top_ms']:.1f} | {row['loop_ms']:.1f} |")
  print(suite.processor_line(processor))
  return rows


if __name__ == "__main__":
  main()
