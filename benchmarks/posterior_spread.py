"""Why a regression run's raw predictive is overconfident (issue 61, item 5): its prior's
log-std, how far adaptation to a task moves the posterior, and the raw predictive's spread
against its error, at one checkpoint of a run folder.

    python -m benchmarks.posterior_spread zoo/regression_cpu_vampire:3000
    python -m benchmarks.posterior_spread RUN/vampire:500 RUN/vampire:1500 --num-tasks 100

Each `FOLDER:STEP` is loaded at that checkpoint (`checkpoints/STEP`), adapted to the first
`--num-tasks` test tasks (key 0; the posterior of each task's support), and its test is
scored on the same number of the run's own test tasks: the 90 % interval's coverage, the
paper's quantile ECE, the PIT ECE and the NLL. `epistemic_std` is the root mean variance of
the network's outputs over the weight draws, to be set beside the noise's std and the root
mean squared error of the predictive mean: a predictive whose spread is far below its
error is overconfident. Prints the processor it runs on, `processor: ...`, then one JSON line a
checkpoint (the rows `main` returns carry it too, as `processor`:
`vampire_jax.backend.processor_record()`).
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np

import vampire_jax as vj
from experiments import zoo_verify
from vampire_jax.metrics import evaluate_split, interval_metrics
from vampire_jax.runs import kinds, programs


def _flat(tree, leading: int = 0) -> np.ndarray:
  """The leaves of `tree`, flattened into one vector (one a task with `leading` = tasks)."""
  leaves = [np.asarray(x) for x in jax.tree.leaves(tree)]
  if leading:
    return np.concatenate([x.reshape(leading, -1) for x in leaves], axis=1)
  return np.concatenate([x.ravel() for x in leaves])


def spread_summary(prior: vj.Gaussian, posteriors: vj.Gaussian, num_tasks: int) -> dict:
  """The prior's log-std and how far the tasks' posteriors (a leading task axis) moved from it.

  `posterior_std_relative_change`: |σ_post / σ_prior − 1| over every weight of every task
  (mean and max); `posterior_mean_shift_in_prior_stds_median`: the median of
  |μ_post − μ_prior| / σ_prior.
  """
  prior_log_std = _flat(prior.log_std)
  post_log_std = _flat(posteriors.log_std, num_tasks)
  relative = np.abs(np.exp(post_log_std - prior_log_std[None]) - 1.0)
  shift = np.abs(_flat(posteriors.mean, num_tasks) - _flat(prior.mean)[None])
  shift = shift / np.exp(prior_log_std)[None]
  return {
    "prior_log_std_mean": float(prior_log_std.mean()),
    "prior_log_std_p10_p50_p90": [float(v) for v in np.percentile(prior_log_std, [10, 50, 90])],
    "posterior_std_relative_change_mean": float(relative.mean()),
    "posterior_std_relative_change_max": float(relative.max()),
    "posterior_mean_shift_in_prior_stds_median": float(np.median(shift)),
  }


def predictive_summary(per_task: dict, noise_std: float) -> dict:
  """The raw test's spread against its error, from `[tasks, draws, query, 1]` predictions."""
  f = np.asarray(per_task["predictions"], np.float64)[..., 0]
  y = np.asarray(per_task["targets"], np.float64)[..., 0]
  return {
    "epistemic_std": float(np.sqrt(np.mean(np.var(f, axis=1)))),
    "noise_std": float(noise_std),
    "rmse_predictive_mean": float(np.sqrt(np.mean(np.square(f.mean(axis=1) - y)))),
    "draws": int(f.shape[1]),
  }


def load_at(folder: Path, step: str, scratch: Path) -> vj.Run:
  """The run of `folder` at checkpoint `step` (a copy holding that checkpoint alone)."""
  copy = scratch / f"run_{step}"
  (copy / "checkpoints").mkdir(parents=True)
  for name in ("run.json", "metrics.jsonl"):
    shutil.copy(folder / name, copy / name)
  shutil.copytree(folder / "checkpoints" / step, copy / "checkpoints" / step)
  run = vj.load_run(copy)
  if run.step != int(step):
    raise SystemExit(f"{folder}: checkpoint {step} did not load (got step {run.step})")
  return run


