"""The distributions API and `vj.summarise`: no silent answers.

A predictive's `log_prob` takes the evaluator's target shapes, an interval has width and
heavy tails, log-stds are finite, probabilities are not taken for logits, a summary scores
the targets its evaluator scored: each gives the right number or refuses in one line naming
the argument and what it got (never `ArrayImpl`). The regression summary's `ece` is the
paper's quantile ECE, and distrax loads without TensorFlow.
"""

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core.distrax_import import import_distrax
from vampire_jax._src.core.errors import InputError
from vampire_jax.data import sine_line

distrax = import_distrax()
NOISE = 0.3


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert "ArrayImpl" not in message, message
  return message


@pytest.fixture(scope="module")
def regression():
  """A VAMPIRE regressor (untrained: the numbers are checked against the evaluator's),
  five sine/line tasks, their keys and the evaluator's per-task results."""
  model = vj.MLP((16,), 1)
  learner = vj.vampire(
    vj.pure_apply(model), vj.gaussian_nll(NOISE), num_mc_query=4, log_std_init=(-2.0, -1.5)
  )
  meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)), jax.random.key(1))
  task_keys = jax.random.split(jax.random.key(2), 5)
  tasks = sine_line.tasks_from_keys(task_keys)
  keys = jax.random.split(jax.random.key(3), 5)
  per_task = vj.make_regression_evaluator(learner, NOISE)(meta_params, tasks, keys)
  return learner, meta_params, tasks, task_keys, keys, per_task


@pytest.fixture(scope="module")
def classification():
  """A 3-way VAMPIRE classifier on 2-D blobs: 4 tasks of 6 queries, and its per-task results."""
  model = vj.MLP((8,), 3)
  learner = vj.vampire(vj.pure_apply(model), vj.categorical_nll, num_mc_query=4)
  meta_params = learner.init(vj.init_params(model, jax.random.key(15), (1, 2)), jax.random.key(16))
  blobs = jax.random.normal(jax.random.key(14), (4, 6, 2))
  labels = jnp.tile(jnp.arange(3), (4, 2))  # [4, 6]
  tasks = vj.Task(blobs + labels[..., None], labels, blobs + 2 * labels[..., None], labels)
  keys = jax.random.split(jax.random.key(17), 4)
  per_task = vj.make_classification_evaluator(learner)(meta_params, tasks, keys)
  return learner, meta_params, tasks, keys, per_task


def _first(tasks):
  return jax.tree.map(lambda field: field[0], tasks)


def _regression_predictive(regression):
  learner, meta_params, tasks, _, keys, per_task = regression
  task = _first(tasks)
  dist = vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, keys[0])
  return dist, task, per_task


def _classifier_predictive(classification):
  learner, meta_params, tasks, keys, per_task = classification
  task = _first(tasks)
  dist = vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, keys[0])
  return dist, task, per_task


# -- 2. A predictive's log_prob takes the evaluator's target shapes, or refuses ---------------


def test_regression_log_prob_refuses_targets_without_their_event_axis(regression):
  """Targets [Q, 1] give the evaluator's NLL; targets [Q] (which would score each query's
  mixture on all Q targets) are refused naming the shape [10, 1] and the one given."""
  dist, task, per_task = _regression_predictive(regression)
  np.testing.assert_allclose(-dist.log_prob(task.query_y).mean(), per_task.nll[0], rtol=1e-5)
  with pytest.raises(
    InputError, match=r"PredictiveMixture.log_prob: value must be shaped \[10, 1\]"
  ) as raised:
    dist.log_prob(task.query_y[:, 0])
  assert _one_line(raised).endswith("got float32[10]")


def test_regression_log_prob_refuses_two_target_columns(regression):
  """Targets [Q, 2] under a 1-D event are refused naming the shape [10, 1] and the one given."""
  dist, task, _ = _regression_predictive(regression)
  with pytest.raises(InputError, match=r"value must be shaped \[10, 1\]") as raised:
    dist.log_prob(jnp.concatenate([task.query_y, task.query_y], axis=1))
  assert "got float32[10, 2]" in _one_line(raised)


