"""What the loop-safe convolution's filter gradient costs a CPU meta-step (issue 62, item 5).

    python -m benchmarks.filter_gradient_cost                      # MAML, the three variants
    python -m benchmarks.filter_gradient_cost --variants default,concatenated --algorithms vampire

On a CPU, Conv4's convolution is `conv_impl="loop_safe"` (`vampire_jax/_src/core/
convolution.py`): its filter gradient stacks the nine kernel taps' strided slices of the
padded input and takes one matrix product, and a second-order meta-gradient differentiates
that again. `benchmarks.profile_step` charges those operations 43-48 % of the traced MAML
step, but tracing slows XLA:CPU about 5x; this measures the cost untraced, by removal. Each
variant runs `benchmarks.meta_step` in a fresh process with `conv2d`'s backward replaced:

  default       the library's, unchanged
  zero          the filter gradient replaced by zeros (WRONG numbers: a cost, not a run)
  concatenated  the taps concatenated on the channel axis, then one [9c, NHW] @ [NHW, d]
                product (the same values to float rounding, second order included)

and prints `benchmarks.meta_step`'s row for each. The difference default - zero is what
the filter gradient costs. It changes nothing in the library.
"""

import argparse
import subprocess
import sys

import jax.numpy as jnp
from jax import lax

VARIANTS = ("default", "zero", "concatenated")


def concatenated_filter_gradient(stride: int, padding, x, kernel, grad):
  """`d kernel` of `convolution.conv2d`, its taps concatenated on the channel axis."""
  kh, kw = kernel.shape[:2]
  (low_h, high_h), (low_w, high_w) = padding
  padded = jnp.pad(x, ((0, 0), (low_h, high_h), (low_w, high_w), (0, 0)))
  out_h, out_w = grad.shape[1:3]
  limit = (padded.shape[0], 0, 0, padded.shape[3])
  taps = jnp.concatenate(
    [
      lax.slice(
        padded,
        (0, i, j, 0),
        (limit[0], i + (out_h - 1) * stride + 1, j + (out_w - 1) * stride + 1, limit[3]),
        (1, stride, stride, 1),
      )
      for i in range(kh)
      for j in range(kw)
    ],
    axis=-1,
  )  # [n, out_h, out_w, kh * kw * in], tap-major as the kernel's [kh, kw, in] flattened
  rows = taps.shape[0] * out_h * out_w
  return (taps.reshape(rows, -1).T @ grad.reshape(rows, -1)).reshape(kernel.shape)


def use_variant(variant: str) -> None:
  """Replaces `convolution.conv2d`'s backward in this process (not for `default`)."""
  from vampire_jax._src.core import convolution

  library_backward = convolution._backward

  def backward(stride, padding, residuals, grad):
    x, kernel = residuals
    d_x, d_kernel = library_backward(stride, padding, residuals, grad)
    if variant == "zero":  # XLA drops the unused filter gradient as dead code
      d_kernel = jnp.zeros_like(kernel)
    elif variant == "concatenated":
      d_kernel = concatenated_filter_gradient(stride, padding, x, kernel, grad)
    return d_x, d_kernel

  if variant != "default":
    convolution.conv2d.defvjp(convolution._forward, backward)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--algorithms", default="maml")
  parser.add_argument("--repeats", default="5")
  parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # the child
  args = parser.parse_args(argv)
  meta_step_args = ["--algorithms", args.algorithms, "--repeats", args.repeats]
  if args.one:
    use_variant(args.one)
    from benchmarks import meta_step

    meta_step.main(meta_step_args)
    return
  variants = [v.strip() for v in args.variants.split(",") if v.strip()]
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
  for variant in variants:
    command = [sys.executable, "-m", "benchmarks.filter_gradient_cost", "--one", variant]
    done = subprocess.run(
      command + ["--algorithms", args.algorithms, "--repeats", args.repeats],
      capture_output=True,
      text=True,
    )
    rows = [
      line for line in done.stdout.splitlines() if line.startswith("|") and "s/step" not in line
    ]
    rows = [row for row in rows if not set(row) <= set("|-")]
    if done.returncode != 0:
      print(f"{variant}: failed\n{done.stderr[-2000:]}")
      continue
    for row in rows:
      print(f"{variant:>12} {row}", flush=True)


if __name__ == "__main__":
  main()
