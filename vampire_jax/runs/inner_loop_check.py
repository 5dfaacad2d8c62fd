"""The inner-loop check before training: one inner loop on a real training task, before the
meta-step compiles (`vj.check_inner_loop`), so that a run whose inner loop diverges at
initialisation is refused with the knob to turn, not discovered as NaN steps later."""

import math

import jax

from vampire_jax._src.core import diagnostics
from vampire_jax._src.core.errors import DivergenceError
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax.runs import problem as problem_lib
from vampire_jax.runs.problem import Problem


def check_key(init_key: jax.Array) -> jax.Array:
  """The key of the inner-loop check before training: its task and draws."""
  return jax.random.fold_in(init_key, 1)


def inner_loop_report(problem: Problem, learner: MetaLearner, meta_params, key: jax.Array):
  """`check_inner_loop` on the training task that `key` draws: the check before training."""
  task = jax.tree_util.tree_map(lambda x: x[0], problem_lib.draw_tasks(problem, "train", key, 1))
  return diagnostics.check_inner_loop(learner, meta_params, task, key)


def check_before_training(
  problem: Problem, config, learner: MetaLearner, state, key, print_fn
) -> None:
  """One inner loop on a real training task before the meta-step compiles (`check_inner_loop`).

  Raises:
    DivergenceError: (a ConfigError) the support loss goes non-finite at
      initialisation; the message names the knob to turn and a value that works.
  """
  if learner.settings is not None and learner.settings.num_inner_steps == 0:
    return  # no inner loop (ProtoNet): nothing to diverge
  report = inner_loop_report(problem, learner, state.meta_params, key)
  if report.ok:
    return
  message = (
    f"{config.algorithm.name}'s inner loop at initialisation, on a training task: "
    f"{report.advice} (the spec's inner_lr, kl_weight; see vj.check_inner_loop)"
  )
  if not math.isfinite(report.loss_after):
    raise DivergenceError(message)
  print_fn(f"warning: {message}")
