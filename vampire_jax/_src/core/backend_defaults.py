"""The backend's "auto" choices, decided once: what each backend picks, and why.

Every setting that says 'auto' (task batching, Monte-Carlo draw batching,
convolution, XLA:CPU's fusion emitters) and the number of meta-steps per jitted call is
resolved here;
the training loop, `algorithms`, `models`, `batching` and the benchmarks ask
this module instead of deciding on their own.

| backend | tasks | draws | convolution | why |
|---|---|---|---|---|
| cpu | `lax.map`, chunk 1 | `lax.map`, each draw recomputed in the backward pass (`remat_map`; VAMPIRE's query loss takes each draw's gradient as it runs, `batching.map_mean`) | `loop_safe`; `xla` in a loop-free program | per-task weights make `vmap` turn each convolution into a grouped one, which XLA:CPU runs slowly; XLA:CPU runs convolution gradients 5-130x slower inside a loop, and its own convolution wins only where nothing loops; a CPU step is limited by moving the draws' stacked activations, which recomputing them avoids (docs/performance.md) |
| gpu | `vmap` | `vmap` | `patches` (im2col and one batched matrix product) in loops; `xla` in a loop-free program | one wide batch keeps the device busy; on one H100 `patches` ran the 5-way 1-shot loop at 839 tasks/s against `xla`'s 531 (docs/performance.md, GPU campaign) |
| tpu, other | `vmap` | `vmap` | `xla` | grouped convolutions are fast there (unmeasured) |

On a CPU, "auto" is decided for the processor at hand: `CPU_ROWS` holds one row per kind of
processor met (vendor, family and model numbers), each filled from measurements on that
kind; a processor of no row gets the `cpu` line above. A row also names the networks XLA:CPU's older
fusion emitters compile, a compile option of every program a run compiles
(`compiler_options`): on a Zen 4 they held 80-110 MB less while stepping on Omniglot at the
same or a faster step, and stepped 10 % slower on mini-ImageNet, so that row takes them for
inputs of up to 28 x 28 values.
The table is fixed, not timed when a run starts, so no run's numbers depend on how busy the
machine was when its choices were made.

A run makes these choices once, when its folder is first recorded (`decide_run_choices`),
records them in `run.json` with the processor it made them on, and a resumed run keeps
them (`vampire_jax.runs.recorded_choices`): a run resumed on another processor, or after
this table changed, computes what it would have computed uninterrupted.

Tasks sharded over devices are batched the same way on each device (on a
CPU each device runs its share in `lax.map`: one device per core, two
independent streams of small operations). A network without convolutions (`dense_only`) is
`vmap`ped on every backend: batched matrix products are fast on a CPU too;
only the benchmarks pass it so far (the training loop keeps `lax.map` on a
CPU for every network, as its timings in docs/performance.md were taken).
"""

import functools
import math
import os
from pathlib import Path
from typing import NamedTuple, Optional

import jax
from jax.sharding import Mesh

from vampire_jax._src.core import machine, sharding


class BackendDefaults(NamedTuple):
  """What 'auto' means on one backend.

  Attributes:
    task_batching: how the tasks of a meta-step are batched.
    chunk_size: tasks per chunk for the chunked strategies.
    sample_batching: how Monte-Carlo weight draws (or particles) are batched.
    conv_in_loops: the convolution where its gradient runs inside a loop.
    conv_loop_free: the convolution in a program with no loop around it.
    why: the reason, in one line.
    older_emitters_up_to: XLA:CPU's older LLVM fusion emitters (`cpu_fusion_emitters`
      'off') for a network whose input holds at most this many values, its default MLIR
      emitters ('on') above it; 0: never. Passed to each run program's compile
      (`compiler_options`); 0 off a CPU, where the option does nothing.
  """

  task_batching: str
  chunk_size: int
  sample_batching: str
  conv_in_loops: str
  conv_loop_free: str
  why: str
  older_emitters_up_to: int = 0


