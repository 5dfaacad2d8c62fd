"""The machine a number was measured on, or a backend choice made on: its processor and jaxlib.

    machine_identity()   {"platform", "device_kind", "cpu", "cpu_id", "isa", "cores", "jaxlib"}
    processor_record()   the identity with the vector units a reader looks for, and one line
    describe_machine(m)  "cpu (AMD EPYC, AuthenticAMD family 25 model 17 stepping 1, AVX-512,
                         2 cores), jaxlib 0.10.2"

XLA compiles for the device it runs on: on a GPU its kind; on a CPU the processor's vendor,
family, model and stepping and the instruction sets LLVM targets (two "AMD EPYC" of
different generations, one with AVX-512, compile different kernels), and the number of
cores (XLA splits a large matmul's sum over its threads). Then jaxlib's version and XLA's
flags (`--xla_cpu_max_isa=SSE4_2` makes another CPU's programs). The identity holds those
and nothing else (not the device count, which changes no score), so two machines of one
identity compile the same programs. `cpu_identity` reads `/proc/cpuinfo` with the standard
library alone.
"""

import os
import platform
import re
from pathlib import Path
from typing import Optional

# The instruction-set flags of /proc/cpuinfo that change what LLVM emits for XLA:CPU
# (vector width, fused multiply-add, AVX-512's and AMX's dot-product units).
_ISA_FLAG = re.compile(r"^(sse\d.*|ssse3|avx.*|fma.*|f16c|amx.*|bmi\d)$")

# The widest vector unit among the ISA flags, as a reader names it.
_WIDEST = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))


def cpu_identity(cpuinfo: Optional[str] = None) -> dict:
  """`{"cpu": model name, "cpu_id": "vendor family F model M stepping S", "isa": flags,
  "cores": n}` of this machine (of `cpuinfo`'s text, given), as far as the system says."""
  fields = {}
  try:
    text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
  except OSError:
    text = ""
  for line in text.splitlines():
    if not line.strip():
      break  # the first processor's block describes them all
    key, _, value = line.partition(":")
    fields[key.strip()] = value.strip()
  name = fields.get("model name") or platform.processor() or platform.machine() or "unknown"
  identity = {"cpu": name}
  if "vendor_id" in fields:
    identity["cpu_id"] = " ".join(
      [fields["vendor_id"]]
      + [
        f"{key.split()[-1]} {fields[key]}"
        for key in ("cpu family", "model", "stepping")
        if key in fields
      ]
    )
  identity["isa"] = " ".join(
    sorted(f for f in fields.get("flags", "").split() if _ISA_FLAG.match(f))
  )
  identity["cores"] = (
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  )
  return identity


def machine_identity() -> dict:
  """What decides the last bits of a number here, and nothing else (the module's docstring):
  the platform and device kind, on a CPU its `cpu_identity`, jaxlib's version and the
  XLA flags that change the programs (`xla_flags`, where any is set)."""
  import jax
  import jaxlib

  device = jax.devices()[0]
  machine = {"platform": device.platform, "device_kind": device.device_kind}
  if device.platform == "cpu":
    machine.update(cpu_identity())
  machine["jaxlib"] = jaxlib.__version__
  flags = [
    flag
    for flag in os.environ.get("XLA_FLAGS", "").split()
    if not flag.startswith("--xla_force_host_platform_device_count")
  ]
  return dict(machine, xla_flags=" ".join(flags)) if flags else machine


def vector_units(machine: dict) -> dict:
  """`{"avx2": bool, "avx512f": bool, "amx": bool}` of an identity's ISA flags (all False off
  a CPU, or for an identity recorded before the flags were)."""
  isa = machine.get("isa", "").split()
  return {
    "avx2": "avx2" in isa,
    "avx512f": "avx512f" in isa,
    "amx": any(flag.startswith("amx") for flag in isa),
  }


def cpu_numbers(machine: dict) -> dict:
  """`{"family": F, "model": M, "stepping": S}` (ints) of an identity's `cpu_id`, as far as it
  names them."""
  words = machine.get("cpu_id", "").split()
  numbers = {}
  for name, value in zip(words, words[1:]):
    if name in ("family", "model", "stepping") and value.isdigit():
      numbers[name] = int(value)
  return numbers


def describe_machine(machine: dict) -> str:
  """e.g. "cpu (AMD EPYC, AuthenticAMD family 25 model 17 stepping 1, AVX-512, 2 cores),
  jaxlib 0.10.2" or "gpu (NVIDIA H200), jaxlib 0.11.2". A record of an older manifest
  names the CPU's model name alone; one of a process without JAX (`cpu_identity` with the
  platform) no jaxlib."""
  if machine["platform"] == "cpu":
    isa = machine.get("isa", "").split()
    widest = next((name for flag, name in _WIDEST if flag in isa), None)
    parts = [machine.get("cpu"), machine.get("cpu_id"), widest]
    parts += [f"{machine['cores']} cores"] if "cores" in machine else []
    kind = ", ".join(part for part in parts if part)
  else:
    kind = machine["device_kind"]
  jaxlib = f", jaxlib {machine['jaxlib']}" if "jaxlib" in machine else ""
  flags = f", XLA_FLAGS {machine['xla_flags']}" if "xla_flags" in machine else ""
  return f"{machine['platform']} ({kind}){jaxlib}{flags}"


def processor_record(machine: Optional[dict] = None) -> dict:
  """What a benchmark row or a run's record names its processor by: `machine` (default:
  `machine_identity()`), the CPU's family and model numbers and vector units apart, and
  the one line `describe_machine` gives.

  e.g. `{"platform": "cpu", "device_kind": "cpu", "cpu": "AMD EPYC", "cpu_id":
  "AuthenticAMD family 25 model 17 stepping 1", "isa": "avx avx2 ... fma ...", "cores": 2,
  "jaxlib": "0.10.2", "family": 25, "model": 17, "stepping": 1, "avx2": true, "avx512f":
  true, "amx": false, "description": "cpu (AMD EPYC, ...), jaxlib 0.10.2"}`.
  """
  machine = machine_identity() if machine is None else dict(machine)
  return {
    **machine,
    **cpu_numbers(machine),
    **vector_units(machine),
    "description": describe_machine(machine),
  }
