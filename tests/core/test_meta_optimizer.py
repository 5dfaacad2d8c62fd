import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from tests.helpers import _sample, _small_regression, _vampire_regression_learner
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.meta_step import log_std_mask
from vampire_jax.baselines.platipus import PlatipusParams
from vampire_jax.data import sine_line


def _gaussian(seed: int = 0) -> vj.Gaussian:
  keys = jax.random.split(jax.random.key(seed), 4)
  mean = {"w": jax.random.normal(keys[0], (3, 2)), "b": jax.random.normal(keys[1], (2,))}
  log_std = {
    "w": jax.random.uniform(keys[2], (3, 2), minval=-4.0, maxval=-3.0),
    "b": jax.random.uniform(keys[3], (2,), minval=-4.0, maxval=-3.0),
  }
  return vj.Gaussian(mean, log_std)


def _torch_adam_reference(params, gradients, *, lr, decay, clip_norm, separately):
  """PyTorch's Adam with `weight_decay` on the log-stds' parameter group, after clipping
  (the authors' vampire.py), written out in float64 for a `Gaussian` of arrays."""
  mean = {k: np.asarray(v, np.float64) for k, v in params.mean.items()}
  log_std = {k: np.asarray(v, np.float64) for k, v in params.log_std.items()}
  state = {
    name: {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in group.items()}
    for name, group in (("mean", mean), ("log_std", log_std))
  }

  def clip(groups):
    norm = math.sqrt(sum(float(np.sum(g**2)) for group in groups for g in group.values()))
    scale = min(1.0, clip_norm / norm)
    return [{k: g * scale for k, g in group.items()} for group in groups]

  for t, grad in enumerate(gradients, start=1):
    g_mean = {k: np.asarray(v, np.float64) for k, v in grad.mean.items()}
    g_log_std = {k: np.asarray(v, np.float64) for k, v in grad.log_std.items()}
    if separately:
      (g_mean,), (g_log_std,) = clip([g_mean]), clip([g_log_std])
    else:
      g_mean, g_log_std = clip([g_mean, g_log_std])
    g_log_std = {k: g + decay * log_std[k] for k, g in g_log_std.items()}  # torch's L2
    for name, group, g_group in (("mean", mean, g_mean), ("log_std", log_std, g_log_std)):
      for k in group:
        m, v = state[name][k]
        m = 0.9 * m + 0.1 * g_group[k]
        v = 0.999 * v + 0.001 * g_group[k] ** 2
        state[name][k] = (m, v)
        group[k] = group[k] - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
  return vj.Gaussian(mean, log_std)


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _train_one_step(optimizer, tasks_per_step):
  learner, params = _vampire_regression_learner()
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  step = jax.jit(vj.make_train_step(learner, optimizer, _sample, tasks_per_step=tasks_per_step))
  return step(state, None, jax.random.key(2))


def _meta_step_on(optimizer, num_tasks):
  learner, params = _vampire_regression_learner()
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(3), num_tasks))
  return jax.jit(vj.make_meta_step(learner, optimizer))(state, tasks, jax.random.key(4))


def test_meta_learning_rate_decays_by_099_every_10000_tasks():
  schedule = vj.meta_lr_schedule(1e-3, tasks_per_step=32)
  # 10 000 / 32 = 312.5 steps per decay: tasks 0..9999 at 1e-3, then x0.99.
  np.testing.assert_allclose(schedule(0), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(312), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(313), 0.99e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(625), 0.99**2 * 1e-3, rtol=1e-6)
  # And the optimiser uses it: Adam's first update is -lr * sign(g).
  opt = vj.meta_optimizer(1e-3, tasks_per_step=32)
  updates, _ = opt.update({"w": jnp.array(5.0)}, opt.init({"w": jnp.array(0.0)}))
  np.testing.assert_allclose(updates["w"], -1e-3, rtol=1e-4)


def test_log_std_mask_marks_log_stds_only():
  prior = _gaussian()
  assert log_std_mask(prior) == vj.Gaussian({"w": False, "b": False}, {"w": True, "b": True})
  platipus = PlatipusParams(prior.mean, prior.log_std, prior.log_std, prior.mean, prior.mean)
  mask = log_std_mask(platipus)
  assert (
    jax.tree_util.tree_leaves(mask.log_std) + jax.tree_util.tree_leaves(mask.log_std_q)
    == [True] * 4
  )
  others = (mask.mean, mask.log_step_p, mask.log_step_q)  # the step sizes are no log-stds
  assert not any(jax.tree_util.tree_leaves(others))
  assert not any(jax.tree_util.tree_leaves(log_std_mask(prior.mean)))  # MAML: none


