"""The benchmark table: MAML and VAMPIRE meta-steps in the paper's four settings.

    python -m benchmarks.suite                 # the paper's settings (for a GPU; hours on a CPU)
    python -m benchmarks.suite --quick         # the whole table in about 15 min on a 2-core CPU
    python -m benchmarks.suite --settings regression --algorithms vampire --repeats 10
    python -m benchmarks.suite --settings mini_imagenet_5w1s --algorithms vampire --second-order-steps 1
    python -m benchmarks.suite --settings omniglot_5w1s,regression --algorithms vampire2,protonet

Settings (second order, float32 unless --compute-dtype bfloat16; MAML always
uses one weight draw; `--second-order-steps 1` differentiates the likelihood's
gradient in the first inner step only, as the authors' code; `--mc-samples L`
sets every VAMPIRE row's L):
  omniglot_5w1s       Conv4-64, 28x28x1, 5-way 1-shot, 15 queries per class, T=32, S=5, L=1
  omniglot_20w1s      Conv4-64, 28x28x1, 20-way 1-shot, 15 queries per class, T=16, S=5, L=1
  mini_imagenet_5w1s  Conv4-32 with max-pool, 84x84x3, 5-way 1-shot, 15 queries, T=2, S=5, L=10
  regression          MLP 1-100-100-100-1, sine/line tasks, 5 support, 10 query, T=10, S=5, L=128

The timed step is the training step: each call draws its T tasks inside the
step, from per-task keys (`make_train_step`, jitted with the state donated;
`make_host_chunked_train_step` on the CPU path), out of random uint8 class
images `[64, 20, H, W, C]` of the setting's shape (`data.tasks_from_keys`,
no rotations) or as sine/line tasks (`sine_line.tasks_from_keys`).

--quick keeps every shape and S as above but uses fewer tasks per step
(Omniglot T=4; mini-ImageNet T=2 and regression T=10 as above), L=2 for
mini-ImageNet VAMPIRE (L=10 needs about 11 GB of XLA temporaries per task on
a CPU), and 2 timed steps after the first: the same per-task work with much
shorter compiles.

Task batching: with more than one device the tasks are sharded over all of
them (`vmap` on each); on one CPU the library's choice (tasks in `lax.map`,
`loop_safe` convolutions; `vmap` for the regression MLP as in
experiments.regression); on one GPU `vmap`. The inner loop is a `lax.scan`
unless `--unroll-inner-steps`; `--batching` picks another task batching.

Each row runs in a fresh process and reports:
  compile (s)     the first call: compilation plus one step
  s/step, steps/s, tasks/s   over --repeats further steps
  GFLOP/step      XLA's cost analysis (`lower(...).cost_analysis()`) of the HLO
                  before optimisation, of a loop-free twin of the step
                  (`make_meta_step` with inner steps unrolled and tasks
                  vmapped, on one batch of tasks sampled beforehand): every
                  operation once, weight noise included, task sampling not;
                  summed over devices. Also `compile().cost_analysis()` of
                  the step that ran, sampling included ("compiled"): it
                  counts loop bodies once and a fused producer once per
                  consumer, which inflates VAMPIRE's count (its weight noise
                  is drawn flat and sliced per leaf).
  GFLOP/s, % peak the HLO FLOPs over the step time, and their share of the
                  device's peak (--peak-tflops; known GPUs and an estimate
                  for this CPU built in)
  XLA MB          argument + output + temporary bytes of the compiled step
                  (`memory_analysis()`), per device
  peak MB         the device's `memory_stats()['peak_bytes_in_use']` (GPU)
                  or the process's peak resident memory (CPU, or a device
                  without memory statistics), compile included
  stepping MB     the process's peak resident memory during the timed steps,
                  after the compile's freed memory went back to the system
                  (`backend.release_freed_memory`; `VAMPIRE_JAX_MEMORY_RELEASE=0`: not): what
                  a run holds while it steps, as the authors' harness reports
then one markdown table. Cost and memory analyses are optional in JAX (the
GPU backend may give none): a number a backend does not give is None in the
row and "n/a" in the table.

Algorithms (`--algorithms`, default maml,vampire): maml and vampire as above;
vampire2, VAMPIRE with its KL to N(0, I) in the inner loop and the meta-loss,
first order with KL weight 1e-6 (the authors' defaults, as `--algorithm
vampire2` trains), L as VAMPIRE's; protonet, the Conv4 without its head,
prototypes and no inner loop (classification settings only); simpa, the generator
of every weight and the PHI network (`vj.baselines.simpa`, first order, L generated
networks per inner step and on the queries, 512 draws in each KL estimate), with its two
Adams.

Test episodes (`--episodes`): VAMPIRE adapting to a task's support set and
predicting its queries, S inner steps with L = --episode-mc-samples (default
10) draws in both, for --episode-tasks tasks at once (default 1 and 32); the
tasks are sampled beforehand, one jitted evaluator call
(`vj.make_classification_evaluator` / `make_regression_evaluator`, the
batching above) scores them all. Each row reports the compile time
(`lower().compile()`) apart from the mean seconds of --repeats calls:

    python -m benchmarks.suite --episodes --settings mini_imagenet_5w1s,omniglot_5w1s
"""

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import resource
import tempfile
import time
from typing import NamedTuple, Optional

# The standard library only at the module level: `benchmarks/authors_pytorch.py` reads the
# settings and `measure_stepping` in a process that holds no JAX while PyTorch steps (JAX's
# import alone is about 160 MB of resident memory). Functions import the library.
SETTINGS_HELP = "omniglot_5w1s, omniglot_20w1s, mini_imagenet_5w1s, regression"
# --sample-batching: how VAMPIRE's L draws are batched (auto: the backend's choice).
DRAW_BATCHINGS = ("auto", "vmap", "map", "remat_map", "unroll")
# What `make_learner` builds (`--algorithms`; the module docstring says what each is).
ALGORITHMS = ("maml", "vampire", "vampire2", "protonet", "simpa")


