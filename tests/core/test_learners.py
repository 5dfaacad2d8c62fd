"""Vampire2 (the authors' 2021 VAMPIRE) as a setting of VAMPIRE's learner: closed forms (issue 51).

`vj.vampire(..., kl_target="standard_normal", outer_kl_weight=w)`: the inner loop's KL is to
N(0, I), and the adapted posterior's KL to it enters each task's meta-loss with weight w.
`tests/benchmark_scripts/test_authors_pytorch_head.py` checks a meta-step against the authors' code itself.
"""

import doctest

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import NLL, _loss, _max_abs_difference, _tiny_hidden_mlp
from vampire_jax._src.core import gaussian
from vampire_jax._src.core.errors import InputError

APPLY = vj.pure_apply(vj.MLP((4,), 1))


def _tiny_mlp():
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  return params, vj.pure_apply(model), vj.gaussian_nll(0.5)


def _task(key, shots=5, query=7):
  x = jax.random.uniform(key, (shots + query, 1), minval=-3.0, maxval=3.0)
  y = jnp.sin(x)
  return vj.Task(x[:shots], y[:shots], x[shots:], y[shots:])


def _network(outputs=1):
  model = vj.MLP((8,), outputs)
  return vj.init_params(model, jax.random.key(0), (1, 1)), vj.pure_apply(model)


def _sine_tasks(key, num_tasks, shots=5, query=10, dtype=jnp.float32):
  k_amp, k_phase, k_x = jax.random.split(key, 3)
  amp = jax.random.uniform(k_amp, (num_tasks, 1, 1), dtype, minval=0.5, maxval=3.0)
  phase = jax.random.uniform(k_phase, (num_tasks, 1, 1), dtype, maxval=jnp.pi)
  x = jax.random.uniform(k_x, (num_tasks, shots + query, 1), dtype, minval=-5.0, maxval=5.0)
  y = amp * jnp.sin(x + phase)
  return vj.Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


def _one_task(key, dtype=jnp.float32):
  return jax.tree_util.tree_map(lambda a: a[0], _sine_tasks(key, 1, dtype=dtype))


@pytest.mark.parametrize("value", ["prior", "standard_normal"])
def test_vampire2_refuses_a_kl_target(value):
  """vj.vampire2 refuses `kl_target` in one line: its target is N(0, I) by definition, and
  vj.vampire takes kl_target="prior"."""
  with pytest.raises(InputError) as raised:
    vj.vampire2(APPLY, NLL, kl_target=value)
  message = str(raised.value)
  assert "\n" not in message
  assert "vampire2" in message and "kl_target" in message and repr(value) in message, message
  assert "N(0, I)" in message and "vj.vampire" in message and "'prior'" in message, message


def test_vampire2_refuses_an_unknown_option_naming_the_options():
  """vj.vampire2 refuses a keyword it does not take in one line naming it and those it takes."""
  with pytest.raises(TypeError) as raised:
    vj.vampire2(APPLY, NLL, unroll_step=True)
  message = str(raised.value)
  assert "vampire2" in message and "'unroll_step'" in message, message
  for option in ("sample_batching", "unroll_steps", "remat", "backtracking", "draw_outputs"):
    assert option in message, message


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


def test_the_outer_weight_is_the_kl_weight_unless_given():
  params, apply_fn = _network()
  nll = vj.gaussian_nll(0.5)
  prior = vj.vampire2(apply_fn, nll).init(params, jax.random.key(1))
  same = vj.vampire2(apply_fn, nll, kl_weight=0.25)
  spelled = vj.vampire2(apply_fn, nll, kl_weight=0.25, outer_kl_weight=0.25)
  halved = vj.vampire2(apply_fn, nll, kl_weight=0.25, outer_kl_weight=0.125)
  losses = [
    float(jax.jit(_loss, static_argnums=0)(learner, prior)) for learner in (same, spelled, halved)
  ]
  assert losses[0] == losses[1] > losses[2]


def test_its_example_runs():
  finder = doctest.DocTestFinder(recurse=False)
  (test,) = finder.find(vj.vampire2, "vampire2", globs={"jax": jax, "jnp": jnp, "vj": vj})
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
  runner.run(test)
  assert test.examples and runner.failures == 0


def test_fomaml_meta_gradient_is_the_query_gradient_at_the_adapted_weights():
  with jax.enable_x64(True):
    params, apply_fn, nll, loss_fn = _tiny_hidden_mlp(jnp.float64)
    task = _one_task(jax.random.key(4), jnp.float64)

    @jax.jit
    def gradients(params):
      def meta_gradient(first_order):
        learner = vj.maml(apply_fn, nll, num_inner_steps=2, inner_lr=0.1, first_order=first_order)
        return jax.grad(lambda p: vj.query_loss(learner, p, task, jax.random.key(0))[0])(params)

      adapted = vj.maml_adapt(
        params, task.support_x, task.support_y, loss_fn=loss_fn, num_steps=2, inner_lr=0.1
      )
      return (
        meta_gradient(True),
        meta_gradient(False),
        jax.grad(loss_fn)(adapted, task.query_x, task.query_y),
      )

    first, second, query_gradient = gradients(params)
    # The inner update is a constant: d adapted / d params = I.
    chex.assert_trees_all_close(first, query_gradient, atol=1e-10)
    assert _max_abs_difference(first, second) > 1e-3, (
      "second-order terms should change the meta-gradient"
    )


@pytest.mark.parametrize(
  "second_order_steps, first_order", [(None, False), (1, False), (None, True)]
)
def test_draws_in_a_loop_give_the_vmapped_draws_meta_gradient(second_order_steps, first_order):
  """VAMPIRE's meta-gradient with its draws in a loop ('map', 'remat_map': each draw's
  gradient taken as it runs on the query set, `batching.map_mean`) against the draws
  vmapped, fully second order, at the authors' truncation and first order, with and
  without the outer KL: the same to float64 rounding."""
  with jax.enable_x64(True):
    model = vj.MLP((8,), 1)
    params = jax.tree.map(
      lambda p: p.astype(jnp.float64), vj.init_params(model, jax.random.key(0), (1, 1))
    )
    x = jnp.linspace(-2.0, 2.0, 12, dtype=jnp.float64)[:, None]
    task = vj.Task(x[:4], jnp.sin(x[:4]), x[4:], jnp.sin(x[4:]))
    for outer_kl_weight in (0.0, 0.3):
      gradients = {}
      for draws in ("vmap", "map", "remat_map"):
        learner = vj.vampire(
          vj.pure_apply(model),
          vj.gaussian_nll(0.3),
          num_inner_steps=2,
          num_mc_train=3,
          num_mc_query=4,
          sample_batching=draws,
          second_order_steps=second_order_steps,
          first_order=first_order,
          outer_kl_weight=outer_kl_weight,
        )
        meta_params = learner.init(params, jax.random.key(1))
        loss = lambda m: vj.query_loss(learner, m, task, jax.random.key(2))[0]  # noqa: B023, E731
        gradients[draws] = jax.value_and_grad(loss)(meta_params)
      reference = gradients.pop("vmap")
      assert (
        _max_abs_difference(reference[1].mean, jax.tree.map(jnp.zeros_like, reference[1].mean))
        > 1e-2
      )
      for draws, gradient in gradients.items():
        chex.assert_trees_all_close(
          gradient, reference, atol=1e-12, rtol=1e-12, custom_message=draws
        )
