"""Times one training step in the paper's Omniglot 5-way 1-shot setting.

    python -m benchmarks.meta_step                       # MAML and VAMPIRE, backend default batching
    python -m benchmarks.meta_step --strategies vmap,host_chunked:4 --tasks 32 --json steps.json

Setting: Conv4-64 on 28x28x1, T tasks (default 32), 5 inner steps, L_t =
L_v = 1, second order, float32. The timed step is the training step: each
call draws its T tasks inside the step from per-task keys, out of random
uint8 class images (`make_train_step`, jitted with the state donated;
`make_host_chunked_train_step` for `host_chunked`). A chunk that does not
divide T becomes the largest divisor of T below it
(`vampire_jax.backend.task_batching`), so `--tasks 2` runs
`host_chunked:4` as `host_chunked:2`. The defaults are the library's: the
backend's task batching (`map` on a CPU, `vmap` elsewhere), the inner loop in
`lax.scan` (`--unroll-inner-steps` unrolls it) and `--conv-impl auto`
(`vampire_jax.backend.conv_impl`: `loop_safe` on a CPU unless nothing is
in a loop).

For each algorithm and task batching strategy it prints compile time (first
call), seconds per step, tasks per second, the process's peak resident
memory (CPU) or the device's peak memory (GPU; "n/a" if unknown), and the
peak resident memory while stepping: after the first call, once the compile's
freed memory went back to the system (`VAMPIRE_JAX_MEMORY_RELEASE=0`: not),
the peak of the timed steps, the quantity `benchmarks/authors_pytorch.py`
reports for PyTorch beside its process peak. Then a summary table; `--json
PATH` also writes the rows there.
"""

import argparse
import dataclasses
import json
from typing import Optional

import jax

from benchmarks import suite
from vampire_jax import backend

SETTING = suite.SETTINGS["omniglot_5w1s"]
# The algorithms this step times: `suite.make_learner`'s with Adam and the classifier network.
ALGORITHMS = ("maml", "vampire", "vampire2")


def resolve_strategies(spec: Optional[str], num_tasks: int) -> list[tuple[str, int]]:
  """`[(strategy, chunk)]` to time, each chunk fitted to `num_tasks`.

  Args:
    spec: comma list of STRATEGY[:CHUNK] (chunk 1 if not given), or None
      for the backend's choice (`map` on a CPU, `vmap` otherwise).
    num_tasks: T; every chunk becomes the largest divisor of T that is at
      most the one asked for.
  """
  if spec is None:
    return [backend.task_batching("auto", 0, num_tasks)]
  resolved = []
  for item in spec.split(","):
    name, _, chunk = item.strip().partition(":")
    resolved.append(backend.task_batching(name, int(chunk or 1), num_tasks))
  return resolved


def time_step(
  algorithm: str,
  strategy: str,
  chunk: int,
  num_tasks: int,
  repeats: int,
  unroll_steps: bool,
  conv_impl: str,
  second_order_steps: Optional[int] = None,
  fusion_emitters: str = "auto",
) -> dict:
  """Compiles and times the training step of one algorithm and task batching."""
  if conv_impl == "auto":
    conv_impl = backend.conv_impl(
      task_batching=strategy, inner_steps_unrolled=unroll_steps, draws_mapped=False
    )
  setting = dataclasses.replace(SETTING, tasks=num_tasks, conv_impl=conv_impl)
  apply_fn, params, nll = suite.network(setting)
  learner = suite.make_learner(
    setting,
    algorithm,
    apply_fn,
    nll,
    unroll_steps=unroll_steps,
    remat=False,
    second_order_steps=second_order_steps,
  )
  step, state, data, mesh = suite.train_step_as_a_run(
    setting,
    learner,
    params,
    strategy=strategy,
    chunk=chunk,
    fusion_emitters=fusion_emitters,
    input_size=suite.input_size(setting),
  )
  timed = suite.time_calls(step, state, data, jax.random.key(3), repeats)
  compile_s, step_s = timed.first_s, timed.call_s
  return {
    "algorithm": algorithm,
    "strategy": suite.batching_label(strategy, chunk, mesh),
    "tasks": num_tasks,
    "conv_impl": conv_impl,
    "inner_loop": "unrolled" if unroll_steps else "scan",
    "fusion_emitters": backend.fusion_emitters(fusion_emitters, suite.input_size(SETTING)),
    "compile_s": compile_s,
    "step_s": step_s,
    "tasks_per_s": num_tasks / step_s,
    "ms_per_task": 1000 * step_s / num_tasks,
    "peak_mb": suite.device_peak_mb(timed.memory.process),
    "stepping_peak_mb": timed.memory.stepping,
    "memory_release": backend.memory_release_enabled(),
    "processor": backend.processor_record(),
  }