@dataclasses.dataclass(frozen=True)
class Setting:
  kind: str  # 'classification' or 'regression'
  tasks: int  # T
  mc_samples: int  # L_t = L_v for VAMPIRE
  ways: int = 5
  shots: int = 1
  query: int = 15  # per class (classification) or per task (regression)
  image: tuple = (28, 28, 1)
  num_filters: int = 64
  max_pool: bool = False
  inner_steps: int = 5  # S
  inner_lr: float = 0.1
  conv_impl: str = "auto"  # Conv4's: "xla", "patches", "loop_safe"; auto: the library's


def input_size(setting: Setting) -> int:
  """The values in one input of the setting's network (a regression's x is one)."""
  return 1 if setting.kind == "regression" else math.prod(setting.image)


SETTINGS = {
  "omniglot_5w1s": Setting("classification", tasks=32, mc_samples=1),
  "omniglot_20w1s": Setting("classification", tasks=16, mc_samples=1, ways=20),
  "mini_imagenet_5w1s": Setting(
    "classification",
    tasks=2,
    mc_samples=10,
    image=(84, 84, 3),
    num_filters=32,
    max_pool=True,
    inner_lr=0.01,
  ),
  "regression": Setting("regression", tasks=10, mc_samples=128, shots=5, query=10, inner_lr=0.001),
}
# --quick: fewer tasks; mini-ImageNet VAMPIRE with L=2, as L=10 needs about
# 11 GB of XLA temporaries per task on a CPU (benchmarks/memory.py).
QUICK = {
  "omniglot_5w1s": {"tasks": 4},
  "omniglot_20w1s": {"tasks": 4},
  "mini_imagenet_5w1s": {"tasks": 2, "mc_samples": 2},
  "regression": {"tasks": 10},
}

# The random class images tasks are drawn from: [classes, examples, H, W, C].
RANDOM_CLASSES, RANDOM_EXAMPLES = 64, 20

# Dense peak TFLOP/s (float32 without tensor cores, bfloat16 with), by device name.
PEAK_TFLOPS = {
  "H100 PCIe": (51.2, 756.0),
  "H100": (66.9, 989.4),
  "H200": (66.9, 989.4),
  "A100": (19.5, 312.0),
  "L4": (30.3, 121.0),
}
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
    return (
      cores * CPU_GHZ * 1e9 * CPU_FLOP_PER_CYCLE,
      f"estimate: {cores} cores x {CPU_GHZ} GHz x {CPU_FLOP_PER_CYCLE} FLOP/cycle",
    )
  for name, (fp32, bf16) in PEAK_TFLOPS.items():
    if name in device.device_kind:
      peak = bf16 if compute_dtype == "bfloat16" else fp32
      return peak * 1e12 * jax.device_count(), f"{name} spec sheet, {compute_dtype}"
  return float("nan"), f"unknown device {device.device_kind!r}: pass --peak-tflops"


def peak_memory() -> tuple[Optional[float], Optional[str]]:
  """`(MB, source)`: the device's peak memory in use, else the process's peak RSS.

  source is 'device' (`memory_stats()['peak_bytes_in_use']`, accelerators
  that report it), 'rss' (the process's peak resident memory: CPUs, and
  devices without memory statistics) or None with MB None if neither is known.
  After `reset_peak_rss` the RSS is the peak since the reset.
  """
  import jax

  if jax.default_backend() != "cpu":
    try:
      stats = jax.devices()[0].memory_stats()
    except (NotImplementedError, RuntimeError):
      stats = None
    if stats and "peak_bytes_in_use" in stats:
      return stats["peak_bytes_in_use"] / 2**20, "device"
  peak = peak_rss_mb()
  return (peak, "rss") if peak else (None, None)


def device_peak_mb(process_peak_mb: Optional[float]) -> Optional[float]:
  """The device's peak memory in use where it reports one (GPU), else `process_peak_mb`."""
  peak, source = peak_memory()
  return peak if source == "device" else process_peak_mb


