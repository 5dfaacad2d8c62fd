"""Speed levers of VAMPIRE's training step on one accelerator, in one table.

    python -m benchmarks.gpu_sweep --json gpu_sweep.json   # on one H100: under 8 minutes
    python -m benchmarks.gpu_sweep --quick                 # tiny shapes: a smoke run on a CPU
    python -m benchmarks.gpu_sweep --configs baseline,bf16,remat

Setting: VAMPIRE on Omniglot 5-way 1-shot as in the paper: Conv4-64 on
28x28x1, T=32 tasks per step, L=1, S=5 second-order inner steps, 15 queries
per class, tasks drawn from random uint8 class images. `--quick`: T=2,
Conv4 with 8 filters, 2 timed steps.

Rows, in this order, each one change to the baseline:
  baseline            make_train_step (tasks sampled inside the jitted step),
                      tasks vmapped, inner loop in lax.scan, conv_impl "xla",
                      one meta-step per call, float32, state donated
  sampling_outside    a separately jitted sampler call per step feeding
                      jax.jit(make_meta_step) (the old way)
  no_donation         the state is not donated
  steps_per_call_10   lax.scan over 10 meta-steps per call
  bf16                the network in bfloat16 (vj.mixed_precision), float32
                      distributions
  patches_conv        conv_impl "patches" (im2col and a batched GEMM)
  remat               jax.checkpoint of every inner step
  maml                MAML, otherwise the baseline, for reference
  unrolled_inner      the inner loop unrolled
  autotune_0          XLA_FLAGS --xla_gpu_autotune_level=0 (GPU only)
  autotune_4          XLA_FLAGS --xla_gpu_autotune_level=4 (GPU only)
  no_command_buffers  XLA_FLAGS --xla_gpu_enable_command_buffer= : no command
                      buffers (CUDA graphs); the baseline has XLA's default
                      (GPU only)

Each row runs in a fresh process (XLA reads XLA_FLAGS once, when JAX
starts: the child gets its flags there), without a persistent compilation
cache, and reports:
  compile (s)         the first call: compilation plus one call
  steps/s, tasks/s    over 30 further meta-steps (2 with --quick; the
                      steps_per_call row times whole calls of 10)
  peak MB             the device's memory_stats()['peak_bytes_in_use'], else
                      the process's peak resident memory (marked "RSS"),
                      else "n/a"
  loss finite         whether every timed step's query loss was finite
  vs baseline         steps/s over the baseline's
A child that fails, or runs past its limit (--child-timeout-s), becomes a
row that says why; once the sweep's budget (--budget-s, 450 s) is spent the
remaining rows are skipped with a note, so the sweep ends within 8 minutes.
GPU-only rows are skipped on other backends. The table goes to stdout as
markdown, and with `--json PATH` the rows to PATH; then, if a child failed,
the sweep exits with status 1 naming its rows. BUILD_NOTES.md records
the numbers.

The children need only the repository and jax, flax, optax, orbax and numpy.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional
from vampire_jax import backend
from vampire_jax.backend import default_to_all_cpu_cores

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMED_STEPS, QUICK_TIMED_STEPS = 30, 2
MIN_CHILD_S = 20  # a row is not started with less of the budget left


@dataclasses.dataclass(frozen=True)
class Lever:
  """One row of the sweep: how its training step is built and run."""

  name: str
  description: str
  algorithm: str = "vampire"
  sampling_inside: bool = True  # make_train_step; else a sampler call before make_meta_step
  donate: bool = True  # donate the state to the step
  steps_per_call: int = 1
  unroll_steps: bool = False  # inner loop unrolled instead of lax.scan
  conv_impl: str = "xla"
  remat: bool = False
  compute_dtype: str = "float32"
  xla_flags: str = ""  # added to the child's XLA_FLAGS
  gpu_only: bool = False


BASELINE = Lever("baseline", "sampling inside, vmap, scan, xla conv, 1 step/call, f32, donated")


def _lever(name: str, description: str, **changes) -> Lever:
  return dataclasses.replace(BASELINE, name=name, description=description, **changes)


LEVERS = (
  BASELINE,
  _lever("sampling_outside", "jitted sampler, then jit(make_meta_step)", sampling_inside=False),
  _lever("no_donation", "state not donated", donate=False),
  _lever("steps_per_call_10", "lax.scan over 10 meta-steps per call", steps_per_call=10),
  _lever("bf16", "network in bfloat16, distributions float32", compute_dtype="bfloat16"),
  _lever("patches_conv", "conv_impl patches (im2col + batched GEMM)", conv_impl="patches"),
  _lever("remat", "jax.checkpoint of every inner step", remat=True),
  _lever("maml", "MAML, otherwise the baseline", algorithm="maml"),
  _lever("unrolled_inner", "inner loop unrolled", unroll_steps=True),
  _lever(
    "autotune_0",
    "--xla_gpu_autotune_level=0",
    xla_flags="--xla_gpu_autotune_level=0",
    gpu_only=True,
  ),
  _lever(
    "autotune_4",
    "--xla_gpu_autotune_level=4",
    xla_flags="--xla_gpu_autotune_level=4",
    gpu_only=True,
  ),
  _lever(
    "no_command_buffers",
    "--xla_gpu_enable_command_buffer= (no CUDA graphs)",
    xla_flags="--xla_gpu_enable_command_buffer=",
    gpu_only=True,
  ),
)
LEVERS_BY_NAME = {lever.name: lever for lever in LEVERS}


def sweep_setting(quick: bool):
  """The benchmark setting: the paper's Omniglot 5-way 1-shot, or tiny with `quick`."""
  from benchmarks import suite

  setting = suite.SETTINGS["omniglot_5w1s"]
  return dataclasses.replace(setting, tasks=2, num_filters=8) if quick else setting


