"""Where a trained sine/line run's inner loop runs away: the support loss's curvature per task.

    python -m experiments.inner_loop_stability RUN/vampire RUN/maml --tasks 2000

Loads each run folder of `experiments.regression`, draws `--tasks` fresh test tasks, and
for each task measures, at the meta-parameters (a Gaussian's means):

- the largest curvature lambda of the support loss (`vj.largest_curvature`: the top
  eigenvalue of its Hessian in the weights), and the inner loop's step factor
  alpha * lambda (plain gradient steps are stable only below 2);
- the support loss before and after the run's inner loop (a Gaussian's on the same
  weight draws of the noise before and after), and the paper's query MSE.

It prints them binned by the support's mean x^2: the sine/line inputs are uniform on
[-5, 5], and a network's gradient in its first layer grows with |x|, so a support whose
points cluster near |x| = 5 has a curvature several times a spread one's. "loss rose":
the support loss after the inner loop is not finite or above the loss before (the loop
did not descend); "ran away": the query MSE is not finite or above (max - min)^2 of the
tasks' query targets, the summaries' definition (`vj.summarise`, `num_ran_away`).
Issue 50 used it (BUILD_NOTES.md, "Runaway test tasks").
"""

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import cli, regression
from vampire_jax import ConfigError, Gaussian, backend, sample
from vampire_jax.runs import experiment_configs

BINS = (0.0, 2.0, 5.0, 10.0, 15.0, 25.0)  # edges of the support's mean x^2 (at most 25)


def task_measures(run: vj.Run, tasks: vj.Task, key: jax.Array, chunk: int = 50) -> dict:
  """Per task: mean x^2, curvature, step factor, support loss before/after, query MSE."""
  learner = run.learner
  settings = learner.settings
  loss_fn = settings.loss_fn
  central = getattr(run.meta_params, "mean", run.meta_params)

  def support_loss(params, task, draw_key):
    if isinstance(params, Gaussian):  # the same draws of the noise for prior and posterior
      draws = sample(params, draw_key, run.config.algorithm.num_mc_test)
      losses = jax.vmap(loss_fn, in_axes=(0, None, None))(draws, task.support_x, task.support_y)
      return jnp.mean(losses)
    return loss_fn(params, task.support_x, task.support_y)

  def one(args):
    task, task_key = args
    curvature_key, adapt_key, draw_key, predict_key = jax.random.split(task_key, 4)
    curvature = vj.largest_curvature(
      loss_fn, central, task.support_x, task.support_y, curvature_key, num_iterations=30
    )
    adapted = learner.adapt(run.meta_params, task.support_x, task.support_y, adapt_key)
    outputs = learner.predict(adapted, task.query_x, predict_key)
    return dict(
      mean_x2=jnp.mean(jnp.square(task.support_x)),
      curvature=curvature,
      before=support_loss(run.meta_params, task, draw_key),
      after=support_loss(adapted, task, draw_key),
      mse=jnp.mean(jnp.square(outputs - task.query_y[None])),
    )

  measure = jax.jit(lambda tasks, keys: jax.lax.map(one, (tasks, keys), batch_size=chunk))
  keys = jax.random.split(key, tasks.support_x.shape[0])
  result = {name: np.asarray(v, np.float64) for name, v in measure(tasks, keys).items()}
  result["step_factor"] = settings.inner_lr * result["curvature"]
  after, before = result["after"], result["before"]
  result["loss_rose"] = ~np.isfinite(after) | (after > before)
  span = float(np.ptp(np.asarray(tasks.query_y)))
  result["ran_away"] = ~np.isfinite(result["mse"]) | (result["mse"] > span**2)
  return result


def table(m: dict) -> list[dict]:
  """The measures binned by the support's mean x^2."""
  rows = []
  for low, high in zip(BINS[:-1], BINS[1:]):
    inside = (m["mean_x2"] >= low) & (m["mean_x2"] < high)
    if not inside.any():
      continue
    pick = {name: v[inside] for name, v in m.items()}
    rows.append(
      dict(
        mean_x2=f"[{low:g}, {high:g})",
        tasks=int(inside.sum()),
        median_curvature=float(np.median(pick["curvature"])),
        max_curvature=float(np.max(pick["curvature"])),
        median_step_factor=float(np.median(pick["step_factor"])),
        step_factor_above_2=int(np.sum(pick["step_factor"] > 2)),
        loss_rose=int(pick["loss_rose"].sum()),
        ran_away=int(pick["ran_away"].sum()),
        median_mse=float(np.median(pick["mse"])),
        max_mse=float(np.max(pick["mse"])),
      )
    )
  return rows