def _status_kib(field: str) -> Optional[int]:
  """A `VmXXX:` line of `/proc/self/status` in KiB, or None off Linux."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return None


def peak_rss_mb() -> Optional[float]:
  """The process's peak resident memory (since the last `reset_peak_rss`), MB.

  Linux's `VmHWM`; elsewhere `ru_maxrss` (KiB on Linux, bytes on macOS; taken as KiB).
  """
  kib = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return kib / 1024 if kib and kib > 0 else None


def reset_peak_rss() -> bool:
  """Sets the process's peak RSS to its current RSS (Linux 4.0+); False where it cannot.

  Writing 5 to `/proc/self/clear_refs` resets `VmHWM`, and `ru_maxrss` with it: read the
  peak before (`peak_rss_mb`) to keep it.
  """
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    return False
  return True


class MemoryPeaks(NamedTuple):
  """Resident memory of a benchmark process in its two phases, MB (None where unknown)."""

  process: Optional[float]  # the whole process: imports, compile, first call, stepping
  stepping: Optional[float]  # the timed calls after the first (and the memory release)


def measure_stepping(first_call, timed_calls, release: bool = True) -> MemoryPeaks:
  """Runs `first_call()` (compile), releases the freed memory, then `timed_calls()`.

  The stepping peak is what a user feels for the length of a run, and what the authors'
  harness reports beside its process peak (`benchmarks/authors_pytorch.py`, with
  `release=False`: PyTorch compiles nothing); the release is
  `vampire_jax.backend.release_freed_memory` (off with `VAMPIRE_JAX_MEMORY_RELEASE=0`).
  """
  first_call()
  if release:  # PyTorch's harness passes False: its process never imports JAX
    from vampire_jax import backend

    backend.release_freed_memory()
  before = peak_rss_mb()
  reset = reset_peak_rss()
  timed_calls()
  stepping = peak_rss_mb() if reset else None
  process = max((p for p in (before, stepping) if p is not None), default=None)
  return MemoryPeaks(process, stepping)


def random_data(setting: Setting, key):
  """What the setting's tasks are drawn from.

  Random uint8 class images `[64, 20, H, W, C]` (at least `ways` classes)
  for classification; None for regression, whose tasks are generated.
  """
  import jax
  import jax.numpy as jnp

  if setting.kind == "regression":
    return None
  shape = (max(RANDOM_CLASSES, setting.ways), RANDOM_EXAMPLES) + tuple(setting.image)
  return jax.random.randint(key, shape, 0, 256, jnp.int32).astype(jnp.uint8)


def task_sampler(setting: Setting):
  """`sample_tasks(data, task_keys [n]) -> Task` for the setting, jittable; task i from key i."""
  import vampire_jax as vj
  from vampire_jax.data import sine_line

  if setting.kind == "regression":
    return lambda data, task_keys: sine_line.tasks_from_keys(
      task_keys, num_support=setting.shots, num_query=setting.query
    )
  return lambda images, task_keys: vj.data.tasks_from_keys(
    task_keys, images, ways=setting.ways, shots=setting.shots, query=setting.query, rotate=False
  )


def random_tasks(setting: Setting, key, num_tasks: int):
  """`num_tasks` tasks of the setting's shapes, sampled from `random_data`."""
  import jax

  data_key, task_key = jax.random.split(key)
  return task_sampler(setting)(
    random_data(setting, data_key), jax.random.split(task_key, num_tasks)
  )


def network(setting: Setting, algorithm: str = "maml"):
  """`(apply_fn, params, nll)` of the setting's network (ProtoNet's: no head)."""
  from vampire_jax import backend
  import jax
  import vampire_jax as vj

  if setting.kind == "regression":
    if algorithm == "protonet":
      raise ValueError("protonet classifies: choose a classification setting")
    model = vj.MLP((100, 100, 100), 1)
    return (
      vj.pure_apply(model),
      vj.init_params(model, jax.random.key(0), (1, 1)),
      vj.gaussian_nll(0.3),
    )
  conv_impl = setting.conv_impl
  if conv_impl == "auto":  # callers that know their loops resolve it first (run_row)
    conv_impl = backend.conv_impl(
      task_batching="map", inner_steps_unrolled=False, draws_mapped=True
    )
  model = vj.Conv4(
    num_classes=None if algorithm == "protonet" else setting.ways,
    num_filters=setting.num_filters,
    max_pool=setting.max_pool,
    conv_impl=conv_impl,
  )
  params = vj.init_params(model, jax.random.key(0), (1,) + setting.image)
  return vj.pure_apply(model), params, vj.categorical_nll


def make_learner(
  setting: Setting,
  algorithm: str,
  apply_fn,
  nll,
  *,
  unroll_steps: bool,
  remat: bool,
  second_order_steps: Optional[int] = None,
  sample_batching: Optional[str] = None,
  first_order: bool = False,
):
  """MAML, VAMPIRE, Vampire2 or ProtoNet in the setting; `second_order_steps=1` is the authors'
  code's meta-gradient.

  `sample_batching` None: the draws as `backend.sample_batching` batches them (below);
  `first_order` stops the meta-gradient at the inner updates (MAML and VAMPIRE).
  """
  from vampire_jax import backend
  import vampire_jax as vj

  if algorithm not in ALGORITHMS:  # never time VAMPIRE under another name
    raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
  if algorithm == "protonet":  # no inner loop, no draws; apply_fn is the embedding
    return vj.baselines.protonet(apply_fn, num_classes=setting.ways)
  if algorithm == "simpa":  # first order, L generated networks, 512 KL draws (Simpa.py's)
    return vj.baselines.simpa(
      apply_fn,
      nll,
      tasks_per_step=setting.tasks,
      num_inner_steps=setting.inner_steps,
      inner_lr=setting.inner_lr,
      num_mc_train=setting.mc_samples,
      num_mc_query=setting.mc_samples,
      unroll_steps=unroll_steps,
    )

  options = dict(
    num_inner_steps=setting.inner_steps,
    inner_lr=setting.inner_lr,
    unroll_steps=unroll_steps,
    remat=remat,
    second_order_steps=second_order_steps,
    first_order=first_order,
  )
  if algorithm == "maml":
    return vj.maml(apply_fn, nll, **options)
  # Draws batched as `backend.sample_batching` decides for the network (the MLP has no convolution).
  draws = backend.sample_batching(dense_only=setting.kind == "regression")
  if algorithm == "vampire2":  # the authors' defaults, as the registry builds it
    options = dict(options, first_order=True, second_order_steps=None)
    kl = dict(kl_weight=1e-6, kl_target="standard_normal", outer_kl_weight=1e-6)
  else:
    kl = dict(kl_weight=0.1)
  return vj.vampire(
    apply_fn,
    nll,
    num_mc_train=setting.mc_samples,
    num_mc_query=setting.mc_samples,
    sample_batching=sample_batching or draws,
    **kl,
    **options,
  )


def choose_batching(setting: Setting, requested: Optional[str]) -> tuple[str, int]:
  """`requested` (STRATEGY[:CHUNK]), else what `backend.task_batching` picks for the setting."""
  from vampire_jax import backend

  if requested:
    name, _, chunk = requested.partition(":")
    return name, int(chunk or 1)
  return backend.task_batching(
    "auto",
    0,
    setting.tasks,
    dense_only=setting.kind == "regression",
  )