def test_regression_log_prob_refuses_integer_targets_and_scalars(regression):
  """A scalar target (one for every query) and integer targets are refused as not float targets."""
  dist, task, _ = _regression_predictive(regression)
  with pytest.raises(InputError, match="value must be an array of float targets") as raised:
    dist.log_prob(1.5)
  _one_line(raised)
  with pytest.raises(InputError, match="value must be float targets, got int32"):
    dist.log_prob(jnp.zeros((10, 1), jnp.int32))


def test_classifier_log_prob_refuses_labels_with_a_trailing_axis(classification):
  """Labels [Q] give the evaluator's NLL; labels [Q, 1] are refused naming the shape [6]."""
  dist, task, per_task = _classifier_predictive(classification)
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
def test_classifier_log_prob_takes_integer_labels_only(classification, value, got):
  """A float scalar, float labels and bool labels are refused naming integer class indices in
  [0, 3) and the dtype and shape given."""
  dist, _, _ = _classifier_predictive(classification)
  with pytest.raises(InputError, match="integer class indices in \\[0, 3\\)") as raised:
    dist.log_prob(value)
  assert f"got {got}" in _one_line(raised)


def test_classifier_log_prob_refuses_one_hot_labels_and_names_argmax(classification):
  """One-hot labels [Q, C] are refused naming jnp.argmax(y, -1) and the shape given."""
  dist, task, _ = _classifier_predictive(classification)
  with pytest.raises(InputError, match=r"jnp.argmax\(y, -1\)") as raised:
    dist.log_prob(jax.nn.one_hot(task.query_y, 3))
  assert "got float32[6, 3]" in _one_line(raised)


@pytest.mark.parametrize("label", [3, -1])
def test_classifier_log_prob_refuses_labels_outside_the_classes(classification, label):
  """A label 3 of 3 classes (or -1) is refused by log_prob and prob, naming the range [0, 3)
  and the label."""
  dist, task, _ = _classifier_predictive(classification)
  labels = task.query_y.at[2].set(label)
  with pytest.raises(InputError, match=r"class indices in \[0, 3\) for 3 outputs") as raised:
    dist.log_prob(labels)
  assert f"[{label}]" in _one_line(raised)
  with pytest.raises(InputError, match="PredictiveCategorical.prob"):
    dist.prob(labels)


