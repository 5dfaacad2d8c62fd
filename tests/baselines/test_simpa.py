"""SImPa (`vj.baselines.simpa`): its pieces against closed forms and hand computations.

Its equality with the authors' `Simpa.py` (PyTorch) is `tests/benchmark_scripts/test_authors_pytorch_simpa.py`
(skipped without torch); here, without torch: the generator is one dense layer over all
the base weights, the KL estimate and the hyper-prior are `Simpa.py`'s formulas (checked
against NumPy on flat vectors, as the authors compute them), the bound terms, the clip,
one inner step by hand, the first-order meta-gradient, the skipped task, the two Adams,
and the refusals.
"""

import argparse
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli
from tests.helpers import _flat, _simpa_task, simpa_module
from vampire_jax.baselines import _simpa_networks as networks
from vampire_jax.data import sine_line
from vampire_jax.runs import algorithms
from vampire_jax.runs.experiment_configs import RegressionConfig

NOISE_STD = 0.3


def _tiny(**settings):
  model = vj.MLP((6,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  options = dict(tasks_per_step=2, num_inner_steps=2, inner_lr=0.01, num_kl_samples=16)
  learner = vj.baselines.simpa(
    vj.pure_apply(model), vj.gaussian_nll(NOISE_STD), **{**options, **settings}
  )
  return learner, learner.init(params, jax.random.key(1)), params


def _task_terms_at(learner, adapted, task, key):
  """The meta-loss's task terms at fixed adapted parameters, with `meta_loss`'s keys."""
  _, predict_key, phi_key, bound_key = jax.random.split(key, 4)
  kl_phi = networks.kl_lower_bound(adapted.generator, adapted.phi, phi_key, 16)
  outputs = learner.predict(adapted, task.query_x, predict_key)
  query = jnp.mean(jax.vmap(learner.nll, in_axes=(0, None))(outputs, task.query_y))
  kl = networks.kl_lower_bound(adapted.generator, adapted.phi, bound_key, 16)
  return -kl_phi + simpa_module.clipped_in_value(query) + simpa_module.bound_term(kl, 10, 0.1)[0]


def test_the_bound_term_and_where_it_is_skipped():
  value, defined = simpa_module.bound_term(jnp.float32(-12.0), 5, 0.1)
  expected = math.sqrt((-12.0 + math.log(5) / 0.1) / 8)
  np.testing.assert_allclose(float(value), expected, rtol=1e-6)
  assert bool(defined)
  np.testing.assert_allclose(
    float(jax.grad(lambda kl: simpa_module.bound_term(kl, 5, 0.1)[0])(jnp.float32(-12.0))),
    1 / (2 * expected * 8),
    rtol=1e-5,
  )
  for kl in (-20.0, jnp.nan):  # a negative argument, and NaN: 0, with a gradient of 0
    value, defined = simpa_module.bound_term(jnp.float32(kl), 5, 0.1)
    gradient = jax.grad(lambda k: simpa_module.bound_term(k, 5, 0.1)[0])(jnp.float32(kl))
    assert (float(value), bool(defined), float(gradient)) == (0.0, False, 0.0)


def test_the_query_loss_is_clipped_in_value_not_in_gradient():
  clipped = simpa_module.clipped_in_value
  assert float(clipped(jnp.float32(3.0))) == 1.0
  assert float(clipped(jnp.float32(0.25))) == 0.25
  assert float(jax.grad(lambda x: clipped(x**2))(jnp.float32(3.0))) == 6.0


def test_one_inner_step_by_hand():
  learner, meta_params, _ = _tiny(num_inner_steps=1, num_mc_train=3)
  task, key = _simpa_task(), jax.random.key(5)
  adapted = learner.adapt(meta_params, task.support_x, task.support_y, key)
  draws_key, phi_key, bound_key = jax.random.split(jax.random.split(key, 1)[0], 3)
  loss_fn = vj.loss_from_apply(vj.pure_apply(vj.MLP((6,), 1)), vj.gaussian_nll(NOISE_STD))

  def support_nll(generator):
    latents = networks.draw_latents(draws_key, 3, networks.LATENT_DIM)
    weights = networks.generate(generator, latents)
    return jnp.mean(
      jax.vmap(loss_fn, in_axes=(0, None, None))(weights, task.support_x, task.support_y)
    )

  generator, phi = meta_params
  phi_grad = jax.grad(lambda p: networks.kl_lower_bound(generator, p, phi_key, 16))(phi)
  phi = jax.tree_util.tree_map(lambda p, g: p + 5e-4 * g, phi, phi_grad)

  def bound(g):
    return simpa_module.bound_term(networks.kl_lower_bound(g, phi, bound_key, 16), 5, 0.1)[0]

  nll_grad, bound_grad = jax.grad(support_nll)(generator), jax.grad(bound)(generator)
  assert float(bound(generator)) > 0  # defined, so its gradient counts
  expected = jax.tree_util.tree_map(
    lambda w, a, b: w - 0.01 * (a / 3 + b), generator, nll_grad, bound_grad
  )
  for ours, theirs in ((adapted.generator, expected), (adapted.phi, phi)):
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert float(jnp.max(jnp.abs(_flat(adapted.generator) - _flat(generator)))) > 1e-6


def test_first_order_meta_gradient_is_the_gradient_at_the_adapted_parameters():
  """First order, the adapted networks move by constants: d(adapted)/d(meta) = I."""
  task, key = _simpa_task(), jax.random.key(6)
  for first_order in (True, False):
    # inner_lr 1e-3: at 1e-2 two steps saturate tanh, every draw is the same network and
    # the batch norm's variance is 0 (the task is then skipped, as Simpa.py's).
    learner, meta_params, _ = _tiny(first_order=first_order, inner_lr=1e-3)
    ours = jax.grad(lambda m: learner.meta_loss(m, task, key)[0])(meta_params)
    adapted = learner.adapt(
      meta_params, task.support_x, task.support_y, jax.random.split(key, 4)[0]
    )
    assert np.isfinite(float(_task_terms_at(learner, adapted, task, key)))
    at_adapted = jax.grad(lambda a: _task_terms_at(learner, a, task, key))(adapted)
    hyper = jax.grad(lambda g: simpa_module.hyper_prior_term(g, 2, 0.1))(meta_params.generator)
    expected = vj.baselines.SimpaParams(
      jax.tree_util.tree_map(jnp.add, at_adapted.generator, hyper), at_adapted.phi
    )
    # Relative to the largest entry: the biases before a batch norm have a gradient of 0
    # in exact arithmetic, float32 noise here, so no leaf is compared with its own size.
    scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree_util.tree_leaves(expected))
    difference = max(
      float(jnp.max(jnp.abs(a - b))) / scale
      for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(expected))
    )
    if first_order:
      assert difference < 1e-5
    else:  # second order: the inner NLL's Hessian enters the generator's gradient
      assert difference > 1e-3
    # The PHI network moves by constants either way.
    # (float32 rounding, amplified by the batch norm at eps 0: 1e-3 of the largest entry.)
    phi_scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree_util.tree_leaves(at_adapted.phi))
    for a, b in zip(jax.tree_util.tree_leaves(ours.phi), jax.tree_util.tree_leaves(at_adapted.phi)):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-3 * phi_scale)


