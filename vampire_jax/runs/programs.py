"""The compiled programs of a run, built from its config: the train step and the evaluators.

`run_keys` are the keys the programs draw from (the run's seed alone).
`build_train_step` picks the task batching for the backend (`backend_defaults`)
and the devices (`backend_defaults.task_mesh_for`), and jits
`meta_step.make_train_step` (or its host-chunked or NaN-checked variants);
`build_evaluator`, `split_evaluator` and `open_set_evaluator` do the same for
the scores of a split. Each compiles with the run's XLA options (XLA:CPU's fusion
emitters, `backend_defaults.compiler_options`) and gives the memory its compile freed back
to the system after the call that compiled it (`host_memory.releasing_after_compiles`).
"""

from typing import Callable, NamedTuple, Optional

import jax
from jax.sharding import Mesh

from vampire_jax._src.core import backend_defaults, diagnostics, host_chunked, host_memory
from vampire_jax._src.core import meta_step
from vampire_jax._src.core.errors import ConfigError
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax._src.metrics import evaluation
from vampire_jax.runs import kinds
from vampire_jax.runs.problem import Problem, sampler


class RunKeys(NamedTuple):
  """The keys a run draws from its seed, one for each use."""

  init: jax.Array  # the initial weights and prior
  train: jax.Array  # the meta-steps' tasks and draws
  val: jax.Array  # the validation's tasks and draws, the same at every validation
  test: jax.Array  # the test's: task i's sample and draws from this key and i alone


def run_keys(seed: int) -> RunKeys:
  """A run's keys from `config.seed` alone: the loop's, and a re-scoring's (experiments.zoo)."""
  return RunKeys(*jax.random.split(jax.random.key(seed), 4))


def mesh_size(mesh: Optional[Mesh]) -> int:
  return 1 if mesh is None else mesh.size


def build_train_step(
  problem: Problem, config, learner: MetaLearner, optimizer, mesh: Optional[Mesh], num_steps: int
) -> Callable:
  """`train_step(state, key) -> (state, metrics [num_steps])`, compiled on first call."""
  kind = kinds.get(problem.kind)
  num_local_tasks = config.schedule.tasks_per_step // mesh_size(mesh)
  strategy, chunk = backend_defaults.task_batching(
    config.speed.task_batching, config.speed.chunk_size, num_local_tasks
  )
  data = problem.splits["train"]
  if config.speed.debug_nans:  # one checked program (vj.debug_nonfinite) names the first NaN
    strategy = "map" if strategy == "host_chunked" else strategy
  if strategy == "host_chunked":
    if mesh is not None:
      raise ConfigError(
        "task_batching host_chunked runs tasks from Python on one device; "
        "with tasks sharded over devices use vmap, or shard_tasks off",
        fields=("task_batching", "shard_tasks"),
      )
    step = host_chunked.make_host_chunked_train_step(
      learner,
      optimizer,
      sampler(problem, "train"),
      tasks_per_step=config.schedule.tasks_per_step,
      chunk_size=chunk,
      metrics_fn=kind.train_metrics,
    )
    return host_memory.releasing_after_compiles(lambda state, key: step(state, data, key))
  train_step = meta_step.make_train_step(
    learner,
    optimizer,
    sampler(problem, "train"),
    tasks_per_step=config.schedule.tasks_per_step,
    steps_per_call=num_steps,
    task_batching=strategy,
    chunk_size=chunk,
    metrics_fn=kind.train_metrics,
    mesh=mesh,
    draw_per_task=kind.draw_per_task,
  )
  if config.speed.debug_nans:
    step = diagnostics.debug_nonfinite(train_step)
  else:
    # Compiled ahead of time at the first call, its traces dropped: a run steps with the
    # executable alone.
    step = host_memory.compiled_on_first_call(
      jax.jit(train_step, donate_argnums=0, compiler_options=_compiler_options(config))
    )
  return host_memory.releasing_after_compiles(lambda state, key: step(state, data, key))


def _compiler_options(config) -> dict:
  """The XLA options of the run's programs (`backend_defaults.compiler_options`)."""
  return backend_defaults.compiler_options(config.speed.cpu_fusion_emitters)


def eval_batch_size(config, mesh: Optional[Mesh] = None) -> int:
  """`eval_batch_tasks`, rounded up to a multiple of the mesh's devices."""
  size = mesh_size(mesh)
  return -(-config.evaluation.eval_batch_tasks // size) * size


def build_evaluator(
  kind: str, noise_std: Optional[float], config, learner: MetaLearner, mesh: Optional[Mesh] = None
) -> Callable:
  """The jitted per-task evaluator of a `kind` problem, for batches of `eval_batch_size` tasks."""
  strategy, chunk = _eval_batching(config, mesh)
  evaluate = kinds.get(kind).make_evaluator(
    learner, noise_std, task_batching=strategy, chunk_size=chunk, mesh=mesh
  )
  return host_memory.releasing_after_compiles(
    jax.jit(evaluate, compiler_options=_compiler_options(config))
  )


def _eval_batching(config, mesh: Optional[Mesh]) -> tuple[str, int]:
  """`(strategy, chunk)` of the evaluators, for batches of `eval_batch_size` tasks."""
  num_local_tasks = eval_batch_size(config, mesh) // mesh_size(mesh)
  strategy, chunk = backend_defaults.task_batching(
    config.speed.eval_task_batching, config.speed.eval_chunk_size, num_local_tasks
  )
  if strategy == "host_chunked":  # evaluation has no gradient to accumulate
    strategy = "chunked_unroll" if chunk < num_local_tasks else "unroll"
  return strategy, chunk


def split_evaluator(
  problem: Problem, evaluate: Callable, split: str, mesh: Optional[Mesh] = None
) -> Callable:
  """`evaluate_indices(meta_params, key, indices)` on `split` (see `evaluation`)."""
  return evaluation.make_split_evaluator(
    evaluate,
    problem.sample_tasks,
    problem.splits[split],
    query_truth=problem.query_truth,
    mesh=mesh,
  )


def open_set_evaluator(
  problem: Problem, config, learner: MetaLearner, mesh: Optional[Mesh] = None
) -> Optional[Callable]:
  """`evaluate_indices` of the test split's open-set episodes, or None if there are none.

  Episode i is test task i (same sample key, same adaptation and draws) with
  the extra queries of `problem.sample_open_set_tasks`.
  """
  if problem.sample_open_set_tasks is None:  # only classification samplers have them
    return None
  strategy, chunk = _eval_batching(config, mesh)
  evaluate = host_memory.releasing_after_compiles(
    jax.jit(
      evaluation.make_open_set_evaluator(
        learner, task_batching=strategy, chunk_size=chunk, mesh=mesh
      ),
      compiler_options=_compiler_options(config),
    )
  )
  return evaluation.make_split_evaluator(
    evaluate, problem.sample_open_set_tasks, problem.splits["test"], mesh=mesh
  )