def test_a_predictive_made_under_vmap_and_jit_scores_each_tasks_targets(regression):
  """The evaluator's target shapes with a task axis: a predictive of batch [tasks, Q] takes
  `tasks.query_y` [tasks, Q, 1] and gives each task's NLL; samples keep working."""
  learner, meta_params, tasks, _, keys, per_task = regression

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
  first_lower, first_upper = vj.predictive_interval(_regression_predictive(regression)[0], 0.9)
  np.testing.assert_allclose(lower[0], first_lower, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(upper[0], first_upper, rtol=1e-5, atol=1e-5)
  # A slice keeps the checks: one task's predictive, one task's targets.
  np.testing.assert_allclose(-dist[0].log_prob(tasks.query_y[0]).mean(), per_task.nll[0], rtol=1e-5)
  with pytest.raises(InputError, match=r"value must be shaped \[10, 1\]"):
    dist[0].log_prob(tasks.query_y[0, :, 0])


# -- 3. The interval: at least one bisection, and heavy tails ------------------------------


@pytest.mark.parametrize("num_bisections", [0, -1, 2.5, True])
def test_predictive_interval_refuses_fewer_than_one_bisection(regression, num_bisections):
  """num_bisections 0, -1, 2.5 and True are refused as not an integer >= 1; one bisection
  gives an interval of positive width."""
  dist, _, _ = _regression_predictive(regression)
  with pytest.raises(
    InputError, match="predictive_interval: num_bisections must be an integer >= 1"
  ) as raised:
    vj.predictive_interval(dist, 0.9, num_bisections=num_bisections)
  _one_line(raised)
  lower, upper = vj.predictive_interval(dist, 0.9, num_bisections=1)
  assert bool(jnp.all(upper > lower))


def _student_t_likelihood(df):
  from tensorflow_probability.substrates import jax as tfp

  return vj.distribution_nll(lambda out: tfp.distributions.StudentT(df, out, NOISE))


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


# -- 4. gaussian_from_distrax: positive scales, and the dtype kept ------------------------


@pytest.mark.parametrize("scale", [0.0, -0.5, math.nan, math.inf])
def test_gaussian_from_distrax_refuses_a_scale_whose_log_is_not_finite(scale):
  """A scale of 0, -0.5, NaN or inf (log-std -inf or NaN) is refused naming the leaf."""
  tree = {"w": distrax.Normal(jnp.zeros(3), jnp.array([1.0, scale, 1.0]))}
  with pytest.raises(
    InputError, match=r"gaussian_from_distrax: tree\['w'\].scale must be finite and > 0"
  ) as raised:
    vj.gaussian_from_distrax(tree)
  _one_line(raised)


def test_gaussian_from_distrax_refuses_a_nan_mean():
  """A NaN loc is refused naming the leaf's loc and the count of non-finite values."""
  tree = {"w": distrax.Normal(jnp.array([0.0, jnp.nan]), jnp.ones(2))}
  with pytest.raises(
    InputError, match=r"tree\['w'\].loc must be finite, got 1 NaN or inf"
  ) as raised:
    vj.gaussian_from_distrax(tree)
  _one_line(raised)


def test_gaussian_from_distrax_keeps_float64_under_x64():
  """Under JAX_ENABLE_X64, to_distrax -> gaussian_from_distrax keeps float64 and round-trips
  the log-stds to 1e-14: the two are inverses, as the docs say."""
  code = (
    "import jax.numpy as jnp, numpy as np, vampire_jax as vj\n"
    "g = vj.Gaussian({'w': jnp.full(3, 0.1, jnp.float64)}, {'w': jnp.full(3, -1.1, jnp.float64)})\n"
    "back = vj.gaussian_from_distrax(vj.to_distrax(g))\n"
    "print(back.mean['w'].dtype, back.log_std['w'].dtype,\n"
    "      float(np.max(np.abs(np.asarray(back.log_std['w']) + 1.1))))\n"
  )
  env = dict(os.environ, JAX_ENABLE_X64="1")
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
  )
  mean_dtype, log_std_dtype, error = out.stdout.split()
  assert (mean_dtype, log_std_dtype) == ("float64", "float64")
  assert float(error) < 1e-14  # float64's round trip through exp and log


# -- 6. vj.summarise: the targets the evaluator scored --------------------------------------


def test_summarise_refuses_other_labels_than_the_evaluators(classification):
  """Labels other than those the evaluator scored (which would mix the accuracy and NLL of
  one set with the ECE and AURC of another) are refused naming per_task['accuracy']."""
  _, _, tasks, _, per_task = classification
  summary = vj.summarise("classification", per_task, tasks.query_y)
  assert summary.metrics["accuracy"] == pytest.approx(float(np.mean(per_task.accuracy)))
  shifted = (tasks.query_y + 1) % 3
  with pytest.raises(
    InputError, match="summarise: targets must be those the evaluator scored"
  ) as raised:
    vj.summarise("classification", per_task, shifted)
  assert "per_task['accuracy']" in _one_line(raised)


def test_summarise_refuses_the_same_labels_of_other_tasks(classification):
  """Tasks in another order: the labels' multiset per task is the same, the NLL is not."""
  _, _, tasks, _, per_task = classification
  with pytest.raises(InputError, match="targets must be those the evaluator scored"):
    vj.summarise("classification", per_task, tasks.query_y[:, ::-1])