def adapt_to_task(run: vj.Run, support_x, support_y, key: jax.Array):
  """The posterior of one task's support, from `key` as the evaluators and `Run.predict`
  split it (the first of its two keys adapts; the second draws the predictions)."""
  adapt_key, _ = jax.random.split(key)
  return run.learner.adapt(run.meta_params, support_x, support_y, adapt_key)


def measure(run: vj.Run, num_tasks: int) -> dict:
  problem = zoo_verify.make_problem(run)
  tasks = vj.draw_tasks(problem, "test", jax.random.key(0), num_tasks)
  keys = jax.random.split(jax.random.key(1), num_tasks)
  adapt = jax.jit(jax.vmap(lambda sx, sy, k: adapt_to_task(run, sx, sy, k)))
  posteriors = adapt(tasks.support_x, tasks.support_y, keys)
  evaluate = programs.build_evaluator(run.kind, run.noise_std, run.config, run.learner)
  evaluator = programs.split_evaluator(problem, evaluate, "test")
  per_task = evaluate_split(
    evaluator, run.meta_params, programs.run_keys(run.config.seed).test, num_tasks,
    programs.eval_batch_size(run.config),
  )  # fmt: skip
  metrics = kinds.summarise("regression", per_task, num_bins=15, noise_std=run.noise_std).metrics
  return {
    "step": run.step,
    **spread_summary(run.meta_params, posteriors, num_tasks),
    **predictive_summary(per_task, run.noise_std),
    "coverage_90": interval_metrics(per_task, run.noise_std)["interval_90_coverage"],
    "paper_ece": float(metrics["ece"]),
    "pit_ece": float(metrics["pit_ece"]),
    "nll": float(metrics["nll"]),
    "mse": float(metrics["mse"]),
  }


def checkpoint_of(spec: str) -> tuple[Path, str]:
  """`(folder, step)` of a `FOLDER:STEP` argument, or the reason it names no checkpoint."""
  folder, colon, step = spec.rpartition(":")
  if not colon or not folder or not step:
    raise ValueError("must be FOLDER:STEP, a run folder and the step of one of its checkpoints")
  if not step.isdigit():
    raise ValueError(f"its STEP {step!r} is not a step number (checkpoints/STEP)")
  missing = [name for name in ("run.json", "metrics.jsonl") if not (Path(folder) / name).is_file()]
  if missing:
    raise ValueError(f"no run folder at {folder} (no {' or '.join(missing)})")
  checkpoints = Path(folder) / "checkpoints"
  if not (checkpoints / step).is_dir():
    kept = sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else []
    raise ValueError(
      f"no checkpoint {checkpoints / step} (its checkpoints: {', '.join(kept) or 'none'})"
    )
  return Path(folder), step


def main(argv=None) -> list[dict]:
  from benchmarks import arguments, suite
  from vampire_jax import backend

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("checkpoints", nargs="+", metavar="FOLDER:STEP")
  parser.add_argument("--num-tasks", type=arguments.count(1), default=100)
  args = parser.parse_args(argv)
  found = []
  for spec in args.checkpoints:  # every one, before any run is loaded
    try:
      found.append((spec, *checkpoint_of(spec)))
    except ValueError as error:
      parser.error(f"FOLDER:STEP {spec!r}: {error}")
  processor = backend.processor_record()
  print(suite.processor_line(processor), flush=True)
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    for spec, folder, step in found:
      row = {"run": spec, **measure(load_at(folder, step, Path(scratch)), args.num_tasks)}
      print(json.dumps(row), flush=True)
      rows.append(dict(row, processor=processor))
  return rows


if __name__ == "__main__":
  main()
