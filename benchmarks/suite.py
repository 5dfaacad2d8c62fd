"""The benchmark table: MAML and VAMPIRE meta-steps in the paper's four settings.

    python -m benchmarks.suite                 # the paper's settings (for a GPU; hours on a CPU)
    python -m benchmarks.suite --quick         # the whole table in about 15 min on a 2-core CPU
    python -m benchmarks.suite --settings regression --algorithms vampire --repeats 10

Settings (random inputs of the real shapes, second order, float32 unless
--compute-dtype bfloat16; MAML always uses one weight draw):
  omniglot_5w1s       Conv4-64, 28x28x1, 5-way 1-shot, 15 queries per class, T=32, S=5, L=1
  omniglot_20w1s      Conv4-64, 28x28x1, 20-way 1-shot, 15 queries per class, T=16, S=5, L=1
  mini_imagenet_5w1s  Conv4-32 with max-pool, 84x84x3, 5-way 1-shot, 15 queries, T=2, S=5, L=10
  regression          MLP 1-100-100-100-1, sine/line tasks, 5 support, 10 query, T=10, S=5, L=128

--quick keeps every shape and S as above but uses fewer tasks per step
(Omniglot T=4; mini-ImageNet T=2 and regression T=10 as above), L=2 for
mini-ImageNet VAMPIRE (L=10 needs about 11 GB of XLA temporaries per task on
a CPU), one task per compiled chunk on a CPU (`host_chunked:1`), and 2 timed
steps after the first: the same per-task work with much shorter compiles.

Task batching: with more than one device the tasks are sharded over all of
them (`vmap` on each); on one CPU the runner's choice (`host_chunked`, inner
loop unrolled; `vmap` for the regression MLP as in experiments.regression);
on one GPU `vmap` with the inner loop in `lax.scan`.

Each row runs in a fresh process and reports:
  compile (s)     the first call: compilation plus one step
  s/step, steps/s, tasks/s   over --repeats further steps
  GFLOP/step      XLA's cost analysis (`lower(...).cost_analysis()`) of the HLO
                  before optimisation, of a loop-free twin of the step
                  (inner steps unrolled, tasks vmapped): every operation
                  once, random-number generation included; summed over
                  devices. Also `compile().cost_analysis()` of the step that
                  ran ("compiled"): it counts loop bodies once and a fused
                  producer once per consumer, which inflates VAMPIRE's count
                  (its weight noise is drawn flat and sliced per leaf).
  GFLOP/s, % peak the HLO FLOPs over the step time, and their share of the
                  device's peak (--peak-tflops; known GPUs and an estimate
                  for this CPU built in)
  XLA MB          argument + output + temporary bytes of the compiled step
                  (`memory_analysis()`), per device
  peak MB         the process's peak resident memory (CPU) or the device's
                  `peak_bytes_in_use` (GPU)
then one markdown table.
"""

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import tempfile
import time
from typing import Optional

SETTINGS_HELP = "omniglot_5w1s, omniglot_20w1s, mini_imagenet_5w1s, regression"


@dataclasses.dataclass(frozen=True)
class Setting:
  kind: str                          # 'classification' or 'regression'
  tasks: int                         # T
  mc_samples: int                    # L_t = L_v for VAMPIRE
  ways: int = 5
  shots: int = 1
  query: int = 15                    # per class (classification) or per task (regression)
  image: tuple = (28, 28, 1)
  num_filters: int = 64
  max_pool: bool = False
  inner_steps: int = 5               # S
  inner_lr: float = 0.1


SETTINGS = {
    "omniglot_5w1s": Setting("classification", tasks=32, mc_samples=1),
    "omniglot_20w1s": Setting("classification", tasks=16, mc_samples=1, ways=20),
    "mini_imagenet_5w1s": Setting("classification", tasks=2, mc_samples=10, image=(84, 84, 3),
                                  num_filters=32, max_pool=True, inner_lr=0.01),
    "regression": Setting("regression", tasks=10, mc_samples=128, shots=5, query=10,
                          inner_lr=0.001),
}
# --quick: fewer tasks; mini-ImageNet VAMPIRE with L=2, as L=10 needs about
# 11 GB of XLA temporaries per task on a CPU (benchmarks/memory.py).
QUICK = {"omniglot_5w1s": {"tasks": 4}, "omniglot_20w1s": {"tasks": 4},
         "mini_imagenet_5w1s": {"tasks": 2, "mc_samples": 2}, "regression": {"tasks": 10}}

# Dense peak TFLOP/s (float32 without tensor cores, bfloat16 with), by device name.
PEAK_TFLOPS = {"H100 PCIe": (51.2, 756.0), "H100": (66.9, 989.4), "H200": (66.9, 989.4),
               "A100": (19.5, 312.0), "L4": (30.3, 121.0)}