def test_summarise_refuses_other_regression_targets(regression):
  """Regression targets other than the evaluator's are refused naming per_task['mse']."""
  _, _, tasks, _, _, per_task = regression
  with pytest.raises(
    InputError, match=r"targets must be those the evaluator scored .* per_task\['mse'\]"
  ) as raised:
    vj.summarise("regression", per_task, tasks.query_y[::-1], noise_std=NOISE)
  _one_line(raised)


def test_summarise_refuses_another_noise_std_than_the_evaluators(regression):
  """noise_std 0.5 for an evaluator of 0.3 is refused: it must be the evaluator's."""
  _, _, tasks, _, _, per_task = regression
  with pytest.raises(InputError, match="summarise: noise_std must be the evaluator's") as raised:
    vj.summarise("regression", per_task, tasks.query_y, noise_std=0.5)
  _one_line(raised)


# -- 7. Probabilities where logits are wanted --------------------------------------------


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


# -- 12. The distributions API's refusals -----------------------------------------------------


@pytest.mark.parametrize(
  "level, got", [("0.9", "a str '0.9'"), (None, "None"), (True, "bool"), (1.0, "1.0"), (0.0, "0.0")]
)
def test_predictive_interval_refuses_a_level_that_is_not_a_number_in_0_1(regression, level, got):
  """A level '0.9', None, True, 1.0 or 0.0 is refused in one line saying it must be a number
  in (0, 1) and naming what was given."""
  dist, _, _ = _regression_predictive(regression)
  with pytest.raises(
    InputError, match=r"vj.predictive_interval: level must be a number in \(0, 1\)"
  ) as raised:
    vj.predictive_interval(dist, level)
  assert got in _one_line(raised)


def test_jit_of_predictive_interval_says_the_level_must_be_static(regression):
  """Under jit a traced level is refused in one line naming static_argnames="level"; the
  static form gives the eager numbers."""
  dist, _, _ = _regression_predictive(regression)
  with pytest.raises(InputError, match='static_argnames="level"') as raised:
    jax.jit(vj.predictive_interval)(dist, 0.9)
  assert "got a traced float32[]" in _one_line(raised)
  jitted = jax.jit(vj.predictive_interval, static_argnames=("level", "num_bisections"))
  for ours, eager in zip(jitted(dist, level=0.8), vj.predictive_interval(dist, 0.8)):
    np.testing.assert_allclose(ours, eager, rtol=1e-6)


def test_a_classifiers_predictive_says_it_has_no_mean_or_variance(classification):
  """mean, variance and stddev of a classifier's predictive say in one line that class labels
  have none; mode is the argmax of probs."""
  dist, _, _ = _classifier_predictive(classification)
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


@pytest.mark.parametrize(
  "call, names",
  [
    (lambda d, a: vj.gaussian_from_distrax({"w": a}), "tree must be a tree of distrax.Normal"),
    (lambda d, a: vj.to_distrax(a), "vj.to_distrax: dist must be a vj.Gaussian"),
    (lambda d, a: vj.predictive_interval(a), "vj.predictive_interval: distribution must be"),
    (lambda d, a: vj.uncertainty(d), "vj.uncertainty: draws must be per-draw class"),
    (lambda d, a: vj.regression_uncertainty(d, 0.3), "vj.regression_uncertainty: draws must"),
  ],
)
def test_refusals_name_what_they_got_not_arrayimpl(classification, call, names):
  """Each refusal names the argument and what it got as a dtype and shape (float32[2]) or as
  a distribution, never `ArrayImpl`."""
  dist, _, _ = _classifier_predictive(classification)
  with pytest.raises(InputError, match=names) as raised:
    call(dist, jnp.zeros(2))
  message = _one_line(raised)
  assert "float32[2]" in message or "a distribution (vampire_jax PredictiveCategorical" in message


# -- 16. vj.summarise's inputs -----------------------------------------------------------------