CPU = BackendDefaults(
  "map",
  1,
  "remat_map",
  "loop_safe",
  "xla",
  "vmap over per-task weights makes grouped convolutions, slow on XLA:CPU; convolution "
  "gradients in loops are 5-130x slower with XLA's own convolution",
)
GPU = BackendDefaults(
  "vmap",
  1,
  "vmap",
  "patches",
  "xla",
  "one wide batch keeps the device busy; im2col convolutions ran the 5-way 1-shot loop "
  "1.58x faster than XLA's on one H100",
)
ACCELERATOR = BackendDefaults(
  "vmap",
  1,
  "vmap",
  "xla",
  "xla",
  "grouped convolutions are fast; one wide batch keeps the device busy",
)
DEFAULTS = {"cpu": CPU, "gpu": GPU, "tpu": ACCELERATOR}


class ProcessorRow(NamedTuple):
  """One kind of processor's CPU choices, and the measurements they were made from.

  Attributes:
    name: the processor kind, as a reader names it.
    vendor: `/proc/cpuinfo`'s vendor_id.
    family: its cpu family.
    models: the model numbers of the kind (empty: every model of the family).
    defaults: what 'auto' means there.
    measured: where the choices were measured, and against what.
  """

  name: str
  vendor: str
  family: int
  models: tuple
  defaults: BackendDefaults
  measured: str

  def matches(self, processor: dict) -> bool:
    """Whether `processor` (a `machine.processor_record` or `cpu_identity`) is of this kind."""
    numbers = machine.cpu_numbers(processor)
    vendor = processor.get("cpu_id", "").split()[:1]
    return (
      vendor == [self.vendor]
      and numbers.get("family") == self.family
      and (not self.models or numbers.get("model") in self.models)
    )


# What 'auto' means on each processor kind met, from measurements on it (BUILD_NOTES, "Against
# their own loop, one table per processor"); a processor of no row gets `CPU`, today's
# choices wherever they were not measured against others. A row changes only with a
# measurement on its processor; a run records the choices it ran with and keeps them.
CPU_ROWS = (
  ProcessorRow(
    "AMD Zen 4 (EPYC Genoa / Bergamo, Ryzen 7000)",
    "AuthenticAMD",
    25,
    tuple(range(0x10, 0x20)) + tuple(range(0x60, 0x80)) + tuple(range(0xA0, 0xB0)),
    CPU._replace(older_emitters_up_to=28 * 28),
    "family 25 model 17, 2026-11-29: XLA:CPU's older fusion emitters held 80-110 MB less "
    "while stepping on Omniglot (28x28x1) at the same or a faster step, and stepped 10 % "
    "slower on mini-ImageNet (84x84x3); tasks and draws in lax.map and the loop-safe "
    "convolution beat vmap, chunked vmap, patches and XLA's convolution (docs/performance.md)",
  ),
  ProcessorRow(
    "AMD Zen 5 (EPYC Turin, Ryzen 9000)",
    "AuthenticAMD",
    26,
    (),
    CPU,
    "issue 70's sitting: today's choices only, 2.25 / 1.74 / 1.12x the authors' loop",
  ),
  ProcessorRow(
    "Intel Xeon, Emerald Rapids (family 6 model 207)",
    "GenuineIntel",
    6,
    (207,),
    CPU,
    "issue 70's sitting: today's choices only, 1.61 / 1.06 / 0.59-0.86x the authors' loop",
  ),
)


@functools.lru_cache(maxsize=1)
def _this_processor() -> dict:
  return machine.cpu_identity()


def cpu_row(processor: Optional[dict] = None) -> Optional[ProcessorRow]:
  """The row of `CPU_ROWS` that `processor` (default: this machine's) is of, or None."""
  processor = _this_processor() if processor is None else processor
  return next((row for row in CPU_ROWS if row.matches(processor)), None)


def for_backend(backend: Optional[str] = None) -> BackendDefaults:
  """The defaults of `backend` (default: JAX's default backend); unknown ones as a TPU. On a
  CPU, its processor's row of `CPU_ROWS`, else `DEFAULTS["cpu"]`."""
  backend = backend or jax.default_backend()
  row = cpu_row() if backend == "cpu" else None
  return row.defaults if row is not None else DEFAULTS.get(backend, ACCELERATOR)


