"""The meta-step and the evaluators compile once per shape (`chex.assert_max_traces`).

A state whose leaves change dtype or weak type between calls (a Python int step, a
float64 leaf) would make `jax.jit` trace and compile again on every call: the loop would
still give the right numbers, only many times slower. chex counts the traces.
"""

import chex
import jax
import jax.numpy as jnp

import vampire_jax as vj
from vampire_jax.data import sine_line


def _sample_tasks(data, task_keys):
  del data
  return sine_line.tasks_from_keys(task_keys)


def test_the_train_step_and_the_evaluator_trace_once_over_calls():
  chex.clear_trace_counter()
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_inner_steps=1)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = vj.make_train_step(learner, optimizer, _sample_tasks, steps_per_call=2)
  train_step = jax.jit(chex.assert_max_traces(train_step, n=1))
  for call in range(3):  # each call's state is the last one's output
    state, metrics = train_step(state, None, jax.random.key(10 + call))
  assert int(state.step) == 6 and bool(metrics["finite"].all())

  evaluate = jax.jit(chex.assert_max_traces(vj.make_regression_evaluator(learner, 0.3), n=1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 3))
  for call in range(3):  # new keys, new meta-parameters of the same shapes
    per_task = evaluate(state.meta_params, tasks, jax.random.key(20 + call))
    state, _ = train_step(state, None, jax.random.key(30 + call))
  assert per_task.nll.shape == (3,)


def test_the_classification_evaluator_traces_once_over_calls():
  chex.clear_trace_counter()
  model = vj.MLP((8,), 3)
  learner = vj.vampire(vj.pure_apply(model), vj.categorical_nll, num_inner_steps=1)
  meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 2)), jax.random.key(1))
  evaluate = jax.jit(chex.assert_max_traces(vj.make_classification_evaluator(learner), n=1))
  labels = jnp.tile(jnp.arange(3), (2, 2))  # [2 tasks, 6]
  for call in range(3):
    points = jax.random.normal(jax.random.key(call), (2, 6, 2)) + labels[..., None]
    result = evaluate(meta_params, vj.Task(points, labels, points, labels), jax.random.key(call))
  assert result.accuracy.shape == (2,)
