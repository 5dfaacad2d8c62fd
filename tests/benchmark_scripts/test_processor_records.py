"""Every measurement names its processor (issue 70): each benchmark's rows carry
`vampire_jax.backend.processor_record()` as `processor`, and its printed table comes with one
line `processor: <description>` (`benchmarks.suite.processor_line`), so that a copied table
says where it was measured. The work itself is replaced where it takes more than a second."""

import ast
import json
import subprocess
from pathlib import Path

import jaxlib
import pytest

from benchmarks import suite
from tests.helpers import REPO_ROOT, python_json
from vampire_jax import backend

# Those that run the authors' PyTorch code (torch imported at their top or where a step is
# built): read here, not run.
NAMED_BY_SOURCE = ("authors_pytorch_simpa", "profile_step_pytorch")
SCRIPTS = (
  "conv_gradients",
  "divergence_side_by_side",
  "filter_gradient_cost",
  "import_time",
  "posterior_spread",
  "precision",
  "profile_step",
  "simpa_inner_loop",
  "simpa_step_tasks",
  "suite_time",
) + NAMED_BY_SOURCE


def _line() -> str:
  return f"processor: {backend.processor_record()['description']}"


def test_the_line_is_the_records_description():
  here = backend.processor_record()
  assert suite.processor_line(here) == "processor: " + here["description"]
  assert suite.processor_line(None) == (
    "processor: unknown (vampire_jax is not installed in this Python)"
  )


def test_the_cpu_record_is_read_without_starting_jax():
  """`suite.cpu_processor`: this CPU's record (with jaxlib's version, or without for a PyTorch
  side) from /proc/cpuinfo, in a process whose JAX backend never starts."""
  code = (
    "import json, sys; from benchmarks import suite; "
    "records = [suite.cpu_processor(), suite.cpu_processor(with_jaxlib=False)]; "
    "bridge = sys.modules.get('jax._src.xla_bridge'); "
    "print(json.dumps([records, bool(bridge and bridge._backends)]))"
  )
  (with_jaxlib, without), started = python_json(code)
  assert not started
  machine = {"platform": "cpu", "device_kind": "cpu", **backend.cpu_identity()}
  assert without == backend.processor_record(machine)
  here = backend.processor_record()
  assert with_jaxlib == backend.processor_record(dict(machine, jaxlib=here["jaxlib"]))
  assert with_jaxlib["description"] == without["description"] + f", jaxlib {here['jaxlib']}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_prints_the_processor_line(script):
  """Each of them calls `suite.processor_line` (read from its source: the tests below run
  those that run without PyTorch)."""
  tree = ast.parse(Path(REPO_ROOT, "benchmarks", f"{script}.py").read_text())
  called = {
    node.func.attr
    for node in ast.walk(tree)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
  }
  assert "processor_line" in called
  if script in NAMED_BY_SOURCE:  # PyTorch's side: read without starting JAX
    assert "cpu_processor" in called


def test_conv_gradients_rows_name_their_processor(capsys):
  from benchmarks import conv_gradients

  rows = conv_gradients.main(["--shape", "1,4,4,1", "--features", "1", "--repeats", "1"])
  assert len(rows) == 5 and all(row["top_ms"] > 0 for row in rows)
  assert [row["processor"] for row in rows] == [backend.processor_record()] * 5
  out = capsys.readouterr().out.splitlines()
  assert out[-1] == _line() and out[-2].startswith("| 2x2 max-pool gradient |")


def test_filter_gradient_cost_names_the_processor_its_children_ran_on(monkeypatch, capsys):
  """The rows are `meta_step`'s, from fresh processes: the line is theirs."""
  from benchmarks import filter_gradient_cost

  theirs = dict(backend.processor_record(), description="cpu (the children's CPU)")

  def child(command, **kwargs):
    variant = command[command.index("--one") + 1]
    step_s = {"default": 0.5, "zero": 0.25}[variant]
    row = {
      "algorithm": "maml", "strategy": "map:1", "compile_s": 3.0, "step_s": step_s,
      "tasks_per_s": 32 / step_s, "ms_per_task": 1000 * step_s / 32, "peak_mb": 900.0,
      "stepping_peak_mb": 700.0, "processor": theirs,
    }  # fmt: skip
    Path(command[command.index("--json") + 1]).write_text(json.dumps([row]))
    return subprocess.CompletedProcess(command, 0, "", "")

  monkeypatch.setattr(subprocess, "run", child)
  rows = filter_gradient_cost.main(["--variants", "default,zero"])
  assert [(row["variant"], row["step_s"]) for row in rows] == [("default", 0.5), ("zero", 0.25)]
  assert all(row["processor"] == theirs for row in rows)
  out = capsys.readouterr().out.splitlines()
  assert out[-1] == "processor: cpu (the children's CPU)"
  assert out[-3].startswith("     default | maml | map:1 | 3.0 | 0.500 |"), out


def test_import_time_names_the_processor_and_jaxlib_it_imported(monkeypatch, capsys):
  from benchmarks import import_time

  seconds = dict(zip(import_time.ROWS.values(), (0.5, 0.75, 2.5, 1.0)))
  monkeypatch.setattr(import_time, "import_seconds", seconds.__getitem__)
  import_time.main(["--repeats", "1"])
  out = capsys.readouterr().out.splitlines()
  assert out[3] == "| + vampire_jax | 0.75 | 1.50 |"
  assert out[-1] == suite.processor_line(suite.cpu_processor())
  assert out[-1].startswith(f"processor: cpu ({backend.cpu_identity()['cpu']}, ")
  assert out[-1].endswith(f", jaxlib {jaxlib.__version__}")


