"""What an experiment trains on: the network, the task sampler and its data, the likelihood.

`train_and_evaluate(problem, config, workdir)` takes a `Problem` (what) and a
`RunConfig` (how); `draw_tasks` samples a split's tasks to look at them.
"""

from typing import Any, Callable, NamedTuple, Optional

import flax.linen as nn
import jax

from vampire_jax._src.core.tasks import Task

PyTree = Any


class Problem(NamedTuple):
  """What an experiment trains on.

  Attributes:
    model: the network, a flax module (recorded in the run folder, so it must
      be importable and its fields JSON values).
    input_shape: one example's shape, e.g. `(28, 28, 1)`.
    splits: `{'train', 'val', 'test'}` -> the data the sampler draws from
      (device arrays; for generated tasks, anything that tells splits apart).
    sample_tasks: `sample_tasks(split_data, task_keys [n]) -> Task` with a
      leading `[n]` axis, task i from key i alone; jittable.
    kind: the name of its `kinds.ProblemKind`: 'classification' or 'regression'.
    noise_std: the regression likelihood's noise (regression only).
    query_truth: optional `query_truth(split_data, task_keys) -> [n, query, 1]`,
      the noiseless targets of the sampled tasks (regression calibration).
    data_info: what the data is and where it came from (recorded).
    sample_open_set_tasks: optional, classification: `sample_open_set_tasks(
      split_data, task_keys) -> Task`, the sampler's task i with extra queries
      of classes outside its support set, labelled -1
      (`data.open_set_tasks_from_keys`). With it the test adds open-set
      episodes (`results['test']['open_set']`); None: no open-set test.
    sample_train_tasks: optional: the training split's sampler where it differs
      from `sample_tasks` (ProtoNet's `--train-ways`: training episodes of
      more classes than the test's); None: `sample_tasks` for every split.
  """

  model: nn.Module
  input_shape: tuple[int, ...]
  splits: dict
  sample_tasks: Callable[[PyTree, jax.Array], Task]
  kind: str = "classification"
  noise_std: Optional[float] = None
  query_truth: Optional[Callable[[PyTree, jax.Array], jax.Array]] = None
  data_info: dict = {}
  sample_open_set_tasks: Optional[Callable[[PyTree, jax.Array], Task]] = None
  sample_train_tasks: Optional[Callable[[PyTree, jax.Array], Task]] = None


def sampler(problem: Problem, split: str) -> Callable[[PyTree, jax.Array], Task]:
  """The task sampler of `split`: `sample_train_tasks` for 'train' where set, else `sample_tasks`."""
  if split == "train" and problem.sample_train_tasks is not None:
    return problem.sample_train_tasks
  return problem.sample_tasks


def draw_tasks(problem: Problem, split: str, key: jax.Array, num_tasks: int) -> Task:
  """`num_tasks` tasks of `split` as its sampler draws them, keys split from `key`."""
  return jax.jit(sampler(problem, split))(problem.splits[split], jax.random.split(key, num_tasks))
