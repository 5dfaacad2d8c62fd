"""The benchmarks run on any backend, count FLOPs that scale with the work, and time what training runs."""

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks import gpu_sweep, meta_step, simpa_inner_loop, simpa_step_tasks, suite
from tests.helpers import REPO_ROOT, _argparse_error, python_json
from vampire_jax import backend

QUICK_OPTIONS = {
  "quick": True,
  "tasks": 2,
  "repeats": 1,
  "batching": None,
  "unroll_inner_steps": False,
  "remat": False,
  "compute_dtype": "float32",
  "peak_tflops": None,
}


CACHE_OPTIONS = (
  "jax_compilation_cache_dir",
  "jax_persistent_cache_min_compile_time_secs",
  "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def keep_cache_config():
  """`suite.run_row` points JAX's persistent cache at a fresh folder: undo it after the test."""
  saved = {name: getattr(jax.config, name) for name in CACHE_OPTIONS}
  yield
  for name, value in saved.items():
    jax.config.update(name, value)


def _refused(capsys, main, argv: list[str]) -> str:
  """Runs `main(argv)`, which must exit with status 2 (argparse's refusal); returns stderr."""
  with pytest.raises(SystemExit) as exited:
    main(argv)
  assert exited.value.code == 2, exited.value.code
  return capsys.readouterr().err


@pytest.fixture
def no_work(monkeypatch):
  """Makes every benchmark's work (timing, compiling, children, loading runs) fail the test."""

  def started(*args, **kwargs):
    raise AssertionError("the benchmark started its work before refusing its arguments")

  import concurrent.futures

  from benchmarks import (
    compile_peak,
    divergence_side_by_side,
    posterior_spread,
    profile_step,
    side_by_side,
  )

  monkeypatch.setattr(subprocess, "run", started)
  monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", started)
  monkeypatch.setattr(meta_step, "time_step", started)
  monkeypatch.setattr(suite, "run_row", started)
  monkeypatch.setattr(suite, "run_episode_row", started)
  monkeypatch.setattr(compile_peak, "measure", started)
  monkeypatch.setattr(profile_step, "profile", started)
  monkeypatch.setattr(side_by_side, "run_process", started)
  monkeypatch.setattr(divergence_side_by_side, "run_ours", started)
  monkeypatch.setattr(posterior_spread, "load_at", started)


TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize(
  "argv, says",
  [
    (["--seeds", "0,a"], "argument --seeds: comma-separated integers >= 0 (e.g. 0,1), not '0,a'"),
    (["--seeds", "-1"], "argument --seeds: comma-separated integers >= 0 (e.g. 0,1), not '-1'"),
    (
      ["--kl-samples", "1"],
      "argument --kl-samples: a count of at least 2 (SImPa's KL estimate needs two draws), not '1'",
    ),
  ],
)
def test_simpa_inner_loop_refuses_what_it_cannot_use(capsys, argv, says):
  """Bad `--seeds` and `--kl-samples` 1 are refused by argparse, naming the form or the least
  count and the value given, before any data is built."""
  assert _argparse_error(capsys, lambda: simpa_inner_loop.main(argv)).endswith(says)


@pytest.mark.parametrize(
  "argv, says",
  [
    (
      ["--stop", "3", "--kl-samples", "1"],
      "argument --kl-samples: a count of at least 2 (SImPa's KL estimate needs two draws), not '1'",
    ),
    (["--stop", "-1"], "argument --stop: a count of at least 0 (the meta-steps to run before"),
  ],
)
def test_simpa_step_tasks_refuses_what_it_cannot_use(capsys, argv, says):
  """Refused in one line before any data are built."""
  assert says in _argparse_error(capsys, lambda: simpa_step_tasks.main(argv))


@pytest.mark.slow
def test_suite_row_counts_flops_in_proportion_to_tasks(keep_cache_config):
  two = suite.run_row("regression", "maml", QUICK_OPTIONS)
  four = suite.run_row("regression", "maml", dict(QUICK_OPTIONS, tasks=4))
  assert two["tasks"] == 2 and two["step_s"] > 0 and two["loss_finite"]
  # Twice the tasks, twice the work (up to the shared optimiser update).
  assert four["gflop_per_step"] == pytest.approx(2 * two["gflop_per_step"], rel=0.05)
  assert four["compiled_gflop_per_step"] == pytest.approx(
    2 * two["compiled_gflop_per_step"], rel=0.05
  )
  table = suite.format_table([two, four])
  assert table.count("\n") == 3 and "| regression | maml | 4 |" in table


@pytest.mark.slow  # 1 to 2.5 min on 2 cores; `pytest -m slow` runs it
def test_suite_counts_every_draw_whichever_way_the_draws_run(keep_cache_config):
  """The FLOPs of a VAMPIRE row are those of the work, not of the program's loops: with the
  draws in `lax.map` (the CPU default) XLA counts a loop body once, so the loop-free twin
  must not keep that loop. (It did, and mini-ImageNet's count was ten times low.)"""
  options = dict(QUICK_OPTIONS, mc_samples=8)
  rows = {
    draws: suite.run_row("regression", "vampire", dict(options, sample_batching=draws))
    for draws in ("vmap", "map")
  }
  assert rows["map"]["sample_batching"] == "map" and rows["vmap"]["sample_batching"] == "vmap"
  assert rows["map"]["gflop_per_step"] == pytest.approx(rows["vmap"]["gflop_per_step"], rel=0.01)
  assert "draws map" in suite.format_table([rows["map"]])


def test_suite_row_without_cost_or_memory_analysis(monkeypatch, keep_cache_config):
  # The GPU backend of jax 0.11 returns None from these; the row must still be made.
  monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: None)
  monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: None)
  monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", lambda self: None)
  row = suite.run_row("regression", "maml", QUICK_OPTIONS)
  for name in (
    "gflop_per_step",
    "compiled_gflop_per_step",
    "gflop_per_s",
    "peak_fraction",
    "xla_mb",
  ):
    assert row[name] is None, name
  assert math.isfinite(row["step_s"]) and row["step_s"] > 0 and row["steps_per_s"] > 0
  assert math.isfinite(row["loss"]) and row["loss_finite"]
  table = suite.format_table([row])
  data_line = table.splitlines()[2]
  assert data_line.startswith("| regression | maml | 2 |")
  assert data_line.count("n/a") == 5  # HLO and compiled GFLOP, GFLOP/s, % peak, XLA MB
  if sys.platform == "linux":  # the peak while stepping, after the compile, is within the peak
    assert 0 < row["stepping_peak_mb"] <= row["peak_mb"]
    assert data_line.endswith(f" {row['peak_mb']:.0f} | {row['stepping_peak_mb']:.0f} |")