def test_weight_decay_with_zero_gradient_widens_the_log_stds_and_leaves_the_means():
  # With a zero meta-gradient the only gradient is the decay's lambda * rho: Adam's
  # first step moves each log-std by lr * g / (|g| + eps) toward 0, each mean by nothing.
  prior, lr, decay = _gaussian(), 1e-3, 1e-3
  optimizer = vj.meta_optimizer(
    lr, tasks_per_step=10, decay_rate=1.0, clip_norm=10.0, log_std_weight_decay=decay
  )
  zeros = jax.tree_util.tree_map(jnp.zeros_like, prior)
  updates, _ = optimizer.update(zeros, optimizer.init(prior), prior)
  after = vj.Gaussian(*jax.tree_util.tree_map(jnp.add, prior, updates))
  for rho, rho_after in zip(
    jax.tree_util.tree_leaves(prior.log_std), jax.tree_util.tree_leaves(after.log_std)
  ):
    gradient = decay * np.asarray(rho, np.float64)
    expected = np.asarray(rho, np.float64) - lr * gradient / (np.abs(gradient) + 1e-8)
    np.testing.assert_allclose(rho_after, expected, rtol=1e-6)
    assert np.all(np.asarray(rho_after) > np.asarray(rho))  # toward 0: a wider prior
  for mu, mu_after in zip(
    jax.tree_util.tree_leaves(prior.mean), jax.tree_util.tree_leaves(after.mean)
  ):
    np.testing.assert_array_equal(mu_after, mu)


@pytest.mark.parametrize("separately", [True, False])
def test_meta_optimizer_is_the_authors_torch_adam_step_by_step(separately):
  # Gradients whose means part is 2.5x the log-stds', both above the clip: separate and joint clipping
  # differ, and the decay is added after the clip (before it, the clip would shrink it).
  prior = _gaussian(1)
  keys = jax.random.split(jax.random.key(2), 8)
  gradients = [
    vj.Gaussian(
      jax.tree_util.tree_map(lambda x, k=k: 50.0 * jax.random.normal(k, x.shape), prior.mean),
      jax.tree_util.tree_map(
        lambda x, k=k: 20.0 * jax.random.normal(jax.random.fold_in(k, 1), x.shape), prior.log_std
      ),
    )
    for k in keys[:4]
  ]
  optimizer = vj.meta_optimizer(
    1e-2,
    tasks_per_step=10,
    decay_rate=1.0,
    clip_norm=10.0,
    clip_separately=separately,
    log_std_weight_decay=0.5,  # large, so that an error in its place shows
  )
  params, state = prior, optimizer.init(prior)
  for grad in gradients:
    updates, state = optimizer.update(grad, state, params)
    params = jax.tree_util.tree_map(jnp.add, params, updates)
  expected = _torch_adam_reference(
    prior, gradients, lr=1e-2, decay=0.5, clip_norm=10.0, separately=separately
  )
  for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
  # And the two clippings do differ here (the test could tell them apart).
  other = _torch_adam_reference(
    prior, gradients, lr=1e-2, decay=0.5, clip_norm=10.0, separately=not separately
  )
  assert (
    max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(other))
    )
    > 1e-3
  )


@pytest.mark.parametrize(
  "kwargs, argument",
  [
    ({"learning_rate": -1e-3}, "learning_rate"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"tasks_per_step": 0}, "tasks_per_step"),
    ({"tasks_per_step": 2.5}, "tasks_per_step"),
    ({"log_std_weight_decay": -1.0}, "log_std_weight_decay"),
    ({"clip_norm": 0.0}, "clip_norm"),
    ({"decay_rate": 1.5}, "decay_rate"),
  ],
)
def test_meta_optimizer_refuses_settings_outside_their_meaning(kwargs, argument):
  settings = dict(learning_rate=1e-3, tasks_per_step=10, **{})
  settings.update(kwargs)
  learning_rate = settings.pop("learning_rate")
  with pytest.raises(vj.InputError, match=f"meta_optimizer|meta_lr_schedule.*{argument}"):
    vj.meta_optimizer(learning_rate, **settings)


