import os
import subprocess
import sys
from pathlib import Path

import pytest

import vampire_jax as vj
from tests.helpers import _regression_problem

REPO = Path(__file__).resolve().parents[2]


def _env(**variables) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
  return dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **variables)


def _python(code: str, **variables) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-c", code], env=_env(**variables), capture_output=True, text=True, timeout=120
  )


def test_mesh_choice_and_flags():
  import argparse

  from experiments import cli
  from vampire_jax._src.core import backend_defaults
  from vampire_jax.runs import programs

  parser = argparse.ArgumentParser()
  cli.add_config_flags(parser, vj.RunConfig())
  args = parser.parse_args(["--shard-tasks", "off", "--remat", "--compute-dtype", "bfloat16"])
  config = cli.apply_overrides(vj.RunConfig(), args)
  assert (config.speed.shard_tasks, config.speed.remat, config.speed.compute_dtype) == (
    "off",
    True,
    "bfloat16",
  )
  assert backend_defaults.task_mesh_for(config, 32) is None
  # One visible device: 'auto' does not shard, 'on' makes a one-device mesh.
  assert backend_defaults.task_mesh_for(vj.RunConfig(), 32) is None
  assert backend_defaults.task_mesh_for(vj.RunConfig().replace(shard_tasks="on"), 32).size == 1
  with pytest.raises(vj.ConfigError, match=r"shard_tasks must be one of auto, on, off, got 'yes'"):
    vj.RunConfig().replace(shard_tasks="yes").validate()
  with pytest.raises(
    vj.ConfigError, match=r"compute_dtype must be one of float32, bfloat16, got 'float16'"
  ):
    vj.RunConfig().replace(compute_dtype="float16").validate()
  with pytest.raises(vj.ConfigError, match="host_chunked"):
    programs.build_train_step(
      _regression_problem(),
      vj.RunConfig().replace(task_batching="host_chunked"),
      None,
      None,
      vj.task_mesh(),
      1,
    )


@pytest.mark.parametrize("tasks", [3, 6])
def test_tasks_that_do_not_divide_take_the_largest_mesh_that_does(tasks):
  code = (
    "import jax, vampire_jax as vj; from vampire_jax import backend_defaults; "
    f"mesh = backend_defaults.task_mesh_for(vj.RunConfig(), {tasks}); "
    "print(1 if mesh is None else mesh.size)"
  )
  out = _python(code, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  assert out.returncode == 0, out.stderr[-2000:]
  assert int(out.stdout) == {3: 3, 6: 3}[tasks]
