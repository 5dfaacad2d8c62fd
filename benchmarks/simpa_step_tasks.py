"""Where a SImPa regression run goes non-finite: one step's tasks, one by one (issue 59, item 4).

    python -m benchmarks.simpa_step_tasks --seed 0 --kl-samples 8 --stop 24

Runs ours as `benchmarks.divergence_side_by_side --algorithm simpa` does (the `cpu` preset,
one jitted meta-step a call) to step `--stop`, prints whether the meta-parameters are still
finite, then takes meta-step `--stop` + 1's tasks and keys one at a time: each task's
meta-loss and whether its meta-gradient is finite, whether its adapted parameters are, and its
KL estimate (the PHI network's lower bound, whose NaN makes SImPa skip the task) with its
gradient. A step whose loss is finite but whose update is not shows here as the task whose
meta-gradient is not finite. It first prints the processor it runs on, `processor: ...`
(`vampire_jax.backend.processor_record()`).
"""

import argparse
import importlib

import jax
import jax.numpy as jnp
import optax

from benchmarks import suite
from experiments import cli
from vampire_jax import backend
from vampire_jax.runs import programs

simpa = importlib.import_module("vampire_jax.baselines.simpa")  # the module, not the builder


def _finite(tree) -> bool:
  """Whether every leaf of `tree` is finite."""
  return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree_util.tree_leaves(tree))


def _norm(tree) -> float:
  return float(optax.global_norm(tree))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seed", type=cli.count_at_least(0, "a run's seed"), default=0)
  parser.add_argument(
    "--kl-samples", type=cli.count_at_least(2, "SImPa's KL estimate needs two draws"), default=8
  )
  parser.add_argument(
    "--stop",
    type=cli.count_at_least(0, "the meta-steps to run before the step looked into"),
    required=True,
    help="meta-steps to run first; the next one is looked into",
  )
  args = parser.parse_args(argv)
  # Imported here: it gives the process one XLA:CPU device per core, as the harness's runs have.
  from benchmarks import divergence_side_by_side as side_by_side

  print(suite.processor_line(backend.processor_record()))
  config = side_by_side.run_config("simpa", args.seed, args.kl_samples)
  problem, learner, _, start, _ = side_by_side.initial_state(config)
  _, state = side_by_side.run_ours(config, args.stop, 5, "ours", stop_at=args.stop)
  meta, first = state.meta_params, jax.device_get(start.meta_params)
  print(
    f"after step {args.stop}: meta-parameters finite {_finite(meta)}; generator norm "
    f"{_norm(meta.generator):.6g} (at the start {_norm(first.generator):.6g})"
  )
  hyper_prior = simpa.hyper_prior_term(
    meta.generator, config.schedule.tasks_per_step, simpa.EPSILON
  )
  print(f"hyper-prior term {float(hyper_prior):.6g}")

  train_key = programs.run_keys(config.seed).train
  task_keys, adapt_keys = side_by_side.step_keys(
    train_key, jnp.int32(args.stop), config.schedule.tasks_per_step
  )
  tasks = jax.device_get(jax.jit(problem.sample_tasks)(problem.splits["train"], task_keys))
  loss_and_grad = jax.jit(jax.value_and_grad(lambda m, t, k: learner.meta_loss(m, t, k)[0]))
  draws = config.algorithm.num_kl_samples
  kl_and_grad = jax.jit(
    jax.value_and_grad(lambda g, p, k: simpa.kl_lower_bound(g, p, k, draws), (0, 1))
  )
  for t in range(config.schedule.tasks_per_step):
    task = jax.tree_util.tree_map(lambda a: a[t], tasks)
    loss, grads = loss_and_grad(meta, task, adapt_keys[t])
    # The task's own split of its key, as simpa.meta_loss splits it.
    adapt_key, _, phi_key, _ = jax.random.split(adapt_keys[t], 4)
    adapted = learner.adapt(meta, task.support_x, task.support_y, adapt_key)
    estimate, estimate_grads = kl_and_grad(adapted.generator, adapted.phi, phi_key)
    print(
      f"task {t}: meta-loss {float(loss):.6g}, its gradient finite {_finite(grads)}; adapted "
      f"parameters finite {_finite(adapted)}; KL estimate {float(estimate):.6g}, its gradient "
      f"finite {_finite(estimate_grads)}"
    )


if __name__ == "__main__":
  main()
