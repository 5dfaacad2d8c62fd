"""The machine a number was measured on (`vampire_jax.backend.machine_identity`,
`processor_record`): the CPU's model name, family and model numbers, its vector units and
jaxlib, read from `/proc/cpuinfo`; and the benchmark rows that name it."""

import json
from pathlib import Path

import jax
import jaxlib
import pytest

from tests.helpers import python_json
from vampire_jax import backend


def _cpuinfo(family: int, model: int, name: str, vendor: str, flags: str) -> str:
  """/proc/cpuinfo of a 2-core machine (both blocks alike)."""
  block = (
    f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
    f"model name\t: {name}\nstepping\t: 1\nflags\t\t: fpu sse2 avx avx2 fma {flags}\n"
  )
  return "\n".join(block.format(i) for i in range(2))


ZEN4 = _cpuinfo(25, 17, "AMD EPYC", "AuthenticAMD", "vaes avx512f avx512bw avx512_bf16")
# Sapphire Rapids: AMX's tile and bfloat16 units beside AVX-512.
SAPPHIRE_RAPIDS = _cpuinfo(
  6, 143, "Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", "avx512f amx_bf16 amx_tile amx_int8"
)
HASWELL = _cpuinfo(6, 63, "Intel(R) Xeon(R) CPU E5-2680 v3", "GenuineIntel", "")


def _record(cpuinfo: str) -> dict:
  machine = dict(backend.cpu_identity(cpuinfo), platform="cpu", device_kind="cpu", jaxlib="0.10.2")
  return backend.processor_record(machine)


def test_the_record_names_the_family_the_model_and_the_vector_units():
  zen4, sapphire, haswell = _record(ZEN4), _record(SAPPHIRE_RAPIDS), _record(HASWELL)
  assert (zen4["cpu"], zen4["family"], zen4["model"], zen4["stepping"]) == ("AMD EPYC", 25, 17, 1)
  assert (zen4["avx2"], zen4["avx512f"], zen4["amx"]) == (True, True, False)
  assert (sapphire["family"], sapphire["model"]) == (6, 143)
  assert (sapphire["avx2"], sapphire["avx512f"], sapphire["amx"]) == (True, True, True)
  assert (haswell["avx2"], haswell["avx512f"], haswell["amx"]) == (True, False, False)
  assert zen4["jaxlib"] == "0.10.2"
  assert zen4["description"] == (
    f"cpu (AMD EPYC, AuthenticAMD family 25 model 17 stepping 1, AVX-512, {zen4['cores']} "
    "cores), jaxlib 0.10.2"
  )
  assert ", AMX, " in sapphire["description"] and ", AVX2, " in haswell["description"]
  assert json.loads(json.dumps(zen4)) == zen4  # a JSON value, as rows and run.json hold it


def test_an_identity_without_flags_or_numbers_has_no_vector_units():
  """Off Linux (no /proc/cpuinfo), or a GPU's identity: nothing claimed."""
  bare = backend.cpu_identity("")
  assert bare["isa"] == "" and "cpu_id" not in bare and bare["cpu"]
  gpu = backend.processor_record({"platform": "gpu", "device_kind": "NVIDIA H200", "jaxlib": "1"})
  assert (gpu["avx2"], gpu["avx512f"], gpu["amx"]) == (False, False, False)
  assert "family" not in gpu and gpu["description"] == "gpu (NVIDIA H200), jaxlib 1"
  # A process without JAX (PyTorch's harness) names no jaxlib.
  no_jax = backend.processor_record(dict(backend.cpu_identity(ZEN4), platform="cpu"))
  assert "jaxlib" not in no_jax["description"]


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads /proc/cpuinfo")
def test_this_machine_is_read_from_proc_cpuinfo():
  text = Path("/proc/cpuinfo").read_text()
  name = next(line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line)
  flags = next(
    line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")
  )
  here = backend.processor_record()
  assert here["platform"] == jax.devices()[0].platform
  assert here["jaxlib"] == jaxlib.__version__
  if here["platform"] == "cpu":
    assert here["cpu"] == name
    assert here["avx2"] == ("avx2" in flags) and here["avx512f"] == ("avx512f" in flags)
    assert here["amx"] == any(flag.startswith("amx") for flag in flags)
    assert {"family", "model"} <= set(here)


def test_the_zoo_verifies_against_the_same_identity():
  """One definition: `experiments.zoo_verify`'s machine is the library's."""
  from experiments import zoo_verify

  assert zoo_verify.this_machine is backend.machine_identity
  assert zoo_verify.cpu_identity is backend.cpu_identity
  assert zoo_verify.describe_machine is backend.describe_machine


# `suite.run_row` points JAX's persistent cache at a fresh folder: put it back after.
CACHE_OPTIONS = (
  "jax_compilation_cache_dir",
  "jax_persistent_cache_min_compile_time_secs",
  "jax_persistent_cache_min_entry_size_bytes",
)


def test_a_suite_row_names_its_processor():
  from benchmarks import suite

  saved = {name: getattr(jax.config, name) for name in CACHE_OPTIONS}
  options = {
    "quick": True,
    "tasks": 2,
    "repeats": 1,
    "batching": None,
    "unroll_inner_steps": False,
    "remat": False,
    "compute_dtype": "float32",
    "peak_tflops": None,
  }
  try:
    row = suite.run_row("regression", "maml", options)
  finally:
    for name, value in saved.items():
      jax.config.update(name, value)
  assert row["processor"] == backend.processor_record()
  assert json.loads(json.dumps(row))["processor"]["jaxlib"] == jaxlib.__version__


def test_the_pytorch_harness_names_its_processor_without_starting_jax():
  """Its process holds no JAX while it steps: the row's processor is read afterwards, from
  /proc/cpuinfo alone, and JAX's backend is never started."""
  pytest.importorskip("torch")
  code = (
    "import sys; from benchmarks import authors_pytorch as ap; "
    "assert 'jax' not in sys.modules; "
    "row = ap._environment({}); import json; "
    "print(json.dumps([row['processor'], 'jax._src.xla_bridge' in sys.modules "
    "and bool(sys.modules['jax._src.xla_bridge']._backends)]))"
  )
  processor, started = python_json(code)
  assert not started
  here = backend.cpu_identity()
  assert processor["cpu"] == here["cpu"] and processor["isa"] == here["isa"]
  assert "avx512f" in processor and "jaxlib" not in processor


def test_side_by_side_names_the_processor_both_sides_ran_on():
  from benchmarks import side_by_side

  processor = side_by_side.this_processor()
  assert processor["jaxlib"] == jaxlib.__version__
  assert processor["cpu"] == backend.cpu_identity()["cpu"]
