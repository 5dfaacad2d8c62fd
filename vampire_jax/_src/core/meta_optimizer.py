"""The meta-optimiser: Adam with the paper's schedule, which counts tasks, not steps.

`meta_optimizer(learning_rate, tasks_per_step=T)` is Adam whose learning rate
decays every `decay_every_tasks` tasks, so its schedule needs T, the tasks per
meta-step. It returns a `MetaOptimizer` that carries T: `make_train_step` reads
it, and every meta-step states the count it adapts to (`tasks_in_step`) while it
is traced, so that a step of another count is refused even where a wrapper
(`optax.chain`, `optax.masked`) hides the attribute.
"""

import contextlib
import contextvars
from typing import Any, Callable, NamedTuple, Optional

import jax
import optax

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError

PyTree = Any


def meta_lr_schedule(
  learning_rate: float = 1e-3,
  *,
  tasks_per_step: int,
  decay_rate: float = 0.99,
  decay_every_tasks: int = 10_000,
) -> optax.Schedule:
  """The paper's meta learning rate: x `decay_rate` after every `decay_every_tasks` tasks.

  Raises:
    InputError: (a ValueError) a rate that is not a finite positive number, a
      `decay_rate` outside (0, 1], or a `tasks_per_step` that is not an integer >= 1.
  """
  where = "meta_lr_schedule"
  checks.rate(where, "learning_rate", learning_rate, positive=True)
  checks.step_count(where, "tasks_per_step", tasks_per_step, 1)
  checks.rate(where, "decay_rate", decay_rate, positive=True)
  if decay_rate > 1:
    raise InputError(f"{where}: decay_rate must be in (0, 1], got {decay_rate!r}")
  checks.rate(where, "decay_every_tasks", decay_every_tasks, positive=True)
  return optax.exponential_decay(
    learning_rate,
    transition_steps=decay_every_tasks / tasks_per_step,
    decay_rate=decay_rate,
    staircase=True,
  )


def log_std_mask(meta_params: PyTree) -> PyTree:
  """True at every log-std of `meta_params`, False elsewhere (a tree of bools).

  A log-std is a leaf under a field whose name starts with `log_std`:
  VAMPIRE's and ABML's prior (`Gaussian.log_std`), PLATIPUS's prior and
  inference spreads (`log_std`, `log_std_q`). Point estimates (MAML) and
  BMAML's particles have none.
  """

  def is_log_std(path, leaf) -> bool:
    del leaf
    return any(
      isinstance(k, jax.tree_util.GetAttrKey) and k.name.startswith("log_std") for k in path
    )

  return jax.tree_util.tree_map_with_path(is_log_std, meta_params)


def _not_log_std(meta_params: PyTree) -> PyTree:
  return jax.tree_util.tree_map(lambda is_log_std: not is_log_std, log_std_mask(meta_params))


class _StepTasks(NamedTuple):
  """The tasks a meta-step adapts to, while it is traced (see `tasks_in_step`)."""

  count: int
  described: str  # e.g. "make_train_step: tasks_per_step=8"


_TASKS_IN_STEP: contextvars.ContextVar[Optional[_StepTasks]] = contextvars.ContextVar(
  "vampire_jax_tasks_in_step", default=None
)


@contextlib.contextmanager
def tasks_in_step(count: int, described: str):
  """While a step calls its optimizer: it adapts to `count` tasks (`described` says where from).

  A `MetaOptimizer`'s update, reached bare or through any optax wrapper
  (`optax.chain`, `optax.masked`, ...), refuses a `count` other than the T its
  schedule counts in. The check runs where the update is traced (once, under `jit`).
  """
  token = _TASKS_IN_STEP.set(_StepTasks(int(count), described))
  try:
    yield
  finally:
    _TASKS_IN_STEP.reset(token)


def _update_counting(update: Callable, tasks_per_step: Optional[int]) -> Callable:
  """`update`, refusing a step (`tasks_in_step`) of another task count than the schedule's."""

  def checked_update(updates, state, params=None, **extra_args):
    step = _TASKS_IN_STEP.get()
    if step is not None and tasks_per_step is not None and step.count != tasks_per_step:
      raise InputError(
        f"{step.described}, but the optimizer's vj.meta_optimizer (bare or inside a wrapper "
        f"such as optax.chain) counts {tasks_per_step} tasks per step in its learning-rate "
        f"schedule; build it with vj.meta_optimizer(..., tasks_per_step={step.count})"
      )
    return update(updates, state, params, **extra_args)

  return checked_update


