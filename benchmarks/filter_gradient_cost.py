"""What the loop-safe convolution's filter gradient costs a CPU meta-step (issue 62, item 5).

    python -m benchmarks.filter_gradient_cost                      # MAML, the four variants
    python -m benchmarks.filter_gradient_cost --variants default,concatenated --algorithms vampire

On a CPU, Conv4's convolution is `conv_impl="loop_safe"` (`vampire_jax/_src/core/
convolution.py`): its filter gradient stacks the nine kernel taps' strided slices of the
padded input and takes one matrix product; a second-order meta-gradient differentiates it
by its own rule (a forward convolution and an input gradient). `benchmarks.profile_step`
charged the filter gradient 43-48 % of the traced MAML step when autodiff differentiated
the taps, but tracing slows XLA:CPU about 5x; this measures the cost untraced, by removal.
Each variant runs `benchmarks.meta_step` in a fresh process with `conv2d`'s backward
replaced:

  default       the library's, unchanged
  zero          the filter gradient replaced by zeros (WRONG numbers: a cost, not a run)
  concatenated  the taps concatenated on the channel axis, then one [9c, NHW] @ [NHW, d]
                product, differentiated by autodiff (the same values to float rounding,
                second order included)
  autodiff      both gradients differentiated by autodiff, not by their rules: the
                library before issue 62's rules (the same values to float rounding)

and prints `benchmarks.meta_step`'s row for each. The difference default - zero is what
the filter gradient costs; autodiff - default is what the rules save. It changes nothing
in the library.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import jax.numpy as jnp

VARIANTS = ("default", "zero", "concatenated", "autodiff")


def concatenated_filter_gradient(stride: int, padding, x, kernel, grad):
  """`d kernel` of `convolution.conv2d`, its taps concatenated on the channel axis."""
  from vampire_jax._src.core import convolution

  (low_h, high_h), (low_w, high_w) = padding
  padded = jnp.pad(x, ((0, 0), (low_h, high_h), (low_w, high_w), (0, 0)))
  taps = convolution.kernel_taps(padded, kernel.shape[:2], grad.shape[1:3], stride)
  taps = jnp.concatenate(taps, axis=-1)  # [n, out_h, out_w, kh * kw * in], as the kernel's rows
  rows = taps.shape[0] * taps.shape[1] * taps.shape[2]
  return (taps.reshape(rows, -1).T @ grad.reshape(rows, -1)).reshape(kernel.shape)


def use_variant(variant: str) -> None:
  """Replaces `convolution.conv2d`'s backward in this process (not for `default`)."""
  from vampire_jax._src.core import convolution

  library_backward = convolution._backward

  def backward(stride, padding, residuals, grad):
    x, kernel = residuals
    if variant == "autodiff":  # the rules' functions, undecorated: autodiff differentiates them
      return (
        convolution.input_gradient.fun(kernel, grad, x.shape, stride, padding),
        convolution.filter_gradient.fun(x, grad, kernel.shape, stride, padding),
      )
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
  parser.add_argument("--json", help=argparse.SUPPRESS)  # the child's rows, for the parent
  args = parser.parse_args(argv)
  from benchmarks import meta_step

  if args.one:
    use_variant(args.one)
    meta_step.main(
      ["--algorithms", args.algorithms, "--repeats", args.repeats, "--json", args.json]
    )
    return
  variants = [v.strip() for v in args.variants.split(",") if v.strip()]
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
  with tempfile.TemporaryDirectory() as folder:
    for variant in variants:
      rows_path = os.path.join(folder, f"{variant}.json")
      command = [sys.executable, "-m", "benchmarks.filter_gradient_cost", "--one", variant]
      command += ["--algorithms", args.algorithms, "--repeats", args.repeats, "--json", rows_path]
      done = subprocess.run(command, capture_output=True, text=True)
      if done.returncode != 0:
        print(f"{variant}: failed\n{done.stderr[-2000:]}")
        continue
      with open(rows_path) as f:
        for row in json.load(f):  # meta_step's table row for it, the variant named first
          print(f"{variant:>12} {meta_step.format_table([row]).splitlines()[-1]}", flush=True)


if __name__ == "__main__":
  main()
