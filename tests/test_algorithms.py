"""The algorithm registry and the library's defaults: stable at initialisation, by test."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax.runs import algorithms
from vampire_jax._src.core import learners


def _default(factory, name):
  return inspect.signature(factory).parameters[name].default


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


def test_each_spec_builds_its_algorithm_with_its_own_settings():
  assert set(vj.specs.SPECS) == {
    "vampire",
    "maml",
    "fomaml",
    "platipus",
    "bmaml",
    "abml",
    "vampire2",
    "protonet",
    "simpa",
  }
  maml = vj.RunConfig(algorithm=vj.specs.Vampire(kl_weight=0.5)).replace(algorithm="maml")
  assert not hasattr(maml.algorithm, "kl_weight") and maml.algorithm.test_draws is None
  abml = vj.RunConfig(algorithm=vj.specs.Vampire(kl_weight=0.5)).replace(algorithm="abml")
  assert abml.algorithm.kl_weight == 0.5  # a setting the two share is carried over
  model = vj.MLP((4,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  config = vj.RunConfig(algorithm=vj.specs.Bmaml(num_particles=3, meta_objective="mean_nll"))
  bmaml = algorithms.make_learner(model, "regression", 0.3, config)
  particles = bmaml.init(params, jax.random.key(1))
  assert jax.tree_util.tree_leaves(particles)[0].shape[0] == 3  # num_particles reached BMAML
  with pytest.raises(vj.ConfigError, match="is unknown"):
    vj.specs.get("reptile")
