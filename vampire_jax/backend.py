"""How the work runs on the backend at hand: what the experiments and benchmarks choose by.

A setting that says 'auto' (the batching of a meta-step's tasks and of its Monte-Carlo
draws, the convolution, the device mesh) is resolved for the backend JAX runs on:

- `task_batching`, `sample_batching`, `conv_impl` and `config_conv_impl` resolve 'auto'
  (on a CPU: tasks and draws in `lax.map`, the loop-safe convolution; on a GPU: `vmap`,
  the im2col convolution); `fusion_emitters` resolves XLA:CPU's fusion emitters and
  `compiler_options` gives the XLA options a run's programs compile with; on a CPU each
  is the processor's: its row of `CPU_ROWS` (`cpu_row`, a `ProcessorRow` measured on that
  kind of processor), else today's CPU choices; `task_mesh_for` is the mesh a config's
  tasks are split over;
- `BATCHING_STRATEGIES` names the ways to batch tasks or draws, `MAPPED_STRATEGIES` those
  that loop over them one at a time, `CONV_IMPLS` the convolutions `vj.Conv4` takes;
- `make_host_chunked_train_step` is the 'host_chunked' task batching: a loop-free jitted
  program per chunk of tasks, the chunks looped on the host (for XLA's own convolution on
  a CPU);
- `conv2d` is the loop-safe convolution (`conv_impl="loop_safe"`): its gradients are
  forward convolutions (`input_gradient`) and one matrix product of the kernel's taps
  (`filter_gradient`, `kernel_taps`), which XLA:CPU runs at full speed inside loops;
  `same_padding` is XLA's 'SAME' padding. It is reverse-mode only (a `jax.custom_vjp`):
  `jax.jvp`, `jax.jacfwd` and `jax.hessian` of it raise a TypeError; `conv_impl="xla"`
  differentiates forward, or take `jax.jacrev(jax.jacrev(f))` for a Hessian;
- `machine_identity` is what decides the last bits of a number here (the device kind; on a
  CPU the processor's vendor, family, model, stepping, instruction sets and cores; jaxlib;
  XLA's flags); `cpu_identity` reads the CPU's from `/proc/cpuinfo`; `processor_record`
  adds the family and model numbers, the vector units (`avx2`, `avx512f`, `amx`) and a
  line (`describe_machine`): what a benchmark row and a run's `run.json` name their
  processor by;
- `default_to_all_cpu_cores` gives XLA one CPU device per core, as the commands do;
  `enable_compilation_cache` keeps compiled programs on disk; `release_freed_memory`
  hands the memory a compile freed back to the operating system, with the resident pages of
  the process's read-only file mappings (jaxlib's compiler code above all), and
  `drop_compiled_programs` forgets the programs compiled so far, with their memory;
  `compiled_on_first_call` compiles a jitted step for its first call's arguments and keeps
  the executable alone, as a run's train step does
  (`memory_release_enabled`: unless `VAMPIRE_JAX_MEMORY_RELEASE` turns them off).

The training loop decides by the same functions, so a benchmark that asks them measures
what a run does.
"""

from vampire_jax._src.core.backend_defaults import (
  CPU_ROWS,
  MAPPED_STRATEGIES,
  ProcessorRow,
  compiler_options,
  config_conv_impl,
  conv_impl,
  cpu_row,
  enable_compilation_cache,
  fusion_emitters,
  sample_batching,
  task_batching,
  task_mesh_for,
)
from vampire_jax._src.core.batching import (
  BATCHING_STRATEGIES,
  map_mean,
)
from vampire_jax._src.core.convolution import (
  conv2d,
  filter_gradient,
  input_gradient,
  kernel_taps,
  same_padding,
)
from vampire_jax._src.core.host_chunked import (
  make_host_chunked_train_step,
)
from vampire_jax._src.core.host_memory import (
  enabled as memory_release_enabled,
)
from vampire_jax._src.core.host_memory import (
  compiled_on_first_call,
  drop_compiled_programs,
  release_freed_memory,
)
from vampire_jax._src.core.machine import (
  cpu_identity,
  describe_machine,
  machine_identity,
  processor_record,
)
from vampire_jax._src.core.models import (
  CONV_IMPLS,
)
from vampire_jax._src.core.sharding import (
  default_to_all_cpu_cores,
)

__all__ = (
  # 'auto' resolved for this backend.
  "task_batching",
  "sample_batching",
  "conv_impl",
  "config_conv_impl",
  "fusion_emitters",
  "compiler_options",
  "task_mesh_for",
  # What 'auto' means on each processor kind met, and this one's.
  "CPU_ROWS",
  "ProcessorRow",
  "cpu_row",
  # The choices' names.
  "BATCHING_STRATEGIES",
  "MAPPED_STRATEGIES",
  "CONV_IMPLS",
  # Tasks in loop-free chunks, looped on the host.
  "make_host_chunked_train_step",
  # A mean over items in a loop, each item's gradient taken as it runs.
  "map_mean",
  # The loop-safe convolution and its gradients.
  "conv2d",
  "input_gradient",
  "filter_gradient",
  "kernel_taps",
  "same_padding",
  # The machine a number was measured on, or a choice made on.
  "machine_identity",
  "cpu_identity",
  "processor_record",
  "describe_machine",
  # The process: CPU devices, the compilation cache, host memory.
  "default_to_all_cpu_cores",
  "enable_compilation_cache",
  "release_freed_memory",
  "drop_compiled_programs",
  "compiled_on_first_call",
  "memory_release_enabled",
)
