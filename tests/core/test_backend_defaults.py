import os
import subprocess
import sys
from pathlib import Path

import jax
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


ZEN_4 = {"cpu": "AMD EPYC", "cpu_id": "AuthenticAMD family 25 model 17 stepping 1"}


@pytest.mark.parametrize(
  "cpu_id, row",
  [
    ("AuthenticAMD family 25 model 17 stepping 1", "AMD Zen 4"),  # Genoa
    ("AuthenticAMD family 25 model 97 stepping 2", "AMD Zen 4"),  # Raphael
    ("AuthenticAMD family 25 model 1 stepping 1", None),  # Zen 3, Milan: not measured
    ("AuthenticAMD family 26 model 2 stepping 0", "AMD Zen 5"),
    ("GenuineIntel family 6 model 207 stepping 2", "Intel Xeon, Emerald Rapids"),
    ("GenuineIntel family 6 model 143 stepping 8", None),  # Sapphire Rapids: not measured
    (None, None),  # /proc/cpuinfo unreadable
  ],
)
def test_each_processor_kind_met_has_its_row_and_any_other_the_cpu_defaults(
  cpu_id, row, monkeypatch
):
  from vampire_jax._src.core import backend_defaults

  processor = {"cpu": "some CPU"} if cpu_id is None else {"cpu": "some CPU", "cpu_id": cpu_id}
  found = backend_defaults.cpu_row(processor)
  assert found.name.startswith(row) if row else found is None, found
  monkeypatch.setattr(backend_defaults, "_this_processor", lambda: processor)
  defaults = backend_defaults.for_backend("cpu")
  assert defaults == (found.defaults if found else backend_defaults.DEFAULTS["cpu"])
  assert backend_defaults.for_backend("gpu") == backend_defaults.GPU  # no CPU row off a CPU
  if jax.default_backend() == "cpu":
    off = {"xla_cpu_use_fusion_emitters": False}
    for size in (1, 28 * 28, 84 * 84 * 3):
      older = size <= defaults.older_emitters_up_to
      assert vj.backend.fusion_emitters("auto", size) == ("off" if older else "on")
      assert vj.backend.compiler_options("auto", size) == (off if older else {})
    assert vj.backend.fusion_emitters("auto") == "on"  # a network of unknown input: XLA's
    assert vj.backend.compiler_options("off") == off and vj.backend.compiler_options("on") == {}


def test_the_rows_choices_are_ones_a_config_can_name():
  from vampire_jax._src.core import backend_defaults

  # Measured there: the older emitters for Omniglot's 28 x 28, not mini-ImageNet's 84 x 84 x 3.
  assert backend_defaults.cpu_row(ZEN_4).defaults.older_emitters_up_to == 28 * 28
  for row in backend_defaults.CPU_ROWS:
    assert row.defaults.task_batching in vj.backend.BATCHING_STRATEGIES
    assert row.defaults.sample_batching in vj.backend.BATCHING_STRATEGIES
    assert {row.defaults.conv_in_loops, row.defaults.conv_loop_free} <= set(vj.backend.CONV_IMPLS)
    assert row.defaults.older_emitters_up_to >= 0 and row.measured
  with pytest.raises(ValueError, match="cpu_fusion_emitters"):
    vj.backend.fusion_emitters("fast")
