"""The distributions API and `vj.summarise`: no silent answers (the fourth sweep, issue 49).

Each case below was a silent answer or a poor refusal before: a predictive's `log_prob`
that broadcast targets of another shape, an interval of zero width or NaN, log-stds of
-inf, probabilities softmaxed twice, a summary that mixed two sets of targets, and
refusals that named `ArrayImpl` or none of the arguments. Each now gives the right number
or refuses in one line naming the argument. Also from issue 50: the regression summary's
`ece` is the paper's quantile ECE, and distrax loads without TensorFlow.
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
  """Before: targets [Q] gave [Q] numbers, each query's mixture scored on all Q targets
  (NLL 1938 instead of 182 on a trained run)."""
  dist, task, per_task = _regression_predictive(regression)
  np.testing.assert_allclose(-dist.log_prob(task.query_y).mean(), per_task.nll[0], rtol=1e-5)
  with pytest.raises(
    InputError, match=r"PredictiveMixture.log_prob: value must be shaped \[10, 1\]"
  ) as raised:
    dist.log_prob(task.query_y[:, 0])
  assert _one_line(raised).endswith("got float32[10]")


def test_regression_log_prob_refuses_two_target_columns(regression):
  """Before: targets [Q, 2] summed the log-densities of both columns under a 1-D event."""
  dist, task, _ = _regression_predictive(regression)
  with pytest.raises(InputError, match=r"value must be shaped \[10, 1\]") as raised:
    dist.log_prob(jnp.concatenate([task.query_y, task.query_y], axis=1))
  assert "got float32[10, 2]" in _one_line(raised)


def test_regression_log_prob_refuses_integer_targets_and_scalars(regression):
  """Before: log_prob(1.5) broadcast one target to every query; integer targets were scored."""
  dist, task, _ = _regression_predictive(regression)
  with pytest.raises(InputError, match="value must be an array of float targets") as raised:
    dist.log_prob(1.5)
  _one_line(raised)
  with pytest.raises(InputError, match="value must be float targets, got int32"):
    dist.log_prob(jnp.zeros((10, 1), jnp.int32))


def test_classifier_log_prob_refuses_labels_with_a_trailing_axis(classification):
  """Before: labels [Q, 1] gave a [Q, Q] table of every query's probability of every label."""
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
  """Before: log_prob(1.5) returned probability 1; float labels were truncated to a class;
  bool labels failed deep in distrax ("iota does not accept dtype bool")."""
  dist, _, _ = _classifier_predictive(classification)
  with pytest.raises(InputError, match="integer class indices in \\[0, 3\\)") as raised:
    dist.log_prob(value)
  assert f"got {got}" in _one_line(raised)


def test_classifier_log_prob_refuses_one_hot_labels_and_names_argmax(classification):
  """Before: one-hot labels [Q, C] failed with "Incompatible shapes for broadcasting"."""
  dist, task, _ = _classifier_predictive(classification)
  with pytest.raises(InputError, match=r"jnp.argmax\(y, -1\)") as raised:
    dist.log_prob(jax.nn.one_hot(task.query_y, 3))
  assert "got float32[6, 3]" in _one_line(raised)


@pytest.mark.parametrize("label", [3, -1])
def test_classifier_log_prob_refuses_labels_outside_the_classes(classification, label):
  """Before: a label 3 of 3 classes (or -1) gave a log-probability without a word."""
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
  """Before: num_bisections 0 or -1 gave a zero-width interval: lower == upper."""
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
  """Before: with df <= 2 the bracket came from an infinite standard deviation and the
  interval was NaN. One draw: the mixture is the Student-t itself, whose quantiles TFP
  computes in closed form (df 1.5: +-1.1116 at level 0.9)."""
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
  """Before: a scale of 0 gave log-stds of -inf, a negative one NaN, then NaN posteriors."""
  tree = {"w": distrax.Normal(jnp.zeros(3), jnp.array([1.0, scale, 1.0]))}
  with pytest.raises(
    InputError, match=r"gaussian_from_distrax: tree\['w'\].scale must be finite and > 0"
  ) as raised:
    vj.gaussian_from_distrax(tree)
  _one_line(raised)


def test_gaussian_from_distrax_refuses_a_nan_mean():
  """The same family: a NaN loc became a NaN mean without a word."""
  tree = {"w": distrax.Normal(jnp.array([0.0, jnp.nan]), jnp.ones(2))}
  with pytest.raises(
    InputError, match=r"tree\['w'\].loc must be finite, got 1 NaN or inf"
  ) as raised:
    vj.gaussian_from_distrax(tree)
  _one_line(raised)


