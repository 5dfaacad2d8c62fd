import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from tests.helpers import REGRESSION_MLP
from vampire_jax._src.core.errors import InputError
from vampire_jax.data import sine_line

BAD_LABELS = jnp.array([0, 1, 2, 3, 5])  # label 5 of a 5-way task


def _regression_setup():
  apply_fn = vj.pure_apply(REGRESSION_MLP)
  params = vj.init_params(REGRESSION_MLP, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


WAYS = 5


CLASSIFIER = vj.MLP((8,), WAYS)


CLASSIFIER_PARAMS = vj.init_params(CLASSIFIER, jax.random.key(0), (1, 3))


CLASSIFIER_LOSS = vj.loss_from_apply(vj.pure_apply(CLASSIFIER), vj.categorical_nll)


X_FEATURES = jax.random.normal(jax.random.key(2), (WAYS, 3))


LABELS = jnp.arange(WAYS)


def _prior(params=CLASSIFIER_PARAMS):
  return vj.gaussian_from_params(params, jax.random.key(1))


def _adapt(prior=None, x=X_FEATURES, y=LABELS, key=None, loss_fn=CLASSIFIER_LOSS, **settings):
  settings = {"num_steps": 2, "inner_lr": 0.1, **settings}
  return vj.adapt(
    _prior() if prior is None else prior,
    x,
    y,
    jax.random.key(3) if key is None else key,
    loss_fn=loss_fn,
    **settings,
  )


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


@pytest.mark.parametrize("noise_std", [0.1, 0.3, 1.0])
@pytest.mark.parametrize("factory", ["vampire", "maml", "abml", "platipus"])
def test_factory_defaults_stay_finite_and_learn_for_gaussian_likelihoods(factory, noise_std):
  apply_fn, params, task = _regression_setup()
  make = getattr(vj, factory, None) or getattr(vj.baselines, factory)
  learner = make(apply_fn, vj.gaussian_nll(noise_std))
  report = vj.check_inner_loop(
    learner, learner.init(params, jax.random.key(1)), task, jax.random.key(2)
  )
  assert report.ok, report
  assert report.loss_after < 0.5 * report.loss_before  # the inner loop learns, not just survives


def test_the_default_inner_lr_follows_the_likelihoods_curvature():
  assert vj.gaussian_nll(0.1).default_inner_lr == pytest.approx(5e-5)
  assert vj.gaussian_nll(10.0).default_inner_lr == 0.1
  apply_fn, _, _ = _regression_setup()
  assert vj.vampire(apply_fn, vj.categorical_nll).settings.inner_lr == 0.01
  assert vj.maml(apply_fn, vj.categorical_nll).settings.inner_lr == 0.1
  assert vj.maml(apply_fn, vj.gaussian_nll(0.3)).settings.inner_lr == pytest.approx(4.5e-4)
  assert vj.maml(apply_fn, vj.gaussian_nll(0.3), inner_lr=0.2).settings.inner_lr == 0.2


def test_distribution_nll_takes_any_distrax_distribution():
  outputs = jax.random.normal(jax.random.key(0), (6, 1))
  targets = jax.random.normal(jax.random.key(1), (6, 1))
  normal = vj.distribution_nll(lambda out: distrax.Normal(out, 0.3))
  np.testing.assert_allclose(
    normal(outputs, targets), vj.gaussian_nll(0.3)(outputs, targets), rtol=1e-6
  )
  laplace = vj.distribution_nll(lambda out: distrax.Laplace(out, 0.3))
  expected = np.mean(np.abs(targets - outputs) / 0.3 + np.log(2 * 0.3))
  np.testing.assert_allclose(laplace(outputs, targets), expected, rtol=1e-5)
  with pytest.raises(InputError, match="distribution_nll: targets must be shaped like"):
    laplace(outputs, targets[:, 0])


def test_traced_out_of_range_labels_give_nan_and_the_finite_flag_catches_them():
  for labels in (jnp.array([-1, 0]), jnp.array([WAYS, 0])):
    assert np.isnan(jax.jit(vj.categorical_nll)(jnp.zeros((2, WAYS)), labels))
  posterior = jax.jit(lambda y: _adapt(y=y))(BAD_LABELS)
  assert np.all(np.isnan(np.asarray(posterior.mean["Dense_0"]["kernel"])))

  learner = vj.maml(vj.pure_apply(CLASSIFIER), vj.categorical_nll, num_inner_steps=1)
  optimizer = optax.adam(1e-3)
  state = vj.init_meta_state(learner, optimizer, CLASSIFIER_PARAMS, jax.random.key(0))

  def sample_tasks(labels, task_keys):
    n = len(task_keys)
    xs = jax.vmap(lambda k: jax.random.normal(k, (WAYS, 3)))(task_keys)
    ys = jnp.broadcast_to(labels, (n, WAYS))
    return vj.Task(xs, ys, xs, ys)

  step = jax.jit(vj.make_train_step(learner, optimizer, sample_tasks, tasks_per_step=2))
  _, good = step(state, LABELS, jax.random.key(1))
  _, bad = step(state, BAD_LABELS, jax.random.key(1))
  assert bool(good["finite"][0]) and not bool(bad["finite"][0])


def test_gaussian_nll_refuses_a_noise_std_given_as_a_string():
  """gaussian_nll refuses a noise_std given as a string, naming the argument and the value."""
  with pytest.raises(InputError) as raised:
    vj.gaussian_nll("0.3")
  message = _one_line(raised)
  assert message.startswith("gaussian_nll: noise_std ")  # the function and the argument
  assert "must be a number, not a string" in message and "got '0.3'" in message
