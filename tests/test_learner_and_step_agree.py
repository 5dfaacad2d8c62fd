"""A meta-step and what it trains agree, or the step is refused in one line.

The learner's tasks per step and the step's are one number, whichever way the step gets its
T (SImPa's hyper-prior term counts M = T); the state is the learner's own kind (a VAMPIRE
Gaussian in a MAML step, weights in a VAMPIRE step); SImPa's optimizer, `vj.kl_step_factor`
and SImPa's own functions refuse what is not theirs by name; a bool is not a rate.
"""

import jax
import jax.numpy as jnp
import optax
import pytest

import vampire_jax as vj
from vampire_jax.data import sine_line

NOISE_STD = 0.3
MODEL = vj.MLP((6,), 1)


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _params():
  return vj.init_params(MODEL, jax.random.key(0), (1, 1))


def _simpa(tasks_per_step=2, **settings):
  options = dict(num_inner_steps=1, inner_lr=0.01, num_kl_samples=16)
  return vj.baselines.simpa(
    vj.pure_apply(MODEL),
    vj.gaussian_nll(NOISE_STD),
    tasks_per_step=tasks_per_step,
    **{**options, **settings},
  )


def _simpa_shapes(learner):
  """The shapes of SImPa's meta-parameters, in their `SimpaParams` (its init, traced only)."""
  return jax.eval_shape(learner.init, _params(), jax.random.key(1))


def _sample(data, task_keys):
  del data
  return sine_line.tasks_from_keys(task_keys)


# -- The learner's T and the step's ----------------------------------------------------------


def test_a_simpa_learner_of_another_task_count_than_its_step_is_refused():
  """`simpa(tasks_per_step=2)` in a step of 4 tasks (its hyper-prior term would count M = 2)
  is refused, whether T comes from the optimizer, the step or the tasks, naming both counts
  and the fix; one T for both is taken, and other learners count no T."""
  learner = _simpa(tasks_per_step=2)
  fix = (
    "but the learner was built for tasks_per_step=2",  # the other count
    "its meta-loss counts 2 tasks a step, as SImPa's hyper-prior term does",  # why it matters
    "give both the same T, e.g. vj.baselines.simpa(..., tasks_per_step=4)",  # the fix
  )
  with pytest.raises(vj.InputError) as raised:  # T from the optimizer
    vj.make_train_step(learner, vj.baselines.simpa_optimizer(tasks_per_step=4), _sample)
  message = _one_line(raised)
  assert message.startswith("make_train_step: tasks_per_step=4 ")
  assert "(the optimizer's, vj.meta_optimizer's or vj.baselines.simpa_optimizer's)" in message
  assert all(fact in message for fact in fix), message
  with pytest.raises(vj.InputError) as raised:  # T given to the step
    vj.make_train_step(learner, optax.adam(1e-3), _sample, tasks_per_step=4)
  message = _one_line(raised)
  assert message.startswith("make_train_step: tasks_per_step=4, ")
  assert all(fact in message for fact in fix), message
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 4))
  meta_step = vj.make_meta_step(learner, optax.adam(1e-3))
  with pytest.raises(vj.InputError) as raised:  # T from the tasks given (at trace time)
    jax.eval_shape(meta_step, None, tasks, jax.random.key(3))
  message = _one_line(raised)
  assert message.startswith("make_meta_step: the step was given 4 tasks (tasks' leading axis)")
  assert all(fact in message for fact in fix), message
  # One T for both is taken, and other learners count no T.
  vj.make_train_step(_simpa(4), vj.baselines.simpa_optimizer(tasks_per_step=4), _sample)
  maml = vj.maml(vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD))
  assert maml.tasks_per_step is None and learner.tasks_per_step == 2
  vj.make_train_step(maml, optax.adam(1e-3), _sample, tasks_per_step=4)


# -- The state is the learner's kind ---------------------------------------------------------


def test_a_state_of_another_learner_is_refused_by_name():
  """A VAMPIRE state in a MAML step, and a MAML state in a VAMPIRE step, are refused naming
  what state.meta_params is, what the learner's init makes, and vj.init_meta_state."""
  apply_fn, nll = vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD)
  vampire = vj.vampire(apply_fn, nll, num_inner_steps=1)
  maml = vj.maml(apply_fn, nll, num_inner_steps=1)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  fix = (
    "(a MAML learner takes weights, VAMPIRE a vj.Gaussian)",  # why
    "build the state for the learner the step trains",  # the fix
    "vj.init_meta_state(learner, optimizer, params, key)",
  )
  for built_for, trained, made, wanted in (
    (vampire, maml, "vj.Gaussian", "weight tree"),
    (maml, vampire, "weight tree", "vj.Gaussian"),
  ):
    state = vj.init_meta_state(built_for, optimizer, _params(), jax.random.key(1))
    step = vj.make_train_step(trained, optimizer, _sample)
    with pytest.raises(vj.InputError) as raised:
      jax.eval_shape(step, state, None, jax.random.key(2))
    message = _one_line(raised)
    assert message.startswith(f"train_step: state.meta_params is a {made}, ")  # the value
    assert f"but this learner's init makes a {wanted}" in message  # what it must be
    assert all(fact in message for fact in fix), message