def default_task_batching() -> tuple[str, int]:
  """`(strategy, chunk_size)`: the fastest task batching measured on the default backend."""
  defaults = for_backend()
  return defaults.task_batching, defaults.chunk_size


def task_batching(
  strategy: str, chunk_size: int, num_tasks: int, *, dense_only: bool = False
) -> tuple[str, int]:
  """`(strategy, chunk)`: 'auto' resolved for the backend, the chunk fitted to `num_tasks`.

  Args:
    strategy: a batching strategy or 'auto'.
    chunk_size: the chunk asked for (0: the backend's).
    num_tasks: the tasks to batch (a device's share, when they are split over
      devices); the chunk becomes the largest divisor at most `chunk_size`.
    dense_only: the network has no convolution (then 'auto' is vmap).
  """
  default_strategy, default_chunk = default_task_batching()
  if strategy == "auto":
    strategy = "vmap" if dense_only else default_strategy
  chunk_size = max(1, min(chunk_size or default_chunk, num_tasks))
  while num_tasks % chunk_size:
    chunk_size -= 1
  return strategy, chunk_size


# The batching strategies that run their items one after another in a `lax.map` loop.
MAPPED_STRATEGIES = ("map", "remat_map")


def sample_batching(requested: str = "auto", *, dense_only: bool = False) -> str:
  """How Monte-Carlo draws are batched: `requested`, or for 'auto' the backend's choice."""
  if requested != "auto":
    return requested
  return "vmap" if dense_only else for_backend().sample_batching


FUSION_EMITTERS = ("auto", "on", "off")


def fusion_emitters(requested: str = "auto", input_size: Optional[int] = None) -> str:
  """XLA:CPU's fusion emitters: `requested`, or for 'auto' the backend's (processor's) choice
  for a network whose input holds `input_size` values ('on', XLA's default, where unknown).
  """
  if requested not in FUSION_EMITTERS:
    raise ValueError(f"cpu_fusion_emitters must be one of {FUSION_EMITTERS}, got {requested!r}")
  if requested != "auto":
    return requested
  up_to = for_backend().older_emitters_up_to
  return "off" if input_size is not None and input_size <= up_to else "on"


def compiler_options(setting: str = "auto", input_size: Optional[int] = None) -> dict:
  """The XLA options a run's programs compile with (`jax.jit(..., compiler_options=...)`):
  on a CPU whose fusion emitters are `setting` ('auto' resolved for `input_size`,
  `fusion_emitters`) 'off', XLA:CPU's older emitters; else none (XLA's defaults)."""
  if jax.default_backend() != "cpu" or fusion_emitters(setting, input_size) == "on":
    return {}
  return {"xla_cpu_use_fusion_emitters": False}


def conv_impl(*, task_batching: str, inner_steps_unrolled: bool, draws_mapped: bool) -> str:
  """The fastest measured convolution for a meta-step's loop structure on this backend.

  A program is loop-free when its tasks are unrolled (`task_batching`
  'host_chunked' or 'unroll'), its inner steps unrolled, and its draws not in
  `lax.map`.
  """
  defaults = for_backend()
  tasks_unrolled = task_batching in ("host_chunked", "unroll")
  loop_free = tasks_unrolled and inner_steps_unrolled and not draws_mapped
  return defaults.conv_loop_free if loop_free else defaults.conv_in_loops


def config_conv_impl(config) -> str:
  """The config's convolution, 'auto' resolved for the loops that config builds."""
  if config.conv_impl != "auto":
    return config.conv_impl
  strategy, _ = task_batching(
    config.speed.task_batching, config.speed.chunk_size, config.schedule.tasks_per_step
  )
  mapped_draws = (
    sample_batching(config.speed.sample_batching) in MAPPED_STRATEGIES
    and max(
      getattr(config.algorithm, "num_mc_train", 1), getattr(config.algorithm, "num_mc_query", 1)
    )
    > 1
  )
  return conv_impl(
    task_batching=strategy,
    inner_steps_unrolled=bool(config.speed.unroll_inner_steps),
    draws_mapped=mapped_draws,
  )


