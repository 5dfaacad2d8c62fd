"""Times one meta-step in the paper's Omniglot 5-way 1-shot setting.

    python -m benchmarks.meta_step                       # MAML and VAMPIRE, backend default batching
    python -m benchmarks.meta_step --strategies vmap,host_chunked:4 --tasks 32

Setting: Conv4-64 on 28x28x1, T tasks (default 32), 5 inner steps, L_t =
L_v = 1, second order, float32, random inputs. For each algorithm and task
batching strategy it prints compile time (first call), seconds per step,
tasks per second and the process's peak resident memory (CPU) or the
device's peak memory (GPU), then a summary table.
"""

import argparse
import resource
import time

import jax
import jax.numpy as jnp

import vampire_jax as vj


def _random_tasks(key, num_tasks, ways=5, shots=1, query=15):
  k = jax.random.split(key, 4)
  return vj.Task(
      jax.random.uniform(k[0], (num_tasks, ways * shots, 28, 28, 1)),
      jax.random.randint(k[1], (num_tasks, ways * shots), 0, ways),
      jax.random.uniform(k[2], (num_tasks, ways * query, 28, 28, 1)),
      jax.random.randint(k[3], (num_tasks, ways * query), 0, ways))


def peak_memory_mb() -> float:
  """Peak device memory (GPU) or the process's peak resident memory (CPU), in MB."""
  stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
  if stats and "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"] / 2**20
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def build_step(learner, optimizer, strategy: str, chunk: int):
  if strategy == "host_chunked":
    return vj.make_host_chunked_meta_step(learner, optimizer, chunk_size=chunk)
  return jax.jit(vj.make_meta_step(learner, optimizer, task_batching=strategy, chunk_size=chunk))


def time_step(algorithm: str, strategy: str, chunk: int, num_tasks: int, repeats: int,
              unroll_steps: bool, conv_impl: str) -> dict:
  model = vj.Conv4(num_classes=5, num_filters=64, conv_impl=conv_impl)
  apply_fn = vj.pure_apply(model)
  params = vj.init_params(model, jax.random.key(0), (1, 28, 28, 1))
  if algorithm == "maml":
    learner = vj.maml(apply_fn, vj.categorical_nll, num_inner_steps=5, inner_lr=0.1,
                      unroll_steps=unroll_steps)
  else:
    learner = vj.vampire(apply_fn, vj.categorical_nll, num_inner_steps=5, inner_lr=0.1,
                         kl_weight=0.1, num_mc_train=1, num_mc_query=1, unroll_steps=unroll_steps)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=num_tasks)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  tasks = _random_tasks(jax.random.key(2), num_tasks)
  step = build_step(learner, optimizer, strategy, chunk)

  start = time.perf_counter()
  state, metrics = step(state, tasks, jax.random.key(3))
  jax.block_until_ready((state, metrics))
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  for i in range(repeats):
    state, metrics = step(state, tasks, jax.random.key(4 + i))
  jax.block_until_ready((state, metrics))
  step_s = (time.perf_counter() - start) / repeats
  return {"algorithm": algorithm, "strategy": f"{strategy}:{chunk}", "tasks": num_tasks,
          "compile_s": compile_s, "step_s": step_s, "tasks_per_s": num_tasks / step_s,
          "ms_per_task": 1000 * step_s / num_tasks, "peak_mb": peak_memory_mb()}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--algorithms", default="maml,vampire")
  parser.add_argument("--strategies", default=None,
                      help="comma list of STRATEGY[:CHUNK]; STRATEGY is host_chunked or one of "
                           f"{vj.BATCHING_STRATEGIES}; default: the backend's choice")
  parser.add_argument("--tasks", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--scan-inner-steps", action="store_true",
                      help="lax.scan the inner loop instead of unrolling it")
  parser.add_argument("--conv-impl", default="xla", choices=["xla", "patches"])
  args = parser.parse_args(argv)
  if args.strategies is None:
    strategy, chunk = vj.default_task_batching()
    strategies = [("host_chunked", chunk)] if jax.default_backend() == "cpu" else [(strategy, chunk)]
  else:
    strategies = []
    for item in args.strategies.split(","):
      name, _, chunk = item.partition(":")
      strategies.append((name, int(chunk or 1)))

  device = jax.devices()[0]
  print(f"backend {jax.default_backend()} ({getattr(device, 'device_kind', '')}), jax {jax.__version__},"
        f" Omniglot 5-way 1-shot, T={args.tasks}, 5 inner steps, L=1, second order,"
        f" inner loop {'scan' if args.scan_inner_steps else 'unrolled'}, conv {args.conv_impl}")
  rows = []
  for algorithm in args.algorithms.split(","):
    for strategy, chunk in strategies:
      row = time_step(algorithm, strategy, chunk, args.tasks, args.repeats,
                      not args.scan_inner_steps, args.conv_impl)
      rows.append(row)
      print(f"  {algorithm:8s} {row['strategy']:18s} compile {row['compile_s']:7.1f} s"
            f"  {row['step_s']:7.3f} s/step  {row['tasks_per_s']:7.1f} tasks/s"
            f"  {row['ms_per_task']:7.1f} ms/task  peak {row['peak_mb']:8.0f} MB", flush=True)

  print("\n| algorithm | batching | compile (s) | s/step | tasks/s | ms/task | peak mem (MB) |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['algorithm']} | {r['strategy']} | {r['compile_s']:.1f} | {r['step_s']:.3f} |"
          f" {r['tasks_per_s']:.1f} | {r['ms_per_task']:.1f} | {r['peak_mb']:.0f} |")
  return rows


if __name__ == "__main__":
  main()
