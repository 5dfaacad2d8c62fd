"""The predictive distribution as a distrax distribution, and `Gaussian` <-> distrax.

Numbers, not shapes: `log_prob` of the query targets against the evaluators' NLL, the
predictive's moments against the variance split and `vj.uncertainty`, a mixture of another
family against its log-sum-exp by hand, and distrax's KL and density against ours.
"""

import math

import distrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core import losses
from vampire_jax._src.metrics.calibration import mixture_cdf
from vampire_jax.data import sine_line
from vampire_jax._src.core.errors import InputError

NOISE = 0.3


def _regression_learner(algorithm="vampire"):
  model = vj.MLP((16, 16), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  nll = vj.gaussian_nll(NOISE)
  if algorithm == "maml":
    learner = vj.maml(vj.pure_apply(model), nll, num_inner_steps=2)
  else:
    learner = vj.vampire(
      vj.pure_apply(model), nll, num_inner_steps=2, num_mc_query=6, log_std_init=(-2.0, -1.5)
    )
  return learner, learner.init(params, jax.random.key(1))


@pytest.mark.parametrize("algorithm", ["vampire", "maml"])
def test_regression_log_prob_is_the_evaluators_nll_per_task(algorithm):
  learner, meta_params = _regression_learner(algorithm)
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 5))
  keys = jax.random.split(jax.random.key(3), 5)
  per_task = vj.make_regression_evaluator(learner, NOISE)(meta_params, tasks, keys)
  for i in range(5):
    task = jax.tree.map(lambda field: field[i], tasks)
    dist = vj.predictive(
      learner, meta_params, task.support_x, task.support_y, task.query_x, keys[i]
    )
    assert isinstance(dist, distrax.MixtureSameFamily)
    assert dist.batch_shape == (10,) and dist.event_shape == (1,)
    log_prob = dist.log_prob(task.query_y)  # one per query point
    assert log_prob.shape == (10,)
    np.testing.assert_allclose(-jnp.mean(log_prob), per_task.nll[i], rtol=1e-5, atol=1e-5)


def test_regression_moments_split_into_the_draws_spread_and_the_noise():
  learner, meta_params = _regression_learner()
  task = jax.tree.map(lambda f: f[0], sine_line.tasks_from_keys(jax.random.key(4)[None]))
  key = jax.random.key(5)
  dist = vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, key)
  adapt_key, predict_key = jax.random.split(key)
  draws = learner.predict(
    learner.adapt(meta_params, task.support_x, task.support_y, adapt_key), task.query_x, predict_key
  )  # [6, 10, 1], noise-free
  np.testing.assert_allclose(dist.mean(), jnp.mean(draws, 0), rtol=1e-5, atol=1e-6)
  epistemic = jnp.var(draws, 0)
  assert float(jnp.max(epistemic)) > 1e-4  # the draws disagree: the split is not trivial
  np.testing.assert_allclose(dist.variance(), epistemic + NOISE**2, rtol=1e-5)
  split = vj.regression_uncertainty(draws, NOISE)
  np.testing.assert_allclose(dist.variance()[:, 0], split.total, rtol=1e-5)


def test_a_point_estimates_predictive_keeps_the_noise():
  """MAML has one draw: its samples still spread by noise_std (zero-width before)."""
  learner, meta_params = _regression_learner("maml")
  task = jax.tree.map(lambda f: f[0], sine_line.tasks_from_keys(jax.random.key(4)[None]))
  dist = vj.predictive(
    learner, meta_params, task.support_x, task.support_y, task.query_x, jax.random.key(6)
  )
  samples = dist.sample(seed=jax.random.key(7), sample_shape=(20_000,))  # [20000, 10, 1]
  residual = samples - dist.mean()[None]
  assert abs(float(jnp.std(residual)) - NOISE) < 0.01
  lower, upper = vj.predictive_interval(dist, 0.9)
  np.testing.assert_allclose(upper - lower, 2 * 1.6448536 * NOISE, rtol=1e-4)
  inside = jnp.mean((samples >= lower) & (samples <= upper))
  assert abs(float(inside) - 0.9) < 0.01


