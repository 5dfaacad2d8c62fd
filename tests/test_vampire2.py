"""Vampire2 (the authors' 2021 VAMPIRE) as a setting of VAMPIRE's learner: closed forms (issue 51).

`vj.vampire(..., kl_target="standard_normal", outer_kl_weight=w)`: the inner loop's KL is to
N(0, I), and the adapted posterior's KL to it enters each task's meta-loss with weight w.
`tests/test_authors_pytorch_head.py` checks a meta-step against the authors' code itself.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core import gaussian
from vampire_jax.runs import algorithms


def _tiny_mlp():
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  return params, vj.pure_apply(model), vj.gaussian_nll(0.5)


def _task(key, shots=5, query=7):
  x = jax.random.uniform(key, (shots + query, 1), minval=-3.0, maxval=3.0)
  y = jnp.sin(x)
  return vj.Task(x[:shots], y[:shots], x[shots:], y[shots:])


def test_kl_to_the_standard_normal_is_its_closed_form():
  mean = {"w": jnp.array([[0.5, -1.0], [2.0, 0.0]]), "b": jnp.array([0.3])}
  log_std = {"w": jnp.array([[-1.0, 0.0], [0.5, -3.0]]), "b": jnp.array([0.2])}
  q = vj.Gaussian(mean, log_std)
  target = gaussian.standard_normal_like(q)
  assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree_util.tree_leaves(target))
  leaves = zip(jax.tree_util.tree_leaves(mean), jax.tree_util.tree_leaves(log_std))
  # KL(N(m, s^2) || N(0, 1)) = (m^2 + s^2 - 1) / 2 - log s, summed over the 5 weights.
  expected = sum(float(np.sum((np.square(m) + np.exp(2 * s) - 1) / 2 - s)) for m, s in leaves)
  np.testing.assert_allclose(float(vj.kl_divergence(q, target)), expected, rtol=1e-6)


def test_one_inner_step_adds_the_standard_normal_kl_gradient():
  # Same key, same draws: the step with the KL term minus the step without it is
  # -inner_lr * kl_weight * dKL/dq at q = prior: -(m) for the means, -(s^2 - 1) for the log-stds.
  params, apply_fn, nll = _tiny_mlp()
  prior = vj.gaussian_from_params(params, jax.random.key(1))
  task = _task(jax.random.key(2))
  inner_lr, kl_weight = 0.05, 0.3
  without = vj.vampire(apply_fn, nll, num_inner_steps=1, inner_lr=inner_lr, kl_weight=0.0)
  with_kl = vj.vampire(
    apply_fn,
    nll,
    num_inner_steps=1,
    inner_lr=inner_lr,
    kl_weight=kl_weight,
    kl_target="standard_normal",
  )
  key = jax.random.key(3)
  a = with_kl.adapt(prior, task.support_x, task.support_y, key)
  b = without.adapt(prior, task.support_x, task.support_y, key)
  step = inner_lr * kl_weight
  expected = vj.Gaussian(
    jax.tree_util.tree_map(lambda m: -step * m, prior.mean),
    jax.tree_util.tree_map(lambda s: -step * (jnp.exp(2 * s) - 1), prior.log_std),
  )
  difference = jax.tree_util.tree_map(lambda x, y: x - y, a, b)
  for got, want in zip(jax.tree_util.tree_leaves(difference), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(got, want, atol=2e-7)
  # VAMPIRE's own target, the prior, has no KL gradient at q = prior: no difference at all.
  prior_target = vj.vampire(
    apply_fn, nll, num_inner_steps=1, inner_lr=inner_lr, kl_weight=kl_weight
  ).adapt(prior, task.support_x, task.support_y, key)
  for got, want in zip(jax.tree_util.tree_leaves(prior_target), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(got, want, atol=1e-7)


@pytest.mark.parametrize("kl_target", ["standard_normal", "prior"])
def test_the_meta_loss_adds_the_posteriors_kl_to_the_query_nll(kl_target):
  params, apply_fn, nll = _tiny_mlp()
  outer = 0.7
  settings = dict(num_inner_steps=2, inner_lr=0.05, kl_weight=0.1, num_mc_query=3)
  learner = vj.vampire(apply_fn, nll, kl_target=kl_target, outer_kl_weight=outer, **settings)
  plain = vj.vampire(apply_fn, nll, kl_target=kl_target, **settings)
  assert learner.meta_loss is not None and plain.meta_loss is None
  prior = learner.init(params, jax.random.key(1))
  task, key = _task(jax.random.key(2)), jax.random.key(3)
  loss, outputs = vj.query_loss(learner, prior, task, key)
  query_nll, plain_outputs = vj.query_loss(plain, prior, task, key)  # the same draws
  np.testing.assert_array_equal(outputs, plain_outputs)
  adapt_key, _ = jax.random.split(key)  # as `adapt_to_task` splits a task's key
  posterior = learner.adapt(prior, task.support_x, task.support_y, adapt_key)
  target = gaussian.standard_normal_like(prior) if kl_target == "standard_normal" else prior
  expected = float(query_nll) + outer * float(vj.kl_divergence(posterior, target))
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)


def test_first_order_meta_gradient_of_the_outer_kl_is_its_gradient_at_the_posterior():
  # First order, d posterior / d prior = I: the outer term's meta-gradient is
  # outer * (m_q, s_q^2 - 1) at the adapted posterior, whatever the inner loop did.
  params, apply_fn, nll = _tiny_mlp()
  settings = dict(num_inner_steps=2, inner_lr=0.05, kl_weight=0.1, first_order=True)
  settings.update(kl_target="standard_normal")
  outer = 2.0
  with_outer = vj.vampire(apply_fn, nll, outer_kl_weight=outer, **settings)
  without = vj.vampire(apply_fn, nll, **settings)
  prior = with_outer.init(params, jax.random.key(1))
  task, key = _task(jax.random.key(2)), jax.random.key(3)

  def meta_grad(learner):
    return jax.grad(lambda p: vj.query_loss(learner, p, task, key)[0])(prior)

  difference = jax.tree_util.tree_map(lambda a, b: a - b, meta_grad(with_outer), meta_grad(without))
  posterior = with_outer.adapt(prior, task.support_x, task.support_y, jax.random.split(key)[0])
  expected = vj.Gaussian(
    jax.tree_util.tree_map(lambda m: outer * m, posterior.mean),
    jax.tree_util.tree_map(lambda s: outer * (jnp.exp(2 * s) - 1), posterior.log_std),
  )
  for got, want in zip(jax.tree_util.tree_leaves(difference), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
  "changes, says",
  [
    (
      dict(kl_target="zero"),
      r"vampire: kl_target must be one of prior, standard_normal, got 'zero'",
    ),
    (dict(outer_kl_weight=-1.0), r"vampire: outer_kl_weight must be a finite number >= 0"),
  ],
)
def test_bad_settings_are_refused_in_one_line(changes, says):
  _, apply_fn, nll = _tiny_mlp()
  with pytest.raises(vj.InputError, match=says) as raised:
    vj.vampire(apply_fn, nll, **changes)
  assert len(str(raised.value).splitlines()) == 1


def test_the_kl_step_factor_is_against_the_standard_normal():
  # The KL to N(0, I) steps with factor inner_lr * kl_weight (sigma 1), not / sigma_p^2.
  params, apply_fn, nll = _tiny_mlp()
  learner = vj.vampire(
    apply_fn, nll, inner_lr=0.1, kl_weight=0.5, kl_target="standard_normal", num_inner_steps=1
  )
  prior = learner.init(params, jax.random.key(1))
  report = vj.check_inner_loop(learner, prior, _task(jax.random.key(2)), jax.random.key(3))
  assert report.kl_factor == pytest.approx(0.05)
  vampire = vj.vampire(apply_fn, nll, inner_lr=0.1, kl_weight=0.5, num_inner_steps=1)
  report = vj.check_inner_loop(vampire, prior, _task(jax.random.key(2)), jax.random.key(3))
  assert report.kl_factor > 100  # against the prior's sigma_p ~ e^-3.5


def test_the_spec_builds_vampire2_with_the_authors_defaults():
  config = vj.RunConfig(algorithm=vj.specs.Vampire(kl_weight=0.02, first_order=False))
  config = config.replace(algorithm="vampire2", inner_lr=0.01)
  # main.py at d797d9d: --KL-weight 1e-6, --first-order; the outer weight is the same KL_weight.
  assert (
    config.algorithm.kl_weight,
    config.algorithm.first_order,
    config.algorithm.outer_kl_weight,
  ) == (1e-6, True, None)
  assert algorithms.stability_factor(config, None) == pytest.approx(0.01 * 1e-6)
  _, apply_fn, nll = _tiny_mlp()
  learner = config.algorithm.learner(apply_fn, nll, num_mc=2)
  assert learner.settings.kl_target == "standard_normal" and learner.meta_loss is not None
  # outer_kl_weight 0: no outer term (the meta-loss is VAMPIRE's); VAMPIRE has no such option.
  zero = config.replace(outer_kl_weight=0.0).algorithm.learner(apply_fn, nll, num_mc=2)
  assert zero.meta_loss is None
  with pytest.raises(vj.ConfigError, match=r"outer_kl_weight.*not a setting of vampire"):
    vj.RunConfig().replace(outer_kl_weight=0.5)
  with pytest.raises(vj.ConfigError, match=r"outer_kl_weight must be a finite number >= 0"):
    algorithms.check_config(config.replace(outer_kl_weight=-1.0))


def test_the_outer_weight_defaults_to_the_kl_weight():
  _, apply_fn, nll = _tiny_mlp()
  config = vj.RunConfig(algorithm=vj.specs.Vampire2(kl_weight=0.25))
  learner = config.algorithm.learner(apply_fn, nll)
  halved = config.replace(outer_kl_weight=0.125).algorithm.learner(apply_fn, nll)
  params, _, _ = _tiny_mlp()
  prior = learner.init(params, jax.random.key(1))
  task, key = _task(jax.random.key(2)), jax.random.key(3)
  full, _ = learner.meta_loss(prior, task, key)
  half, _ = halved.meta_loss(prior, task, key)
  posterior = learner.adapt(prior, task.support_x, task.support_y, jax.random.split(key)[0])
  kl = float(vj.kl_divergence(posterior, gaussian.standard_normal_like(prior)))
  np.testing.assert_allclose(float(full) - float(half), 0.125 * kl, rtol=1e-4)