# The speed settings a run resolves here, with the value that says "the backend's" (a chunk's
# 0), by field: what a run records it ran with (`run.json`'s backend_choices) and a
# resumed run keeps. A config's `conv_impl` is the network's, chosen beside them.
RUN_CHOICES = {
  "task_batching": "auto",
  "chunk_size": 0,
  "eval_task_batching": "auto",
  "eval_chunk_size": 0,
  "sample_batching": "auto",
  "cpu_fusion_emitters": "auto",
}

# What a run recorded before a choice existed ran with, by field: a resumed run of such a
# record keeps it (XLA's defaults then).
RECORDED_BEFORE = {"cpu_fusion_emitters": "on"}


def decide_run_choices(
  speed, *, train_tasks: int, eval_tasks: int, input_size: Optional[int] = None
) -> dict:
  """What this backend runs a run's speed settings (a `Speed` part) with: each field of
  `RUN_CHOICES`, 'auto' (or 0) resolved, the chunks fitted to the tasks each device runs.

  Args:
    speed: the run's speed settings.
    train_tasks: a meta-step's tasks per device.
    eval_tasks: an evaluation call's tasks per device.
    input_size: the values in one input of the network (28 * 28 for Omniglot), or None.
  """
  strategy, chunk = task_batching(speed.task_batching, speed.chunk_size, train_tasks)
  eval_strategy, eval_chunk = task_batching(
    speed.eval_task_batching, speed.eval_chunk_size, eval_tasks
  )
  return {
    "task_batching": strategy,
    "chunk_size": chunk,
    "eval_task_batching": eval_strategy,
    "eval_chunk_size": eval_chunk,
    "sample_batching": sample_batching(speed.sample_batching),
    "cpu_fusion_emitters": fusion_emitters(speed.cpu_fusion_emitters, input_size),
  }


def steps_per_call(config, first_step: int) -> int:
  """Meta-steps per jitted call: the config's (default 1), made to divide every boundary.

  Logging, validation and checkpoints happen between calls, so the count
  divides their intervals, the run's length and the step it resumes from.
  The same on every backend: more steps per call save the host round trip
  only where it is not already hidden (see docs/performance.md).
  """
  requested = config.speed.steps_per_call or 1
  return math.gcd(
    requested,
    config.evaluation.log_every,
    config.evaluation.eval_every,
    config.evaluation.checkpoint_every,
    config.schedule.num_meta_steps,
    first_step or requested,
  )


# -- Devices and the compilation cache ---------------------------------------------


def task_mesh_for(config, num_tasks: int) -> Optional[Mesh]:
  """The device mesh `num_tasks` tasks are split over, or None for one device.

  'off': None. 'on': every device (of every host); `num_tasks` must divide
  evenly. 'auto': like 'on' when more than one device is visible; with one
  process it takes the largest number of devices that divides `num_tasks`.
  """
  devices = jax.devices()
  if config.speed.shard_tasks == "off" or (
    config.speed.shard_tasks == "auto" and len(devices) == 1
  ):
    return None
  if config.speed.shard_tasks == "auto" and jax.process_count() == 1:
    count = max(n for n in range(1, len(devices) + 1) if num_tasks % n == 0)
    devices = devices[:count]
  mesh = sharding.task_mesh(devices)
  sharding.check_divisible(num_tasks, mesh)
  return mesh


def enable_compilation_cache(cache_dir: str | os.PathLike) -> Path:
  """Turns on JAX's persistent compilation cache in `cache_dir`.

  A second run of the same program loads its compiled steps instead of
  compiling them (keyed by the program and the compiler, so nothing stale
  is reused). Call it before anything is compiled.
  """
  folder = Path(cache_dir)
  folder.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  return folder