# This CPU (AMD EPYC Zen 5): 2.6 GHz x 64 float32 FLOP/cycle (two 512-bit FMA units).
CPU_GHZ, CPU_FLOP_PER_CYCLE = 2.6, 64


def peak_flops(compute_dtype: str, override_tflops: Optional[float]) -> tuple[float, str]:
  """Peak FLOP/s of the visible devices and where the number comes from."""
  import jax
  if override_tflops:
    return override_tflops * 1e12 * jax.device_count(), "--peak-tflops"
  device = jax.devices()[0]
  if device.platform == "cpu":
    cores = len(os.sched_getaffinity(0))
    return (cores * CPU_GHZ * 1e9 * CPU_FLOP_PER_CYCLE,
            f"estimate: {cores} cores x {CPU_GHZ} GHz x {CPU_FLOP_PER_CYCLE} FLOP/cycle")
  for name, (fp32, bf16) in PEAK_TFLOPS.items():
    if name in device.device_kind:
      peak = bf16 if compute_dtype == "bfloat16" else fp32
      return peak * 1e12 * jax.device_count(), f"{name} spec sheet, {compute_dtype}"
  return float("nan"), f"unknown device {device.device_kind!r}: pass --peak-tflops"


def random_tasks(setting: Setting, key, num_tasks: int):
  """Tasks of the setting's shapes: random images and labels, or sine/line tasks."""
  import jax
  import vampire_jax as vj
  if setting.kind == "regression":
    from vampire_jax.data import sine_line
    return sine_line.sample_tasks(key, num_tasks, num_support=setting.shots,
                                  num_query=setting.query)
  keys = jax.random.split(key, 4)
  support, query = setting.ways * setting.shots, setting.ways * setting.query
  return vj.Task(jax.random.uniform(keys[0], (num_tasks, support) + setting.image),
                 jax.random.randint(keys[1], (num_tasks, support), 0, setting.ways),
                 jax.random.uniform(keys[2], (num_tasks, query) + setting.image),
                 jax.random.randint(keys[3], (num_tasks, query), 0, setting.ways))


def network(setting: Setting):
  """`(apply_fn, params, nll)` of the setting's network."""
  import jax
  import vampire_jax as vj
  if setting.kind == "regression":
    model = vj.MLP((100, 100, 100), 1)
    return vj.pure_apply(model), vj.init_params(model, jax.random.key(0), (1, 1)), vj.gaussian_nll(0.3)
  model = vj.Conv4(num_classes=setting.ways, num_filters=setting.num_filters,
                   max_pool=setting.max_pool)
  params = vj.init_params(model, jax.random.key(0), (1,) + setting.image)
  return vj.pure_apply(model), params, vj.categorical_nll


def make_learner(setting: Setting, algorithm: str, apply_fn, nll, *, unroll_steps: bool,
                 remat: bool):
  import vampire_jax as vj
  if algorithm == "maml":
    return vj.maml(apply_fn, nll, num_inner_steps=setting.inner_steps, inner_lr=setting.inner_lr,
                   unroll_steps=unroll_steps, remat=remat)
  return vj.vampire(apply_fn, nll, num_inner_steps=setting.inner_steps, inner_lr=setting.inner_lr,
                    kl_weight=0.1, num_mc_train=setting.mc_samples,
                    num_mc_query=setting.mc_samples, unroll_steps=unroll_steps, remat=remat)


def choose_batching(setting: Setting, requested: Optional[str], quick: bool) -> tuple[str, int]:
  import jax
  if requested:
    name, _, chunk = requested.partition(":")
    return name, int(chunk or 1)
  if jax.device_count() > 1 or jax.default_backend() != "cpu" or setting.kind == "regression":
    return "vmap", 1
  return "host_chunked", 1 if quick else 4


RANDOM_OPS = ("threefry", "_uniform", "_normal", "random_bits")  # names of the RNG's loops


def _xla_costs(compiled) -> tuple[float, float, bool]:
  """FLOPs and memory (MB) of a compiled executable, and whether it loops over work.

  XLA counts a loop body once. The random-number generator's own loops
  (threefry rounds on CPU) do not count here; loops over inner steps or
  tasks do.
  """
  memory = compiled.memory_analysis()
  megabytes = (memory.argument_size_in_bytes + memory.output_size_in_bytes
               + memory.temp_size_in_bytes) / 2**20
  has_loops = any(" while(" in line and not any(tag in line for tag in RANDOM_OPS)
                  for line in compiled.as_text().splitlines())
  return float(compiled.cost_analysis()["flops"]), megabytes, has_loops