def format_table(rows: list[dict]) -> str:
  """The rows as a markdown table."""
  lines = [
    "| algorithm | batching | compile (s) | s/step | tasks/s | ms/task | peak MB, process |"
    " peak MB, stepping |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['algorithm']} | {r['strategy']} | {r['compile_s']:.1f} | {r['step_s']:.3f} |"
      f" {r['tasks_per_s']:.1f} | {r['ms_per_task']:.1f} | {suite.fmt(r['peak_mb'], '.0f')} |"
      f" {suite.fmt(r['stepping_peak_mb'], '.0f')} |"
    )
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  from benchmarks import arguments

  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--algorithms", default="maml,vampire", help=f"comma list of {', '.join(ALGORITHMS)}"
  )
  parser.add_argument(
    "--strategies",
    default=None,
    help="comma list of STRATEGY[:CHUNK]; STRATEGY is host_chunked or one of "
    f"{backend.BATCHING_STRATEGIES}; default: the backend's choice",
  )
  parser.add_argument("--tasks", type=arguments.count(1), default=32)
  parser.add_argument("--repeats", type=arguments.count(1), default=3)
  parser.add_argument(
    "--unroll-inner-steps", action="store_true", help="unroll the inner loop instead of lax.scan"
  )
  parser.add_argument(
    "--conv-impl",
    default="auto",
    choices=("auto",) + backend.CONV_IMPLS,
    help="auto: the library's choice for each row's loop structure",
  )
  parser.add_argument(
    "--second-order-steps",
    type=arguments.count(0),
    default=None,
    help="differentiate the likelihood's gradient in the first K inner steps "
    "only (1: the authors' code); default: all",
  )
  parser.add_argument(
    "--cpu-fusion-emitters",
    default="auto",
    choices=("auto", "on", "off"),
    help="XLA:CPU's fusion emitters (auto: the processor's, as a run compiles with)",
  )
  parser.add_argument("--json", default=None, help="also write the rows to this file")
  args = parser.parse_args(argv)
  algorithms = arguments.names(parser, "--algorithms", args.algorithms, ALGORITHMS)
  try:
    strategies = resolve_strategies(args.strategies, args.tasks)
  except ValueError:  # a chunk that is not a count
    strategies = [("", 0)]
  known = ("host_chunked",) + tuple(backend.BATCHING_STRATEGIES)
  if any(strategy not in known for strategy, _ in strategies):
    parser.error(
      f"--strategies: {args.strategies!r} is not a comma list of STRATEGY[:CHUNK], STRATEGY "
      f"one of {', '.join(known)}"
    )

  print(
    f"{backend.describe_machine(backend.machine_identity())}, jax {jax.__version__},"
    f" Omniglot 5-way 1-shot, T={args.tasks}, 5 inner steps, L=1, second order"
    f" {'through all steps' if args.second_order_steps is None else f'through {args.second_order_steps} step(s)'},"
    f" inner loop {'unrolled' if args.unroll_inner_steps else 'scan'}, conv {args.conv_impl},"
    " XLA:CPU fusion emitters"
    f" {backend.fusion_emitters(args.cpu_fusion_emitters, suite.input_size(SETTING))},"
    " tasks sampled inside the step"
  )
  rows = []
  for algorithm in algorithms:
    for strategy, chunk in strategies:
      row = time_step(
        algorithm,
        strategy,
        chunk,
        args.tasks,
        args.repeats,
        args.unroll_inner_steps,
        args.conv_impl,
        args.second_order_steps,
        args.cpu_fusion_emitters,
      )
      rows.append(row)
      print(
        f"  {algorithm:8s} {row['strategy']:18s} compile {row['compile_s']:7.1f} s"
        f"  {row['step_s']:7.3f} s/step  {row['tasks_per_s']:7.1f} tasks/s"
        f"  {row['ms_per_task']:7.1f} ms/task  peak {suite.fmt(row['peak_mb'], '6.0f')} MB"
        f"  stepping {suite.fmt(row['stepping_peak_mb'], '6.0f')} MB",
        flush=True,
      )
  print("\n" + format_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == "__main__":
  main()
