"""The algorithms' specs (`vj.specs`): each holds its factory's arguments with the factory's
defaults, builds the factory's learner, and refuses another algorithm's option."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax.runs import specs

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


def _tiny():
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  x = jnp.linspace(-1.0, 1.0, 5)[:, None]
  return model, params, x, jnp.sin(3 * x)


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