def test_the_interval_of_a_mixture_holds_its_level_by_the_cdf():
  means = jnp.array([[[-1.0], [0.0]], [[2.0], [0.1]], [[0.5], [0.0]]])  # [3 draws, 2 queries, 1]
  dist = vj.predictive_distribution(means, vj.gaussian_nll(0.5))
  lower, upper = vj.predictive_interval(dist, 0.8)
  for q, bound in ((0.1, lower), (0.9, upper)):
    cdf = np.mean([mixture_cdf(bound, means, 0.5)], axis=0)
    np.testing.assert_allclose(cdf, q, atol=1e-5)
  with pytest.raises(InputError, match="level must be a number in"):
    vj.predictive_interval(dist, 1.5)
  with pytest.raises(InputError, match="a classifier's has no interval"):
    vj.predictive_interval(vj.predictive_distribution(means, vj.categorical_nll))


def test_classification_is_a_categorical_of_the_mean_softmax():
  logits = jax.random.normal(jax.random.key(0), (4, 7, 5)) * 2  # [draws, query, ways]
  labels = jnp.arange(7) % 5
  dist = vj.predictive_distribution(logits, vj.categorical_nll)
  assert isinstance(dist, distrax.Categorical) and dist.batch_shape == (7,)
  draws = jax.nn.softmax(logits, -1)
  np.testing.assert_allclose(dist.probs, jnp.mean(draws, 0), rtol=1e-6)
  np.testing.assert_allclose(
    dist.log_prob(labels), losses.mixture_log_prob_categorical(logits, labels), rtol=1e-5
  )
  np.testing.assert_allclose(dist.entropy(), vj.uncertainty(draws).total, rtol=1e-5, atol=1e-6)


def test_a_distribution_likelihood_gives_a_mixture_of_its_family():
  nll = vj.distribution_nll(lambda out: distrax.Laplace(out, 0.4))
  outputs = jax.random.normal(jax.random.key(1), (3, 6, 2))  # [draws, query, 2 outputs]
  targets = jax.random.normal(jax.random.key(2), (6, 2))
  dist = vj.predictive_distribution(outputs, nll)
  assert isinstance(dist.components_distribution.distribution, distrax.Laplace)
  assert dist.batch_shape == (6,) and dist.event_shape == (2,)
  by_hand = jax.nn.logsumexp(
    jnp.sum(-jnp.abs(targets[None] - outputs) / 0.4 - math.log(2 * 0.4), -1), 0
  ) - math.log(3)
  np.testing.assert_allclose(dist.log_prob(targets), by_hand, rtol=1e-5)
  # Its mean NLL under one draw is the likelihood itself.
  one = vj.predictive_distribution(outputs[:1], nll)
  np.testing.assert_allclose(-jnp.mean(one.log_prob(targets)), nll(outputs[0], targets), rtol=1e-6)


def test_a_likelihood_without_a_distribution_is_refused():
  with pytest.raises(InputError, match="names no distribution; use vj.categorical_nll"):
    vj.predictive_distribution(jnp.zeros((2, 3, 1)), lambda out, y: jnp.mean((out - y) ** 2))
  with pytest.raises(InputError, match="outputs must be"):
    vj.predictive_distribution(jnp.zeros((3,)), vj.gaussian_nll(0.3))


def test_gaussian_to_distrax_and_back_with_the_same_kl_and_density():
  params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
  q = vj.gaussian_from_params(params, jax.random.key(0), log_std_range=(-2.0, -1.0))
  p = vj.gaussian_from_params(
    jax.tree.map(lambda x: x + 0.3, params), jax.random.key(1), log_std_range=(-1.5, -0.5)
  )
  q_tree, p_tree = vj.to_distrax(q), vj.to_distrax(p)
  assert isinstance(q_tree["dense"]["kernel"], distrax.Normal)
  back = vj.gaussian_from_distrax(q_tree)
  for ours, theirs in zip(jax.tree.leaves(q), jax.tree.leaves(back)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)

  def is_normal(x):
    return isinstance(x, distrax.Normal)

  per_leaf = jax.tree.map(
    lambda a, b: jnp.sum(a.kl_divergence(b)), q_tree, p_tree, is_leaf=is_normal
  )
  np.testing.assert_allclose(vj.kl_divergence(q, p), sum(jax.tree.leaves(per_leaf)), rtol=1e-5)
  # vj.sample's draws are mean + eps * std: distrax's density of a draw is N(eps; 0, 1) / std.
  draws = vj.sample(q, jax.random.key(2), num_samples=4)
  for dist, mean, log_std, w in zip(
    jax.tree.leaves(q_tree, is_leaf=is_normal),
    jax.tree.leaves(q.mean),
    jax.tree.leaves(q.log_std),
    jax.tree.leaves(draws),
  ):
    eps = (w - mean) * jnp.exp(-log_std)
    ours = -0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(dist.log_prob(w), ours, rtol=1e-5, atol=1e-5)
  with pytest.raises(InputError, match="distrax.Normal leaves only"):
    vj.gaussian_from_distrax({"a": distrax.Laplace(0.0, 1.0)})


