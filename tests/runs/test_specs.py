"""The algorithms' specs (`vj.specs`): each holds its factory's arguments with the factory's
defaults, builds the factory's learner, and refuses another algorithm's option."""

import dataclasses
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import _tiny_config
from vampire_jax._src.core import gaussian
from vampire_jax._src.core.errors import ConfigError
from vampire_jax.runs import algorithms, specs


def _tiny_mlp():
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  return params, vj.pure_apply(model), vj.gaussian_nll(0.5)


def _task(key, shots=5, query=7):
  x = jax.random.uniform(key, (shots + query, 1), minval=-3.0, maxval=3.0)
  y = jnp.sin(x)
  return vj.Task(x[:shots], y[:shots], x[shots:], y[shots:])


def _prior(hidden=(16, 16), log_std=(-1.5, -0.5), seed=0):
  model = vj.MLP(hidden, 1)
  params = vj.init_params(model, jax.random.key(seed), (1, 1))
  return model, vj.gaussian_from_params(params, jax.random.key(seed + 1), log_std)


OTHER_ALGORITHMS_OPTIONS = {  # an algorithm, an option it does not take -> who takes it
  "--algorithm maml --kl-weight 0.5": ("maml", dict(kl_weight=0.5), "Maml", "Vampire"),
  "--algorithm bmaml --log-std-init -5 -4": (
    "bmaml",
    dict(log_std_init=(-5.0, -4.0)),
    "Bmaml",
    "Vampire",
  ),
  "--algorithm vampire --num-particles 4": ("vampire", dict(num_particles=4), "Vampire", "Bmaml"),
  "--algorithm platipus --second-order-steps 1": (
    "platipus",
    dict(second_order_steps=1),
    "Platipus",
    "Maml",
  ),
}


# What a run gives a factory instead of its spec: the network, the likelihood, the speed
# settings (`vj.specs.Context`), the draws' sampler behind `local_reparameterization` and the
# tasks of a SImPa step (the schedule's).
FROM_THE_RUN = {
  "apply_fn",
  "embed_fn",
  "nll",
  "sample_batching",
  "particle_batching",
  "unroll_steps",
  "remat",
  "draw_outputs",
  "tasks_per_step",
  "options",
}


# What a spec holds beside its factory's arguments: the test's draws, the spec's own name of
# a factory's switch (`local_reparameterization` for `draw_outputs`), and the meta-optimiser's
# settings of the algorithms that have log-stds (and SImPa's PHI network's rate).
BESIDE_THE_FACTORY = {
  "num_mc_test",
  "local_reparameterization",
  "log_std_weight_decay",
  "meta_grad_clip_separately",
  "phi_lr",
}


FACTORIES = {
  "vampire": vj.vampire,
  "vampire2": vj.vampire2,
  "maml": vj.maml,
  "fomaml": vj.maml,
  "platipus": vj.baselines.platipus,
  "bmaml": vj.baselines.bmaml,
  "abml": vj.baselines.abml,
  "protonet": vj.baselines.protonet,
  "simpa": vj.baselines.simpa,
}


def _tiny():
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  x = jnp.linspace(-1.0, 1.0, 5)[:, None]
  return model, params, x, jnp.sin(3 * x)


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


@pytest.mark.parametrize("name", ["vampire", "abml"])
def test_a_config_asking_for_it_builds_a_learner_that_draws_examples_apart(name):
  # The spec's field reaches the learner (`draw_outputs`): its predictions for two
  # neighbouring points are uncorrelated, where one weight draw would tie them.
  from tests.conftest import tiny_regression_config
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


@pytest.mark.parametrize("row", list(OTHER_ALGORITHMS_OPTIONS))
def test_an_option_of_another_algorithm_is_refused_at_construction(row):
  """A config holds only its algorithm's options: another algorithm's is refused when the
  config is made, in one line naming the option, the algorithm and the specs that take it."""
  algorithm, changes, spec, owner = OTHER_ALGORITHMS_OPTIONS[row]
  ((name, _),) = changes.items()
  config = _tiny_config().replace(algorithm=algorithm)
  with pytest.raises(ConfigError) as raised:
    config.replace(**changes)
  message = str(raised.value)
  assert message.startswith(f"{name} is not a setting of {algorithm} ({spec})"), message
  assert re.search(rf"it is an option of .*\b{owner}\b", message), message
  assert len(message.splitlines()) == 1 and raised.value.fields == (name,)
  with pytest.raises(ConfigError, match=f"^{name} is not a setting of {algorithm}"):
    getattr(vj.specs, spec)(**changes)


@pytest.mark.parametrize("name", list(vj.specs.SPECS))
def test_a_spec_holds_its_factorys_arguments_with_the_factorys_defaults(name):
  cls = vj.specs.SPECS[name]
  parameters = inspect.signature(FACTORIES[name]).parameters
  if name == "vampire2":  # its **options are vampire's: their defaults are vampire's
    parameters = {**inspect.signature(vj.vampire).parameters, **parameters}
  taken = {p for p in parameters if p not in FROM_THE_RUN}
  if name == "vampire2":
    taken -= {"kl_target"}  # N(0, I) by definition
  if name == "vampire":  # vj.vampire's KL to N(0, I) and its meta-loss weight are Vampire2's spec
    taken -= {"kl_target", "outer_kl_weight"}
  if name == "fomaml":
    taken -= {"first_order", "second_order_steps"}  # first order in every step
  fields = set(cls.field_names())
  assert taken <= fields, taken - fields
  assert fields - taken <= BESIDE_THE_FACTORY, fields - taken
  for field in dataclasses.fields(cls):
    if field.name in parameters:
      default = parameters[field.name].default
      if default is inspect.Parameter.empty:  # a required argument: None, the run's (ways)
        assert field.default is None, field.name
        continue
      assert field.default == (tuple(default) if isinstance(default, list) else default), field.name