def test_gaussian_from_distrax_keeps_float64_under_x64():
  """Before: under JAX_ENABLE_X64, to_distrax -> gaussian_from_distrax turned float64 into
  float32, though the docs call them inverses."""
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
  """Before: other labels gave accuracy and NLL from one set, ECE and AURC from the other
  (accuracy 0.29 next to an AURC of 0.90)."""
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
  """Before: the MSE and NLL were the evaluator's, the PIT calibration of other targets."""
  _, _, tasks, _, _, per_task = regression
  with pytest.raises(
    InputError, match=r"targets must be those the evaluator scored .* per_task\['mse'\]"
  ) as raised:
    vj.summarise("regression", per_task, tasks.query_y[::-1], noise_std=NOISE)
  _one_line(raised)


def test_summarise_refuses_another_noise_std_than_the_evaluators(regression):
  """Before: noise_std 0.5 for an evaluator of 0.3 gave its NLL beside a PIT and a variance
  split of 0.5."""
  _, _, tasks, _, _, per_task = regression
  with pytest.raises(InputError, match="summarise: noise_std must be the evaluator's") as raised:
    vj.summarise("regression", per_task, tasks.query_y, noise_std=0.5)
  _one_line(raised)


# -- 7. Probabilities where logits are wanted --------------------------------------------


def test_predictive_distribution_refuses_probabilities_for_logits():
  """Before: probabilities were softmaxed again: [0.9, 0.1] became [0.69, 0.31]."""
  probabilities = jnp.array([[[0.9, 0.1], [0.25, 0.75]]])  # [1 draw, 2 queries, 2 classes]
  with pytest.raises(InputError, match=r"outputs must be logits .* jnp.log\(p\)") as raised:
    vj.predictive_distribution(probabilities, vj.categorical_nll)
  assert "whose every row is in [0, 1] and sums to 1" in _one_line(raised)
  dist = vj.predictive_distribution(jnp.log(probabilities), vj.categorical_nll)
  np.testing.assert_allclose(dist.probs, probabilities[0], rtol=1e-6)


def test_predictive_distribution_refuses_a_classifiers_outputs_without_a_class_axis():
  """Before: [draws, Q] logits were read as one distribution over Q 'classes'."""
  with pytest.raises(InputError, match=r"outputs must be \[num_draws, num_query, classes\] logits"):
    vj.predictive_distribution(jnp.zeros((4, 6)), vj.categorical_nll)


# -- 12. The distributions API's refusals -----------------------------------------------------


@pytest.mark.parametrize(
  "level, got", [("0.9", "a str '0.9'"), (None, "None"), (True, "bool"), (1.0, "1.0"), (0.0, "0.0")]
)
def test_predictive_interval_refuses_a_level_that_is_not_a_number_in_0_1(regression, level, got):
  """Before: "'<' not supported between instances of 'float' and 'str'" (or 'NoneType'), and
  True was read as 1.0; 0.0 and 1.0 were refused already, by the same line."""
  dist, _, _ = _regression_predictive(regression)
  with pytest.raises(
    InputError, match=r"vj.predictive_interval: level must be a number in \(0, 1\)"
  ) as raised:
    vj.predictive_interval(dist, level)
  assert got in _one_line(raised)


def test_jit_of_predictive_interval_says_the_level_must_be_static(regression):
  """Before: a TracerBoolConversionError of many lines under jit; now the fix is named, and
  the static form gives the eager numbers."""
  dist, _, _ = _regression_predictive(regression)
  with pytest.raises(InputError, match='static_argnames="level"') as raised:
    jax.jit(vj.predictive_interval)(dist, 0.9)
  assert "got a traced float32[]" in _one_line(raised)
  jitted = jax.jit(vj.predictive_interval, static_argnames=("level", "num_bisections"))
  for ours, eager in zip(jitted(dist, level=0.8), vj.predictive_interval(dist, 0.8)):
    np.testing.assert_allclose(ours, eager, rtol=1e-6)


def test_a_classifiers_predictive_says_it_has_no_mean_or_variance(classification):
  """Before: "Distribution `Categorical` does not implement `mean`", while the README listed
  mean among its methods; now it names what to use, and the README lists probs and mode."""
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
  """Before: distrax.Categorical as nll "names no distribution"; in vj.distribution_nll it
  failed deep in distrax ("mixture_distribution.batch_shape ((6,)) is not compatible")."""
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
  """Before: "got ['ArrayImpl']", "expected a vampire_jax.Gaussian, got ArrayImpl", "got
  int32[]" for a distribution, "setting an array element with a sequence"."""
  dist, _, _ = _classifier_predictive(classification)
  with pytest.raises(InputError, match=names) as raised:
    call(dist, jnp.zeros(2))
  message = _one_line(raised)
  assert "float32[2]" in message or "a distribution (vampire_jax PredictiveCategorical" in message