def test_summarise_accepts_regression_targets_without_their_last_axis(regression):
  """Regression targets [tasks, queries], a documented form, give the same summary as
  [tasks, queries, 1]."""
  _, _, tasks, _, _, per_task = regression
  with_axis = vj.summarise("regression", per_task, tasks.query_y, noise_std=NOISE)
  without = vj.summarise("regression", per_task, tasks.query_y[..., 0], noise_std=NOISE)
  assert without.metrics == with_axis.metrics
  assert without.metrics["mse"] == pytest.approx(float(np.mean(per_task.mse)))


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_summarise_refuses_the_other_kinds_results(regression, classification, kind):
  """The other kind's results are refused in one line naming vj.summarise('<other kind>')."""
  per_task, targets = (
    (regression[5], regression[2].query_y)
    if kind == "classification"
    else (classification[4], classification[2].query_y)
  )
  other = "regression" if kind == "classification" else "classification"
  with pytest.raises(InputError, match=f"summarise it as vj.summarise\\('{other}'") as raised:
    vj.summarise(kind, per_task, targets, noise_std=NOISE)
  _one_line(raised)


def test_summarise_names_a_missing_field(classification):
  """A dict without 'probabilities' is refused naming vj.ClassificationEval's fields."""
  _, _, tasks, _, per_task = classification
  fields = {"accuracy": per_task.accuracy, "nll": per_task.nll}
  with pytest.raises(
    InputError,
    match="per_task must hold vj.ClassificationEval's fields .* got none named 'probabilities'",
  ) as raised:
    vj.summarise("classification", fields, tasks.query_y)
  _one_line(raised)


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_summarise_refuses_zero_tasks(regression, classification, kind):
  """Results of zero tasks are refused naming per_task and the one task it needs at least."""
  per_task, targets = (
    (classification[4], classification[2].query_y)
    if kind == "classification"
    else (regression[5], regression[2].query_y)
  )
  empty = jax.tree.map(lambda field: field[:0], per_task)
  with pytest.raises(
    InputError, match="summarise: per_task must be the results of at least one task, got zero tasks"
  ):
    vj.summarise(kind, empty, targets[:0], noise_std=NOISE)


def test_summarise_refuses_a_list_of_floats(classification):
  """A list of floats as per_task is refused as not an evaluator's result, naming the list."""
  _, _, tasks, _, _ = classification
  with pytest.raises(
    InputError, match=r"per_task must be an evaluator's result .* got a list"
  ) as raised:
    vj.summarise("classification", [0.5, 0.6], tasks.query_y)
  _one_line(raised)


def test_summarise_names_nan_probabilities_as_nan(classification):
  """NaN probabilities are named as NaN with the tasks that hold them, not as logits."""
  _, _, tasks, _, per_task = classification
  broken = per_task._replace(probabilities=per_task.probabilities.at[2, 0, 0].set(jnp.nan))
  with pytest.raises(
    InputError,
    match=r"per_task\['probabilities'\] must be finite, got NaN .* 1 of 4 tasks \(tasks \[2\]\)",
  ) as raised:
    vj.summarise("classification", broken, tasks.query_y)
  assert "logits" not in _one_line(raised)


def test_summarise_names_nan_regression_predictions(regression):
  """A diverged task's NaN predictions are refused naming per_task['predictions'] and the task."""
  _, _, tasks, _, _, per_task = regression
  broken = per_task._replace(predictions=per_task.predictions.at[3, 0, 0, 0].set(jnp.nan))
  with pytest.raises(InputError, match=r"per_task\['predictions'\] must be finite, .*tasks \[3\]"):
    vj.summarise("regression", broken, tasks.query_y, noise_std=NOISE)