def test_a_task_whose_phi_loss_is_nan_is_skipped_and_no_nan_reaches_the_gradient():
  """Simpa.py skips the task (`continue`); a plain `where` would give NaN gradients (0 x NaN)."""
  learner, meta_params, _ = _tiny()
  broken_phi = meta_params.phi._replace(
    output=networks.Dense(
      jnp.full_like(meta_params.phi.output.kernel, jnp.nan), meta_params.phi.output.bias
    )
  )
  broken = meta_params._replace(phi=broken_phi)
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(7), 2))
  keys = jax.random.split(jax.random.key(8), 2)
  grads, metrics = jax.jit(vj.make_meta_gradient(learner))(broken, tasks, keys)
  hyper = simpa_module.hyper_prior_term(meta_params.generator, 2, 0.1)
  hyper_grad = jax.grad(lambda g: simpa_module.hyper_prior_term(g, 2, 0.1))(meta_params.generator)
  np.testing.assert_allclose(float(metrics["loss"]), float(hyper), rtol=1e-6)
  for a, b in zip(
    jax.tree_util.tree_leaves(grads.generator), jax.tree_util.tree_leaves(hyper_grad)
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)  # jitted against eager: rounding
  assert all(not np.any(leaf) for leaf in jax.tree_util.tree_leaves(grads.phi))


def test_a_nan_query_loss_is_reported_not_skipped():
  learner, meta_params, _ = _tiny()
  generator = meta_params.generator
  broken = meta_params._replace(
    generator=generator._replace(
      output_bias=jax.tree_util.tree_map(lambda b: jnp.full_like(b, jnp.nan), generator.output_bias)
    )
  )
  loss, _ = learner.meta_loss(broken, _simpa_task(), jax.random.key(9))
  assert np.isnan(float(loss))


def test_the_optimizer_steps_each_network_with_its_own_adam_and_clip():
  _, meta_params, _ = _tiny()
  optimizer = vj.baselines.simpa_optimizer(1e-3, tasks_per_step=2, clip_norm=10.0)
  state = optimizer.init(meta_params)
  grads = jax.tree_util.tree_map(lambda leaf: jnp.full_like(leaf, 0.5), meta_params)
  grads = grads._replace(phi=jax.tree_util.tree_map(lambda leaf: 1e6 * leaf, grads.phi))
  updates, _ = optimizer.update(grads, state, meta_params)
  for part, rate in (("generator", 1e-3), ("phi", 1e-4)):
    alone = vj.meta_optimizer(rate, tasks_per_step=2, clip_norm=10.0)
    expected, _ = alone.update(
      getattr(grads, part), alone.init(getattr(meta_params, part)), getattr(meta_params, part)
    )
    for a, b in zip(
      jax.tree_util.tree_leaves(getattr(updates, part)), jax.tree_util.tree_leaves(expected)
    ):
      np.testing.assert_allclose(a, b, rtol=1e-6)
    # Adam's first step is -rate * sign(g): each network at its own rate, the PHI
    # network's huge gradient clipped apart from the generator's.
    np.testing.assert_allclose(_flat(getattr(updates, part)), -rate, rtol=1e-4)
  assert optimizer.tasks_per_step == 2