def test_posterior_spread_rows_name_their_processor(monkeypatch, capsys, tmp_path):
  from benchmarks import posterior_spread

  run = tmp_path / "run"
  (run / "checkpoints" / "3").mkdir(parents=True)
  for name in ("run.json", "metrics.jsonl"):
    (run / name).write_text("{}")
  monkeypatch.setattr(posterior_spread, "load_at", lambda folder, step, scratch: int(step))
  monkeypatch.setattr(posterior_spread, "measure", lambda step, tasks: {"step": step, "nll": 1.5})
  rows = posterior_spread.main([f"{run}:3", "--num-tasks", "2"])
  assert rows == [{"run": f"{run}:3", "step": 3, "nll": 1.5, "processor": rows[0]["processor"]}]
  assert rows[0]["processor"] == backend.processor_record()
  out = capsys.readouterr().out.splitlines()
  assert out[0] == _line()  # once, before the JSON lines, which leave it out
  assert [json.loads(line) for line in out[1:]] == [{"run": f"{run}:3", "step": 3, "nll": 1.5}]


def test_precision_results_name_their_processor(monkeypatch, capsys, tmp_path):
  from benchmarks import precision
  from experiments import regression

  def run(algorithms, preset, workdir, overrides, progress):
    mse = {"float32": 0.25, "bfloat16": 0.5}[overrides["compute_dtype"]]
    method = {"mse": mse, "mse_ci95": 0.125, "nll": 1.0, "num_tasks": 4}
    return {"methods": {"maml": dict(method, wall_time_s={"train": 7.0})}}

  monkeypatch.setattr(regression, "run", run)
  results = precision.main(["--algorithms", "maml", "--workdir", str(tmp_path)])
  assert {dtype: methods["maml"]["mse"] for dtype, methods in results.items()} == {
    "float32": 0.25,
    "bfloat16": 0.5,
  }
  assert all(m["maml"]["processor"] == backend.processor_record() for m in results.values())
  out = capsys.readouterr().out.splitlines()
  assert out[-2] == "| maml | bfloat16 | 0.500 +- 0.125 | 1.000 | 4 | 7 |"
  assert out[-1] == _line()


def test_divergence_side_by_side_names_its_processor(monkeypatch, capsys, tmp_path):
  from benchmarks import divergence_side_by_side

  def run_ours(config, steps, every, label, stop_at=0):
    print(f"{label}: steps 1..{steps}, finite", flush=True)
    return {"side": label, "losses": [2.0] * steps}, None

  monkeypatch.setattr(divergence_side_by_side, "run_ours", run_ours)
  record = tmp_path / "sides.json"
  argv = ["--algorithm", "vampire2", "--steps", "2", "--side", "ours", "--json", str(record)]
  divergence_side_by_side.main(argv)
  written = json.loads(record.read_text())
  assert written["processor"] == backend.processor_record()
  assert written["sides"] == {"ours": {"side": "ours", "losses": [2.0, 2.0]}}
  out = capsys.readouterr().out.splitlines()
  assert out[1:3] == [_line(), "ours: steps 1..2, finite"]  # after the header, before the sides


def test_simpa_inner_loop_names_its_processor_before_the_table(monkeypatch, capsys):
  from benchmarks import simpa_inner_loop

  monkeypatch.setattr(
    simpa_inner_loop, "support_loss_change", lambda seed, draws, changes: (2.0, 3.0 + seed)
  )
  simpa_inner_loop.main(["--seeds", "1", "--kl-samples", "2"])
  out = capsys.readouterr().out.splitlines()
  assert out[1] == _line() and out[2].startswith("| variant | seed |")
  assert out[4].startswith("| preset (MLP 100-100-100, NLL sigma 0.3, inner lr 1e-3) | 1 | 2 | 4 |")


def test_simpa_step_tasks_names_its_processor_before_its_work(monkeypatch, capsys):
  from benchmarks import divergence_side_by_side, simpa_step_tasks

  class Started(Exception):
    pass

  def run_config(*args):
    raise Started

  monkeypatch.setattr(divergence_side_by_side, "run_config", run_config)
  with pytest.raises(Started):
    simpa_step_tasks.main(["--stop", "1"])
  assert capsys.readouterr().out.splitlines() == [_line()]


def test_profile_step_pytorch_report_ends_with_the_processor():
  """The PyTorch profile's report (its result as `profile` makes it, PyTorch aside)."""
  from benchmarks import profile_step_pytorch

  result = {
    "setting": "regression", "algorithm": "maml", "torch": "2.13", "threads": 2, "tasks": 4,
    "mc_samples": 1, "repeats": 1, "traced_step_s": 0.5, "untraced_step_s": 0.25,
    "operator_seconds": 0.4, "traced_wall_seconds": 0.5, "operator_calls": 100,
    "by_kind": [{"name": "matrix product", "share": 1.0, "seconds": 0.5}], "heaviest": [],
    "processor": suite.cpu_processor(with_jaxlib=False),
  }  # fmt: skip
  report = profile_step_pytorch.format_report(result).splitlines()
  assert report[-1] == "processor: " + result["processor"]["description"]
  assert "jaxlib" not in report[-1]