def _outside_sampling_step(learner, optimizer, sample_tasks, num_tasks: int, donate: bool):
  """`step(state, data, key)`: a jitted sampler call, then the jitted meta-step on its tasks."""
  import jax
  import vampire_jax as vj

  meta_step = jax.jit(vj.make_meta_step(learner, optimizer), donate_argnums=0 if donate else ())

  @jax.jit
  def sample(data, key, step):
    task_key, adapt_key = jax.random.split(jax.random.fold_in(key, step))
    return sample_tasks(data, jax.random.split(task_key, num_tasks)), adapt_key

  def step(state, data, key):
    tasks, adapt_key = sample(data, key, state.step)
    return meta_step(state, tasks, adapt_key)

  return step


def build_step(lever: Lever, learner, optimizer, sample_tasks, num_tasks: int) -> Callable:
  """The lever's `step(state, data, key) -> (state, metrics)`."""
  from benchmarks import suite

  if not lever.sampling_inside:
    if lever.steps_per_call != 1:
      raise ValueError("sampling outside the step runs one meta-step per call")
    return _outside_sampling_step(learner, optimizer, sample_tasks, num_tasks, lever.donate)
  return suite.build_train_step(
    learner,
    optimizer,
    sample_tasks,
    num_tasks=num_tasks,
    strategy="vmap",
    chunk=1,
    steps_per_call=lever.steps_per_call,
    donate=lever.donate,
  )