@pytest.mark.skipif(sys.platform != "linux", reason="the peak is reset through /proc")
def test_the_stepping_peak_leaves_out_the_first_call():
  held = []

  def first():  # a compile's worth of memory, touched, then freed (numpy: an mmap)
    held.append(np.ones(300 * 2**20 // 8))
    held.clear()

  def timed():
    held.append(np.ones(50 * 2**20 // 8))

  memory = suite.measure_stepping(first, timed, release=False)
  held.clear()
  assert memory.process - memory.stepping > 200, memory
  assert memory.stepping >= 50, memory


@pytest.mark.parametrize(
  "command, label",
  [
    (["benchmarks.suite", "--quick", "--settings", "regression", "--repeats", "1"], "batching"),
    (["benchmarks.meta_step", "--tasks", "2", "--repeats", "1"], "strategy"),
  ],
)
def test_benchmark_steps_run_on_every_core_as_a_user_runs_them(tmp_path, command, label):
  """Run as a user runs them, `benchmarks.suite` (each row in a spawned interpreter) and
  `benchmarks.meta_step` shard the step's tasks over one XLA:CPU device per core, as the
  experiments do (each once timed one device of the several its process had)."""
  from tests.conftest import user_env
  from vampire_jax._src.core import sharding

  out = tmp_path / "rows.json"
  argv = [sys.executable, "-m", *command, "--algorithms", "maml", "--json", str(out)]
  done = subprocess.run(argv, cwd=REPO_ROOT, env=user_env(), capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  (row,) = json.loads(out.read_text())
  cores = sharding.cpu_core_count()  # the count `default_to_all_cpu_cores` gives a command
  assert row[label].endswith(f" x{cores} devices") == (cores > 1), (row[label], cores)


def test_suite_number_formatting():
  assert suite.fmt(None, ".1f") == "n/a" and suite.fmt(float("nan"), ".1f") == "n/a"
  assert suite.fmt(2.345, ".1f") == "2.3"


def test_suite_samples_tasks_of_the_setting_shapes():
  setting = suite.SETTINGS["omniglot_20w1s"]
  tasks = suite.random_tasks(setting, jax.random.key(0), 3)
  assert tasks.support_x.shape == (3, 20, 28, 28, 1) and tasks.query_x.shape == (3, 300, 28, 28, 1)
  # Each task's support holds one image per class, labelled 0..19 in order.
  assert (tasks.support_y == jax.numpy.arange(20)).all()
  assert 0.0 <= float(tasks.support_x.min()) and float(tasks.support_x.max()) <= 1.0
  regression = suite.random_tasks(suite.SETTINGS["regression"], jax.random.key(0), 3)
  assert regression.support_x.shape == (3, 5, 1) and regression.query_y.shape == (3, 10, 1)


def test_meta_step_fits_the_chunk_to_the_tasks():
  # A chunk of 4 stopped `--tasks 2` with an error; it becomes the largest divisor of T.
  backend_default = ("map", 1) if jax.default_backend() == "cpu" else ("vmap", 1)
  assert meta_step.resolve_strategies(None, 2) == [backend_default]
  assert meta_step.resolve_strategies("host_chunked:4", 2) == [("host_chunked", 2)]
  assert meta_step.resolve_strategies("host_chunked:4,chunked_unroll:4,vmap", 6) == [
    ("host_chunked", 3),
    ("chunked_unroll", 3),
    ("vmap", 1),
  ]
  assert meta_step.resolve_strategies("chunked_vmap:8", 4) == [("chunked_vmap", 4)]


@pytest.mark.slow  # 1 to 2.5 min on 2 cores; `pytest -m slow` runs it
def test_gpu_sweep_quick_rows(tmp_path):
  out = tmp_path / "sweep.json"
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.gpu_sweep",
      "--quick",
      "--json",
      str(out),
      "--configs",
      "baseline,autotune_0,no_command_buffers",
      # Limits far beyond any load: the test checks the rows, never the wall clock (a
      # 150 s limit failed the test command on a machine loaded by other jobs).
      "--child-timeout-s",
      "3000",
      "--budget-s",
      "3000",
    ],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=3600,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  rows = {row["config"]: row for row in json.loads(out.read_text())}
  assert list(rows) == ["baseline", "autotune_0", "no_command_buffers"]
  base = rows["baseline"]
  assert base["status"] == "ok" and base["loss_finite"] is True
  assert base["steps_per_s"] > 0 and base["compile_s"] > 0 and base["tasks"] == 2
  assert base["tasks_per_s"] == pytest.approx(2 * base["steps_per_s"])
  assert base["timed_steps"] == 2 and base["vs_baseline"] == pytest.approx(1.0)
  for name in ("autotune_0", "no_command_buffers"):
    if base["backend"] == "gpu":
      assert rows[name]["status"] == "ok" and rows[name]["loss_finite"] is True
    else:
      assert rows[name]["status"] == "skipped" and "GPU only" in rows[name]["note"]
      assert rows[name]["steps_per_s"] is None
  assert "| baseline |" in done.stdout and "GPU only" in done.stdout


def test_gpu_sweep_lever_rows_and_budget():
  names = [lever.name for lever in gpu_sweep.LEVERS]
  assert names[0] == "baseline" and len(set(names)) == len(names) == 12
  # Each lever changes the baseline in one field (maml: the algorithm).
  for lever in gpu_sweep.LEVERS[1:]:
    changed = [
      field
      for field in (
        "algorithm",
        "sampling_inside",
        "donate",
        "steps_per_call",
        "unroll_steps",
        "conv_impl",
        "remat",
        "compute_dtype",
        "xla_flags",
      )
      if getattr(lever, field) != getattr(gpu_sweep.BASELINE, field)
    ]
    assert len(changed) == 1, (lever.name, changed)
  # No budget left: every row is skipped with the reason, no child is started.
  rows = gpu_sweep.sweep(
    gpu_sweep.LEVERS[:2],
    quick=True,
    backend="cpu",
    child_timeout_s=10,
    budget_s=0,
    print_fn=lambda line: None,
  )
  assert [row["status"] for row in rows] == ["skipped", "skipped"]
  assert "budget" in rows[0]["note"] and rows[0]["vs_baseline"] is None
  assert "n/a" in gpu_sweep.format_table(rows)


def test_gpu_sweep_child_timeout_and_failure_become_rows():
  slow = gpu_sweep.run_child(gpu_sweep.BASELINE, quick=True, timeout_s=0.5)
  assert (
    slow["status"] == "timeout" and "0.5 s limit" in slow["note"] and slow["steps_per_s"] is None
  )
  # XLA aborts on an unknown flag: the row says so and the sweep goes on.
  bad_flag = dataclasses.replace(gpu_sweep.BASELINE, xla_flags="--xla_no_such_flag=1")
  failed = gpu_sweep.run_child(bad_flag, quick=True, timeout_s=120)
  assert failed["status"] == "error" and "xla_no_such_flag" in failed["note"]


def test_benchmarks_import_no_tensorflow_distrax_or_tensorboard():
  # The GPU machine has only jax, flax, optax, orbax and numpy.
  code = (
    "import sys, vampire_jax, benchmarks.gpu_sweep, benchmarks.suite, benchmarks.meta_step, "
    "benchmarks.compile_peak; "
    "import json; print(json.dumps([m for m in ('tensorflow', 'tensorflow_datasets', "
    "'distrax', 'tensorboardX') if m in sys.modules]))"
  )
  assert python_json(code) == []


def test_conv_gradients_benchmark_rows():
  from benchmarks import conv_gradients

  rows = conv_gradients.measure((2, 6, 6, 2), features=3, repeats=1)
  assert [row["operation"] for row in rows] == [
    "xla conv, input gradient",
    "xla conv, filter gradient",
    "loop_safe conv, input gradient",
    "loop_safe conv, filter gradient",
    "2x2 max-pool gradient",
  ]
  assert all(row["top_ms"] > 0 and row["loop_ms"] > 0 for row in rows)


@pytest.mark.slow  # 1 to 2.5 min on 2 cores; `pytest -m slow` runs it
def test_episode_rows_adapt_and_predict(keep_cache_config, capsys):
  rows = suite.main(
    [
      "--episodes",
      "--settings",
      "regression",
      "--episode-tasks",
      "1,2",
      "--episode-mc-samples",
      "3",
      "--repeats",
      "1",
      "--same-process",
    ]
  )
  assert [(r["tasks"], r["mc_samples"]) for r in rows] == [(1, 3), (2, 3)]
  for row in rows:
    assert row["compile_s"] > 0 and row["episode_s"] > 0 and row["score_finite"]
    assert row["tasks_per_s"] == pytest.approx(row["tasks"] / row["episode_s"])
  assert "| regression | 2 | 3 | 5 | vmap:1 |" in capsys.readouterr().out
  options = dict(QUICK_OPTIONS, mc_samples=2, repeats=1)
  omniglot = suite.run_episode_row("omniglot_5w1s", 2, options)
  expected_batching = "map:1" if jax.default_backend() == "cpu" else "vmap:1"
  assert omniglot["batching"] == expected_batching and omniglot["mc_samples"] == 2
  assert omniglot["score_finite"] and omniglot["episode_s"] > 0
  with pytest.raises(ValueError, match="host_chunked"):
    suite.run_episode_row("regression", 2, dict(options, batching="host_chunked:1"))


def test_profile_charges_each_operation_its_exclusive_time():
  from benchmarks import profile_step

  events = [
    {"pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0, "name": "while.1"},
    {"pid": 1, "tid": 1, "ts": 2.0, "dur": 3.0, "name": "fusion.2"},
    {"pid": 1, "tid": 1, "ts": 6.0, "dur": 1.0, "name": "fusion.2"},
    {"pid": 1, "tid": 2, "ts": 1.0, "dur": 4.0, "name": "dot.3"},
  ]
  assert profile_step.exclusive_times(events) == {"while.1": 6.0, "fusion.2": 4.0, "dot.3": 4.0}
  x = jax.numpy.ones((8, 8))
  text = jax.jit(lambda x: jax.numpy.tanh(x @ x).sum(0)).lower(x).compile().as_text()
  hlo = profile_step.parse_hlo(text)
  assert any("dot" in info["kind"] for info in hlo.values()), hlo
  assert profile_step.source_of("jit(f)/transpose(jvp(g))/conv_general_dilated") == (
    "conv_general_dilated [backward]"
  )
  # The network part, whether or not a transform wraps the module's name (MAML's op names
  # wrap it, VAMPIRE's draws do not), as the two profiles of issue 70 named them.
  where = "jit(train_step)/shard_map/while/body/"
  for op_name, part in [
    (where + "jvp(Conv4)/conv1/conv_general_dilated", "Conv4/conv1"),
    (where + "transpose(jvp(Conv4))/conv2/dot_general", "Conv4/conv2"),
    (where + "transpose(jvp())/while/body/closed_call/checkpoint/Conv4/conv0/stack", "Conv4/conv0"),
    (where + "jvp()/while/body/closed_call/Conv4/max", "Conv4/max"),
    (where + "jvp(MLP)/Dense_0/dot_general", "MLP/Dense_0"),
  ]:
    assert profile_step.part_of(op_name) == part, op_name
  assert profile_step.part_of(where + "transpose(jvp())/add_any").startswith("outside")
  times = {name: 1.0 for name in hlo}
  summary = profile_step.summarise(times, hlo, top=3)
  assert sum(row["share"] for row in summary["by_kind"]) == pytest.approx(1.0)
  assert len(summary["heaviest"]) == 3


def test_the_pytorch_profile_groups_aten_operations_as_ours_and_charges_the_rest_outside():
  """`benchmarks.profile_step_pytorch`'s grouping, on averages as torch's profiler gives them."""
  from types import SimpleNamespace

  from benchmarks import profile_step_pytorch as theirs

  expected = {
    "aten::convolution_backward": "convolution backward",
    "aten::mkldnn_convolution": "convolution",
    "aten::mm": "matrix product",
    "aten::native_batch_norm_backward": "batch norm",
    "aten::clamp_min": "element-wise",  # the ReLU, not a reduction
    "aten::sum": "reduction",
    "aten::_log_softmax_backward_data": "reduction",
    "aten::copy_": "copy and layout",
    "aten::_foreach_add_": "optimiser and clipping",
    "aten::max_pool2d": "other",
  }
  assert {name: theirs.kind_of(name) for name in expected} == expected
  averages = [
    SimpleNamespace(key="aten::convolution_backward", self_cpu_time_total=60.0, count=2),
    SimpleNamespace(key="aten::mul", self_cpu_time_total=20.0, count=5),
    SimpleNamespace(key="ProfilerStep#1", self_cpu_time_total=5.0, count=1),  # not aten
  ]
  summary = theirs.summarise(averages, wall_us=100.0, top=1)
  shares = {row["name"]: row["share"] for row in summary["by_kind"]}
  assert shares == pytest.approx(
    {"convolution backward": 0.6, "element-wise": 0.2, "outside the operators": 0.2}
  )
  assert summary["operator_calls"] == 7
  assert [row["name"] for row in summary["heaviest"]] == ["aten::convolution_backward"]


def test_profile_of_a_small_step(capsys):
  from benchmarks import profile_step

  result = profile_step.main(
    ["--settings", "regression", "--tasks", "2", "--mc-samples", "2", "--top", "3"]
  )
  assert result["traced_op_seconds"] > 0 and len(result["heaviest"]) == 3
  assert result["operations_per_step"] > 10  # thunks run, each a traced event
  for grouping in ("by_kind", "by_source", "by_part"):
    assert sum(row["share"] for row in result[grouping]) == pytest.approx(1.0)
  assert "| by network part | share |" in capsys.readouterr().out


def test_profile_of_a_test_episode(capsys):
  from benchmarks import profile_step

  result = profile_step.main(
    ["--settings", "regression", "--episode", "--tasks", "2", "--mc-samples", "2", "--top", "3"]
  )
  assert result["episode"] and result["traced_op_seconds"] > 0
  assert sum(row["share"] for row in result["by_kind"]) == pytest.approx(1.0)
  out = capsys.readouterr().out
  assert "traced episode call(s)" in out
  assert result["processor"] == backend.processor_record()
  assert out.splitlines()[-1] == "processor: " + result["processor"]["description"]


def test_simpa_inner_loop_replays_the_runs_check_and_its_runaway():
  """BUILD_NOTES' SImPa table: on the regression preset's MLP the inner loop runs away at
  initialisation (the loss rises by orders of magnitude), on the run's own task and weights."""
  from benchmarks import simpa_inner_loop

  before, after = simpa_inner_loop.support_loss_change(0, 16, {})
  assert before == pytest.approx(3.339e4, rel=1e-3)  # seed 0's table entry: the same task
  assert after > 1e3 * before


def test_suite_time_counts_a_tests_compiles_and_its_time(tmp_path):
  """`benchmarks.suite_time` attributes XLA's compiles to the test that made them."""
  (tmp_path / "test_two.py").write_text(
    "import jax, jax.numpy as jnp\n"
    "def test_compiles():\n"
    "  assert float(jax.jit(lambda x: jnp.sin(x) * 2)(jnp.float32(0.5))) > 0\n"
    "def test_compiles_nothing():\n"
    "  assert 1 + 1 == 2\n"
  )
  done = subprocess.run(
    [sys.executable, "-m", "benchmarks.suite_time", str(tmp_path / "test_two.py"), "-p",
     "no:cacheprovider", "--json", str(tmp_path / "times.json")],
    cwd=REPO_ROOT, env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"},
    capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  rows = json.loads((tmp_path / "times.json").read_text())
  compiled = next(row for name, row in rows.items() if name.endswith("::test_compiles"))
  idle = next(row for name, row in rows.items() if name.endswith("::test_compiles_nothing"))
  assert compiled["compiles"] >= 1 and 0 < compiled["compile"] <= compiled["wall"]
  assert idle.get("compiles", 0) == 0 and idle["wall"] > 0
  assert "| all tests |" in done.stdout
  processor = backend.processor_record()  # the same machine, the same XLA_FLAGS
  assert all(row["processor"] == processor for row in rows.values())
  lines = done.stdout.splitlines()
  at = lines.index("processor: " + processor["description"])
  assert lines[at + 1].startswith("| test | wall s |")  # just before the table


def test_make_learner_refuses_an_algorithm_it_does_not_know():
  """`suite.make_learner` refuses a name it does not know, naming those it knows."""
  setting = suite.SETTINGS["regression"]
  with pytest.raises(ValueError) as raised:
    suite.make_learner(setting, "bogus", None, None, unroll_steps=False, remat=False)
  message = str(raised.value)
  assert "'bogus'" in message and all(name in message for name in suite.ALGORITHMS), message


@pytest.mark.parametrize(
  "module, argv, known",
  [
    ("filter_gradient_cost", ["--algorithms", "bogus"], ("maml", "vampire")),
    ("meta_step", ["--algorithms", "maml,bogus"], ("maml", "vampire", "vampire2")),
    ("memory", ["--algorithms", "bogus"], ("maml", "vampire", "protonet")),
    ("suite", ["--algorithms", "vampire,bogus"], ("maml", "vampire", "simpa", "protonet")),
  ],
)
def test_a_benchmark_refuses_an_unknown_algorithm_naming_those_it_knows(
  capsys, no_work, module, argv, known
):
  """`--algorithms` with a name the benchmark does not know is refused before any work,
  naming the flag, the name and the algorithms it knows."""
  import importlib

  err = _refused(capsys, importlib.import_module(f"benchmarks.{module}").main, argv)
  assert "--algorithms" in err and "'bogus'" in err, err
  assert all(name in err for name in known), err


@pytest.mark.parametrize(
  "module, argv, flag",
  [
    ("meta_step", ["--tasks", "0"], "--tasks"),
    ("meta_step", ["--repeats", "0"], "--repeats"),
    ("compile_peak", ["--tasks", "0"], "--tasks"),
    ("compile_peak", ["--mc-samples", "0"], "--mc-samples"),
    ("profile_step", ["--tasks", "0"], "--tasks"),
    ("profile_step", ["--mc-samples", "-1"], "--mc-samples"),
    ("suite", ["--tasks", "-1"], "--tasks"),
    ("suite", ["--episodes", "--episode-tasks", "1,0"], "--episode-tasks"),
    ("memory", ["--shots", "1,x"], "--shots"),
    ("side_by_side", ["--tasks", "-2"], "--tasks"),
    ("filter_gradient_cost", ["--repeats", "0"], "--repeats"),
    ("posterior_spread", ["run:5", "--num-tasks", "0"], "--num-tasks"),
  ],
)
def test_a_benchmark_refuses_a_count_out_of_range(capsys, no_work, module, argv, flag):
  """A count flag out of its range (tasks, draws, repeats, shots) is refused before any work,
  naming the flag and the value."""
  import importlib

  err = _refused(capsys, importlib.import_module(f"benchmarks.{module}").main, argv)
  value = argv[argv.index(flag) + 1]
  assert flag in err and repr(value) in err, err


def test_side_by_side_fails_when_a_process_fails(monkeypatch, capsys, tmp_path):
  """A run of `benchmarks.side_by_side` whose process failed still prints its table, then
  exits non-zero naming the failed runs."""
  from benchmarks import side_by_side

  monkeypatch.setattr(side_by_side, "run_process", lambda command, log, timeout: (False, 0.0))
  argv = ["--rows", "omniglot_maml", "--rounds", "1", "--torch-python", sys.executable]
  with pytest.raises(SystemExit) as exited:
    side_by_side.main(argv + ["--log-dir", str(tmp_path)])
  assert exited.value.code not in (0, None)
  assert "omniglot_maml" in str(exited.value.code) and "failed" in str(exited.value.code)
  assert "| omniglot_maml" in capsys.readouterr().out  # the table, before the refusal


def test_gpu_sweep_fails_when_a_row_failed(monkeypatch, capsys):
  """`benchmarks.gpu_sweep` prints every row, then exits non-zero when a row's child failed."""
  monkeypatch.setattr(
    gpu_sweep, "probe_backend", lambda: {"backend": "cpu", "jax": "?", "device": "?"}
  )
  monkeypatch.setattr(
    gpu_sweep,
    "run_child",
    lambda lever, quick, timeout_s: gpu_sweep._empty_row(lever, "error", "XLA aborted"),
  )
  with pytest.raises(SystemExit) as exited:
    gpu_sweep.main(["--quick", "--configs", "baseline"])
  assert exited.value.code not in (0, None)
  assert "baseline" in str(exited.value.code) and "XLA aborted" in str(exited.value.code)
  assert "| baseline |" in capsys.readouterr().out


@pytest.mark.parametrize(
  "spec, cause",
  [
    ("{run}", "FOLDER:STEP"),
    ("{run}:last", "'last'"),
    ("{missing}:5", "no run folder"),
    ("{run}:7", "checkpoints/7"),
  ],
  ids=["no-step", "step-not-a-number", "no-folder", "no-checkpoint"],
)
def test_posterior_spread_refuses_a_checkpoint_it_cannot_load(
  capsys, no_work, tmp_path, spec, cause
):
  """Each FOLDER:STEP is checked before any run is loaded: its form, the folder (a run's
  run.json) and the checkpoint folder, each refused naming the argument."""
  from benchmarks import posterior_spread

  run = tmp_path / "run"
  (run / "checkpoints" / "5").mkdir(parents=True)
  (run / "run.json").write_text("{}")
  (run / "metrics.jsonl").write_text("")
  argument = spec.format(run=run, missing=tmp_path / "missing")
  err = _refused(capsys, posterior_spread.main, [f"{run}:5", argument])
  assert argument in err and cause in err, err


def test_divergence_side_by_side_refuses_an_authors_repo_that_is_not_there(
  capsys, no_work, tmp_path
):
  """`--side theirs` with an --authors-repo that does not exist, or holds neither their code
  nor a git directory, is refused naming it, before either side runs."""
  from benchmarks import divergence_side_by_side

  for repo in (tmp_path / "missing", tmp_path):
    argv = ["--algorithm", "vampire2", "--steps", "2", "--side", "theirs", "--authors-repo"]
    err = _refused(capsys, divergence_side_by_side.main, argv + [str(repo)])
    assert "--authors-repo" in err and str(repo) in err, err


@pytest.mark.skipif(TORCH, reason="checks the refusal where PyTorch is not installed")
@pytest.mark.parametrize(
  "argv",
  [
    ["benchmarks.authors_pytorch", "--rows", "omniglot_maml"],
    ["benchmarks.authors_pytorch_simpa"],
    ["benchmarks.profile_step_pytorch"],
  ],
  ids=lambda argv: argv[0],
)
def test_a_pytorch_benchmark_without_pytorch_says_so_in_one_line(argv):
  """A benchmark of the authors' PyTorch code, run where torch is not installed, exits with
  status 2 and one line naming torch and how to run it, not a traceback."""
  done = subprocess.run(
    [sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 2, done.stderr[-2000:]
  assert "Traceback" not in done.stderr and "torch" in done.stderr, done.stderr


@pytest.mark.skipif(TORCH, reason="checks the refusal where PyTorch is not installed")
def test_divergence_side_by_side_refuses_theirs_without_pytorch(capsys, no_work, tmp_path):
  """`--side theirs` where torch is not installed is refused naming it, before either side runs."""
  from benchmarks import divergence_side_by_side

  (tmp_path / "Vampire2.py").write_text("")
  argv = ["--algorithm", "vampire2", "--steps", "2", "--side", "ours", "--side", "theirs"]
  err = _refused(capsys, divergence_side_by_side.main, argv + ["--authors-repo", str(tmp_path)])
  assert "torch" in err and "theirs" in err, err
