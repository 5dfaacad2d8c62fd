"""Steps that sample their own tasks: equal to the plain meta-step, whatever the speed knobs."""

import chex
import jax
import jax.numpy as jnp
import pytest

import vampire_jax as vj
from vampire_jax.data import sine_line


def _sampler(data, task_keys):
  del data  # generated tasks
  return sine_line.tasks_from_keys(task_keys, num_support=5, num_query=5)


def _setup(algorithm, num_tasks=4):
  model = vj.MLP((16,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  apply_fn, nll = vj.pure_apply(model), vj.gaussian_nll(0.3)
  if algorithm == "maml":
    learner = vj.maml(apply_fn, nll, num_inner_steps=2, inner_lr=0.005)
  else:
    learner = vj.vampire(apply_fn, nll, num_inner_steps=2, inner_lr=0.005, kl_weight=0.1,
                         num_mc_train=2, num_mc_query=2)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=num_tasks)
  return learner, optimizer, vj.init_meta_state(learner, optimizer, params, jax.random.key(1))


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_train_step_is_the_meta_step_on_the_tasks_it_draws(algorithm):
  learner, optimizer, state = _setup(algorithm)
  key = jax.random.key(7)
  step = jax.jit(vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4))
  new_state, metrics = step(state, None, key)
  # By hand: the keys of step 0, the tasks they draw, the per-task gradient mean.
  task_keys, adapt_keys = vj.meta_step.step_keys(key, state.step, 4)
  grads, expected = vj.make_meta_gradient(learner)(state.meta_params, _sampler(None, task_keys),
                                                   adapt_keys)
  chex.assert_trees_all_close(new_state, vj.apply_meta_gradient(optimizer, state, grads),
                              rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(metrics["loss"][0], expected["loss"], rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_steps_per_call_and_host_chunking_do_not_change_the_run(algorithm):
  learner, optimizer, state = _setup(algorithm)
  key = jax.random.key(3)
  one = jax.jit(vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4))
  three = jax.jit(vj.make_train_step(learner, optimizer, _sampler, tasks_per_step=4,
                                     steps_per_call=3))
  chunked = vj.make_host_chunked_train_step(learner, optimizer, _sampler, tasks_per_step=4,
                                            chunk_size=2)
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