def build_train_step(
  learner,
  optimizer,
  sample_tasks,
  *,
  num_tasks: int,
  strategy: str,
  chunk: int,
  mesh=None,
  steps_per_call: int = 1,
  donate: bool = True,
  fusion_emitters: str = "auto",
  input_size: Optional[int] = None,
  draw_per_task: bool = False,
):
  """`step(state, data, key) -> (state, metrics)`: the training step, tasks sampled inside.

  `host_chunked`: `make_host_chunked_train_step` (one step per call);
  otherwise `make_train_step` with `strategy`, jitted with a run's XLA options for
  XLA:CPU's `fusion_emitters` ('auto': the processor's for a network of `input_size` input
  values, as a run compiles; `backend.compiler_options`), the state donated unless
  `donate` is False; `draw_per_task` as `vj.make_train_step`'s (a run's classification
  steps draw each task inside the loop over tasks).
  """
  from vampire_jax import backend
  import jax
  import vampire_jax as vj

  if strategy == "host_chunked":
    return backend.make_host_chunked_train_step(
      learner, optimizer, sample_tasks, tasks_per_step=num_tasks, chunk_size=chunk
    )
  step = vj.make_train_step(
    learner,
    optimizer,
    sample_tasks,
    tasks_per_step=num_tasks,
    steps_per_call=steps_per_call,
    task_batching=strategy,
    chunk_size=chunk,
    mesh=mesh,
    draw_per_task=draw_per_task,
  )
  return backend.compiled_on_first_call(
    jax.jit(
      step,
      donate_argnums=0 if donate else (),
      compiler_options=backend.compiler_options(fusion_emitters, input_size),
    )
  )


class Timed(NamedTuple):
  """What `time_calls` measured."""

  state: object  # the last call's
  metrics: object
  first_s: float  # the first call: compilation included
  call_s: float  # the mean of the later calls
  memory: MemoryPeaks  # the process's peak RSS, and its peak while stepping


def time_calls(step, state, data, key, calls: int) -> Timed:
  """Calls `step(state, data, key)` once, then `calls` more times, each on the last state.

  Every call starts from the state the previous one returned, so a donated
  state is never reused. Between the first call and the others the compile's
  freed memory goes back to the system (`measure_stepping`).
  """
  import jax

  from vampire_jax import backend

  out = {}
  backend.drop_compiled_programs()  # the setup's programs, as the training loop drops them

  def first():
    start = time.perf_counter()
    out["state"], out["metrics"] = jax.block_until_ready(step(state, data, key))
    out["first_s"] = time.perf_counter() - start

  def timed():
    start = time.perf_counter()
    for _ in range(calls):
      out["state"], out["metrics"] = step(out["state"], data, key)
    jax.block_until_ready((out["state"], out["metrics"]))
    out["call_s"] = (time.perf_counter() - start) / calls

  memory = measure_stepping(first, timed)
  return Timed(out["state"], out["metrics"], out["first_s"], out["call_s"], memory)


RANDOM_OPS = ("threefry", "_uniform", "_normal", "random_bits")  # names of the RNG's loops


def _analysis(method):
  """`method()` (a cost or memory analysis), or None where the backend gives none."""
  try:
    result = method()
  except (NotImplementedError, RuntimeError):
    return None
  if isinstance(result, (list, tuple)):  # older JAX: one analysis per program
    result = result[0] if result else None
  return result


def _flops(cost_analysis) -> Optional[float]:
  """The 'flops' entry of a cost analysis, or None if it has none."""
  if not cost_analysis or "flops" not in cost_analysis:
    return None
  return float(cost_analysis["flops"])


def _xla_costs(compiled) -> tuple[Optional[float], Optional[float], Optional[bool]]:
  """FLOPs and memory (MB) of a compiled executable, and whether it loops over work.

  XLA counts a loop body once. The random-number generator's own loops
  (threefry rounds on CPU) do not count here; loops over inner steps or
  tasks do. A number the backend does not give is None.
  """
  memory = _analysis(compiled.memory_analysis)
  sizes = [
    getattr(memory, name, None)
    for name in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
  ]
  megabytes = None if None in sizes else sum(sizes) / 2**20
  text = compiled.as_text()
  has_loops = (
    None
    if not text
    else any(
      " while(" in line and not any(tag in line for tag in RANDOM_OPS) for line in text.splitlines()
    )
  )
  return _flops(_analysis(compiled.cost_analysis)), megabytes, has_loops


def _times(value: Optional[float], factor: float) -> Optional[float]:
  return None if value is None else value * factor