def test_tasks_per_step_is_stated_once_to_meta_optimizer():
  """`make_train_step` reads `tasks_per_step` from `meta_optimizer`: stated again it must agree,
  and it is required only with an optimizer not built by it."""
  from vampire_jax.data import sine_line

  apply_fn, params, _ = _small_regression()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), num_inner_steps=1, num_mc_query=2)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=4)
  assert isinstance(optimizer, optax.GradientTransformation) and optimizer.tasks_per_step == 4
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(0))

  def sample(data, task_keys):
    return sine_line.tasks_from_keys(task_keys)

  once = vj.make_train_step(learner, optimizer, sample)
  twice = vj.make_train_step(learner, optimizer, sample, tasks_per_step=4)
  (_, m_once), (_, m_twice) = (f(state, None, jax.random.key(3)) for f in (once, twice))
  assert float(m_once["loss"][0]) == float(m_twice["loss"][0])
  with pytest.raises(InputError, match="tasks_per_step=8 differs from the 4 tasks per step"):
    vj.make_train_step(learner, optimizer, sample, tasks_per_step=8)
  with pytest.raises(InputError, match="tasks_per_step is required with an optimizer not built"):
    vj.make_train_step(learner, optax.adam(1e-3), sample)
  assert vj.make_train_step(learner, optax.adam(1e-3), sample, tasks_per_step=4)


def test_a_wrapped_meta_optimizer_of_another_task_count_is_refused_by_make_train_step():
  """make_train_step of 8 tasks refuses optax.chain(vj.meta_optimizer(tasks_per_step=4)),
  whose schedule counts 4 (its decay would come twice as late), naming the count to give; the
  agreeing count trains as the bare optimizer does, to the bit."""
  wrapped = optax.chain(vj.meta_optimizer(1e-3, tasks_per_step=4, decay_every_tasks=8))
  with pytest.raises(InputError) as raised:
    _train_one_step(wrapped, 8)
  assert _one_line(raised).startswith(
    "make_train_step: tasks_per_step=8, but the optimizer's vj.meta_optimizer (bare or inside "
    "a wrapper such as optax.chain) counts 4 tasks per step"
  )
  assert "vj.meta_optimizer(..., tasks_per_step=8)" in str(raised.value)
  # The count that agrees trains as the bare optimizer does, to the bit.
  bare = vj.meta_optimizer(1e-3, tasks_per_step=4, decay_every_tasks=8)
  (wrapped_state, wrapped_metrics), (bare_state, bare_metrics) = (
    _train_one_step(o, 4) for o in (wrapped, bare)
  )
  assert float(wrapped_metrics["loss"][0]) == float(bare_metrics["loss"][0])
  for a, b in zip(
    jax.tree_util.tree_leaves(wrapped_state.meta_params),
    jax.tree_util.tree_leaves(bare_state.meta_params),
  ):
    np.testing.assert_array_equal(a, b)


def test_a_meta_optimizer_under_masked_or_after_another_transformation_is_refused_too():
  """The count is read through any wrapper: optax.chain after clipping, and optax.masked."""
  inner = vj.meta_optimizer(1e-3, tasks_per_step=2)
  for wrapped in (
    optax.chain(optax.clip(1.0), inner),
    optax.masked(inner, lambda tree: jax.tree_util.tree_map(lambda _: True, tree)),
  ):
    with pytest.raises(InputError, match="tasks_per_step=4, but .* counts 2 tasks per step"):
      _train_one_step(wrapped, 4)


def test_make_train_step_without_a_count_says_a_wrapper_hides_it():
  """Without tasks_per_step, a vj.meta_optimizer inside optax.chain is refused saying that
  the wrapper hides its count, not that the optimizer is not vj.meta_optimizer's."""
  learner, _ = _vampire_regression_learner()
  wrapped = optax.chain(vj.meta_optimizer(1e-3, tasks_per_step=4))
  with pytest.raises(InputError) as raised:
    vj.make_train_step(learner, wrapped, _sample)
  assert "a wrapper such as optax.chain hides its T" in _one_line(raised)


@pytest.mark.parametrize("wrap", [False, True], ids=["bare", "chained"])
def test_make_meta_step_refuses_a_task_batch_of_another_count_than_the_schedule(wrap):
  """make_meta_step refuses 8 tasks for a schedule counting 4, bare or wrapped; 4 tasks step."""
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=4)
  optimizer = optax.chain(optimizer) if wrap else optimizer
  with pytest.raises(InputError) as raised:
    _meta_step_on(optimizer, 8)
  assert _one_line(raised).startswith(
    "make_meta_step: the step was given 8 tasks (tasks' leading axis), but the optimizer's "
    "vj.meta_optimizer"
  )
  state, metrics = _meta_step_on(optimizer, 4)
  assert int(state.step) == 1 and bool(metrics["finite"])
