"""Where VAMPIRE's meta-gradient pushes the prior's log-stds, estimated with few and many draws.

    python -m experiments.prior_gradient runs/compare_regression_cpu/vampire --tasks 100

Loads a trained sine/line VAMPIRE run, draws `--tasks` training tasks, and takes the
meta-gradient (the query NLL averaged over weight draws, Alg. 1) at the run's
meta-parameters with each of `--draws` (L_t = L_v = L). It prints, for each L, the mean
of the gradient over all log-stds and the share of positive entries (a positive entry
narrows that weight's prior), and the cosine between the log-std gradients of the first
and the last L. Issue 23 used it to ask whether training with L = 8 instead of the
paper's 128 changes where the prior's width goes (docs/fidelity.md, "The paper's regression
claim under its own metric").
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import regression
from vampire_jax import backend
from vampire_jax.runs import algorithms


def flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(leaf) for leaf in jax.tree_util.tree_leaves(tree)])


def main(argv=None) -> dict:
  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("run_dir", help="a VAMPIRE run folder of experiments.regression")
  parser.add_argument("--tasks", type=int, default=100)
  parser.add_argument("--draws", default="8,128", help="comma list of L")
  parser.add_argument("--seed", type=int, default=123)
  parser.add_argument("--per-task", action="store_true", help="also each task's gradient norm")
  args = parser.parse_args(argv)
  run = vj.load_run(args.run_dir)
  config = run.config
  problem = regression.make_problem(config)  # the run's training split, as it was trained on
  task_keys = jax.random.split(jax.random.key(args.seed), args.tasks)
  tasks = problem.sample_tasks(problem.splits["train"], task_keys)
  draw_keys = jax.random.split(jax.random.key(args.seed + 1), args.tasks)
  gradients = {}
  for num_draws in [int(n) for n in args.draws.split(",")]:
    learner = algorithms.make_learner(
      run.model,
      "regression",
      run.noise_std,
      config,
      num_mc=num_draws,  # L draws on the support and on the query
    )
    meta_gradient = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))
    grads, _ = meta_gradient(run.meta_params, tasks, draw_keys)
    gradients[num_draws] = flat(grads.log_std)
    g = gradients[num_draws]
    print(
      f"L = {num_draws}: mean d loss / d log_std {g.mean():+.4g}, positive (narrowing) "
      f"{(g > 0).mean():.1%}, norm {np.linalg.norm(g):.4g}"
    )
    if args.per_task:  # one task at a time: which tasks dominate the average
      norms = np.array(
        [
          np.linalg.norm(flat(meta_gradient(run.meta_params, one, keys)[0].log_std))
          for one, keys in (
            (jax.tree_util.tree_map(lambda x: x[i : i + 1], tasks), draw_keys[i : i + 1])
            for i in range(args.tasks)
          )
        ]
      )
      heaviest = np.argsort(-norms)[:3]
      print(
        f"  per task: median norm {np.median(norms):.4g}; heaviest tasks "
        + ", ".join(f"{i} ({norms[i]:.4g})" for i in heaviest)
      )
  first, last = gradients[min(gradients)], gradients[max(gradients)]
  cosine = float(first @ last / np.linalg.norm(first) / np.linalg.norm(last))
  log_std = flat(run.meta_params.log_std)
  print(f"cosine between L = {min(gradients)} and L = {max(gradients)}: {cosine:.3f}")
  print(
    f"prior log-std mean {log_std.mean():.3f}, median sigma {float(jnp.median(jnp.exp(log_std))):.4f}"
  )
  return {"cosine": cosine, "gradients": gradients}


if __name__ == "__main__":
  main()