def run_row(name: str, algorithm: str, options: dict) -> dict:
  """Times one setting and algorithm; run it in a fresh process."""
  import jax
  # An empty persistent cache per row: compile time is measured cold, and
  # recompiling the same step for its cost analysis is a cache hit.
  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="vj_bench_cache_"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  import vampire_jax as vj
  from benchmarks.meta_step import peak_memory_mb

  setting = SETTINGS[name]
  if options["quick"]:
    setting = dataclasses.replace(setting, **QUICK[name])
  num_tasks = options["tasks"] or setting.tasks
  strategy, chunk = choose_batching(setting, options["batching"], options["quick"])
  chunk = max(n for n in range(1, min(chunk, num_tasks) + 1) if num_tasks % n == 0)
  unroll_steps = jax.default_backend() == "cpu" and not options["scan_inner_steps"]
  apply_fn, params, nll = network(setting)
  if options["compute_dtype"] == "bfloat16":
    apply_fn = vj.mixed_precision(apply_fn)
  learner = make_learner(setting, algorithm, apply_fn, nll, unroll_steps=unroll_steps,
                         remat=options["remat"])
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=num_tasks)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  tasks = random_tasks(setting, jax.random.key(2), num_tasks)
  mesh = vj.task_mesh() if jax.device_count() > 1 else None
  if mesh is not None:
    state, tasks = vj.replicate(state, mesh), vj.shard_tasks(tasks, mesh)
  if strategy == "host_chunked":
    step = vj.make_host_chunked_meta_step(learner, optimizer, chunk_size=chunk)
  else:
    step = jax.jit(vj.make_meta_step(learner, optimizer, task_batching=strategy,
                                     chunk_size=chunk, mesh=mesh))

  start = time.perf_counter()
  new_state, metrics = step(state, tasks, jax.random.key(3))
  jax.block_until_ready((new_state, metrics))
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  for i in range(options["repeats"]):
    new_state, metrics = step(new_state, tasks, jax.random.key(4 + i))
  jax.block_until_ready((new_state, metrics))
  step_s = (time.perf_counter() - start) / options["repeats"]

  # FLOPs, two ways. `compiled`: XLA's cost analysis of what ran (the jitted
  # step, or host_chunked's chunk gradient, recompiled from the cache, once
  # per chunk). It counts a loop body once, and a fused producer once per
  # consumer: VAMPIRE's weight noise, drawn flat and sliced into leaves, is
  # counted again for every leaf. `hlo`: XLA's cost analysis of the HLO
  # before optimisation (no fusion) of a loop-free twin of the step (inner
  # steps unrolled, tasks vmapped): each operation once; FLOP/s use it.
  # With a mesh both are per device.
  if strategy == "host_chunked":
    chunk_gradient = jax.jit(vj.make_meta_gradient(learner, task_batching="unroll"))
    chunk_tasks = jax.tree_util.tree_map(lambda x: x[:chunk], tasks)
    compiled = chunk_gradient.lower(state.meta_params, chunk_tasks,
                                    jax.random.split(jax.random.key(0), chunk)).compile()
    compiled_flops, xla_mb, has_loops = _xla_costs(compiled)
    compiled_flops *= num_tasks // chunk
  else:
    compiled_flops, xla_mb, has_loops = _xla_costs(
        step.lower(state, tasks, jax.random.key(3)).compile())
  twin = make_learner(setting, algorithm, apply_fn, nll, unroll_steps=True, remat=options["remat"])
  twin_step = jax.jit(vj.make_meta_step(twin, optimizer, task_batching="vmap", mesh=mesh))
  hlo_flops = float(twin_step.lower(state, tasks, jax.random.key(3)).cost_analysis()["flops"])
  devices = 1 if mesh is None else mesh.size
  compiled_flops, hlo_flops = compiled_flops * devices, hlo_flops * devices
  peak, peak_source = peak_flops(options["compute_dtype"], options["peak_tflops"])
  loss = float(metrics["loss"])
  return {"setting": name, "algorithm": algorithm, "tasks": num_tasks,
          "mc_samples": setting.mc_samples if algorithm == "vampire" else 1,
          "batching": f"{strategy}:{chunk}" + (f" x{mesh.size} devices" if mesh else ""),
          "inner_loop": "unrolled" if unroll_steps else "scan", "remat": options["remat"],
          "compute_dtype": options["compute_dtype"], "compile_s": compile_s, "step_s": step_s,
          "steps_per_s": 1 / step_s, "tasks_per_s": num_tasks / step_s,
          "gflop_per_step": hlo_flops / 1e9, "compiled_gflop_per_step": compiled_flops / 1e9,
          "compiled_has_loops": has_loops, "gflop_per_s": hlo_flops / step_s / 1e9,
          "peak_fraction": hlo_flops / step_s / peak, "peak_source": peak_source,
          "xla_mb": xla_mb, "peak_mb": peak_memory_mb(),
          "loss_finite": bool(loss == loss and abs(loss) != float("inf"))}


