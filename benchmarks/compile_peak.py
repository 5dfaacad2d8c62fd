"""What the compile of the Omniglot training step holds at its peak (issue 62, item 4).

    python -m benchmarks.compile_peak --algorithm vampire --second-order-steps 1
    python -m benchmarks.compile_peak --algorithm maml --inner-steps 2 --tasks 4
    python -m benchmarks.compile_peak --algorithm vampire --order first --mc-samples 2 --eval

One row, in this process: run each setting in a fresh process (the peaks are the
process's). Setting: `benchmarks.meta_step`'s, Conv4-64 on 28x28x1, 5-way 1-shot, 15
queries per class, the backend's task batching and convolutions, the inner loop in
`lax.scan` (`--unroll-inner-steps`: unrolled), T tasks drawn inside the step; one driver at a time is changed by the flags.
Phases, each with the peak resident memory reset before it (Linux `VmHWM`,
`suite.reset_peak_rss`): tracing and lowering (`jax.jit(step).lower`), XLA's compile
(`.compile()`), then the compile's freed memory given back (`backend.release_freed_memory`),
then stepping (`--repeats` calls of the compiled step). With `--eval` the run's evaluator
(`make_classification_evaluator`, the test learner's `--eval-mc-samples` draws on
`--eval-tasks` tasks) is lowered and compiled after that, as a run does at its first
validation. Beside each peak: the compiled program's size (lines of its optimised HLO,
`compiled.as_text()`) and XLA's `memory_analysis()` (temporary bytes), so a row says
whether the compile's peak follows the program or its buffers. `--json PATH` writes the
row there too.
"""

import argparse
import dataclasses
import json
import time
from typing import Optional

from vampire_jax import backend

ORDERS = ("second", "truncated", "first")  # all steps, --second-order-steps, first order


def _rss_mb() -> Optional[float]:
  """The process's resident memory now, MB (Linux `VmRSS`)."""
  from benchmarks import suite

  kib = suite._status_kib("VmRSS")
  return None if kib is None else kib / 1024


def _phase(fn) -> tuple[object, float, Optional[float], Optional[float]]:
  """`(fn(), seconds, peak MB during fn, resident MB after)`; the peak is reset first."""
  from benchmarks import suite

  suite.reset_peak_rss()
  start = time.perf_counter()
  out = fn()
  seconds = time.perf_counter() - start
  return out, seconds, suite.peak_rss_mb(), _rss_mb()


def _program(lowered, compiled) -> dict:
  """The size of a compiled program: its HLO, before and after XLA optimised it."""
  from benchmarks import suite

  optimised = compiled.as_text()
  memory = suite._analysis(compiled.memory_analysis)

  def mb(name):
    value = getattr(memory, name, None) if memory is not None else None
    return None if value is None else value / 2**20

  return {
    "stablehlo_lines": len(lowered.as_text().splitlines()),
    "hlo_lines": len(optimised.splitlines()),
    "hlo_instructions": sum(" = " in line for line in optimised.splitlines()),
    "temp_mb": mb("temp_size_in_bytes"),
    "argument_mb": mb("argument_size_in_bytes"),
    "output_mb": mb("output_size_in_bytes"),
    "generated_code_mb": mb("generated_code_size_in_bytes"),
  }


