"""What the loop-safe convolution's filter gradient costs a CPU meta-step (issue 62, item 5).

    python -m benchmarks.filter_gradient_cost                      # MAML, the five variants
    python -m benchmarks.filter_gradient_cost --variants default,concatenated --algorithms vampire

On a CPU, Conv4's convolution is `conv_impl="loop_safe"` (`vampire_jax.backend.conv2d`):
its filter gradient puts the nine kernel taps' strided slices of the padded
input side by side and takes one matrix product; a second-order meta-gradient differentiates it
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
  stacked       the filter gradient as the library computed it before `e6a3b7a` (the
                taps stacked in front of the pixels, one product, a transposed copy of
                the stack), differentiated by the library's rule (the same values to
                float rounding)

and prints `benchmarks.meta_step`'s row for each (a variant whose process failed: its
error, and the command exits with status 1 at the end), then the processor they ran on,
`processor: ...` (each row's `processor`, as `meta_step` records it). The difference
default - zero is what the filter gradient costs; autodiff - default is what the rules save.
It changes nothing in the library.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile

import jax.numpy as jnp

VARIANTS = ("default", "zero", "concatenated", "autodiff", "stacked")


@functools.lru_cache(maxsize=None)
def stacked_filter_gradient():
  """The library's filter gradient before `e6a3b7a`, its own gradient by the library's rule.

  The taps stacked in front of the pixels (`[taps, n, out_h, out_w, in]`) and one product
  contracting the pixels: XLA copies the stack transposed before it multiplies.
  """
  import jax

  from vampire_jax import backend

  @functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
  def filter_gradient(x, grad, kernel_shape, stride, padding):
    (low_h, high_h), (low_w, high_w) = padding
    padded = jnp.pad(x, ((0, 0), (low_h, high_h), (low_w, high_w), (0, 0)))
    taps = jnp.stack(backend.kernel_taps(padded, kernel_shape[:2], grad.shape[1:3], stride))
    return jnp.einsum("tnhwc,nhwd->tcd", taps, grad).reshape(kernel_shape)

  def forward(x, grad, kernel_shape, stride, padding):
    return filter_gradient(x, grad, kernel_shape, stride, padding), (x, grad)

  def backward(kernel_shape, stride, padding, residuals, cotangent):
    # The library's own rule: the pullback of `backend.filter_gradient` at the same inputs
    # (its value, unused, is dropped by XLA under jit).
    x, grad = residuals
    _, pullback = jax.vjp(
      lambda x, grad: backend.filter_gradient(x, grad, kernel_shape, stride, padding), x, grad
    )
    return pullback(cotangent)

  filter_gradient.defvjp(forward, backward)
  return filter_gradient


def concatenated_filter_gradient(stride: int, padding, x, kernel, grad):
  """`d kernel` of `backend.conv2d`, its taps concatenated on the channel axis."""
  from vampire_jax import backend

  (low_h, high_h), (low_w, high_w) = padding
  padded = jnp.pad(x, ((0, 0), (low_h, high_h), (low_w, high_w), (0, 0)))
  taps = backend.kernel_taps(padded, kernel.shape[:2], grad.shape[1:3], stride)
  taps = jnp.concatenate(taps, axis=-1)  # [n, out_h, out_w, kh * kw * in], as the kernel's rows
  rows = taps.shape[0] * taps.shape[1] * taps.shape[2]
  return (taps.reshape(rows, -1).T @ grad.reshape(rows, -1)).reshape(kernel.shape)


def use_variant(variant: str) -> None:
  """Replaces `backend.conv2d`'s backward in this process (not for `default`).

  The library's rule is `(input_gradient, filter_gradient)` of the inputs kept by the
  forward pass; a variant replaces one or both (`conv2d.defvjp` patches the library's own
  function, which `vj.Conv4(conv_impl="loop_safe")` calls).
  """
  from vampire_jax import backend

  def forward(x, kernel, stride, padding):  # the library's: its value, (x, kernel) kept
    return backend.conv2d(x, kernel, stride, padding), (x, kernel)

  def backward(stride, padding, residuals, grad):
    x, kernel = residuals
    if variant == "autodiff":  # the rules' functions, undecorated: autodiff differentiates them
      return (
        backend.input_gradient.fun(kernel, grad, x.shape, stride, padding),
        backend.filter_gradient.fun(x, grad, kernel.shape, stride, padding),
      )
    d_x = backend.input_gradient(kernel, grad, x.shape, stride, padding)
    if variant == "zero":  # what the filter gradient costs: none computed
      d_kernel = jnp.zeros_like(kernel)
    elif variant == "concatenated":
      d_kernel = concatenated_filter_gradient(stride, padding, x, kernel, grad)
    elif variant == "stacked":
      d_kernel = stacked_filter_gradient()(x, grad, kernel.shape, stride, padding)
    else:
      d_kernel = backend.filter_gradient(x, grad, kernel.shape, stride, padding)
    return d_x, d_kernel

  if variant != "default":
    backend.conv2d.defvjp(forward, backward)


def main(argv=None) -> list[dict]:
  """`benchmarks.meta_step`'s rows (the parent's: each with its `variant`)."""
  from benchmarks import arguments, suite

  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--algorithms", default="maml")
  parser.add_argument("--repeats", type=arguments.count(1), default=5)
  parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # the child
  parser.add_argument("--json", help=argparse.SUPPRESS)  # the child's rows, for the parent
  args = parser.parse_args(argv)
  from benchmarks import meta_step

  arguments.names(parser, "--algorithms", args.algorithms, meta_step.ALGORITHMS)
  args.repeats = str(args.repeats)  # passed on to meta_step's command line
  if args.one:
    use_variant(args.one)
    return meta_step.main(
      ["--algorithms", args.algorithms, "--repeats", args.repeats, "--json", args.json]
    )
  variants = [v.strip() for v in args.variants.split(",") if v.strip()]
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
  rows, failed = [], []
  with tempfile.TemporaryDirectory() as folder:
    for variant in variants:
      rows_path = os.path.join(folder, f"{variant}.json")
      command = [sys.executable, "-m", "benchmarks.filter_gradient_cost", "--one", variant]
      command += ["--algorithms", args.algorithms, "--repeats", args.repeats, "--json", rows_path]
      done = subprocess.run(command, capture_output=True, text=True)
      if done.returncode != 0:
        print(f"{variant}: failed\n{done.stderr[-2000:]}")
        failed.append(variant)
        continue
      with open(rows_path) as f:
        for row in json.load(f):  # meta_step's table row for it, the variant named first
          print(f"{variant:>12} {meta_step.format_table([row]).splitlines()[-1]}", flush=True)
          rows.append(dict(row, variant=variant))
  if rows:
    print(suite.processor_line(rows[0]["processor"]))
  if failed:  # the others' rows are printed: the exit status says the table is incomplete
    raise SystemExit(f"filter_gradient_cost: the variants {', '.join(failed)} failed (above)")
  return rows


if __name__ == "__main__":
  main()