def _in_fresh_process(name: str, algorithm: str, options: dict) -> dict:
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
    return pool.submit(run_row, name, algorithm, options).result()


def format_table(rows: list[dict]) -> str:
  lines = ["| setting | algorithm | T | L | batching | compile (s) | s/step | steps/s | tasks/s |"
           " GFLOP/step (HLO) | GFLOP/step (compiled) | GFLOP/s | % peak | XLA MB | peak MB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    compiled = f"{r['compiled_gflop_per_step']:.2f}" + (" (loops once)" if r["compiled_has_loops"] else "")
    lines.append(
        f"| {r['setting']} | {r['algorithm']} | {r['tasks']} | {r['mc_samples']} | {r['batching']} |"
        f" {r['compile_s']:.1f} | {r['step_s']:.3f} | {r['steps_per_s']:.2f} |"
        f" {r['tasks_per_s']:.1f} | {r['gflop_per_step']:.2f} | {compiled} | {r['gflop_per_s']:.1f} |"
        f" {100 * r['peak_fraction']:.1f} | {r['xla_mb']:.0f} | {r['peak_mb']:.0f} |")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="fewer tasks, chunks of one, 2 steps")
  parser.add_argument("--settings", default=",".join(SETTINGS), help=SETTINGS_HELP)
  parser.add_argument("--algorithms", default="maml,vampire")
  parser.add_argument("--tasks", type=int, default=0, help="T for every setting (0: its own)")
  parser.add_argument("--repeats", type=int, default=None, help="timed steps (default 5, quick 2)")
  parser.add_argument("--batching", default=None,
                      help="STRATEGY[:CHUNK] for every row (default: see above)")
  parser.add_argument("--scan-inner-steps", action="store_true",
                      help="lax.scan the inner loop on a CPU too")
  parser.add_argument("--remat", action="store_true", help="jax.checkpoint every inner step")
  parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--peak-tflops", type=float, default=None,
                      help="one device's peak TFLOP/s (default: built-in table or CPU estimate)")
  parser.add_argument("--json", default=None, help="also write the rows to this file")
  parser.add_argument("--same-process", action="store_true",
                      help="run every row in this process (peak memory then accumulates)")
  args = parser.parse_args(argv)
  options = {"quick": args.quick, "tasks": args.tasks,
             "repeats": args.repeats or (2 if args.quick else 5), "batching": args.batching,
             "scan_inner_steps": args.scan_inner_steps, "remat": args.remat,
             "compute_dtype": args.compute_dtype, "peak_tflops": args.peak_tflops}
  names = [n.strip() for n in args.settings.split(",") if n.strip()]
  unknown = set(names) - set(SETTINGS)
  if unknown:
    parser.error(f"unknown settings {sorted(unknown)}; choose from {SETTINGS_HELP}")

  import jax
  device = jax.devices()[0]
  print(f"backend {jax.default_backend()} ({getattr(device, 'device_kind', '')}) x{jax.device_count()},"
        f" jax {jax.__version__}; {'quick' if args.quick else 'full'} settings, {options['repeats']}"
        f" timed steps, second order, {args.compute_dtype}, remat {args.remat}", flush=True)
  rows, start = [], time.time()
  for name in names:
    for algorithm in args.algorithms.split(","):
      run = run_row if args.same_process else _in_fresh_process
      row = run(name, algorithm, options)
      rows.append(row)
      print(f"  {name:19s} {algorithm:8s} T={row['tasks']:<3d} L={row['mc_samples']:<4d}"
            f" {row['batching']:16s} compile {row['compile_s']:6.1f} s  {row['step_s']:7.3f} s/step"
            f"  {row['tasks_per_s']:7.1f} tasks/s  {row['gflop_per_step']:8.2f} GFLOP/step"
            f" (compiled count {row['compiled_gflop_per_step']:.2f})"
            f"  {row['gflop_per_s']:7.1f} GFLOP/s ({100 * row['peak_fraction']:.1f}% of peak)"
            f"  XLA {row['xla_mb']:6.0f} MB  peak {row['peak_mb']:6.0f} MB", flush=True)
  print(f"\npeak FLOP/s: {rows[0]['peak_source'] if rows else ''}; inner loop"
        f" {rows[0]['inner_loop'] if rows else ''}; total wall time {time.time() - start:.0f} s\n")
  print(format_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == "__main__":
  main()