@pytest.mark.parametrize(
  "labels, got",
  [
    (lambda y: jax.nn.one_hot(y, 3), "float32[4, 6, 3]"),
    (lambda y: y.astype(jnp.float32), "float32[4, 6]"),
    (lambda y: y > 0, "bool[4, 6]"),
  ],
)
def test_summarise_takes_integer_labels_only(classification, labels, got):
  """One-hot, float and bool labels are refused naming [4, 6] integer class indices and the
  dtype and shape given."""
  _, _, tasks, _, per_task = classification
  with pytest.raises(InputError, match=r"targets must be \[4, 6\] integer class indices") as raised:
    vj.summarise("classification", per_task, labels(tasks.query_y))
  assert f"got {got}" in _one_line(raised)


@pytest.mark.parametrize("kind, error", [("regresion", "'regresion'"), (None, "None")])
def test_summarise_names_an_unknown_kind(classification, kind, error):
  """An unknown kind is refused naming summarise, the kinds it takes and the one given."""
  _, _, tasks, _, per_task = classification
  with pytest.raises(
    InputError, match=f"summarise: kind must be one of 'classification', 'regression', got {error}"
  ):
    vj.summarise(kind, per_task, tasks.query_y)


# -- Issue 50: the regression summary's ECE, its noise_std, distrax without TensorFlow ---------


def test_the_regression_summarys_ece_is_the_papers_quantile_ece(regression):
  """Given the noiseless truth, `vj.summarise("regression", ...)`'s `ece`/`mce` are
  `vj.paper_quantile_calibration`'s (the README's ECE, 0.092, is the paper's quantile ECE),
  as results.json has them; truth of another shape is refused."""
  _, _, tasks, task_keys, _, per_task = regression
  truth = sine_line.query_truth_from_keys(task_keys)
  summary = vj.summarise("regression", per_task, tasks.query_y, noise_std=NOISE, truth=truth)
  paper = vj.paper_quantile_calibration(per_task.predictions[..., 0], truth[..., 0], NOISE)
  assert summary.metrics["ece"] == paper.ece and summary.metrics["mce"] == paper.mce
  assert 0.0 < paper.ece < 0.5
  with pytest.raises(
    InputError, match=r"summarise: truth must be \[5, 10\] or \[5, 10, 1\] floats"
  ):
    vj.summarise("regression", per_task, tasks.query_y, noise_std=NOISE, truth=truth[:, :3])


@pytest.mark.parametrize("noise_std, got", [(None, "None"), ("0.3", "a str '0.3'"), (0.0, "0.0")])
def test_summarise_without_noise_std_says_which_function_and_argument(regression, noise_std, got):
  """A missing, string or zero noise_std is refused in one line that starts "summarise:
  noise_std" and ends with the value given."""
  _, _, tasks, _, _, per_task = regression
  with pytest.raises(
    InputError, match="^summarise: noise_std must be the likelihood's noise"
  ) as raised:
    vj.summarise("regression", per_task, tasks.query_y, noise_std=noise_std)
  assert _one_line(raised).endswith(f"got {got}")


def test_distrax_loads_without_importing_tensorflow():
  """The first `vj.predictive` loads distrax without importing TensorFlow (which TFP's JAX
  substrate tries where it is installed, to copy docstrings, at 16-22 s on a loaded 2-core
  CPU): its log-probability is right, no TensorFlow module or start-up line appears, and
  TensorFlow stays importable as usual."""
  code = (
    "import sys, jax, vampire_jax as vj\n"
    "dist = vj.predictive_distribution(jax.numpy.zeros((2, 3, 1)), vj.gaussian_nll(0.3))\n"
    "print(float(dist.log_prob(jax.numpy.zeros((3, 1))).sum()))\n"
    "print('tensorflow' in sys.modules, sys.modules.get('tensorflow', 'absent'))\n"
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
  )
  log_prob, imported = out.stdout.strip().splitlines()[-2:]
  expected = 3 * (-math.log(NOISE) - 0.5 * math.log(2 * math.pi))
  assert float(log_prob) == pytest.approx(expected, rel=1e-5)
  assert imported == "False absent"
  assert "oneDNN" not in out.stderr and "cpu_feature_guard" not in out.stderr