def _compiled_costs(
  step, strategy: str, learner, sample_tasks, state, data, key, chunk: int, num_tasks: int
):
  """`_xla_costs` of the step that ran, over all its tasks (sampling included).

  host_chunked: one chunk's program (sampling and gradient, unrolled),
  compiled again, times the number of chunks. Otherwise the jitted step.
  """
  import jax
  import vampire_jax as vj

  if strategy != "host_chunked":
    return _xla_costs(step.lower(state, data, key).compile())
  gradient = vj.make_meta_gradient(learner, task_batching="unroll")
  chunk_program = jax.jit(
    lambda params, data, task_keys, adapt_keys: gradient(
      params, sample_tasks(data, task_keys), adapt_keys
    )
  )
  keys = jax.random.split(key, chunk)
  flops, megabytes, has_loops = _xla_costs(
    chunk_program.lower(state.meta_params, data, keys, keys).compile()
  )
  return _times(flops, num_tasks // chunk), megabytes, has_loops


def _twin_flops(twin_learner, optimizer, state, tasks, mesh) -> Optional[float]:
  """XLA's FLOPs, before optimisation, of `make_meta_step` (tasks vmapped) on `tasks`."""
  import jax
  import vampire_jax as vj

  if mesh is not None:
    tasks = vj.shard_tasks(tasks, mesh)
  twin_step = jax.jit(vj.make_meta_step(twin_learner, optimizer, task_batching="vmap", mesh=mesh))
  return _flops(_analysis(twin_step.lower(state, tasks, jax.random.key(3)).cost_analysis))


def _fresh_compilation_cache() -> None:
  # An empty persistent cache per row: compile time is measured cold, and
  # recompiling the same step for its cost analysis is a cache hit.
  import jax

  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="vj_bench_cache_"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _row_setting(name: str, options: dict) -> Setting:
  setting = SETTINGS[name]
  if options["quick"]:
    setting = dataclasses.replace(setting, **QUICK[name])
  return dataclasses.replace(
    setting,
    tasks=options["tasks"] or setting.tasks,
    mc_samples=options.get("mc_samples") or setting.mc_samples,
  )


def draw_batching(setting: Setting, options: dict) -> str:
  """How the row batches VAMPIRE's draws: --sample-batching, else the backend's choice."""
  from vampire_jax import backend

  return backend.sample_batching(
    options.get("sample_batching") or "auto", dense_only=setting.kind == "regression"
  )


def on_every_device(state, data, strategy: str):
  """`(state, data, mesh)` as a run shards its training step: with more than one device (one
  per core, `backend.default_to_all_cpu_cores`), a task mesh over all of them and the state
  and data replicated on it, for `build_train_step(..., mesh=mesh)`; with one device, or a
  `host_chunked` step (several programs), the arguments as they are and no mesh."""
  import jax
  import vampire_jax as vj

  if jax.device_count() == 1 or strategy == "host_chunked":
    return state, data, None
  mesh = vj.task_mesh()
  return vj.replicate(state, mesh), vj.replicate(data, mesh), mesh


def train_step_as_a_run(setting, learner, params, *, strategy, chunk, optimizer=None, **build):
  """`(step, state, data, mesh)`: the setting's training step over its random class images,
  the state and data placed as a run places them (`on_every_device`).

  `optimizer`: the meta-optimiser (None: `vj.meta_optimizer(1e-3)` for the setting's tasks);
  `build`: `build_train_step`'s other options (donation, XLA's options, steps per call).
  """
  import jax
  import vampire_jax as vj
  from vampire_jax.runs import kinds

  if optimizer is None:
    optimizer = vj.meta_optimizer(1e-3, tasks_per_step=setting.tasks)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  data = jax.block_until_ready(random_data(setting, jax.random.key(2)))
  state, data, mesh = on_every_device(state, data, strategy)
  step = build_train_step(
    learner,
    optimizer,
    task_sampler(setting),
    num_tasks=setting.tasks,
    strategy=strategy,
    chunk=chunk,
    mesh=mesh,
    draw_per_task=kinds.get(setting.kind).draw_per_task,  # as a run of the setting's kind
    **build,
  )
  return step, state, data, mesh


def batching_label(strategy: str, chunk: int, mesh) -> str:
  """How a row's tasks ran, e.g. `map:1 x2 devices` (`on_every_device`'s mesh, or None)."""
  return f"{strategy}:{chunk}" + (f" x{mesh.size} devices" if mesh is not None else "")


def run_row(name: str, algorithm: str, options: dict) -> dict:
  """Times one setting and algorithm's training step; run it in a fresh process."""
  from vampire_jax import backend

  _fresh_compilation_cache()
  import jax
  import numpy as np
  import vampire_jax as vj

  setting = _row_setting(name, options)
  num_tasks = setting.tasks
  strategy, chunk = choose_batching(setting, options["batching"])
  strategy, chunk = backend.task_batching(strategy, chunk, num_tasks)
  unroll_steps = options["unroll_inner_steps"]
  draws = draw_batching(setting, options)
  if setting.conv_impl == "auto":
    setting = dataclasses.replace(
      setting,
      conv_impl=backend.conv_impl(
        task_batching=strategy,
        inner_steps_unrolled=unroll_steps,
        draws_mapped=setting.mc_samples > 1 and draws in backend.MAPPED_STRATEGIES,
      ),
    )
  apply_fn, params, nll = network(setting, algorithm)
  if options["compute_dtype"] == "bfloat16":
    apply_fn = vj.mixed_precision(apply_fn)
  learner = make_learner(
    setting,
    algorithm,
    apply_fn,
    nll,
    unroll_steps=unroll_steps,
    remat=options["remat"],
    second_order_steps=options.get("second_order_steps"),
    sample_batching=draws,
  )
  if algorithm == "simpa":  # the generator's Adam and the PHI network's
    optimizer = vj.baselines.simpa_optimizer(1e-3, tasks_per_step=num_tasks)
  else:
    optimizer = vj.meta_optimizer(1e-3, tasks_per_step=num_tasks)
  sample_tasks = task_sampler(setting)  # for the FLOP counts below
  emitters = options.get("fusion_emitters", "auto")
  step, state, data, mesh = train_step_as_a_run(
    setting,
    learner,
    params,
    strategy=strategy,
    chunk=chunk,
    optimizer=optimizer,
    fusion_emitters=emitters,
    input_size=input_size(setting),
  )
  timed = time_calls(step, state, data, jax.random.key(3), options["repeats"])
  state, metrics, compile_s, step_s = timed.state, timed.metrics, timed.first_s, timed.call_s

  # FLOPs, two ways. `compiled`: XLA's cost analysis of what ran (see
  # `_compiled_costs`). It counts a loop body once, and a fused producer once
  # per consumer: VAMPIRE's weight noise, drawn flat and sliced into leaves, is
  # counted again for every leaf. `hlo`: XLA's cost analysis of the HLO
  # before optimisation (no fusion) of a loop-free twin of the step (inner
  # steps unrolled, tasks vmapped, on one batch of tasks sampled beforehand):
  # each operation once; FLOP/s use it. With a mesh both are per device.
  compiled_flops, xla_mb, has_loops = _compiled_costs(
    step, strategy, learner, sample_tasks, state, data, jax.random.key(3), chunk, num_tasks
  )
  # The twin's draws unrolled too: a `lax.map` over draws would be counted once, not L times.
  twin = make_learner(
    setting,
    algorithm,
    apply_fn,
    nll,
    unroll_steps=True,
    remat=options["remat"],
    second_order_steps=options.get("second_order_steps"),
    sample_batching="unroll",
  )
  tasks = sample_tasks(data, jax.random.split(jax.random.key(4), num_tasks))
  hlo_flops = _twin_flops(twin, optimizer, state, tasks, mesh)
  devices = 1 if mesh is None else mesh.size
  compiled_flops, hlo_flops = _times(compiled_flops, devices), _times(hlo_flops, devices)
  peak, peak_source = peak_flops(options["compute_dtype"], options["peak_tflops"])
  losses = np.asarray(metrics["loss"], np.float64)
  return {
    "setting": name,
    "algorithm": algorithm,
    "tasks": num_tasks,
    "mc_samples": setting.mc_samples if algorithm in ("vampire", "vampire2", "simpa") else 1,
    "batching": batching_label(strategy, chunk, mesh),
    "inner_loop": "unrolled" if unroll_steps else "scan",
    "sample_batching": draws,
    "remat": options["remat"],
    "second_order_steps": options.get("second_order_steps"),
    "compute_dtype": options["compute_dtype"],
    "fusion_emitters": backend.fusion_emitters(emitters, input_size(setting)),
    "compile_s": compile_s,
    "step_s": step_s,
    "steps_per_s": 1 / step_s,
    "tasks_per_s": num_tasks / step_s,
    "gflop_per_step": _times(hlo_flops, 1e-9),
    "compiled_gflop_per_step": _times(compiled_flops, 1e-9),
    "compiled_has_loops": has_loops,
    "gflop_per_s": _times(hlo_flops, 1e-9 / step_s),
    "peak_fraction": _times(hlo_flops, 1 / step_s / peak),
    "peak_source": peak_source,
    "xla_mb": xla_mb,
    "peak_mb": device_peak_mb(timed.memory.process),
    "stepping_peak_mb": timed.memory.stepping,
    "loss": float(losses[-1]),
    "loss_finite": bool(np.all(np.isfinite(losses))),
    "processor": backend.processor_record(),
  }


def run_episode_row(name: str, num_tasks: int, options: dict) -> dict:
  """Times VAMPIRE test episodes: adapt and predict `num_tasks` tasks in one jitted call.

  `options` as `run_row`'s, with "mc_samples" (L for adaptation and
  prediction, the setting's own if 0 or missing). The compile time is
  `lower(...).compile()` alone; `episode_s` is the mean of "repeats" calls
  after one untimed call.
  """
  from vampire_jax import backend

  _fresh_compilation_cache()
  import jax
  import numpy as np
  import vampire_jax as vj

  setting = dataclasses.replace(SETTINGS[name], tasks=num_tasks)
  if options.get("mc_samples"):
    setting = dataclasses.replace(setting, mc_samples=options["mc_samples"])
  strategy, chunk = choose_batching(setting, options["batching"])
  if strategy == "host_chunked":
    raise ValueError(
      "--batching host_chunked is for training steps; an episode row needs one of"
      f" {backend.BATCHING_STRATEGIES}"
    )
  strategy, chunk = backend.task_batching(strategy, chunk, num_tasks)
  if setting.conv_impl == "auto":
    setting = dataclasses.replace(
      setting,
      conv_impl=backend.conv_impl(
        task_batching=strategy,
        inner_steps_unrolled=options["unroll_inner_steps"],
        draws_mapped=setting.mc_samples > 1,
      ),
    )
  apply_fn, params, nll = network(setting)
  learner = make_learner(
    setting, "vampire", apply_fn, nll, unroll_steps=options["unroll_inner_steps"], remat=False
  )
  meta_params = learner.init(params, jax.random.key(1))
  tasks = random_tasks(setting, jax.random.key(2), num_tasks)
  if setting.kind == "regression":
    evaluator = vj.make_regression_evaluator(learner, 0.3, task_batching=strategy, chunk_size=chunk)
  else:
    evaluator = vj.make_classification_evaluator(learner, task_batching=strategy, chunk_size=chunk)
  key = jax.random.key(3)
  out = {}

  def first():
    start = time.perf_counter()
    out["episode"] = jax.jit(evaluator).lower(meta_params, tasks, key).compile()
    out["compile_s"] = time.perf_counter() - start
    jax.block_until_ready(out["episode"](meta_params, tasks, key))

  def timed():
    start = time.perf_counter()
    for _ in range(options["repeats"]):
      out["result"] = jax.block_until_ready(out["episode"](meta_params, tasks, key))
    out["episode_s"] = (time.perf_counter() - start) / options["repeats"]

  memory = measure_stepping(first, timed)
  compile_s, episode_s, result = out["compile_s"], out["episode_s"], out["result"]
  score = result.accuracy if setting.kind == "classification" else result.mse
  return {
    "setting": name,
    "algorithm": "vampire",
    "tasks": num_tasks,
    "mc_samples": setting.mc_samples,
    "inner_steps": setting.inner_steps,
    "batching": f"{strategy}:{chunk}",
    "conv_impl": setting.conv_impl,
    "compile_s": compile_s,
    "episode_s": episode_s,
    "ms_per_task": 1000 * episode_s / num_tasks,
    "tasks_per_s": num_tasks / episode_s,
    "peak_mb": device_peak_mb(memory.process),
    "stepping_peak_mb": memory.stepping,
    "score_finite": bool(np.all(np.isfinite(np.asarray(score)))),
    "processor": backend.processor_record(),
  }


def format_episode_table(rows: list[dict]) -> str:
  """Episode rows as one markdown table."""
  lines = [
    "| setting | T | L | S | batching | conv | compile (s) | s/call | ms/task | tasks/s |"
    " peak MB | stepping MB |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['setting']} | {r['tasks']} | {r['mc_samples']} | {r['inner_steps']} |"
      f" {r['batching']} | {r['conv_impl']} | {r['compile_s']:.1f} | {r['episode_s']:.3f} |"
      f" {r['ms_per_task']:.1f} | {r['tasks_per_s']:.1f} | {fmt(r['peak_mb'], '.0f')} |"
      f" {fmt(r.get('stepping_peak_mb'), '.0f')} |"
    )
  return "\n".join(lines)


def _in_fresh_process(name: str, algorithm: str, options: dict, row_fn=None) -> dict:
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
    return pool.submit(_on_every_core, row_fn or run_row, name, algorithm, options).result()


def _on_every_core(row_fn, *args) -> dict:
  """`row_fn(*args)` with one XLA:CPU device per core, as `main` gives its own process: a
  spawned interpreter starts JAX afresh, and without this its rows ran on one device."""
  from vampire_jax import backend

  backend.default_to_all_cpu_cores()
  return row_fn(*args)


def fmt(value, spec: str) -> str:
  """`format(value, spec)`, or "n/a" for a number that is missing (None) or NaN."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "n/a"
  return format(value, spec)


def cpu_processor(with_jaxlib: bool = True) -> Optional[dict]:
  """This CPU's `vampire_jax.backend.processor_record`, without starting JAX: for a process
  that holds no JAX while it measures (a PyTorch side, the parent of fresh interpreters), as
  `benchmarks/authors_pytorch.py`'s rows name theirs. With jaxlib's version unless
  `with_jaxlib` is False (a PyTorch row ran without it); None where the library is not
  installed (a PyTorch interpreter without it)."""
  try:
    from vampire_jax import backend
  except ImportError:  # a PyTorch interpreter without the library
    return None
  machine = {"platform": "cpu", "device_kind": "cpu", **backend.cpu_identity()}
  if with_jaxlib:
    import jaxlib

    machine["jaxlib"] = jaxlib.__version__
  return backend.processor_record(machine)


def processor_line(processor: Optional[dict]) -> str:
  """`processor: <description>`, the line a benchmark prints with its table so that a copied
  table says where it was measured (`processor`: a `processor_record`, or `cpu_processor`'s
  None)."""
  if processor is None:
    return "processor: unknown (vampire_jax is not installed in this Python)"
  return f"processor: {processor['description']}"


def _percent(fraction: Optional[float]) -> Optional[float]:
  return None if fraction is None else 100 * fraction


def _batching(row: dict) -> str:
  """The tasks' batching, and the draws' where there is more than one."""
  draws = row.get("sample_batching")
  return row["batching"] + (f", draws {draws}" if draws and row["mc_samples"] > 1 else "")


def format_table(rows: list[dict]) -> str:
  """The rows as one markdown table; "n/a" where a backend gave no number."""
  lines = [
    "| setting | algorithm | T | L | batching | compile (s) | s/step | steps/s | tasks/s |"
    " GFLOP/step (HLO) | GFLOP/step (compiled) | GFLOP/s | % peak | XLA MB | peak MB |"
    " stepping MB |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    compiled = fmt(r["compiled_gflop_per_step"], ".2f") + (
      " (loops once)" if r["compiled_has_loops"] else ""
    )
    lines.append(
      f"| {r['setting']} | {r['algorithm']} | {r['tasks']} | {r['mc_samples']} | {_batching(r)} |"
      f" {r['compile_s']:.1f} | {r['step_s']:.3f} | {r['steps_per_s']:.2f} |"
      f" {r['tasks_per_s']:.1f} | {fmt(r['gflop_per_step'], '.2f')} | {compiled} |"
      f" {fmt(r['gflop_per_s'], '.1f')} | {fmt(_percent(r['peak_fraction']), '.1f')} |"
      f" {fmt(r['xla_mb'], '.0f')} | {fmt(r['peak_mb'], '.0f')} |"
      f" {fmt(r.get('stepping_peak_mb'), '.0f')} |"
    )
  return "\n".join(lines)


def _row_line(row: dict) -> str:
  """One row as the progress line printed while the suite runs."""
  return (
    f"  {row['setting']:19s} {row['algorithm']:8s} T={row['tasks']:<3d} L={row['mc_samples']:<4d}"
    f" {row['batching']:16s} compile {row['compile_s']:6.1f} s  {row['step_s']:7.3f} s/step"
    f"  {row['tasks_per_s']:7.1f} tasks/s  {fmt(row['gflop_per_step'], '8.2f')} GFLOP/step"
    f" (compiled count {fmt(row['compiled_gflop_per_step'], '.2f')})"
    f"  {fmt(row['gflop_per_s'], '7.1f')} GFLOP/s"
    f" ({fmt(_percent(row['peak_fraction']), '.1f')}% of peak)"
    f"  XLA {fmt(row['xla_mb'], '6.0f')} MB  peak {fmt(row['peak_mb'], '6.0f')} MB"
    f" (stepping {fmt(row.get('stepping_peak_mb'), '.0f')} MB)"
  )


def main(argv=None) -> list[dict]:
  from benchmarks import arguments
  from vampire_jax import backend

  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--quick", action="store_true", help="fewer tasks, 2 timed steps")
  parser.add_argument("--settings", default=",".join(SETTINGS), help=SETTINGS_HELP)
  parser.add_argument("--algorithms", default="maml,vampire")
  parser.add_argument(
    "--tasks",
    type=arguments.count(0, " (0: the setting's)"),
    default=0,
    help="T for every setting (0: its own)",
  )
  parser.add_argument(
    "--repeats",
    type=arguments.count(1),
    default=None,
    help="timed steps (default 5, quick 2)",
  )
  parser.add_argument(
    "--batching", default=None, help="STRATEGY[:CHUNK] for every row (default: see above)"
  )
  parser.add_argument(
    "--unroll-inner-steps", action="store_true", help="unroll the inner loop instead of lax.scan"
  )
  parser.add_argument("--remat", action="store_true", help="jax.checkpoint every inner step")
  parser.add_argument(
    "--sample-batching",
    default="auto",
    choices=DRAW_BATCHINGS,
    help="how VAMPIRE's L draws are batched (auto: the backend's choice)",
  )
  parser.add_argument(
    "--mc-samples",
    type=arguments.count(0, " (0: the setting's)"),
    default=0,
    help="L of every VAMPIRE row (0: the setting's, or --quick's); not --episodes'",
  )
  parser.add_argument(
    "--second-order-steps",
    type=int,
    default=None,
    help="differentiate the likelihood's gradient in the first K inner steps only"
    " (1: the authors' code); default: all",
  )
  parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument(
    "--cpu-fusion-emitters",
    default="auto",
    choices=["auto", "on", "off"],
    help="XLA:CPU's fusion emitters (auto: the processor's, as a run's)",
  )
  parser.add_argument(
    "--peak-tflops",
    type=float,
    default=None,
    help="one device's peak TFLOP/s (default: built-in table or CPU estimate)",
  )
  parser.add_argument("--json", default=None, help="also write the rows to this file")
  parser.add_argument(
    "--same-process",
    action="store_true",
    help="run every row in this process (peak memory then accumulates)",
  )
  parser.add_argument(
    "--episodes",
    action="store_true",
    help="time VAMPIRE test episodes (adapt + predict) instead of training steps",
  )
  parser.add_argument(
    "--episode-tasks",
    type=arguments.counts(1),
    default="1,32",
    help="comma list of task counts per episode call (with --episodes)",
  )
  parser.add_argument(
    "--episode-mc-samples",
    type=arguments.count(1),
    default=10,
    help="L, weight draws to adapt and to predict (with --episodes)",
  )
  args = parser.parse_args(argv)
  algorithms = arguments.names(parser, "--algorithms", args.algorithms, ALGORITHMS)
  options = {
    "quick": args.quick,
    "tasks": args.tasks,
    "mc_samples": args.mc_samples,
    "second_order_steps": args.second_order_steps,
    "repeats": args.repeats or (2 if args.quick else 5),
    "batching": args.batching,
    "unroll_inner_steps": args.unroll_inner_steps,
    "remat": args.remat,
    "fusion_emitters": args.cpu_fusion_emitters,
    "sample_batching": args.sample_batching,
    "compute_dtype": args.compute_dtype,
    "peak_tflops": args.peak_tflops,
  }
  names = [n.strip() for n in args.settings.split(",") if n.strip()]
  unknown = set(names) - set(SETTINGS)
  if unknown:
    parser.error(f"unknown settings {sorted(unknown)}; choose from {SETTINGS_HELP}")

  if args.episodes:
    return _episodes(names, args, options)
  import jax

  print(
    f"{backend.describe_machine(backend.machine_identity())} x{jax.device_count()},"
    f" jax {jax.__version__}; {'quick' if args.quick else 'full'} settings, {options['repeats']}"
    f" timed steps, second order through"
    f" {'all' if args.second_order_steps is None else args.second_order_steps} inner steps,"
    f" {args.compute_dtype}, remat {args.remat}",
    flush=True,
  )
  rows, start = [], time.time()
  for name in names:
    for algorithm in algorithms:
      run = run_row if args.same_process else _in_fresh_process
      rows.append(run(name, algorithm, options))
      print(_row_line(rows[-1]), flush=True)
  print(
    f"\npeak FLOP/s: {rows[0]['peak_source'] if rows else ''}; inner loop"
    f" {rows[0]['inner_loop'] if rows else ''}; total wall time {time.time() - start:.0f} s\n"
  )
  print(format_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return rows


def _episodes(names: list[str], args, options: dict) -> list[dict]:
  import jax

  from vampire_jax import backend

  counts = args.episode_tasks  # a list of counts >= 1 (`arguments.counts`)
  options = dict(options, mc_samples=args.episode_mc_samples)
  print(
    f"{backend.describe_machine(backend.machine_identity())}, jax {jax.__version__};"
    " VAMPIRE test episodes,"
    f" L={args.episode_mc_samples}, {options['repeats']} timed calls",
    flush=True,
  )
  rows = []
  for name in names:
    for count in counts:
      if args.same_process:
        rows.append(run_episode_row(name, count, options))
      else:
        rows.append(_in_fresh_process(name, count, options, row_fn=run_episode_row))
      row = rows[-1]
      print(
        f"  {name:19s} T={count:<3d} compile {row['compile_s']:6.1f} s  {row['episode_s']:7.3f} s/call"
        f"  {row['ms_per_task']:8.1f} ms/task",
        flush=True,
      )
  print("\n" + format_episode_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return rows


if __name__ == "__main__":
  main()
