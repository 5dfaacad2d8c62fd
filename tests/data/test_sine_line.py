import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vampire_jax.data import sine_line


def test_task_generator_ranges_and_mixture():
  tasks, functions = sine_line.sample_tasks_and_functions(
    jax.random.key(0), 20_000, num_support=5, num_query=7, noise_std=0.3
  )
  assert tasks.support_x.shape == tasks.support_y.shape == (20_000, 5, 1)
  assert tasks.query_x.shape == tasks.query_y.shape == (20_000, 7, 1)
  f = jax.tree_util.tree_map(np.asarray, functions)
  assert 0.1 <= f.amplitude.min() and f.amplitude.max() <= 5.0
  assert 0.0 <= f.phase.min() and f.phase.max() <= math.pi
  for v in (f.slope, f.intercept):
    assert -3.0 <= v.min() and v.max() <= 3.0 and v.max() - v.min() > 5.9
  x = np.concatenate([tasks.support_x, tasks.query_x], axis=1)
  assert -5.0 <= x.min() and x.max() <= 5.0 and x.max() - x.min() > 9.9
  # Half sinusoids, half lines: 20 000 Bernoulli(1/2) draws, 5 sigma = 0.018.
  assert abs(f.is_sine.mean() - 0.5) < 0.018
  # The noise: residuals about the true functions have mean 0 and std 0.3.
  y = np.concatenate([tasks.support_y, tasks.query_y], axis=1)
  residual = y - np.asarray(sine_line.evaluate_functions(functions, x))
  assert abs(residual.mean()) < 0.003 and abs(residual.std() - 0.3) < 0.003
  # Uniform amplitudes: mean (0.1 + 5) / 2.
  assert abs(f.amplitude.mean() - 2.55) < 0.03


def test_functions_by_hand_and_determinism():
  functions = sine_line.TaskFunctions(
    is_sine=jnp.array([True, False]),
    amplitude=jnp.array([2.0, 9.0]),
    phase=jnp.array([0.5, 9.0]),
    slope=jnp.array([9.0, -1.5]),
    intercept=jnp.array([9.0, 2.0]),
  )
  x = jnp.array([[[0.0], [1.0]], [[0.0], [4.0]]])
  np.testing.assert_allclose(
    sine_line.evaluate_functions(functions, x)[..., 0],
    [[2 * math.sin(0.5), 2 * math.sin(1.5)], [2.0, -4.0]],
    rtol=1e-6,
  )
  a = sine_line.sample_tasks(jax.random.key(3), 4)
  b = jax.jit(sine_line.sample_tasks, static_argnums=1)(jax.random.key(3), 4)
  c = sine_line.sample_tasks(jax.random.key(4), 4)
  for u, v, w in zip(a, b, c):
    np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-6)  # jit may round sin differently
    assert not np.allclose(u, w)
  with pytest.raises(ValueError, match="num_support"):
    sine_line.sample_tasks(jax.random.key(0), 4, num_support=0)