def summary(m: dict) -> dict:
  above = m["step_factor"] > 2
  log_mse = np.log10(np.maximum(m["mse"], 1e-12))
  return dict(
    tasks=int(len(m["mse"])),
    step_factor_above_2=int(above.sum()),
    loss_rose=int(m["loss_rose"].sum()),
    loss_rose_with_factor_above_2=int((m["loss_rose"] & above).sum()),
    ran_away=int(m["ran_away"].sum()),
    ran_away_with_factor_above_2=int((m["ran_away"] & above).sum()),
    ran_away_with_loss_rose=int((m["ran_away"] & m["loss_rose"]).sum()),
    # Rank correlation of the curvature with the support's mean x^2.
    spearman_curvature_x2=float(
      np.corrcoef(np.argsort(np.argsort(m["curvature"])), np.argsort(np.argsort(m["mean_x2"])))[
        0, 1
      ]
    ),
    median_mse=float(np.median(m["mse"])),
    mean_mse=float(np.mean(m["mse"])),
    max_mse=float(np.max(m["mse"])),
    median_mse_loss_rose=float(np.median(m["mse"][m["loss_rose"]]))
    if m["loss_rose"].any()
    else None,
    largest_step_factor=float(np.max(m["step_factor"])),
    step_factor_of_the_worst_task=float(m["step_factor"][np.argmax(log_mse)]),
    mean_x2_of_the_worst_task=float(m["mean_x2"][np.argmax(log_mse)]),
  )


def load_checked_run(run_dir: str) -> vj.Run:
  """The run in `run_dir`, refused in one line unless its inner loop can be measured here: a
  sine/line run (`experiments.regression`) of a learner with gradient inner steps."""
  where = "experiments.inner_loop_stability"
  if not (Path(run_dir) / "run.json").is_file():
    raise ConfigError(
      f"{where}: {run_dir} is not a run folder (no run.json); give run folders of "
      "experiments.regression, e.g. runs/regression_cpu_seed0/vampire"
    )
  run = vj.load_run(run_dir)
  if not isinstance(run.config, experiment_configs.RegressionConfig):
    raise ConfigError(
      f"{where}: {run_dir} is a run of {type(run.config).__name__}, not of "
      "experiments.regression: this tool draws sine/line tasks; give a regression run"
    )
  settings = run.learner.settings
  if settings is None or settings.num_inner_steps == 0 or not settings.inner_lr:
    raise ConfigError(
      f"{where}: {run_dir} is a {run.config.algorithm.name} run, whose inner loop has no gradient "
      "step of a support loss to measure; give a run of vampire, vampire2, abml, maml, fomaml "
      "or platipus"
    )
  return run


def main(argv=None) -> dict:
  backend.default_to_all_cpu_cores()
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("run_dirs", nargs="+", help="run folders of experiments.regression")
  parser.add_argument(
    "--tasks",
    type=cli.count_at_least(2, "the summary's rank correlation needs two", " of test tasks"),
    default=2000,
  )
  parser.add_argument("--seed", type=int, default=50)
  parser.add_argument("--json", help="also write every number here")
  parser.add_argument("--npz", help="also write every task's numbers here")
  args = parser.parse_args(argv)
  runs = {run_dir: load_checked_run(run_dir) for run_dir in args.run_dirs}  # all, before work
  out = {}
  for run_dir, run in runs.items():
    problem = regression.make_problem(run.config)
    tasks = vj.draw_tasks(problem, "test", jax.random.key(args.seed), args.tasks)
    m = task_measures(run, tasks, jax.random.key(args.seed + 1))
    s = summary(m)
    print(
      f"== {run_dir}: {run.config.algorithm.name}, inner lr {run.learner.settings.inner_lr:g}, "
      f"{json.dumps(s)}"
    )
    print(
      f"{'mean x^2':>10s} {'tasks':>6s} {'median λ':>9s} {'max λ':>9s} {'median αλ':>10s} "
      f"{'αλ > 2':>7s} {'loss rose':>9s} {'ran away':>9s} {'median MSE':>11s} {'max MSE':>10s}"
    )
    rows = table(m)
    for r in rows:
      print(
        f"{r['mean_x2']:>10s} {r['tasks']:6d} {r['median_curvature']:9.0f} "
        f"{r['max_curvature']:9.0f} {r['median_step_factor']:10.2f} "
        f"{r['step_factor_above_2']:7d} {r['loss_rose']:9d} {r['ran_away']:9d} "
        f"{r['median_mse']:11.3g} "
        f"{r['max_mse']:10.3g}"
      )
    out[run_dir] = dict(summary=s, table=rows)
    if args.npz:
      np.savez(f"{args.npz}_{run.config.algorithm.name}.npz", **m)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
