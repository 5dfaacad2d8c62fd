"""`vj.vampire2(apply_fn, nll)`: Vampire2 with the authors' defaults, as `vj.vampire` has the
paper's (issue 59, item 2). It is the learner `--algorithm vampire2` trains, number for number."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from vampire_jax.runs import algorithms


def _network(outputs=1):
  model = vj.MLP((8,), outputs)
  return vj.init_params(model, jax.random.key(0), (1, 1)), vj.pure_apply(model)


def _task(classes=None):
  x = jax.random.uniform(jax.random.key(2), (12, 1), minval=-3.0, maxval=3.0)
  y = jnp.sin(x) if classes is None else jnp.arange(12) % classes  # labels: a classifier's
  return vj.Task(x[:5], y[:5], x[5:], y[5:])


def _loss(learner, prior, classes=None):
  return vj.query_loss(learner, prior, _task(classes), jax.random.key(3))[0]


def _loss_and_grad(learner, prior):
  return jax.jit(jax.value_and_grad(lambda meta_params: _loss(learner, meta_params, 3)))(prior)


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