def measure(lever: Lever, quick: bool) -> dict:
  """Compiles and times the lever's training step in this process."""
  import jax
  import numpy as np
  import vampire_jax as vj
  from benchmarks import suite

  setting = dataclasses.replace(sweep_setting(quick), conv_impl=lever.conv_impl)
  apply_fn, params, nll = suite.network(setting)
  if lever.compute_dtype == "bfloat16":
    apply_fn = vj.mixed_precision(apply_fn)
  learner = suite.make_learner(
    setting, lever.algorithm, apply_fn, nll, unroll_steps=lever.unroll_steps, remat=lever.remat
  )
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=setting.tasks)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  data = suite.random_data(setting, jax.random.key(2))
  step = build_step(lever, learner, optimizer, suite.task_sampler(setting), setting.tasks)
  calls = max(1, (QUICK_TIMED_STEPS if quick else TIMED_STEPS) // lever.steps_per_call)
  timed = suite.time_calls(step, state, data, jax.random.key(3), calls)
  metrics, first_s, call_s = timed.metrics, timed.first_s, timed.call_s
  step_s = call_s / lever.steps_per_call
  peak_mb, peak_source = suite.device_peak_mb(timed.memory.process), suite.peak_memory()[1]
  device = jax.devices()[0]
  return dict(
    _empty_row(lever),
    status="ok",
    backend=jax.default_backend(),
    device=device.device_kind,
    tasks=setting.tasks,
    compile_s=first_s,
    timed_steps=calls * lever.steps_per_call,
    step_s=step_s,
    steps_per_s=1 / step_s,
    tasks_per_s=setting.tasks / step_s,
    peak_mb=peak_mb,
    peak_source=peak_source,
    loss_finite=bool(np.all(np.isfinite(np.asarray(metrics["loss"])))),
    processor=backend.processor_record(),
  )


def _empty_row(lever: Lever, status: str = "", note: str = "") -> dict:
  return {
    "config": lever.name,
    "description": lever.description,
    "status": status,
    "note": note,
    "xla_flags": lever.xla_flags,
    "compile_s": None,
    "steps_per_s": None,
    "tasks_per_s": None,
    "peak_mb": None,
    "peak_source": None,
    "loss_finite": None,
  }


def _child_env(lever: Lever) -> dict:
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile times are cold
  if lever.xla_flags:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {lever.xla_flags}".strip()
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
  return env


def _last_line(text: str) -> str:
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return lines[-1][:300] if lines else ""


def run_child(lever: Lever, quick: bool, timeout_s: float) -> dict:
  """`measure(lever)` in a fresh Python process with the lever's XLA flags.

  A child that fails or runs past `timeout_s` seconds gives a row with
  status 'error' or 'timeout' and the reason in its note.
  """
  with tempfile.TemporaryDirectory(prefix="vj_gpu_sweep_") as tmp:
    out = Path(tmp) / "row.json"
    command = [
      sys.executable,
      "-m",
      "benchmarks.gpu_sweep",
      "--child",
      lever.name,
      "--child-out",
      str(out),
    ] + (["--quick"] if quick else [])
    start = time.perf_counter()
    try:
      done = subprocess.run(
        command,
        env=_child_env(lever),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
      )
    except subprocess.TimeoutExpired:
      row = _empty_row(lever, "timeout", f"no result within its {timeout_s:.3g} s limit")
    else:
      if done.returncode == 0 and out.exists():
        row = json.loads(out.read_text())
      else:
        reason = _last_line(done.stderr) or f"exit status {done.returncode}"
        row = _empty_row(lever, "error", reason)
    row["wall_s"] = time.perf_counter() - start
  return row


def probe_backend(timeout_s: float = 120) -> dict:
  """The default backend, device kind and JAX version, asked of a child process.

  The sweep's own process never starts JAX, so that it holds no
  accelerator memory while the children run.
  """
  code = (
    "import jax; d = jax.devices()[0]; "
    "print(jax.default_backend(), jax.__version__, d.device_kind, sep='|')"
  )
  try:
    done = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      timeout=timeout_s,
      env=_child_env(BASELINE),
    )
    backend, version, device = _last_line(done.stdout).split("|", 2)
  except (subprocess.TimeoutExpired, ValueError):
    return {"backend": "unknown", "jax": "?", "device": "?"}
  return {"backend": backend, "jax": version, "device": device}


def sweep(
  levers,
  *,
  quick: bool,
  backend: str,
  child_timeout_s: float,
  budget_s: float,
  print_fn: Callable[[str], None] = print,
) -> list[dict]:
  """One row per lever, each from `run_child` within the budget; see the module docstring."""
  start, rows = time.perf_counter(), []
  for lever in levers:
    left = budget_s - (time.perf_counter() - start)
    if lever.gpu_only and backend != "gpu":
      row = _empty_row(lever, "skipped", f"GPU only; skipped on {backend}")
    elif left < MIN_CHILD_S:
      row = _empty_row(lever, "skipped", f"the sweep's {budget_s:.0f} s budget was spent")
    else:
      row = run_child(lever, quick, min(child_timeout_s, left))
    rows.append(row)
    print_fn(
      f"  {row['config']:19s} {row['status']:8s} compile {_fmt(row['compile_s'], '6.1f')} s"
      f"  {_fmt(row['steps_per_s'], '8.2f')} steps/s  {row['note']}"
    )
  return _with_speedups(rows)