def test_importing_the_library_leaves_the_heavy_packages_until_they_are_used():
  """`import vampire_jax` stays near `import jax, flax, optax` (benchmarks/import_time.py):
  distrax (TFP's JAX substrate, about 5 s) loads on a predictive's first call, and the
  experiments' packages never load with the library."""
  import subprocess
  import sys

  heavy = ["distrax", "tensorflow_probability", "tensorflow", "matplotlib", "tqdm", "equinox"]
  code = f"import sys, vampire_jax; print([m for m in {heavy!r} if m in sys.modules])"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
  code = (
    "import sys, jax, vampire_jax as vj; "
    "vj.predictive_distribution(jax.numpy.zeros((2, 3, 1)), vj.gaussian_nll(0.3)); "
    "print('distrax' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "True"


def test_a_trained_runs_interval_covers_what_its_pit_calibration_says():
  """On a trained learner, the 90 % interval's coverage of held-out targets is the one the
  PIT calibration reports (F(0.95) - F(0.05)): the interval is the predictive's own. How
  close that is to 90 % is the model's calibration (measured in BUILD_NOTES), not this
  function's."""
  learner, _ = _regression_learner()
  model = vj.MLP((16, 16), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=8)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = jax.jit(
    vj.make_train_step(
      learner, optimizer, lambda data, keys: sine_line.tasks_from_keys(keys), steps_per_call=100
    )
  )
  mean_losses = []
  for call in range(3):
    state, metrics = train_step(state, None, jax.random.key(10 + call))
    mean_losses.append(float(jnp.mean(metrics["loss"])))
  assert mean_losses[-1] < mean_losses[0]  # it learned something
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(3), 100))
  keys = jax.random.split(jax.random.key(4), 100)

  def coverage(task, key):
    dist = vj.predictive(
      learner, state.meta_params, task.support_x, task.support_y, task.query_x, key
    )
    lower, upper = vj.predictive_interval(dist, 0.9)
    return (task.query_y >= lower) & (task.query_y <= upper)

  inside = float(jnp.mean(jax.jit(jax.vmap(coverage))(tasks, keys)))
  per_task = vj.make_regression_evaluator(learner, NOISE)(state.meta_params, tasks, keys)
  pit = vj.regression_quantile_calibration(
    per_task.predictions, tasks.query_y, NOISE, levels=np.array([0.05, 0.95])
  )
  assert abs(inside - (pit.observed[1] - pit.observed[0])) < 2e-3  # 1000 targets
  assert 0.3 < inside < 1.0


def test_an_omniglot_runs_predictive_scores_what_its_test_scores(tiny_omniglot_run):
  """Run.predictive on a trained Omniglot run: log_prob is the evaluator's NLL of the task
  (same key), probs is Run.predict's, entropy is vj.uncertainty's total."""
  run = vj.load_run(tiny_omniglot_run[0])
  rng = np.random.default_rng(0)
  support_x = rng.uniform(0, 1, (5,) + run.input_shape).astype(np.float32)
  query_x = rng.uniform(0, 1, (10,) + run.input_shape).astype(np.float32)
  support_y, query_y = np.arange(5), np.arange(10) % 5
  key = jax.random.key(8)
  dist = run.predictive(support_x, support_y, query_x, key)
  assert isinstance(dist, distrax.Categorical) and dist.batch_shape == (10,)
  task = vj.Task(support_x[None], support_y[None], query_x[None], query_y[None])
  evaluate = vj.make_classification_evaluator(run.learner)
  reported = evaluate(run.meta_params, task, key[None])
  np.testing.assert_allclose(-jnp.mean(dist.log_prob(query_y)), reported.nll[0], atol=1e-5)
  np.testing.assert_allclose(dist.probs, run.predict(support_x, support_y, query_x, key), atol=1e-6)
  draws = run.predict_draws(support_x, support_y, query_x, key)
  np.testing.assert_allclose(dist.entropy(), vj.uncertainty(draws).total, atol=1e-5)