class MetaOptimizer(optax.GradientTransformationExtraArgs):
  """`meta_optimizer`'s result: an optax transformation that knows its `tasks_per_step`.

  It is an ordinary `optax.GradientTransformation` (`init`, `update`), and
  `make_train_step` reads `tasks_per_step` from it, so a user states T once.
  A wrapper (`optax.chain(vj.meta_optimizer(...), ...)`) hides the attribute,
  but not the count: a meta-step of another number of tasks is refused when it
  is traced, whatever wraps the optimizer.
  """

  def __new__(cls, init, update, tasks_per_step: Optional[int] = None):
    self = super().__new__(cls, init, _update_counting(update, tasks_per_step))
    self.tasks_per_step = tasks_per_step
    return self


def meta_optimizer(
  learning_rate: float = 1e-3,
  *,
  tasks_per_step: int,
  decay_rate: float = 0.99,
  decay_every_tasks: int = 10_000,
  clip_norm: Optional[float] = None,
  clip_separately: bool = False,
  log_std_weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  """Adam with the paper's schedule: lr x `decay_rate` every `decay_every_tasks` tasks.

  In order: clip the meta-gradient, add the log-std weight decay, Adam. That
  is what the authors' 2019 code did with PyTorch's Adam (`weight_decay` in
  its parameter group of log-stds: coupled L2, added to the clipped gradient
  before the moments).

  Args:
    learning_rate: gamma.
    tasks_per_step: T, tasks per meta-update (sets the decay's step count);
      `make_train_step` takes it from here.
    decay_rate: multiplicative decay (1: none, as the authors' code).
    decay_every_tasks: tasks between decays.
    clip_norm: if set, clip the meta-gradient's global norm first (the
      authors' code clips at 10).
    clip_separately: clip the means' part and the log-stds' part each to
      `clip_norm` (the authors' VAMPIRE), instead of the whole gradient.
    log_std_weight_decay: lambda: every log-std rho (`log_std_mask`) gets
      `lambda * rho` added to its gradient, which pulls it toward 0 (a wider
      prior, sigma = 1); means and point estimates are left alone. The
      authors' VAMPIRE: 1e-3.

  Returns:
    A `MetaOptimizer`: the optax transformation, with `tasks_per_step`.

  Raises:
    InputError: (a ValueError) a setting that is not a finite number in its range.
  """
  where = "meta_optimizer"
  checks.flag(where, "clip_separately", clip_separately)
  if clip_norm is not None:
    checks.rate(where, "clip_norm", clip_norm, positive=True)
  checks.rate(where, "log_std_weight_decay", log_std_weight_decay, positive=False)
  transforms = []
  if clip_norm is not None and clip_separately:
    clip = optax.clip_by_global_norm(clip_norm)
    transforms += [optax.masked(clip, _not_log_std), optax.masked(clip, log_std_mask)]
  elif clip_norm is not None:
    transforms.append(optax.clip_by_global_norm(clip_norm))
  if log_std_weight_decay:
    transforms.append(optax.add_decayed_weights(log_std_weight_decay, mask=log_std_mask))
  adam = optax.adam(
    meta_lr_schedule(
      learning_rate,
      tasks_per_step=tasks_per_step,
      decay_rate=decay_rate,
      decay_every_tasks=decay_every_tasks,
    )
  )
  # Adam alone is not chained: its state keeps the structure of earlier runs' checkpoints.
  optimizer = optax.chain(*transforms, adam) if transforms else adam
  return MetaOptimizer(*optimizer, tasks_per_step=tasks_per_step)


def _tasks_per_step(optimizer: optax.GradientTransformation, tasks_per_step: Optional[int]) -> int:
  """T from `make_train_step`'s argument or its `MetaOptimizer`; both given must agree."""
  known = getattr(optimizer, "tasks_per_step", None)
  if tasks_per_step is None and known is None:
    raise InputError(
      "make_train_step: tasks_per_step is required with an optimizer not built by "
      "vj.meta_optimizer(..., tasks_per_step=T) (a wrapper such as optax.chain hides its T): "
      "pass tasks_per_step=T"
    )
  if tasks_per_step is not None and known is not None and tasks_per_step != known:
    raise InputError(
      f"make_train_step: tasks_per_step={tasks_per_step!r} differs from the "
      f"{known} tasks per step the optimizer's schedule counts in (vj.meta_optimizer); "
      "give it once, to vj.meta_optimizer"
    )
  return known if tasks_per_step is None else tasks_per_step