# -- 16. vj.summarise's inputs -----------------------------------------------------------------


def test_summarise_accepts_regression_targets_without_their_last_axis(regression):
  """Before: targets [tasks, queries], a documented form, were refused with "got shapes
  (5, 4, 10) and (5,)"."""
  _, _, tasks, _, _, per_task = regression
  with_axis = vj.summarise("regression", per_task, tasks.query_y, noise_std=NOISE)
  without = vj.summarise("regression", per_task, tasks.query_y[..., 0], noise_std=NOISE)
  assert without.metrics == with_axis.metrics
  assert without.metrics["mse"] == pytest.approx(float(np.mean(per_task.mse)))


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_summarise_refuses_the_other_kinds_results(regression, classification, kind):
  """Before: KeyError: 'accuracy' (or 'mse')."""
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
  """Before: KeyError: 'probabilities'."""
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
  """Before: "values must not be empty"."""
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
  """Before: "cannot convert dictionary update sequence element #0 to a sequence"."""
  _, _, tasks, _, _ = classification
  with pytest.raises(
    InputError, match=r"per_task must be an evaluator's result .* got a list"
  ) as raised:
    vj.summarise("classification", [0.5, 0.6], tasks.query_y)
  _one_line(raised)


def test_summarise_names_nan_probabilities_as_nan(classification):
  """Before: "probabilities must lie in [0, 1] (pass softmax outputs, not logits)"."""
  _, _, tasks, _, per_task = classification
  broken = per_task._replace(probabilities=per_task.probabilities.at[2, 0, 0].set(jnp.nan))
  with pytest.raises(
    InputError,
    match=r"per_task\['probabilities'\] must be finite, got NaN .* 1 of 4 tasks \(tasks \[2\]\)",
  ) as raised:
    vj.summarise("classification", broken, tasks.query_y)
  assert "logits" not in _one_line(raised)


def test_summarise_names_nan_regression_predictions(regression):
  """The same family: a diverged task's NaN predictions gave a NaN MSE without a word."""
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
  """Before: one-hot labels: "labels must have shape (4, 6) to match ..."; float labels were
  read as classes without a word."""
  _, _, tasks, _, per_task = classification
  with pytest.raises(InputError, match=r"targets must be \[4, 6\] integer class indices") as raised:
    vj.summarise("classification", per_task, labels(tasks.query_y))
  assert f"got {got}" in _one_line(raised)


@pytest.mark.parametrize("kind, error", [("regresion", "'regresion'"), (None, "None")])
def test_summarise_names_an_unknown_kind(classification, kind, error):
  """Before: a ConfigError without the function's name ("problem kind 'regresion' is
  unknown")."""
  _, _, tasks, _, per_task = classification
  with pytest.raises(
    InputError, match=f"summarise: kind must be one of 'classification', 'regression', got {error}"
  ):
    vj.summarise(kind, per_task, tasks.query_y)


# -- Issue 50: the regression summary's ECE, its noise_std, distrax without TensorFlow ---------


def test_the_regression_summarys_ece_is_the_papers_quantile_ece(regression):
  """Before: `vj.summarise("regression", ...)` gave `pit_ece` only; the README's ECE (0.092)
  is the paper's quantile ECE. Given the noiseless truth, the summary's `ece`/`mce` are
  `vj.paper_quantile_calibration`'s, as results.json has them."""
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
  """Before: `ValueError: regression summaries need the likelihood's noise_std`, without the
  usual "function: argument" start."""
  _, _, tasks, _, _, per_task = regression
  with pytest.raises(
    InputError, match="^summarise: noise_std must be the likelihood's noise"
  ) as raised:
    vj.summarise("regression", per_task, tasks.query_y, noise_std=noise_std)
  assert _one_line(raised).endswith(f"got {got}")


def test_distrax_loads_without_importing_tensorflow():
  """Before: the first `vj.predictive` imported TensorFlow (where installed) through TFP's
  JAX substrate, which tries it to copy docstrings: its start-up log lines printed, and
  distrax took 26-32 s to import instead of 10 s on a loaded 2-core CPU. After the call,
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
