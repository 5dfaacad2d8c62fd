"""bfloat16 mixed precision against float32: a short training run's accuracy.

    python -m benchmarks.precision                        # regression 'quick' preset, both methods
    python -m benchmarks.precision --algorithms vampire --kl-weight 0.1

Runs `experiments.regression` (sine/line tasks, MLP 1-100-100-100-1) once
with `compute_dtype='float32'` and once with 'bfloat16' (the network's
matmuls in bfloat16; weight distributions, KL and likelihood in float32),
same seed and tasks, and prints test MSE +- 95% CI, NLL and the training
wall time of each, then the processor they ran on, `processor: ...` (each
method's result carries it as `processor`: `vampire_jax.backend.processor_record()`).
For speed see `python -m benchmarks.suite --compute-dtype bfloat16`.
"""

import argparse
import tempfile
from pathlib import Path

from benchmarks import suite
from vampire_jax import backend


def main(argv=None) -> dict:
  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--preset", default="quick")
  parser.add_argument("--algorithms", default="maml,vampire")
  parser.add_argument("--num-meta-steps", type=int, default=None)
  parser.add_argument(
    "--kl-weight",
    type=float,
    default=None,
    help="VAMPIRE's beta (the preset's 1.0 makes its inner loop oscillate at"
    " initialisation; 0.1 is stable)",
  )
  parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
  args = parser.parse_args(argv)
  from experiments import regression

  workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vj_precision_"))
  algorithms = args.algorithms.split(",")
  processor = backend.processor_record()
  results = {}
  for dtype in ("float32", "bfloat16"):
    overrides = {"compute_dtype": dtype}
    if args.kl_weight is not None:
      overrides["kl_weight"] = args.kl_weight
    if args.num_meta_steps:
      overrides.update(
        num_meta_steps=args.num_meta_steps,
        eval_every=args.num_meta_steps,
        checkpoint_every=args.num_meta_steps,
      )
    combined = regression.run(
      algorithms, args.preset, workdir / dtype, overrides=overrides, progress=False
    )
    methods = combined["methods"].items()
    results[dtype] = {name: dict(method, processor=processor) for name, method in methods}

  print(f"\nregression preset {args.preset!r}, results in {workdir}\n")
  print("| algorithm | compute dtype | test MSE +- 95% CI | test NLL | tasks | train time (s) |")
  print("|---|---|---|---|---|---|")
  for algorithm in algorithms:
    for dtype in ("float32", "bfloat16"):
      m = results[dtype][algorithm]
      print(
        f"| {algorithm} | {dtype} | {m['mse']:.3f} +- {m['mse_ci95']:.3f} | {m['nll']:.3f} |"
        f" {m['num_tasks']} | {m['wall_time_s']['train']:.0f} |"
      )
  print(suite.processor_line(processor))
  return results


if __name__ == "__main__":
  main()
