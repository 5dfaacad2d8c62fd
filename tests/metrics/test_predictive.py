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
from tests.helpers import NOISE, _classifier_predictive, _first
from vampire_jax._src.core import losses
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.metrics.calibration import mixture_cdf
from vampire_jax.data import sine_line


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


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert "ArrayImpl" not in message, message
  return message


def _regression_predictive(regressor):
  learner, meta_params, tasks, _, keys, per_task = regressor
  task = _first(tasks)
  dist = vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, keys[0])
  return dist, task, per_task


def _student_t_likelihood(df):
  from tensorflow_probability.substrates import jax as tfp

  return vj.distribution_nll(lambda out: tfp.distributions.StudentT(df, out, NOISE))


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


def test_regression_log_prob_refuses_targets_without_their_event_axis(regressor):
  """Targets [Q, 1] give the evaluator's NLL; targets [Q] (which would score each query's
  mixture on all Q targets) are refused naming the shape [10, 1] and the one given."""
  dist, task, per_task = _regression_predictive(regressor)
  np.testing.assert_allclose(-dist.log_prob(task.query_y).mean(), per_task.nll[0], rtol=1e-5)
  with pytest.raises(
    InputError, match=r"PredictiveMixture.log_prob: value must be shaped \[10, 1\]"
  ) as raised:
    dist.log_prob(task.query_y[:, 0])
  assert _one_line(raised).endswith("got float32[10]")


def test_regression_log_prob_refuses_two_target_columns(regressor):
  """Targets [Q, 2] under a 1-D event are refused naming the shape [10, 1] and the one given."""
  dist, task, _ = _regression_predictive(regressor)
  with pytest.raises(InputError, match=r"value must be shaped \[10, 1\]") as raised:
    dist.log_prob(jnp.concatenate([task.query_y, task.query_y], axis=1))
  assert "got float32[10, 2]" in _one_line(raised)


def test_regression_log_prob_refuses_integer_targets_and_scalars(regressor):
  """A scalar target (one for every query) and integer targets are refused as not float targets."""
  dist, task, _ = _regression_predictive(regressor)
  with pytest.raises(InputError, match="value must be an array of float targets") as raised:
    dist.log_prob(1.5)
  _one_line(raised)
  with pytest.raises(InputError, match="value must be float targets, got int32"):
    dist.log_prob(jnp.zeros((10, 1), jnp.int32))


def test_classifier_log_prob_refuses_labels_with_a_trailing_axis(classifier):
  """Labels [Q] give the evaluator's NLL; labels [Q, 1] are refused naming the shape [6]."""
  dist, task, per_task = _classifier_predictive(classifier)
  np.testing.assert_allclose(-dist.log_prob(task.query_y).mean(), per_task.nll[0], rtol=1e-5)
  with pytest.raises(
    InputError, match=r"PredictiveCategorical.log_prob: value must be shaped \[6\]"
  ) as raised:
    dist.log_prob(task.query_y[:, None])
  assert "got int32[6, 1]" in _one_line(raised)


@pytest.mark.parametrize(
  "value, got",
  [
    (1.5, "float32[]"),  # a probability of 1 before
    (jnp.full(6, 1.5), "float32[6]"),  # read as class 1
    (jnp.zeros(6, bool), "bool[6]"),  # "iota does not accept dtype bool"
  ],
)
def test_classifier_log_prob_takes_integer_labels_only(classifier, value, got):
  """A float scalar, float labels and bool labels are refused naming integer class indices in
  [0, 3) and the dtype and shape given."""
  dist, _, _ = _classifier_predictive(classifier)
  with pytest.raises(InputError, match="integer class indices in \\[0, 3\\)") as raised:
    dist.log_prob(value)
  assert f"got {got}" in _one_line(raised)


def test_classifier_log_prob_refuses_one_hot_labels_and_names_argmax(classifier):
  """One-hot labels [Q, C] are refused naming jnp.argmax(y, -1) and the shape given."""
  dist, task, _ = _classifier_predictive(classifier)
  with pytest.raises(InputError, match=r"jnp.argmax\(y, -1\)") as raised:
    dist.log_prob(jax.nn.one_hot(task.query_y, 3))
  assert "got float32[6, 3]" in _one_line(raised)