def measure(
  algorithm: str,
  inner_steps: int,
  order: str,
  second_order_steps: int,
  tasks: int,
  mc_samples: int,
  repeats: int,
  evaluate: bool,
  eval_tasks: int,
  eval_mc_samples: int,
  unroll_steps: bool = False,
) -> dict:
  """One row: the train step's (and with `evaluate` the evaluator's) phases, in this process."""
  import jax

  import vampire_jax as vj
  from benchmarks import meta_step, suite

  strategy, chunk = backend.task_batching("auto", 0, tasks)
  conv_impl = backend.conv_impl(
    task_batching=strategy, inner_steps_unrolled=unroll_steps, draws_mapped=False
  )
  setting = dataclasses.replace(
    meta_step.SETTING,
    tasks=tasks,
    mc_samples=mc_samples,
    inner_steps=inner_steps,
    conv_impl=conv_impl,
  )
  apply_fn, params, nll = suite.network(setting)
  learner = suite.make_learner(
    setting,
    algorithm,
    apply_fn,
    nll,
    unroll_steps=unroll_steps,
    remat=False,
    second_order_steps=second_order_steps if order == "truncated" else None,
    first_order=order == "first",
  )
  step, state, data, mesh = suite.train_step_as_a_run(
    setting, learner, params, strategy=strategy, chunk=chunk
  )
  row = {
    "algorithm": algorithm,
    "inner_steps": inner_steps,
    "order": order if order != "truncated" else f"second through {second_order_steps}",
    "tasks": tasks,
    "L": mc_samples if algorithm != "maml" else 1,
    "inner_loop": "unrolled" if unroll_steps else "scan",
    "batching": suite.batching_label(strategy, chunk, mesh),
    "conv_impl": conv_impl,
    "memory_release": backend.memory_release_enabled(),
    "before_mb": _rss_mb(),
  }
  key = jax.random.key(3)
  lowered, row["lower_s"], row["lower_peak_mb"], _ = _phase(lambda: step.lower(state, data, key))
  compiled, row["compile_s"], row["compile_peak_mb"], row["after_compile_mb"] = _phase(
    lowered.compile
  )
  backend.release_freed_memory()
  row["after_release_mb"] = _rss_mb()
  row.update(_program(lowered, compiled))
  del lowered  # the program's text is not kept alive into stepping

  def steps():
    current = state
    for _ in range(1 + repeats):  # the first call runs the program once before the timed ones
      current, metrics = compiled(current, data, key)
    return jax.block_until_ready((current, metrics))

  (state, _), row["step_s"], row["stepping_peak_mb"], _ = _phase(steps)
  row["step_s"] /= 1 + repeats
  if evaluate:
    test_setting = dataclasses.replace(setting, mc_samples=eval_mc_samples)
    test_learner = suite.make_learner(
      test_setting, algorithm, apply_fn, nll, unroll_steps=unroll_steps, remat=False
    )
    eval_strategy, eval_chunk = backend.task_batching("auto", 0, eval_tasks)
    evaluator = jax.jit(
      vj.make_classification_evaluator(
        test_learner, task_batching=eval_strategy, chunk_size=eval_chunk
      )
    )
    eval_batch = suite.random_tasks(setting, jax.random.key(4), eval_tasks)
    eval_keys = jax.random.key(5)
    eval_lowered, _, row["eval_lower_peak_mb"], _ = _phase(
      lambda: evaluator.lower(state.meta_params, eval_batch, eval_keys)
    )
    eval_compiled, row["eval_compile_s"], row["eval_compile_peak_mb"], _ = _phase(
      eval_lowered.compile
    )
    backend.release_freed_memory()
    row["eval_program"] = _program(eval_lowered, eval_compiled)
    del eval_lowered
    _, _, row["eval_peak_mb"], _ = _phase(
      lambda: jax.block_until_ready(eval_compiled(state.meta_params, eval_batch, eval_keys))
    )
    row["eval_L"] = eval_mc_samples if algorithm != "maml" else 1
    row["after_eval_mb"] = _rss_mb()
  row["process_peak_mb"] = max(v for k, v in row.items() if k.endswith("peak_mb") and v is not None)
  row["processor"] = backend.processor_record()
  return row


def main(argv=None) -> dict:
  from benchmarks import arguments

  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core, as benchmarks.meta_step
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--algorithm", default="vampire", choices=("maml", "vampire"))
  parser.add_argument("--inner-steps", type=arguments.count(0), default=5, help="S")
  parser.add_argument(
    "--order",
    default=None,
    choices=ORDERS,
    help="second: every inner step at second order; truncated: the first "
    "--second-order-steps only; first: first order (default: truncated if "
    "--second-order-steps is given, else second)",
  )
  parser.add_argument(
    "--second-order-steps",
    type=arguments.count(0),
    default=None,
    help="1: the authors' code's truncation",
  )
  parser.add_argument("--tasks", type=arguments.count(1), default=32, help="T")
  parser.add_argument(
    "--mc-samples", type=arguments.count(1), default=1, help="L_t = L_v (VAMPIRE)"
  )
  parser.add_argument(
    "--unroll-inner-steps", action="store_true", help="unroll the inner loop instead of lax.scan"
  )
  parser.add_argument("--repeats", type=arguments.count(0), default=2, help="steps after the first")
  parser.add_argument("--eval", action="store_true", help="also compile the evaluator after")
  parser.add_argument("--eval-tasks", type=arguments.count(1), default=20, help="eval_batch_tasks")
  parser.add_argument(
    "--eval-mc-samples", type=arguments.count(1), default=10, help="num_mc_test (VAMPIRE)"
  )
  parser.add_argument("--json", default=None, help="also write the row to this file")
  args = parser.parse_args(argv)
  order = args.order or ("second" if args.second_order_steps is None else "truncated")
  if order == "truncated" and args.second_order_steps is None:
    parser.error("--order truncated needs --second-order-steps")
  row = measure(
    args.algorithm,
    args.inner_steps,
    order,
    args.second_order_steps or 0,
    args.tasks,
    args.mc_samples,
    args.repeats,
    args.eval,
    args.eval_tasks,
    args.eval_mc_samples,
    args.unroll_inner_steps,
  )
  for name, value in row.items():
    print(f"{name:20s} {value:.1f}" if isinstance(value, float) else f"{name:20s} {value}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(row, f, indent=2)
  return row


if __name__ == "__main__":
  main()