@pytest.mark.parametrize(
  "spec, factory",
  [
    (vj.specs.Vampire(inner_lr=0.01, kl_weight=0.5, num_mc_train=2), "vampire"),
    (vj.specs.Vampire2(inner_lr=0.01, outer_kl_weight=0.25), "vampire2"),
    (vj.specs.Maml(inner_lr=0.05, num_inner_steps=2), "maml"),
    (vj.specs.Fomaml(inner_lr=0.05), "fomaml"),
    (vj.specs.Platipus(inner_lr=0.01, inference_data="query"), "platipus"),
    (vj.specs.Bmaml(num_particles=3, inner_lr=0.01), "bmaml"),
    (vj.specs.Abml(inner_lr=0.01, hyper_prior_weight=0.0), "abml"),
    (vj.specs.Simpa(inner_lr=0.01, num_kl_samples=4), "simpa"),
  ],
)
def test_a_spec_builds_what_its_factory_builds(spec, factory):
  model, params, x, y = _tiny()
  apply_fn, nll = vj.pure_apply(model), vj.gaussian_nll(0.3)
  context = vj.specs.Context(tasks_per_step=2)
  built = spec.learner(apply_fn, nll, context)
  kwargs = {k: v for k, v in spec.settings().items() if k not in BESIDE_THE_FACTORY}
  if factory == "fomaml":
    kwargs["first_order"] = True
  if factory == "simpa":
    kwargs["tasks_per_step"] = 2
  direct = FACTORIES[factory](apply_fn, nll, **kwargs)
  key = jax.random.key(3)
  ours, theirs = built.init(params, key), direct.init(params, key)
  chex_close = lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # noqa: E731
  jax.tree_util.tree_map(chex_close, ours, theirs)
  adapted = jax.jit(built.adapt)(ours, x, y, key)
  expected = jax.jit(direct.adapt)(theirs, x, y, key)
  jax.tree_util.tree_map(chex_close, adapted, expected)


def test_protonet_takes_its_classes_from_the_run():
  embed = vj.pure_apply(vj.Conv4(num_classes=None, num_filters=4))
  spec = vj.specs.Protonet(train_num_classes=7)
  learner = spec.learner(embed, vj.categorical_nll, vj.specs.Context(ways=5))
  assert spec.training_ways(5) == 7 and vj.specs.Protonet().training_ways(5) == 5
  assert learner.meta_loss is not None  # 7-way training episodes
  with pytest.raises(vj.ConfigError, match=r"protonet classifies.*ways"):
    spec.learner(embed, vj.categorical_nll)


@pytest.mark.parametrize(
  "make, field, owners",
  [
    (lambda: vj.specs.Vampire(num_particles=8), "num_particles", ["Bmaml"]),
    (lambda: vj.specs.Maml(kl_weight=0.1), "kl_weight", ["Vampire", "Platipus", "Abml"]),
    (lambda: vj.specs.Bmaml(num_mc_test=4), "num_mc_test", ["Vampire", "Simpa"]),
    (lambda: vj.specs.Protonet(inner_lr=0.1), "inner_lr", ["Maml"]),
  ],
)
def test_another_algorithms_option_is_refused_where_the_spec_is_built(make, field, owners):
  with pytest.raises(vj.ConfigError) as raised:
    make()
  message = str(raised.value)
  assert field in message and all(owner in message for owner in owners), message
  assert raised.value.fields == (field,)
  assert len(message.splitlines()) == 1


@pytest.mark.parametrize(
  "spec, field",
  [
    (vj.specs.Vampire(inner_lr=-1.0), "inner_lr"),
    (vj.specs.Vampire(num_mc_test=0), "num_mc_test"),
    (vj.specs.Vampire(log_std_init=(-3.0, -4.0)), "log_std_init"),
    (vj.specs.Maml(first_order="False"), "first_order"),
    (vj.specs.Bmaml(meta_objective="elbo"), "meta_objective"),
    (vj.specs.Simpa(num_kl_samples=1), "num_kl_samples"),
    (vj.specs.Protonet(distance="cosine"), "distance"),
    (vj.specs.Maml(first_order=True, second_order_steps=1), "second_order_steps"),
  ],
)
def test_an_impossible_value_is_refused_naming_the_field_and_what_it_takes(spec, field):
  with pytest.raises(vj.ConfigError) as raised:
    spec.validate()
  message = str(raised.value)
  assert message.startswith(field) and field in raised.value.fields, message
  assert "--" not in message  # the library names fields, not a command line's flags


def test_convert_carries_the_shared_settings_and_keeps_an_algorithms_own_defaults():
  vampire = vj.specs.Vampire(inner_lr=0.1, kl_weight=0.3, num_mc_test=4, first_order=True)
  maml = vj.specs.convert(vampire, "maml")
  assert maml == vj.specs.Maml(inner_lr=0.1, first_order=True)
  abml = vj.specs.convert(vampire, vj.specs.Abml)
  assert (abml.kl_weight, abml.num_mc_test) == (0.3, 4)
  # The authors' Vampire2 keeps its KL weight and first order (main.py's), whatever it came from.
  vampire2 = vj.specs.convert(vj.specs.Vampire(kl_weight=0.3, first_order=False), "vampire2")
  assert (vampire2.kl_weight, vampire2.first_order) == (1e-6, True)
  assert specs.dropped_in_conversion(vampire, "maml") == {"kl_weight": 0.3, "num_mc_test": 4}
