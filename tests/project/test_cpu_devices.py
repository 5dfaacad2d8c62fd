"""One XLA:CPU device per core by default (issue 30): who decides the count, and a run
that gives the same numbers, bit for bit, on one device and on several.

Each check runs in a fresh process: JAX fixes its devices when it starts. The suite
itself keeps one device (tests/conftest.py sets JAX_NUM_CPU_DEVICES=1); these children
drop that setting to see the default.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_OMNIGLOT_FLAGS, needs_omniglot

REPO = Path(__file__).resolve().parents[2]


def _env(**variables) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
  return dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **variables)


def _python(code: str, **variables) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-c", code], env=_env(**variables), capture_output=True, text=True, timeout=120
  )


COUNT = (
  "import jax, vampire_jax as vj; from vampire_jax._src.core import sharding; "
  "vj.use_all_cpu_cores(); print(len(jax.devices('cpu')), sharding.cpu_core_count())"
)


def _rows_without_rates(workdir: Path) -> list[dict]:
  """metrics.jsonl's rows without their wall-clock rates."""
  return [
    {k: v for k, v in json.loads(line).items() if not k.endswith("_per_s")}
    for line in (workdir / "metrics.jsonl").read_text().splitlines()
  ]


def test_the_default_is_one_device_per_core_and_a_users_count_wins():
  devices, cores = map(int, _python(COUNT).stdout.split())
  assert devices == cores
  assert _python(COUNT, JAX_NUM_CPU_DEVICES="1").stdout.split()[0] == "1"
  forced = _python(COUNT, XLA_FLAGS="--xla_force_host_platform_device_count=3")
  assert forced.stdout.split()[0] == "3"
  explicit = "import jax, vampire_jax as vj; vj.use_all_cpu_cores(5); print(len(jax.devices()))"
  assert _python(explicit).stdout.strip() == "5"


def test_the_readmes_line_gives_every_core_to_a_users_own_code():
  from tests.project.test_readme import readme_blocks

  block = readme_blocks("cpu-cores") + "\nprint(len(jax.devices()), mesh.size)"
  out = _python(block)
  assert out.returncode == 0, out.stderr[-2000:]
  cores = int(_python(COUNT).stdout.split()[1])
  assert out.stdout.split() == [str(cores), str(cores)]


def test_too_late_is_said_not_ignored():
  late = _python("import jax, vampire_jax as vj; jax.numpy.zeros(1); vj.use_all_cpu_cores(4)")
  assert late.returncode != 0
  assert "use_all_cpu_cores: JAX has started already, with 1 CPU device(s)" in late.stderr
  # An entry point called in a process whose JAX has started (a notebook, a test) goes on.
  entry = _python(
    "import jax; from vampire_jax._src.core import sharding; jax.numpy.zeros(1); "
    "sharding.default_to_all_cpu_cores(); print(len(jax.devices()))"
  )
  assert entry.returncode == 0 and entry.stdout.strip() == "1"


@pytest.mark.slow  # two command lines, one device and every core
@needs_omniglot
def test_a_run_gives_the_same_numbers_on_one_device_and_on_every_core(tmp_path, tiny_omniglot_run):
  # The experiments' default (one device per core: tasks sharded, each device's share in
  # lax.map), the suite's shared run (`tiny_omniglot_run`: the command line in a fresh
  # process as a user starts it), against the same command with JAX_NUM_CPU_DEVICES=1.
  # Every training loss, every validation and test number agree bit for bit: the tasks and
  # their keys come from the step and the task's index, never from a device, and the
  # meta-gradient is reduced in task order.
  cores_dir, config, cores = tiny_omniglot_run
  workdir = tmp_path / "one"
  command = [sys.executable, "-m", "experiments.omniglot", *TINY_OMNIGLOT_FLAGS]
  command += ["--data-dir", config.data_dir, "--cache-dir", config.cache_dir]
  command += ["--workdir", str(workdir)]
  run = subprocess.run(
    command, env=_env(JAX_NUM_CPU_DEVICES="1"), cwd=REPO, capture_output=True, text=True,
    timeout=600,
  )  # fmt: skip
  assert run.returncode == 0, run.stderr[-3000:]
  one = json.loads((workdir / "results.json").read_text())
  one_metrics, cores_metrics = (_rows_without_rates(folder) for folder in (workdir, cores_dir))
  assert one["task_mesh_devices"] == 1
  cores_count = int(_python(COUNT).stdout.split()[1])
  assert cores["task_mesh_devices"] == max(n for n in (1, 2) if n <= cores_count)
  assert len(one_metrics) >= 4 and cores_metrics == one_metrics
  assert cores["test"] == one["test"] and cores["best_validation"] == one["best_validation"]