# -- What is not SImPa's, or not a rate --------------------------------------------------------


def test_simpa_optimizer_and_kl_step_factor_refuse_another_learners_parameters():
  """simpa_optimizer.init refuses a Gaussian, and kl_step_factor SImPa's parameters, naming
  the parameters each takes and what it got."""
  gaussian = vj.vampire(vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD)).init(
    _params(), jax.random.key(1)
  )
  with pytest.raises(vj.InputError) as raised:
    vj.baselines.simpa_optimizer(tasks_per_step=2).init(gaussian)
  message = _one_line(raised)
  assert message.startswith("simpa_optimizer.init: params ")  # the function and the argument
  assert "must be SImPa's meta-parameters (vj.baselines.SimpaParams" in message
  assert "from vj.baselines.simpa(...).init" in message and "got a Gaussian" in message
  assert "another learner's take vj.meta_optimizer" in message  # the way out
  simpa_params = _simpa_shapes(_simpa())  # the kind is what is refused: shapes are enough
  with pytest.raises(vj.InputError) as raised:
    vj.kl_step_factor(simpa_params, 1e-3, 1.0)
  message = _one_line(raised)
  assert message.startswith("kl_step_factor: prior ")  # the function and the argument
  assert "must be a vj.Gaussian (VAMPIRE's, ABML's or Vampire2's meta-parameters)" in message
  assert "got a SimpaParams" in message
  assert "only those learners take KL steps in their inner loop" in message  # why


@pytest.mark.parametrize(
  "build, name",
  [
    (lambda: _simpa(epsilon=True), "simpa: epsilon"),
    (
      lambda: vj.vampire(
        vj.pure_apply(MODEL), vj.gaussian_nll(NOISE_STD), kl_target="standard_normal",
        outer_kl_weight=True,
      ),
      "vampire: outer_kl_weight",
    ),
  ],
)  # fmt: skip
def test_a_bool_is_not_taken_as_a_rate(build, name):
  """`epsilon=True` and `outer_kl_weight=True` are refused as a bool, not taken as 1.0."""
  with pytest.raises(vj.InputError) as raised:
    build()
  message = _one_line(raised)
  assert message.startswith(f"{name} ")  # the function and the argument
  assert "must be a number, not a bool" in message and "got True" in message


def test_simpa_names_the_query_of_one_target_and_a_network_that_does_not_fit():
  """One query target is refused by simpa's meta-loss (the function called), naming the 2
  it needs; inputs of another feature count are refused by simpa.adapt and simpa.predict,
  naming the shapes."""
  learner = _simpa()
  meta_params = _simpa_shapes(learner)  # refused where traced: shapes are enough
  task = jax.tree_util.tree_map(
    lambda field: field[0], sine_line.tasks_from_keys(jax.random.split(jax.random.key(7), 1))
  )
  one_query = task._replace(query_x=task.query_x[:1], query_y=task.query_y[:1])
  with pytest.raises(vj.InputError) as raised:
    jax.eval_shape(learner.meta_loss, meta_params, one_query, jax.random.key(0))
  message = _one_line(raised)
  assert message.startswith("simpa's meta-loss: task.query_y has 1 target")  # field, value
  assert "SImPa's bound term divides by 2 (n - 1)" in message  # the cause
  assert "give at least 2" in message  # the fix
  wide = jnp.ones((task.support_x.shape[0], 3))  # 3 features for a network of 1
  with pytest.raises(vj.InputError) as raised:
    jax.eval_shape(learner.adapt, meta_params, wide, task.support_y, jax.random.key(0))
  assert _one_line(raised).startswith(
    "simpa.adapt: the generator's weights and support_x float32[5, 3] do not fit together "
    "(another network's parameters, or inputs of another shape"
  )
  with pytest.raises(vj.InputError) as raised:
    jax.eval_shape(learner.predict, meta_params, wide, jax.random.key(0))
  assert _one_line(raised).startswith(
    "simpa.predict: the generator's weights and x float32[5, 3] do not fit together"
  )
