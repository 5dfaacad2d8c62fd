"""The algorithm registry and the library's defaults: stable at initialisation, by test."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from tests.helpers import _flat, _loss, _tiny_config
from vampire_jax._src.core import learners
from vampire_jax._src.core.errors import ConfigError
from vampire_jax.runs import algorithms


def _network(outputs=1):
  model = vj.MLP((8,), outputs)
  return vj.init_params(model, jax.random.key(0), (1, 1)), vj.pure_apply(model)


def _loss_and_grad(learner, prior):
  return jax.jit(jax.value_and_grad(lambda meta_params: _loss(learner, meta_params, 3)))(prior)


def _default(factory, name):
  return inspect.signature(factory).parameters[name].default


def test_vampire2_is_the_registrys_vampire2_with_the_authors_defaults():
  params, apply_fn = _network(outputs=3)
  nll = vj.categorical_nll  # main.py's default inner lr (0.01) is the classifier's default
  shortcut = vj.vampire2(apply_fn, nll, num_mc_train=2, num_mc_query=2)
  config = vj.RunConfig().replace(algorithm="vampire2", num_mc_train=2, num_mc_query=2)
  assert config.algorithm == vj.specs.Vampire2(num_mc_train=2, num_mc_query=2)
  registry = config.algorithm.learner(apply_fn, nll, algorithms.context(config))
  assert shortcut.settings._replace(loss_fn=None) == registry.settings._replace(loss_fn=None)
  assert shortcut.settings.kl_target == "standard_normal"
  assert (shortcut.settings.kl_weight, shortcut.settings.inner_lr) == (1e-6, 0.01)
  assert shortcut.settings.num_inner_steps == 5 and config.algorithm.first_order
  prior = shortcut.init(params, jax.random.key(1))
  registry_prior = registry.init(params, jax.random.key(1))  # U[-4, -3] log-stds, both
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), prior, registry_prior))
  log_stds = np.concatenate([np.ravel(x) for x in jax.tree.leaves(prior.log_std)])
  assert -4.0 <= log_stds.min() and log_stds.max() <= -3.0
  ours, theirs = _loss_and_grad(shortcut, prior), _loss_and_grad(registry, prior)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Its meta-loss is the query NLL plus the outer KL (weight: kl_weight) of the posterior.
  assert shortcut.meta_loss is not None


@pytest.mark.parametrize("factory", [vj.vampire, vj.baselines.abml])
def test_factory_defaults_keep_the_kl_step_factor_below_2(factory):
  model = vj.Conv4(num_classes=5, num_filters=8)
  learner = factory(vj.pure_apply(model), vj.categorical_nll)
  prior = learner.init(vj.init_params(model, jax.random.key(0), (1, 28, 28, 1)), jax.random.key(1))
  settings = learner.settings
  assert (settings.inner_lr, settings.kl_weight) == (
    learners.DEFAULT_INNER_LR,
    _default(factory, "kl_weight"),
  )
  factor = float(vj.kl_step_factor(prior, settings.inner_lr, settings.kl_weight))
  # At most e^8 * inner_lr * kl_weight with log-stds in [-4, -3]: 0.6 at the defaults.
  assert 0.3 < factor < 2.0, factor


def test_run_config_defaults_are_stable_too():
  config = vj.RunConfig()
  model = vj.MLP((4,), 5)
  settings = config.algorithm.learner(vj.pure_apply(model), vj.categorical_nll).settings
  assert config.algorithm.inner_lr is None  # the factory's default, which the learner resolves
  assert (settings.inner_lr, settings.kl_weight) == (
    learners.DEFAULT_INNER_LR,
    learners.DEFAULT_KL_WEIGHT,
  )
  assert settings.inner_lr * settings.kl_weight * np.exp(8) < 2.0
  # The paper's pair diverges: the warning's case.
  assert 0.1 * 0.1 * np.exp(8) > 2.0


@pytest.mark.parametrize("name", ["vampire", "abml", "platipus", "maml", "bmaml"])
def test_one_adaptation_at_the_defaults_does_not_blow_up(name):
  # The case: a small Conv4 on random 5-way images. With the paper's
  # inner lr 0.1 and KL weight 0.1, VAMPIRE's means moved by 5.8e4 and the
  # support NLL reached 4.7e7; at the defaults the NLL must stay near log 5.
  model = vj.Conv4(num_classes=5, num_filters=8)
  apply_fn, nll = vj.pure_apply(model), vj.categorical_nll
  factory = {
    "vampire": vj.vampire,
    "abml": vj.baselines.abml,
    "platipus": vj.baselines.platipus,
    "maml": vj.maml,
    "bmaml": vj.baselines.bmaml,
  }[name]
  learner = factory(apply_fn, nll)
  meta = learner.init(vj.init_params(model, jax.random.key(0), (1, 28, 28, 1)), jax.random.key(1))
  x = jax.random.uniform(jax.random.key(2), (5, 28, 28, 1))
  y = jnp.arange(5)
  task_params = jax.jit(learner.adapt)(meta, x, y, jax.random.key(3))
  outputs = learner.predict(task_params, x, jax.random.key(4))
  support_nll = float(jnp.mean(jax.vmap(nll, in_axes=(0, None))(outputs, y)))
  assert np.isfinite(support_nll) and support_nll < 3.0, support_nll


def test_paper_pair_is_the_unstable_case():
  model = vj.Conv4(num_classes=5, num_filters=8)
  learner = vj.vampire(vj.pure_apply(model), vj.categorical_nll, inner_lr=0.1, kl_weight=0.1)
  meta = learner.init(vj.init_params(model, jax.random.key(0), (1, 28, 28, 1)), jax.random.key(1))
  config = vj.RunConfig(algorithm=vj.specs.Vampire(inner_lr=0.1, kl_weight=0.1))
  assert algorithms.stability_factor(config, meta) > 10  # the runner warns
  # And it does blow up, where the defaults stay near log 5 (the test above).
  x, y = jax.random.uniform(jax.random.key(2), (5, 28, 28, 1)), jnp.arange(5)
  outputs = learner.predict(
    jax.jit(learner.adapt)(meta, x, y, jax.random.key(3)), x, jax.random.key(4)
  )
  assert float(jnp.mean(jax.vmap(vj.categorical_nll, in_axes=(0, None))(outputs, y))) > 1e3
  # PLATIPUS's KL is in its meta-loss only; MAML has none: no inner-loop limit.
  for other in ("platipus", "maml", "bmaml"):
    assert algorithms.stability_factor(config.replace(algorithm=other), meta) is None


def test_the_registry_builds_simpa_with_its_settings():
  config = vj.RunConfig(schedule=vj.Schedule(tasks_per_step=4)).replace(algorithm="simpa")
  assert config.algorithm.first_order is True  # Simpa.py: first order
  assert "kl_weight" not in config.algorithm.field_names()  # SImPa takes no KL weight
  config = config.replace(
    phi_lr=2e-4, meta_lr=3e-3, num_kl_samples=8, num_mc_train=1, num_mc_query=2
  )
  algorithms.check_config(config)
  model = vj.MLP((4,), 1)
  learner = algorithms.make_learner(model, "regression", 0.3, config)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  optimizer = algorithms.make_optimizer(config)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  grads = jax.tree_util.tree_map(jnp.ones_like, state.meta_params)
  updates, _ = optimizer.update(grads, state.opt_state, state.meta_params)
  np.testing.assert_allclose(_flat(updates.generator), -3e-3, rtol=1e-4)
  np.testing.assert_allclose(_flat(updates.phi), -2e-4, rtol=1e-4)
  assert learner.predict(state.meta_params, jnp.zeros((3, 1)), jax.random.key(2)).shape == (2, 3, 1)


def test_a_setting_with_no_effect_is_refused_before_anything_runs(tmp_path):
  """second_order_steps with first_order=True (every step is then first-order) is refused
  before the run folder is made, naming both fields; the command line names both flags."""
  config = _tiny_config().replace(first_order=True, second_order_steps=1)
  with pytest.raises(
    ConfigError, match=r"^second_order_steps 1 has no effect with first_order=True"
  ):
    regression.run_experiment(config, tmp_path / "run", progress=False)
  assert not (tmp_path / "run").exists()