@pytest.mark.parametrize("label", [3, -1])
def test_classifier_log_prob_refuses_labels_outside_the_classes(classifier, label):
  """A label 3 of 3 classes (or -1) is refused by log_prob and prob, naming the range [0, 3)
  and the label."""
  dist, task, _ = _classifier_predictive(classifier)
  labels = task.query_y.at[2].set(label)
  with pytest.raises(InputError, match=r"class indices in \[0, 3\) for 3 outputs") as raised:
    dist.log_prob(labels)
  assert f"[{label}]" in _one_line(raised)
  with pytest.raises(InputError, match="PredictiveCategorical.prob"):
    dist.prob(labels)


def test_a_predictive_made_under_vmap_and_jit_scores_each_tasks_targets(regressor):
  """The evaluator's target shapes with a task axis: a predictive of batch [tasks, Q] takes
  `tasks.query_y` [tasks, Q, 1] and gives each task's NLL; samples keep working."""
  learner, meta_params, tasks, _, keys, per_task = regressor

  @jax.jit
  def predictives(tasks, keys):
    def one(task, key):
      return vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, key)

    return jax.vmap(one)(tasks, keys)

  dist = predictives(tasks, keys)
  assert dist.batch_shape == (5, 10) and dist.event_shape == (1,)
  np.testing.assert_allclose(-dist.log_prob(tasks.query_y).mean(axis=1), per_task.nll, rtol=1e-5)
  with pytest.raises(InputError, match=r"value must be shaped \[5, 10, 1\]"):
    dist.log_prob(tasks.query_y[0])
  samples, log_prob = dist.sample_and_log_prob(seed=jax.random.key(0), sample_shape=(3,))
  assert samples.shape == (3, 5, 10, 1)
  np.testing.assert_allclose(log_prob, jax.vmap(dist.log_prob)(samples), rtol=1e-6)
  # The intervals of the batch are each task's own.
  lower, upper = vj.predictive_interval(dist, 0.9)
  first_lower, first_upper = vj.predictive_interval(_regression_predictive(regressor)[0], 0.9)
  np.testing.assert_allclose(lower[0], first_lower, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(upper[0], first_upper, rtol=1e-5, atol=1e-5)
  # A slice keeps the checks: one task's predictive, one task's targets.
  np.testing.assert_allclose(-dist[0].log_prob(tasks.query_y[0]).mean(), per_task.nll[0], rtol=1e-5)
  with pytest.raises(InputError, match=r"value must be shaped \[10, 1\]"):
    dist[0].log_prob(tasks.query_y[0, :, 0])


@pytest.mark.parametrize("num_bisections", [0, -1, 2.5, True])
def test_predictive_interval_refuses_fewer_than_one_bisection(regressor, num_bisections):
  """num_bisections 0, -1, 2.5 and True are refused as not an integer >= 1; one bisection
  gives an interval of positive width."""
  dist, _, _ = _regression_predictive(regressor)
  with pytest.raises(
    InputError, match="predictive_interval: num_bisections must be an integer >= 1"
  ) as raised:
    vj.predictive_interval(dist, 0.9, num_bisections=num_bisections)
  _one_line(raised)
  lower, upper = vj.predictive_interval(dist, 0.9, num_bisections=1)
  assert bool(jnp.all(upper > lower))


@pytest.mark.parametrize("df", [1.5, 1.0, 2.0])
def test_a_student_t_predictive_of_infinite_variance_has_its_true_interval(df):
  """With df <= 2 (infinite variance) the interval is the Student-t's own. One draw: the
  mixture is the Student-t itself, whose quantiles TFP computes in closed form (df 1.5:
  +-1.1116 at level 0.9)."""
  from tensorflow_probability.substrates import jax as tfp

  outputs = jnp.array([[[0.0], [2.0], [-1.0]]])  # [1 draw, 3 queries, 1]
  dist = vj.predictive_distribution(outputs, _student_t_likelihood(df))
  lower, upper = vj.predictive_interval(dist, 0.9)
  half_width = float(tfp.distributions.StudentT(df, 0.0, NOISE).quantile(0.95))
  np.testing.assert_allclose(upper[:, 0], outputs[0, :, 0] + half_width, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lower[:, 0], outputs[0, :, 0] - half_width, rtol=1e-5, atol=1e-5)
  if df == 1.5:
    assert half_width == pytest.approx(1.1116, abs=1e-4)


def test_a_mixture_of_cauchy_draws_has_ends_where_its_cdf_is_the_level():
  """Cauchy components (df 1: no mean, no variance): the ends are where the mixture's CDF,
  averaged over the draws by hand, is 0.05 and 0.95."""
  from tensorflow_probability.substrates import jax as tfp

  outputs = jnp.array([[[0.0]], [[1.0]], [[5.0]]])  # 3 draws, 1 query
  lower, upper = vj.predictive_interval(
    vj.predictive_distribution(outputs, _student_t_likelihood(1.0)), 0.9
  )
  components = tfp.distributions.StudentT(1.0, outputs[:, 0, 0], NOISE)
  for end, level in ((lower, 0.05), (upper, 0.95)):
    assert float(jnp.mean(components.cdf(end[0, 0]))) == pytest.approx(level, abs=1e-5)


def test_predictive_distribution_refuses_probabilities_for_logits():
  """Probabilities given as logits are refused naming jnp.log(p); their log gives them back."""
  probabilities = jnp.array([[[0.9, 0.1], [0.25, 0.75]]])  # [1 draw, 2 queries, 2 classes]
  with pytest.raises(InputError, match=r"outputs must be logits .* jnp.log\(p\)") as raised:
    vj.predictive_distribution(probabilities, vj.categorical_nll)
  assert "whose every row is in [0, 1] and sums to 1" in _one_line(raised)
  dist = vj.predictive_distribution(jnp.log(probabilities), vj.categorical_nll)
  np.testing.assert_allclose(dist.probs, probabilities[0], rtol=1e-6)


def test_predictive_distribution_refuses_a_classifiers_outputs_without_a_class_axis():
  """[draws, Q] outputs are refused naming the [num_draws, num_query, classes] shape."""
  with pytest.raises(InputError, match=r"outputs must be \[num_draws, num_query, classes\] logits"):
    vj.predictive_distribution(jnp.zeros((4, 6)), vj.categorical_nll)


@pytest.mark.parametrize(
  "level, got", [("0.9", "a str '0.9'"), (None, "None"), (True, "bool"), (1.0, "1.0"), (0.0, "0.0")]
)
def test_predictive_interval_refuses_a_level_that_is_not_a_number_in_0_1(regressor, level, got):
  """A level '0.9', None, True, 1.0 or 0.0 is refused in one line saying it must be a number
  in (0, 1) and naming what was given."""
  dist, _, _ = _regression_predictive(regressor)
  with pytest.raises(
    InputError, match=r"vj.predictive_interval: level must be a number in \(0, 1\)"
  ) as raised:
    vj.predictive_interval(dist, level)
  assert got in _one_line(raised)


def test_jit_of_predictive_interval_says_the_level_must_be_static(regressor):
  """Under jit a traced level is refused in one line naming static_argnames="level"; the
  static form gives the eager numbers."""
  dist, _, _ = _regression_predictive(regressor)
  with pytest.raises(InputError, match='static_argnames="level"') as raised:
    jax.jit(vj.predictive_interval)(dist, 0.9)
  assert "got a traced float32[]" in _one_line(raised)
  jitted = jax.jit(vj.predictive_interval, static_argnames=("level", "num_bisections"))
  for ours, eager in zip(jitted(dist, level=0.8), vj.predictive_interval(dist, 0.8)):
    np.testing.assert_allclose(ours, eager, rtol=1e-6)


def test_a_classifiers_predictive_says_it_has_no_mean_or_variance(classifier):
  """mean, variance and stddev of a classifier's predictive say in one line that class labels
  have none; mode is the argmax of probs."""
  dist, _, _ = _classifier_predictive(classifier)
  for method in (dist.mean, dist.variance, dist.stddev):
    with pytest.raises(
      NotImplementedError, match="PredictiveCategorical.(mean|variance): class labels have no"
    ) as raised:
      method()
    assert len(str(raised.value).splitlines()) == 1
  np.testing.assert_array_equal(dist.mode(), jnp.argmax(dist.probs, axis=-1))


@pytest.mark.parametrize("likelihood", ["class", "instance", "family"])
def test_a_distrax_categorical_is_refused_as_a_likelihood(likelihood):
  """distrax.Categorical as nll (the class, an instance, or in vj.distribution_nll) is
  refused in one line naming vj.categorical_nll."""
  nll = {
    "class": distrax.Categorical,
    "instance": distrax.Categorical(logits=jnp.zeros(3)),
    "family": vj.distribution_nll(lambda outputs: distrax.Categorical(logits=outputs)),
  }[likelihood]
  with pytest.raises(
    InputError, match="vj.predictive_distribution: nll.* vj.categorical_nll"
  ) as raised:
    vj.predictive_distribution(jnp.zeros((4, 6, 3)), nll)
  _one_line(raised)
