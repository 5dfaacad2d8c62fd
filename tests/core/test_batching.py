import doctest

import chex
import jax
import jax.extend
import jax.numpy as jnp
import pytest

import vampire_jax as vj
from vampire_jax._src.core import batching
from vampire_jax._src.core.batching import BATCHING_STRATEGIES
from vampire_jax._src.core.host_chunked import make_host_chunked_meta_step


def _sine_tasks(key, num_tasks, shots=5, query=10):
  k_amp, k_phase, k_x = jax.random.split(key, 3)
  amp = jax.random.uniform(k_amp, (num_tasks, 1, 1), minval=0.5, maxval=3.0)
  phase = jax.random.uniform(k_phase, (num_tasks, 1, 1), maxval=jnp.pi)
  x = jax.random.uniform(k_x, (num_tasks, shots + query, 1), minval=-5.0, maxval=5.0)
  y = amp * jnp.sin(x + phase)
  return vj.Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


def _regression_learner(algorithm, hidden=(40, 40), **kw):
  model = vj.MLP(hidden, 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  apply_fn = vj.pure_apply(model)
  nll = vj.gaussian_nll(0.3)
  if algorithm == "maml":
    learner = vj.maml(apply_fn, nll, num_inner_steps=3, inner_lr=0.005, **kw)
  else:
    # kl_weight 0.1 keeps inner_lr * kl_weight / sigma_p^2 < 2 at the paper's
    # log-std init [-4, -3] (see vj.kl_step_factor).
    learner = vj.vampire(
      apply_fn,
      nll,
      num_inner_steps=3,
      inner_lr=0.005,
      kl_weight=0.1,
      num_mc_train=4,
      num_mc_query=4,
      **kw,
    )
  return learner, params


@pytest.mark.parametrize("algorithm", ["maml", "vampire"])
def test_all_task_batching_strategies_give_the_same_step(algorithm):
  learner, params = _regression_learner(algorithm, hidden=(16,))
  opt = vj.meta_optimizer(1e-3, tasks_per_step=4)
  state = vj.init_meta_state(learner, opt, params, jax.random.key(1))
  tasks = _sine_tasks(jax.random.key(2), 4)
  results = {}
  for strategy in BATCHING_STRATEGIES:
    step = jax.jit(vj.make_meta_step(learner, opt, task_batching=strategy, chunk_size=2))
    results[strategy] = step(state, tasks, jax.random.key(3))
  results["host_chunked"] = make_host_chunked_meta_step(learner, opt, chunk_size=2)(
    state, tasks, jax.random.key(3)
  )
  reference = results.pop("vmap")
  for name, result in results.items():
    chex.assert_trees_all_close(result, reference, atol=1e-5, rtol=1e-4, custom_message=name)


def test_every_draw_batching_gives_the_same_vampire_meta_gradient():
  """VAMPIRE's L draws on a convolutional network (`loop_safe`, max-pool, second order):
  `lax.map`, `remat_map` (the CPU default) and `vmap` give one meta-gradient. `remat_map`
  recomputes each draw's forward pass in the backward pass; a recomputation that dropped
  or reordered a draw's noise would differ. (With max-pool as a max over a reshaped
  window, XLA:CPU miscompiled these meta-gradients: `models.max_pool_2x2`.)"""
  model = vj.Conv4(num_classes=3, num_filters=4, max_pool=True, conv_impl="loop_safe")
  params = vj.init_params(model, jax.random.key(0), (1, 16, 16, 1))
  kx, kq = jax.random.split(jax.random.key(1))
  task = vj.Task(
    jax.random.uniform(kx, (3, 16, 16, 1)),
    jnp.arange(3),
    jax.random.uniform(kq, (6, 16, 16, 1)),
    jnp.arange(6) % 3,
  )
  tasks = jax.tree_util.tree_map(lambda x: x[None], task)
  keys = jax.random.split(jax.random.key(2), 1)
  gradients = {}
  for draws in ("vmap", "map", "remat_map"):
    learner = vj.vampire(
      vj.pure_apply(model),
      vj.categorical_nll,
      num_inner_steps=1,
      inner_lr=0.01,
      kl_weight=0.1,
      num_mc_train=3,
      num_mc_query=3,
      sample_batching=draws,
    )
    meta_params = learner.init(params, jax.random.key(3))
    gradient = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))
    gradients[draws] = gradient(meta_params, tasks, keys)[0]
  reference = gradients.pop("vmap")
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(reference)) > 1e-3
  for draws, grads in gradients.items():
    chex.assert_trees_all_close(grads, reference, atol=1e-5, rtol=1e-4, custom_message=draws)


