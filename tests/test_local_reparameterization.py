"""The local reparameterisation trick (`vj.local_reparameterization`, issue 30): each
example's outputs are distributed as under weight draws; the expected loss is the same."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core import adaptation


def _prior(hidden=(16, 16), log_std=(-1.5, -0.5), seed=0):
  model = vj.MLP(hidden, 1)
  params = vj.init_params(model, jax.random.key(seed), (1, 1))
  return model, vj.gaussian_from_params(params, jax.random.key(seed + 1), log_std)


def _weight_draws(model, dist, x, key, num):
  return vj.predict(dist, x, key, apply_fn=vj.pure_apply(model), num_mc_samples=num)


def test_one_layer_is_the_closed_form():
  # h = x W + b: mean x mu + m, variance x^2 s^2 + t^2, exactly.
  model, dist = _prior(hidden=())
  x = jnp.array([[-2.0], [0.5], [3.0]])
  draws = vj.local_reparameterization(dist, x, jax.random.key(2), 200_000)[..., 0]
  mean = (x @ dist.mean["Dense_0"]["kernel"] + dist.mean["Dense_0"]["bias"])[:, 0]
  var = (
    jnp.square(x) @ jnp.exp(2 * dist.log_std["Dense_0"]["kernel"])
    + jnp.exp(2 * dist.log_std["Dense_0"]["bias"])
  )[:, 0]
  np.testing.assert_allclose(draws.mean(0), mean, atol=4 * np.sqrt(var.max() / 200_000))
  np.testing.assert_allclose(draws.var(0), var, rtol=0.02)


def test_each_examples_outputs_are_distributed_as_under_weight_draws():
  # A 1-16-16-1 ReLU network with wide weights: the outputs are far from Gaussian, and
  # the marginal of each example (mean, spread, quantiles) must still match.
  model, dist = _prior()
  x = jnp.linspace(-4.0, 4.0, 5)[:, None]
  num = 40_000
  lrt = np.asarray(vj.local_reparameterization(dist, x, jax.random.key(3), num)[..., 0])
  weights = np.asarray(_weight_draws(model, dist, x, jax.random.key(4), num)[..., 0])
  spread = weights.std(0)
  assert spread.min() > 0.1  # a real spread to compare
  np.testing.assert_allclose(lrt.mean(0), weights.mean(0), atol=0.05 * spread.max())
  np.testing.assert_allclose(lrt.std(0), spread, rtol=0.05)
  levels = [0.1, 0.5, 0.9]
  np.testing.assert_allclose(
    np.quantile(lrt, levels, axis=0), np.quantile(weights, levels, axis=0), atol=0.06 * spread.max()
  )
  # What differs, by design: one weight draw ties the examples together; here they are
  # drawn independently.
  assert np.corrcoef(weights[:, 1], weights[:, 2])[0, 1] > 0.3
  assert abs(np.corrcoef(lrt[:, 1], lrt[:, 2])[0, 1]) < 0.03


def test_the_vfe_has_the_same_expectation():
  model, dist = _prior(log_std=(-2.0, -1.0))
  x = jax.random.uniform(jax.random.key(5), (5, 1), minval=-5, maxval=5)
  y = jnp.sin(x)
  nll = vj.gaussian_nll(0.3)
  loss_fn = vj.loss_from_apply(vj.pure_apply(model), nll)
  keys = jax.random.split(jax.random.key(6), 400)

  def estimate(key, local):
    return adaptation.expected_nll(
      dist,
      x,
      y,
      key,
      loss_fn=loss_fn,
      num_mc_samples=32,
      draw_outputs=vj.local_reparameterization if local else None,
      nll=nll if local else None,
    )

  weights = np.asarray(jax.jit(jax.vmap(lambda k: estimate(k, False)))(keys))
  local = np.asarray(jax.jit(jax.vmap(lambda k: estimate(k, True)))(keys))
  standard_error = np.hypot(weights.std(), local.std()) / np.sqrt(len(keys))
  assert abs(weights.mean() - local.mean()) < 4 * standard_error
  assert local.std() < weights.std()  # independent examples: less variance


def test_vampire_adapts_and_predicts_with_it():
  model, _ = _prior()
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  learner = vj.vampire(
    vj.pure_apply(model),
    vj.gaussian_nll(0.3),
    num_mc_train=8,
    num_mc_query=8,
    inner_lr=1e-3,
    kl_weight=0.1,
    draw_outputs=vj.local_reparameterization,
  )
  prior = learner.init(params, jax.random.key(1))
  x = jnp.linspace(-5, 5, 5)[:, None]
  posterior = learner.adapt(prior, x, jnp.sin(x), jax.random.key(2))
  assert jax.tree_util.tree_structure(posterior) == jax.tree_util.tree_structure(prior)
  assert learner.predict(posterior, x, jax.random.key(3)).shape == (8, 5, 1)


def test_a_network_that_is_no_mlp_is_refused():
  conv = vj.Conv4(num_classes=5, num_filters=4)
  params = vj.init_params(conv, jax.random.key(0), (1, 28, 28, 1))
  dist = vj.gaussian_from_params(params, jax.random.key(1))
  with pytest.raises(vj.InputError, match="local_reparameterization: dist must be a Gaussian"):
    vj.local_reparameterization(dist, jnp.zeros((2, 28, 28, 1)), jax.random.key(2), 2)


def _abml_and_task(draw_outputs, num_mc=8):
  model, _ = _prior()
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  learner = vj.baselines.abml(
    vj.pure_apply(model),
    vj.gaussian_nll(0.3),
    num_mc_train=num_mc,
    num_mc_query=num_mc,
    inner_lr=1e-3,
    kl_weight=0.1,
    log_std_init=(-2.0, -1.0),
    draw_outputs=draw_outputs,
  )
  x = jnp.linspace(-5.0, 5.0, 10)[:, None]
  task = vj.Task(x[:5], jnp.sin(x[:5]), x[5:], jnp.sin(x[5:]))
  return learner, learner.init(params, jax.random.key(1)), task


def test_abml_meta_loss_has_the_same_expectation_and_draws_examples_apart():
  # ABML with the trick (the authors2019 comparison's fast route): its meta-loss
  # (inner loop, support-and-query ELBO) estimates the same number as with weight draws,
  # and its query outputs come from the trick, each example drawn independently.
  keys = jax.random.split(jax.random.key(7), 300)
  estimates = {}
  for local in (False, True):
    learner, prior, task = _abml_and_task(vj.local_reparameterization if local else None)
    losses, outputs = jax.jit(jax.vmap(lambda k: learner.meta_loss(prior, task, k)))(keys)
    estimates[local] = np.asarray(losses)
    draws = np.asarray(outputs[:, :, :, 0]).reshape(-1, 5)  # [keys * draws, query points]
    correlation = np.corrcoef(draws[:, 1], draws[:, 2])[0, 1]
    assert (abs(correlation) < 0.1) if local else (correlation > 0.3)
  standard_error = np.hypot(estimates[False].std(), estimates[True].std()) / np.sqrt(len(keys))
  assert abs(estimates[False].mean() - estimates[True].mean()) < 4 * standard_error


@pytest.mark.parametrize("name", ["vampire", "abml"])
def test_a_config_asking_for_it_builds_a_learner_that_draws_examples_apart(name):
  # The spec's field reaches the learner (`draw_outputs`): its predictions for two
  # neighbouring points are uncorrelated, where one weight draw would tie them.
  from conftest import tiny_regression_config
  from vampire_jax.runs import algorithms

  assert "local_reparameterization" in vj.specs.get(name).field_names()
  config = tiny_regression_config(name, local_reparameterization=True)
  assert config.algorithm.local_reparameterization is True
  model, dist = _prior()
  learner = algorithms.make_learner(model, "regression", 0.3, config, num_mc=4000)
  draws = np.asarray(learner.predict(dist, jnp.array([[0.5], [0.6]]), jax.random.key(8)))
  assert abs(np.corrcoef(draws[:, 0, 0], draws[:, 1, 0])[0, 1]) < 0.1


def test_platipus_has_no_such_setting():
  """PLATIPUS draws weights, never pre-activations: its spec has no local_reparameterization,
  and asking for it is refused naming the specs that take it."""
  assert "local_reparameterization" not in vj.specs.Platipus.field_names()
  with pytest.raises(vj.ConfigError) as raised:
    vj.specs.Platipus(local_reparameterization=True)
  message = str(raised.value)
  assert "local_reparameterization" in message
  assert all(owner in message for owner in ("Vampire", "Abml")), message
