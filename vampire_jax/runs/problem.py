"""What an experiment trains on: the network, the task sampler and its data, the likelihood.

`train_and_evaluate(problem, config, workdir)` takes a `Problem` (what) and a
`RunConfig` (how); `draw_tasks` samples a split's tasks to look at them;
`checked_problem` refuses, in one line, a problem the loop could not train.
"""

from typing import Any, Callable, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core import losses, models
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.tasks import Task, check_task_batch
from vampire_jax.runs import kinds

PyTree = Any


class Problem(NamedTuple):
  """What an experiment trains on.

  Attributes:
    model: the network, a `flax.linen.Module` (recorded in the run folder by
      its class and fields, so it must be importable and its fields JSON
      values; `vj.load_run` rebuilds it from them). Linen only: a Flax NNX
      or Equinox network trains through `vj.from_nnx` / `vj.from_equinox`
      and `vj.make_train_step` (the user guide's "Flax NNX and Equinox
      networks"), not through `train_and_evaluate`, whose run folders could
      not rebuild it.
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
      from `sample_tasks` (ProtoNet's `train_num_classes`: training episodes of
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


# What `Problem.model` takes, and where the other networks go (the run folder records a
# linen module's class and fields, which `load_run` rebuilds; NNX and Equinox have no such
# record here).
_LINEN_ONLY = (
  "a flax.linen module (e.g. vj.MLP, vj.Conv4): run folders record and rebuild linen "
  "networks only; an NNX or Equinox network trains through vj.from_nnx / vj.from_equinox "
  "and vj.make_train_step (user guide, 'Flax NNX and Equinox networks')"
)
SPLITS = ("train", "val", "test")  # meta-train, pick the best meta-parameters, test them
WHERE = "train_and_evaluate"


def checked_problem(problem) -> Problem:
  """`problem`, or the `Problem` that the function `problem` builds, checked (`check_problem`).

  Raises:
    InputError: neither a `Problem` nor a function that returns one (the class
      `vj.Problem` itself too), or a problem `check_problem` refuses.
  """
  if isinstance(problem, type):  # a class is callable: calling vj.Problem() fails obscurely
    raise InputError(
      f"{WHERE}: problem is the class {problem.__name__} itself; pass a vj.Problem("
      "model=..., input_shape=..., splits=..., sample_tasks=...) or a function that returns one"
    )
  if not isinstance(problem, Problem):
    if not callable(problem):
      raise InputError(
        f"{WHERE}: problem is a {type(problem).__name__}; pass a vj.Problem "
        "or a function that returns one"
      )
    built = problem()
    if not isinstance(built, Problem):
      raise InputError(
        f"{WHERE}: the problem's function returned a {type(built).__name__}, not a vj.Problem"
      )
    problem = built
  check_problem(problem)
  return problem


def check_problem(problem: Problem) -> None:
  """Refuses, in one line naming the field and the fix, a problem the loop could not train.

  Its fields' types; the three splits, their values finite; then one training task, drawn
  and checked against
  `input_shape` and the network's outputs (labels within its classes, targets of its
  shape), so that no folder is made for a run whose first step would fail.
  """
  if not isinstance(problem.model, nn.Module):
    raise checks.fail(WHERE, "problem.model", _LINEN_ONLY, _got(problem.model))
  if problem.kind not in kinds.KINDS:
    raise checks.fail(WHERE, "problem.kind", f"one of {', '.join(kinds.KINDS)}", _got(problem.kind))
  if problem.kind == "regression":
    checks.rate(
      WHERE, "problem.noise_std (the likelihood's noise)", problem.noise_std, positive=True
    )
  if not isinstance(problem.splits, dict) or set(SPLITS) - set(problem.splits):
    got = sorted(problem.splits) if isinstance(problem.splits, dict) else _got(problem.splits)
    raise checks.fail(
      WHERE,
      "problem.splits",
      "a dict with 'train' (meta-training), 'val' (the best checkpoint) and 'test'",
      f"{got}",
    )
  if not callable(problem.sample_tasks):
    raise checks.fail(WHERE, "problem.sample_tasks", "a function", _got(problem.sample_tasks))
  shape = problem.input_shape
  if not (
    isinstance(shape, (tuple, list))
    and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape)
  ):
    raise checks.fail(WHERE, "problem.input_shape", "a tuple of positive integers", _got(shape))
  for split, data in problem.splits.items():  # values, once, on the host: nothing NaN trains
    checks.check_finite(
      WHERE,
      {
        f"problem.splits[{split!r}]{jax.tree_util.keystr(path)}": leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(data)
        if getattr(leaf, "is_fully_addressable", True)  # a host sees its own shards only
      },
    )
  _check_a_training_task(problem)


def _got(value) -> str:
  return f"{type(value).__name__} {value!r}"[:120]


def _check_a_training_task(problem: Problem) -> None:
  """One training task against `input_shape` and the network's outputs (traced, not run)."""
  try:
    tasks = draw_tasks(problem, "train", jax.random.key(0), 1)
  except (TypeError, ValueError, IndexError) as error:
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    raise InputError(
      f"{WHERE}: problem.sample_tasks(problem.splits['train'], task_keys) failed "
      f"({type(error).__name__}: {first_line}); it must take a split's data and task_keys "
      "[n] and return a vj.Task of n tasks"
    ) from None
  check_task_batch(tasks, f"{WHERE}: problem.sample_tasks(problem.splits['train'], keys)")
  task = jax.tree_util.tree_map(lambda field: field[0], tasks)
  example_shape = tuple(jnp.shape(task.support_x)[1:])
  if tuple(problem.input_shape) != example_shape:
    raise InputError(
      f"{WHERE}: problem.input_shape is {tuple(problem.input_shape)}, but the training tasks' "
      f"examples are {example_shape} (support_x {checks.describe(task.support_x)}); set "
      f"input_shape={example_shape}"
    )
  params = jax.eval_shape(  # shapes only: nothing is initialised
    lambda key: models.init_params(problem.model, key, (1,) + example_shape), jax.random.key(0)
  )
  apply_fn = models.pure_apply(problem.model)
  names = ("problem.model's parameters", "the training tasks' support_x")
  outputs = checks.network_fits(WHERE, names, apply_fn, params, task.support_x)
  num_outputs = jnp.shape(outputs)[-1]
  if problem.kind == "classification" and jnp.issubdtype(task.support_y.dtype, jnp.integer):
    num_classes = int(max(np.max(task.support_y), np.max(task.query_y))) + 1
    if num_classes > num_outputs:
      raise InputError(
        f"{WHERE}: problem.model has {num_outputs} outputs, but the training tasks' labels "
        f"go up to {num_classes - 1} ({num_classes} ways): give the model {num_classes} "
        "outputs (e.g. vj.Conv4(num_classes=ways))"
      )
  targets = jnp.shape(task.support_y)
  if problem.kind == "regression" and len(targets) == 2 and targets[-1] != num_outputs:
    raise InputError(
      f"{WHERE}: problem.model gives outputs {checks.describe(outputs)} for the training "
      f"tasks' targets {checks.describe(task.support_y)} (support_y): give the model "
      f"{targets[-1]} output(s) per example"
    )
  nll = kinds.get(problem.kind).likelihood(problem.noise_std)
  checks.loss_fits(
    WHERE,
    ("the training tasks' support_x", "the training tasks' support_y"),
    losses.loss_from_apply(apply_fn, nll),
    params,
    task.support_x,
    task.support_y,
    params_name="problem.model's parameters",
  )