def _linear_items():
  """Five weight matrices, inputs and labels in float64: `map_mean`'s test problem."""
  keys = jax.random.split(jax.random.key(0), 2)
  weights = jax.random.normal(keys[0], (5, 3, 4), jnp.float64)
  x = jax.random.normal(keys[1], (7, 3), jnp.float64)
  y = jnp.arange(7) % 4

  def one_item(w, shared):
    x, y = shared
    logits = 2.0 * jnp.tanh(x @ w)
    return jnp.mean(-jax.nn.log_softmax(logits)[jnp.arange(7), y]), logits

  def reference(w, x):  # the plain map and mean, differentiated by JAX
    values, outputs = jax.lax.map(lambda item: one_item(item, (x, y)), w)
    return jnp.mean(values), outputs

  def mapped(w, x):
    return batching.map_mean(one_item, w, (x, y))

  def rematted(w):  # the mean of the values over `remat_map`, differentiated by JAX
    value = lambda item: one_item(item, (x, y))[0]  # noqa: E731
    return jnp.mean(batching.batched_map(value, w, strategy="remat_map"))

  return weights, x, reference, mapped, rematted


def _equal(a, b):
  chex.assert_trees_all_close(a, b, atol=1e-13, rtol=1e-13)


def test_map_mean_is_the_plain_mean_and_its_gradients():
  """map_mean's value and outputs, its gradient of the items and of a shared input, its
  gradient where the outputs are differentiated too, its second order and under vmap and
  jit: the plain map's, to float64 rounding (a gradient scaled by 1 / n twice, or a shared
  input's gradient of one item only, would differ)."""
  with jax.enable_x64(True):
    weights, x, reference, mapped, _ = _linear_items()
    _equal(mapped(weights, x), reference(weights, x))
    mean_only = lambda f: jax.grad(lambda w, x: f(w, x)[0], (0, 1))  # noqa: E731
    _equal(mean_only(mapped)(weights, x), mean_only(reference)(weights, x))
    assert float(jnp.max(jnp.abs(mean_only(reference)(weights, x)[1]))) > 1e-3
    _equal(jax.jit(mean_only(mapped))(weights, x), mean_only(reference)(weights, x))
    with_outputs = lambda f: jax.grad(  # noqa: E731
      lambda w, x: f(w, x)[0] + jnp.sum(f(w, x)[1] ** 2), (0, 1)
    )
    _equal(with_outputs(mapped)(weights, x), with_outputs(reference)(weights, x))
    second = lambda f: jax.jacrev(jax.grad(lambda w: f(w, x)[0]))  # noqa: E731
    _equal(second(mapped)(weights), second(reference)(weights))
    stacked = jnp.stack([weights, 2.0 * weights])
    per_row = lambda f: jax.vmap(jax.grad(lambda w: f(w, x)[0]))  # noqa: E731
    _equal(per_row(mapped)(stacked), per_row(reference)(stacked))


def _primitive_count(jaxpr, name: str) -> int:
  here = sum(eqn.primitive.name == name for eqn in jaxpr.eqns)
  return here + sum(_primitive_count(sub, name) for sub in jax.extend.core.subjaxprs(jaxpr))


def test_map_mean_runs_each_items_forward_pass_once():
  """The gradient of the mean over items: map_mean has one product forward and one back
  (d w = x^T g; x is not differentiated); `remat_map` runs the forward product again in
  the backward pass, so three."""
  with jax.enable_x64(True):
    weights, x, _, mapped, rematted = _linear_items()
    fused = jax.make_jaxpr(jax.grad(lambda w: mapped(w, x)[0]))(weights)
    assert _primitive_count(fused.jaxpr, "dot_general") == 2
    assert _primitive_count(jax.make_jaxpr(jax.grad(rematted))(weights).jaxpr, "dot_general") == 3


def test_map_means_example_runs():
  globs = {"jax": jax, "jnp": jnp, "vj": vj}
  tests = doctest.DocTestFinder(recurse=False).find(vj.backend.map_mean, "map_mean", globs=globs)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  for test in tests:
    runner.run(test)
  assert sum(len(t.examples) for t in tests) >= 4 and runner.failures == 0
