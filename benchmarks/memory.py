"""Memory that remat (`jax.checkpoint` of each inner step) saves, mini-ImageNet-sized.

    python -m benchmarks.memory                  # 1-shot and 5-shot, MAML and VAMPIRE
    python -m benchmarks.memory --shots 1 --no-run
    python -m benchmarks.memory --algorithms vampire2,protonet --shots 1

Setting: Conv4-32 with max-pool on 84x84x3, 5-way, 15 queries per class,
T=2 tasks, S=5 inner steps, L_t = L_v = 10 weight draws for VAMPIRE (--mc-samples), second
order, float32, tasks vmapped and the inner loop in `lax.scan` (the GPU
path). For each algorithm, shots and remat off/on, in a fresh process: XLA's
`memory_analysis()` of the compiled meta-step (temporary, argument and output
bytes), XLA's FLOP count of the step (before optimisation, inner loop
unrolled, so remat's recomputation is counted), and, unless --no-run, the process's peak resident memory and the time
of one step after compiling (CPU: XLA:CPU allocates temporaries as it goes,
so peak RSS shows what is really used).
"""

import argparse
import concurrent.futures
import json
import multiprocessing
import resource
import time
from vampire_jax import backend


def _hlo_gflop(setting, algorithm, apply_fn, nll, remat, optimizer, state, tasks) -> float:
  # XLA's count before optimisation, of the step with its inner loop unrolled
  # (a loop body would count once): remat's recomputation shows up here.
  import jax
  import vampire_jax as vj
  from benchmarks import suite

  learner = suite.make_learner(setting, algorithm, apply_fn, nll, unroll_steps=True, remat=remat)
  step = jax.jit(vj.make_meta_step(learner, optimizer, task_batching="vmap"))
  lowered = step.lower(state, tasks, jax.random.key(3))
  flops = suite._flops(suite._analysis(lowered.cost_analysis))
  return None if flops is None else flops / 1e9


def _megabytes(memory, name: str):
  """A field of a memory analysis in MiB, or None where the backend gives no analysis."""
  value = getattr(memory, name, None) if memory is not None else None
  return None if value is None else value / 2**20


def measure(
  algorithm: str, shots: int, remat: bool, run: bool, unroll_steps: bool, mc_samples: int
) -> dict:
  """One row; call it in a fresh process so that peak RSS is its own."""
  import jax
  import vampire_jax as vj
  from benchmarks import suite

  setting = suite.dataclasses.replace(
    suite.SETTINGS["mini_imagenet_5w1s"], shots=shots, mc_samples=mc_samples
  )
  apply_fn, params, nll = suite.network(setting, algorithm)
  learner = suite.make_learner(
    setting, algorithm, apply_fn, nll, unroll_steps=unroll_steps, remat=remat
  )
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=setting.tasks)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  tasks = suite.random_tasks(setting, jax.random.key(2), setting.tasks)
  step = jax.jit(vj.make_meta_step(learner, optimizer, task_batching="vmap"))
  start = time.perf_counter()
  compiled = step.lower(state, tasks, jax.random.key(3)).compile()
  compile_s = time.perf_counter() - start
  memory = suite._analysis(compiled.memory_analysis)
  row = {
    "algorithm": algorithm,
    "shots": shots,
    "remat": remat,
    "L": setting.mc_samples if algorithm in ("vampire", "vampire2") else 1,
    "compile_s": compile_s,
    "temp_mb": _megabytes(memory, "temp_size_in_bytes"),
    "argument_mb": _megabytes(memory, "argument_size_in_bytes"),
    "output_mb": _megabytes(memory, "output_size_in_bytes"),
    "hlo_gflop": _hlo_gflop(setting, algorithm, apply_fn, nll, remat, optimizer, state, tasks),
    "processor": backend.processor_record(),
  }
  if run:
    jax.block_until_ready(compiled(state, tasks, jax.random.key(3)))  # warm-up
    start = time.perf_counter()
    jax.block_until_ready(compiled(state, tasks, jax.random.key(4)))
    row["step_s"] = time.perf_counter() - start
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  return row


# The algorithms it measures: `suite.make_learner`'s that train with Adam (not SImPa).
ALGORITHMS = ("maml", "vampire", "vampire2", "protonet")


def main(argv=None) -> list[dict]:
  from benchmarks import arguments

  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--algorithms", default="maml,vampire", help=f"comma list of {', '.join(ALGORITHMS)}"
  )
  parser.add_argument("--shots", type=arguments.counts(1), default="1,5")
  parser.add_argument("--no-run", action="store_true", help="compile only: XLA's analysis")
  parser.add_argument("--mc-samples", type=arguments.count(1), default=10, help="L for VAMPIRE")
  parser.add_argument(
    "--unroll-inner-steps",
    action="store_true",
    help="unroll the inner loop (the CPU path) instead of lax.scan",
  )
  parser.add_argument("--json", default=None, help="also write the rows to this file")
  args = parser.parse_args(argv)
  algorithms = arguments.names(parser, "--algorithms", args.algorithms, ALGORITHMS)
  import jax

  from benchmarks import suite

  print(
    f"{backend.describe_machine(backend.machine_identity())}, jax {jax.__version__};"
    " Conv4-32, 84x84x3, 5-way,"
    f" T=2, S=5, L={args.mc_samples} (VAMPIRE), inner loop"
    f" {'unrolled' if args.unroll_inner_steps else 'scan'}",
    flush=True,
  )
  rows = []
  context = multiprocessing.get_context("spawn")
  for algorithm in algorithms:
    for shots in args.shots:
      for remat in (False, True):
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
          row = pool.submit(
            measure,
            algorithm,
            shots,
            remat,
            not args.no_run,
            args.unroll_inner_steps,
            args.mc_samples,
          ).result()
        rows.append(row)
        print(
          f"  {algorithm:8s} {shots}-shot remat {str(remat):5s}"
          f"  temp {suite.fmt(row['temp_mb'], '8.1f')} MB"
          f"  args {suite.fmt(row['argument_mb'], '6.1f')} MB"
          f"  out {suite.fmt(row['output_mb'], '6.1f')} MB"
          f"  {suite.fmt(row['hlo_gflop'], '7.1f')} GFLOP  compile {row['compile_s']:6.1f} s"
          + (
            f"  step {row['step_s']:6.2f} s  peak RSS {row['peak_rss_mb']:7.0f} MB"
            if "step_s" in row
            else ""
          ),
          flush=True,
        )

  print(
    "\n| algorithm | shots | L | remat | XLA temp MB | XLA args+out MB | HLO GFLOP/step |"
    " step (s) | peak RSS MB |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    inputs_outputs = (
      None
      if r["argument_mb"] is None or r["output_mb"] is None
      else r["argument_mb"] + r["output_mb"]
    )
    print(
      f"| {r['algorithm']} | {r['shots']} | {r['L']} | {'on' if r['remat'] else 'off'} |"
      f" {suite.fmt(r['temp_mb'], '.1f')} | {suite.fmt(inputs_outputs, '.1f')} |"
      f" {suite.fmt(r['hlo_gflop'], '.1f')} | {suite.fmt(r.get('step_s'), '.2f')} |"
      f" {suite.fmt(r.get('peak_rss_mb'), '.0f')} |"
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == "__main__":
  main()