@pytest.mark.parametrize(
  "settings, message",
  [
    (dict(tasks_per_step=1), r"simpa: tasks_per_step must be at least 2 \(the hyper-prior"),
    (dict(num_kl_samples=1), r"simpa: num_kl_samples must be an integer >= 2"),
    (dict(epsilon=0.0), r"simpa: epsilon must be"),
    (dict(phi_inner_lr=float("nan")), r"simpa: phi_inner_lr must be"),
  ],
)
def test_the_factory_refuses_in_one_line(settings, message):
  with pytest.raises(vj.InputError, match=message) as raised:
    _tiny(**settings)
  assert len(str(raised.value).splitlines()) == 1


def test_one_support_target_is_refused_in_one_line():
  learner, meta_params, _ = _tiny()
  task = _simpa_task()
  with pytest.raises(vj.InputError, match=r"simpa.adapt: support_y has 1 target") as raised:
    learner.adapt(meta_params, task.support_x[:1], task.support_y[:1], jax.random.key(0))
  assert len(str(raised.value).splitlines()) == 1


@pytest.mark.parametrize(
  "algorithm, changes, refused, owner",
  [
    ("simpa", dict(kl_weight=0.5), "kl_weight is not a setting of simpa (Simpa", "Vampire"),
    ("simpa", dict(log_std_init=(-5.0, -4.0)), "log_std_init is not a setting of simpa", "Abml"),
    ("simpa", dict(second_order_steps=1), "second_order_steps is not a setting of simpa", "Maml"),
    ("vampire", dict(phi_lr=1e-3), "phi_lr is not a setting of vampire (Vampire", "Simpa"),
    ("maml", dict(num_kl_samples=64), "num_kl_samples is not a setting of maml (Maml", "Simpa"),
  ],
)
def test_options_simpa_does_not_take_or_only_simpa_takes_are_refused_at_construction(
  algorithm, changes, refused, owner
):
  """An option of another algorithm is no field of the spec: giving it is refused in one
  line naming the option, the spec and an algorithm that takes it; the command line says
  it in a note, by its flag, and does not apply it."""
  config = vj.RunConfig().replace(algorithm=algorithm)
  with pytest.raises(vj.ConfigError) as raised:
    config.replace(**changes)
  message = str(raised.value)
  assert refused in message and re.search(rf"it is an option of .*\b{owner}\b", message), message
  assert len(message.splitlines()) == 1
  (name, value), notes = next(iter(changes.items())), []
  applied = cli.apply_overrides(config, argparse.Namespace(**changes), print_fn=notes.append)
  assert applied == config
  (note,) = notes
  assert note.startswith(f"note: --algorithm {algorithm} ignores {cli.flag(name)} {value!r} (an ")
  assert note.endswith("; not applied") and owner.lower() in note


@pytest.mark.parametrize(
  "config, changes, message, flag_message",
  [
    (
      vj.RunConfig(algorithm="simpa"),
      dict(tasks_per_step=1),
      r"tasks_per_step 1: SImPa's hyper-prior term divides by 2 \(T - 1\); use 2 or more",
      "--tasks-per-step 1: SImPa's hyper-prior term divides",
    ),
    (
      vj.RunConfig(algorithm="simpa"),
      dict(num_kl_samples=1),
      r"num_kl_samples must be an integer >= 2, got 1",
      "--simpa-kl-samples must be an integer >= 2",
    ),
    (
      vj.RunConfig(algorithm="simpa"),
      dict(epsilon=0.0),
      r"epsilon must be a finite number > 0, got 0.0",
      "--simpa-epsilon must be a finite number > 0",
    ),
    (
      RegressionConfig(algorithm="simpa"),
      dict(kernel_init_gain=1.0),
      r"kernel_init_gain 1.0 has no effect with simpa: its weights come from the generator",
      "--kernel-init-gain 1.0 has no effect with simpa",
    ),
  ],
  ids=["tasks_per_step", "num_kl_samples", "epsilon", "kernel_init_gain"],
)
def test_settings_simpa_cannot_use_are_refused_in_one_line(config, changes, message, flag_message):
  """A value SImPa cannot use is refused by `validate`, naming the field and the value (and
  what it must be); the command line says it by the flag."""
  with pytest.raises(vj.ConfigError, match=message) as raised:
    algorithms.check_config(config.replace(**changes))
  assert len(str(raised.value).splitlines()) == 1
  assert raised.value.fields[0] == next(iter(changes))
  assert flag_message in str(cli.as_flags(raised.value))
