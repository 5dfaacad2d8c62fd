import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from tests.helpers import (
  _max_abs_difference,
  _sample,
  _sampler,
  _setup,
  _tiny_hidden_mlp,
  _vampire_regression_learner,
)
from vampire_jax import baselines
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.host_chunked import (
  make_host_chunked_meta_step,
  make_host_chunked_train_step,
)
from vampire_jax.data import sine_line


def _sine_tasks(key, num_tasks, shots=5, query=10, dtype=jnp.float32):
  k_amp, k_phase, k_x = jax.random.split(key, 3)
  amp = jax.random.uniform(k_amp, (num_tasks, 1, 1), dtype, minval=0.5, maxval=3.0)
  phase = jax.random.uniform(k_phase, (num_tasks, 1, 1), dtype, maxval=jnp.pi)
  x = jax.random.uniform(k_x, (num_tasks, shots + query, 1), dtype, minval=-5.0, maxval=5.0)
  y = amp * jnp.sin(x + phase)
  return vj.Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_steps_per_call_and_host_chunking_do_not_change_the_run(algorithm):
  learner, optimizer, state = _setup(algorithm)
  key = jax.random.key(3)
  one = jax.jit(vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4))
  three = jax.jit(
    vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4, steps_per_call=3)
  )
  chunked = make_host_chunked_train_step(
    learner, optimizer, _sampler, tasks_per_step=4, chunk_size=2
  )
  single, chunk_state, losses = state, state, []
  for _ in range(3):
    single, metrics = one(single, None, key)
    chunk_state, _ = chunked(chunk_state, None, key)
    losses.append(metrics["loss"][0])
  scanned, scanned_metrics = three(state, None, key)
  assert int(scanned.step) == int(single.step) == 3
  chex.assert_trees_all_close(scanned, single, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(chunk_state, single, rtol=1e-4, atol=1e-6)
  chex.assert_trees_all_close(scanned_metrics["loss"], jnp.stack(losses), rtol=1e-5)
  # Each step draws other tasks: the three losses differ.
  assert len({round(float(v), 6) for v in losses}) == 3


@pytest.mark.parametrize("name", ["platipus", "bmaml", "abml"])
def test_host_chunked_meta_step_takes_the_vmapped_step(name):
  # The CPU meta-step (tasks unrolled in jitted chunks, looped on the host)
  # against the vmapped one; first order and one inner step keep compiles short.
  params, apply_fn, nll, _ = _tiny_hidden_mlp()
  settings = {"bmaml": dict(num_particles=2)}.get(name, dict(num_mc_train=1, num_mc_query=2))
  learner = baselines.LEARNERS[name](
    apply_fn, nll, num_inner_steps=1, inner_lr=0.05, first_order=True, **settings
  )
  opt = vj.meta_optimizer(1e-3, tasks_per_step=2)
  state = vj.init_meta_state(learner, opt, params, jax.random.key(1))
  tasks = _sine_tasks(jax.random.key(2), 2)
  vmapped, metrics = jax.jit(vj.make_meta_step(learner, opt))(state, tasks, jax.random.key(3))
  host_chunked, host_metrics = make_host_chunked_meta_step(learner, opt, chunk_size=1)(
    state, tasks, jax.random.key(3)
  )
  chex.assert_trees_all_close(host_chunked, vmapped, atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(host_metrics["loss"], metrics["loss"], rtol=1e-5)
  assert _max_abs_difference(vmapped.meta_params, state.meta_params) > 1e-4


def test_the_host_chunked_steps_refuse_another_count_too():
  """The host-chunked (CPU) train and meta steps refuse a schedule of another count too."""
  learner, params = _vampire_regression_learner()
  optimizer = optax.chain(vj.meta_optimizer(1e-3, tasks_per_step=2))
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = make_host_chunked_train_step(
    learner, optimizer, _sample, tasks_per_step=4, chunk_size=2
  )
  with pytest.raises(InputError, match="make_host_chunked_train_step: tasks_per_step=4, but"):
    train_step(state, None, jax.random.key(2))
  meta_step = make_host_chunked_meta_step(learner, optimizer, chunk_size=2)
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(3), 4))
  with pytest.raises(InputError, match="make_host_chunked_meta_step: the step was given 4 tasks"):
    meta_step(state, tasks, jax.random.key(4))
  two = jax.tree_util.tree_map(lambda x: x[:2], tasks)
  assert int(meta_step(state, two, jax.random.key(4))[0].step) == 1