def _with_speedups(rows: list[dict]) -> list[dict]:
  """Adds `vs_baseline`: steps/s over the baseline row's (None without both)."""
  base = next((r["steps_per_s"] for r in rows if r["config"] == "baseline"), None)
  return [
    dict(r, vs_baseline=r["steps_per_s"] / base if base and r["steps_per_s"] else None)
    for r in rows
  ]


def _fmt(value, spec: str) -> str:
  from benchmarks import suite

  return suite.fmt(value, spec)


def _memory(row: dict) -> str:
  text = _fmt(row["peak_mb"], ".0f")
  return f"{text} (RSS)" if row["peak_source"] == "rss" else text


def format_table(rows: list[dict]) -> str:
  """The rows as one markdown table; "n/a" for numbers a row does not have."""
  lines = [
    "| configuration | compile (s) | steps/s | tasks/s | peak MB | loss finite |"
    " vs baseline | note |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    finite = "n/a" if r["loss_finite"] is None else ("yes" if r["loss_finite"] else "NO")
    speedup = _fmt(r.get("vs_baseline"), ".2f") + ("x" if r.get("vs_baseline") else "")
    lines.append(
      f"| {r['config']} | {_fmt(r['compile_s'], '.1f')} | {_fmt(r['steps_per_s'], '.2f')} |"
      f" {_fmt(r['tasks_per_s'], '.1f')} | {_memory(r)} | {finite} | {speedup} |"
      f" {r['note'] or r['description']} |"
    )
  return "\n".join(lines)


def _parse_args(argv):
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--quick", action="store_true", help="T=2, Conv4-8, 2 timed steps")
  parser.add_argument(
    "--configs", default=",".join(LEVERS_BY_NAME), help="comma list of rows to run (default: all)"
  )
  parser.add_argument("--json", default=None, help="also write the rows to this file")
  parser.add_argument(
    "--child-timeout-s", type=float, default=150, help="limit of one row's process, in seconds"
  )
  parser.add_argument(
    "--budget-s", type=float, default=450, help="no row starts once the sweep has run this long"
  )
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  names = [n.strip() for n in args.configs.split(",") if n.strip()]
  unknown = [n for n in names + ([args.child] if args.child else []) if n not in LEVERS_BY_NAME]
  if unknown:
    parser.error(f"unknown configs {unknown}; choose from {', '.join(LEVERS_BY_NAME)}")
  return args, [LEVERS_BY_NAME[n] for n in names]


def main(argv=None) -> Optional[list[dict]]:
  default_to_all_cpu_cores()  # one XLA:CPU device per core
  args, levers = _parse_args(argv)
  if args.child:  # one row, in this fresh process
    row = measure(LEVERS_BY_NAME[args.child], args.quick)
    Path(args.child_out).write_text(json.dumps(row))
    return None
  start = time.perf_counter()
  platform = probe_backend()
  setting = sweep_setting(args.quick)
  print(
    f"backend {platform['backend']} ({platform['device']}), jax {platform['jax']}; VAMPIRE"
    f" Omniglot 5-way 1-shot, Conv4-{setting.num_filters}, T={setting.tasks}, L=1, S=5"
    f" second order; {QUICK_TIMED_STEPS if args.quick else TIMED_STEPS} timed steps per row",
    flush=True,
  )
  rows = sweep(
    levers,
    quick=args.quick,
    backend=platform["backend"],
    child_timeout_s=args.child_timeout_s,
    budget_s=args.budget_s,
    print_fn=lambda line: print(line, flush=True),
  )
  print(f"\ntotal wall time {time.perf_counter() - start:.0f} s\n")
  print(format_table(rows))
  if args.json:
    Path(args.json).write_text(json.dumps(rows, indent=2))
  failed = [f"{row['config']} ({row['note']})" for row in rows if row["status"] == "error"]
  if failed:  # every row is printed: the exit status says that some have no numbers
    raise SystemExit(f"gpu_sweep: {len(failed)} row(s) failed: {'; '.join(failed)}")
  return rows


if __name__ == "__main__":
  main()
