"""The paper's multi-modal regression tasks (Sec. 4.1, App. A), made in JAX.

Half the tasks are sinusoids A sin(x + phi), A ~ U[0.1, 5], phi ~ U[0, pi];
half are lines a x + b, a, b ~ U[-3, 3]. Inputs x ~ U[-5, 5]; targets get
Gaussian noise of standard deviation 0.3. Everything is a pure function of a
PRNG key, so task sampling runs inside `jit` next to the meta-step.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from vampire_jax._src.core.tasks import Task

AMPLITUDE_RANGE = (0.1, 5.0)
PHASE_RANGE = (0.0, math.pi)
SLOPE_RANGE = (-3.0, 3.0)
INTERCEPT_RANGE = (-3.0, 3.0)
INPUT_RANGE = (-5.0, 5.0)
NOISE_STD = 0.3


class TaskFunctions(NamedTuple):
  """The noiseless function behind each task; every field is `[tasks]`.

  A task is a sinusoid where `is_sine`, else a line; both parameter pairs are
  always drawn, and the other pair is ignored.
  """

  is_sine: jax.Array  # bool
  amplitude: jax.Array  # A
  phase: jax.Array  # phi
  slope: jax.Array  # a
  intercept: jax.Array  # b


def _one_function(key: jax.Array) -> TaskFunctions:
  """One task's function: a sinusoid or a line with probability 1/2."""
  keys = jax.random.split(key, 5)

  def uniform(k, bounds):
    return jax.random.uniform(k, (), minval=bounds[0], maxval=bounds[1])

  return TaskFunctions(
    is_sine=jax.random.bernoulli(keys[0], 0.5),
    amplitude=uniform(keys[1], AMPLITUDE_RANGE),
    phase=uniform(keys[2], PHASE_RANGE),
    slope=uniform(keys[3], SLOPE_RANGE),
    intercept=uniform(keys[4], INTERCEPT_RANGE),
  )


def sample_functions(key: jax.Array, num_tasks: int) -> TaskFunctions:
  """Draws `num_tasks` functions, each a sinusoid or a line with probability 1/2."""
  return jax.vmap(_one_function)(jax.random.split(key, num_tasks))


def evaluate_functions(functions: TaskFunctions, x: jax.Array) -> jax.Array:
  """Noiseless targets; `x` is `[tasks, points, 1]` (or `[points, 1]` for one task)."""
  expand = lambda v: jnp.reshape(v, jnp.shape(v) + (1,) * (jnp.ndim(x) - jnp.ndim(v)))
  sine = expand(functions.amplitude) * jnp.sin(x + expand(functions.phase))
  line = expand(functions.slope) * x + expand(functions.intercept)
  return jnp.where(expand(functions.is_sine), sine, line)


def query_grid(num_points: int) -> jax.Array:
  """`num_points` evenly spaced inputs over `INPUT_RANGE`, `[num_points, 1]` (the authors' test: 100)."""
  return jnp.linspace(*INPUT_RANGE, num_points)[:, None]


def tasks_and_functions_from_keys(
  task_keys: jax.Array,
  *,
  num_support: int = 5,
  num_query: int = 10,
  noise_std: float = NOISE_STD,
  query_x: jax.Array | None = None,
) -> tuple[Task, TaskFunctions]:
  """One task per key, and the function behind it; task i depends on key i alone.

  Args:
    task_keys: `[tasks]` keys.
    num_support, num_query: points per task; the inputs are drawn from U[-5, 5].
    noise_std: the standard deviation of the noise added to the targets.
    query_x: optional `[n, 1]` query inputs shared by every task (e.g.
      `query_grid(100)`, the authors' test); `num_query` is then n.

  Returns:
    A `Task` with `support_x/support_y` of shape `[tasks, num_support, 1]`
    and `query_x/query_y` of shape `[tasks, num_query, 1]` (targets with
    noise), and the `TaskFunctions` (each field `[tasks]`).
  """
  if query_x is not None:
    num_query = query_x.shape[0]
  if num_support < 1 or num_query < 1:
    raise ValueError(f"num_support and num_query must be >= 1; got {num_support}, {num_query}")
  if noise_std < 0:
    raise ValueError(f"noise_std must be >= 0, got {noise_std}")
  num_drawn = num_support + (num_query if query_x is None else 0)

  def one_task(key):
    function_key, x_key, noise_key = jax.random.split(key, 3)
    function = _one_function(function_key)
    x = jax.random.uniform(x_key, (num_drawn, 1), minval=INPUT_RANGE[0], maxval=INPUT_RANGE[1])
    if query_x is not None:
      x = jnp.concatenate([x, query_x.astype(x.dtype)])
    y = evaluate_functions(function, x) + noise_std * jax.random.normal(noise_key, x.shape)
    return Task(x[:num_support], y[:num_support], x[num_support:], y[num_support:]), function

  return jax.vmap(one_task)(task_keys)


def tasks_from_keys(
  task_keys: jax.Array,
  *,
  num_support: int = 5,
  num_query: int = 10,
  noise_std: float = NOISE_STD,
  query_x: jax.Array | None = None,
) -> Task:
  """One task per key (see `tasks_and_functions_from_keys`)."""
  return tasks_and_functions_from_keys(
    task_keys, num_support=num_support, num_query=num_query, noise_std=noise_std, query_x=query_x
  )[0]


def query_truth_from_keys(
  task_keys: jax.Array,
  *,
  num_support: int = 5,
  num_query: int = 10,
  noise_std: float = NOISE_STD,
  query_x: jax.Array | None = None,
) -> jax.Array:
  """The noiseless targets `[tasks, num_query, 1]` at the query inputs of the keys' tasks."""
  tasks, functions = tasks_and_functions_from_keys(
    task_keys, num_support=num_support, num_query=num_query, noise_std=noise_std, query_x=query_x
  )
  return evaluate_functions(functions, tasks.query_x)


def sample_tasks_and_functions(
  key: jax.Array,
  num_tasks: int,
  *,
  num_support: int = 5,
  num_query: int = 10,
  noise_std: float = NOISE_STD,
) -> tuple[Task, TaskFunctions]:
  """`num_tasks` tasks from one key, and the functions behind them."""
  if num_tasks < 1:
    raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
  return tasks_and_functions_from_keys(
    jax.random.split(key, num_tasks),
    num_support=num_support,
    num_query=num_query,
    noise_std=noise_std,
  )


def sample_tasks(
  key: jax.Array,
  num_tasks: int,
  *,
  num_support: int = 5,
  num_query: int = 10,
  noise_std: float = NOISE_STD,
) -> Task:
  """`num_tasks` regression tasks (see `tasks_and_functions_from_keys`)."""
  return sample_tasks_and_functions(
    key, num_tasks, num_support=num_support, num_query=num_query, noise_std=noise_std
  )[0]
