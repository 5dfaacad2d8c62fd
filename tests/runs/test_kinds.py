"""The distributions API and `vj.summarise`: no silent answers.

A predictive's `log_prob` takes the evaluator's target shapes, an interval has width and
heavy tails, log-stds are finite, probabilities are not taken for logits, a summary scores
the targets its evaluator scored: each gives the right number or refuses in one line naming
the argument and what it got (never `ArrayImpl`). The regression summary's `ece` is the
paper's quantile ECE, and distrax loads without TensorFlow.
"""

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.conftest import tiny_regression_config
from tests.helpers import NOISE, _small_regression
from vampire_jax._src.core.errors import ConfigError, InputError
from vampire_jax._src.metrics import calibration, summary_inputs
from vampire_jax.data import sine_line
from vampire_jax.runs import kinds


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert "ArrayImpl" not in message, message
  return message


def _with_mae(evaluate):
  def with_mae(meta_params, tasks, keys):
    result = evaluate(meta_params, tasks, keys)
    mae = jnp.mean(jnp.abs(jnp.mean(result.predictions, axis=1) - tasks.query_y), axis=(1, 2))
    return _MaeEval(*result, mae)

  return with_mae


class _MaeEval(NamedTuple):
  mse: jax.Array
  predictive_mean_mse: jax.Array
  nll: jax.Array
  predictions: jax.Array
  mae: jax.Array  # [tasks], the new kind's score


def _regression_tasks(predictions: np.ndarray, targets: np.ndarray) -> dict:
  """Per-task results of point predictions `[tasks, query]` against `targets` `[tasks, query]`."""
  squared = np.square(predictions - targets)
  return dict(
    mse=squared.mean(axis=1),
    predictive_mean_mse=squared.mean(axis=1),
    nll=np.mean(0.5 * squared / 0.09 + np.log(0.3 * np.sqrt(2 * np.pi)), axis=1),  # noise 0.3
    predictions=predictions[:, None, :, None],
  )


def test_summarise_refuses_other_labels_than_the_evaluators(classifier):
  """Labels other than those the evaluator scored (which would mix the accuracy and NLL of
  one set with the ECE and AURC of another) are refused naming per_task['accuracy']."""
  _, _, tasks, _, per_task = classifier
  summary = vj.summarise("classification", per_task, tasks.query_y)
  assert summary.metrics["accuracy"] == pytest.approx(float(np.mean(per_task.accuracy)))
  shifted = (tasks.query_y + 1) % 3
  with pytest.raises(
    InputError, match="summarise: targets must be those the evaluator scored"
  ) as raised:
    vj.summarise("classification", per_task, shifted)
  assert "per_task['accuracy']" in _one_line(raised)


def test_summarise_refuses_the_same_labels_of_other_tasks(classifier):
  """Tasks in another order: the labels' multiset per task is the same, the NLL is not."""
  _, _, tasks, _, per_task = classifier
  with pytest.raises(InputError, match="targets must be those the evaluator scored"):
    vj.summarise("classification", per_task, tasks.query_y[:, ::-1])


def test_summarise_refuses_other_regression_targets(regressor):
  """Regression targets other than the evaluator's are refused naming per_task['mse']."""
  _, _, tasks, _, _, per_task = regressor
  with pytest.raises(
    InputError, match=r"targets must be those the evaluator scored .* per_task\['mse'\]"
  ) as raised:
    vj.summarise("regression", per_task, tasks.query_y[::-1], noise_std=NOISE)
  _one_line(raised)


def test_summarise_refuses_another_noise_std_than_the_evaluators(regressor):
  """noise_std 0.5 for an evaluator of 0.3 is refused: it must be the evaluator's."""
  _, _, tasks, _, _, per_task = regressor
  with pytest.raises(InputError, match="summarise: noise_std must be the evaluator's") as raised:
    vj.summarise("regression", per_task, tasks.query_y, noise_std=0.5)
  _one_line(raised)


def test_summarise_accepts_regression_targets_without_their_last_axis(regressor):
  """Regression targets [tasks, queries], a documented form, give the same summary as
  [tasks, queries, 1]."""
  _, _, tasks, _, _, per_task = regressor
  with_axis = vj.summarise("regression", per_task, tasks.query_y, noise_std=NOISE)
  without = vj.summarise("regression", per_task, tasks.query_y[..., 0], noise_std=NOISE)
  assert without.metrics == with_axis.metrics
  assert without.metrics["mse"] == pytest.approx(float(np.mean(per_task.mse)))


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_summarise_refuses_the_other_kinds_results(regressor, classifier, kind):
  """The other kind's results are refused in one line naming vj.summarise('<other kind>')."""
  per_task, targets = (
    (regressor[5], regressor[2].query_y)
    if kind == "classification"
    else (classifier[4], classifier[2].query_y)
  )
  other = "regression" if kind == "classification" else "classification"
  with pytest.raises(InputError, match=f"summarise it as vj.summarise\\('{other}'") as raised:
    vj.summarise(kind, per_task, targets, noise_std=NOISE)
  _one_line(raised)


def test_summarise_names_a_missing_field(classifier):
  """A dict without 'probabilities' is refused naming vj.ClassificationEval's fields."""
  _, _, tasks, _, per_task = classifier
  fields = {"accuracy": per_task.accuracy, "nll": per_task.nll}
  with pytest.raises(
    InputError,
    match="per_task must hold vj.ClassificationEval's fields .* got none named 'probabilities'",
  ) as raised:
    vj.summarise("classification", fields, tasks.query_y)
  _one_line(raised)


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_summarise_refuses_zero_tasks(regressor, classifier, kind):
  """Results of zero tasks are refused naming per_task and the one task it needs at least."""
  per_task, targets = (
    (classifier[4], classifier[2].query_y)
    if kind == "classification"
    else (regressor[5], regressor[2].query_y)
  )
  empty = jax.tree.map(lambda field: field[:0], per_task)
  with pytest.raises(
    InputError, match="summarise: per_task must be the results of at least one task, got zero tasks"
  ):
    vj.summarise(kind, empty, targets[:0], noise_std=NOISE)


def test_summarise_refuses_a_list_of_floats(classifier):
  """A list of floats as per_task is refused as not an evaluator's result, naming the list."""
  _, _, tasks, _, _ = classifier
  with pytest.raises(
    InputError, match=r"per_task must be an evaluator's result .* got a list"
  ) as raised:
    vj.summarise("classification", [0.5, 0.6], tasks.query_y)
  _one_line(raised)


def test_summarise_names_nan_probabilities_as_nan(classifier):
  """NaN probabilities are named as NaN with the tasks that hold them, not as logits."""
  _, _, tasks, _, per_task = classifier
  broken = per_task._replace(probabilities=per_task.probabilities.at[2, 0, 0].set(jnp.nan))
  with pytest.raises(
    InputError,
    match=r"per_task\['probabilities'\] must be finite, got NaN .* 1 of 4 tasks \(tasks \[2\]\)",
  ) as raised:
    vj.summarise("classification", broken, tasks.query_y)
  assert "logits" not in _one_line(raised)


def test_summarise_names_nan_regression_predictions(regressor):
  """A diverged task's NaN predictions are refused naming per_task['predictions'] and the task."""
  _, _, tasks, _, _, per_task = regressor
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
def test_summarise_takes_integer_labels_only(classifier, labels, got):
  """One-hot, float and bool labels are refused naming [4, 6] integer class indices and the
  dtype and shape given."""
  _, _, tasks, _, per_task = classifier
  with pytest.raises(InputError, match=r"targets must be \[4, 6\] integer class indices") as raised:
    vj.summarise("classification", per_task, labels(tasks.query_y))
  assert f"got {got}" in _one_line(raised)


@pytest.mark.parametrize("kind, error", [("regresion", "'regresion'"), (None, "None")])
def test_summarise_names_an_unknown_kind(classifier, kind, error):
  """An unknown kind is refused naming summarise, the kinds it takes and the one given."""
  _, _, tasks, _, per_task = classifier
  with pytest.raises(
    InputError, match=f"summarise: kind must be one of 'classification', 'regression', got {error}"
  ):
    vj.summarise(kind, per_task, tasks.query_y)


def test_the_regression_summarys_ece_is_the_papers_quantile_ece(regressor):
  """Given the noiseless truth, `vj.summarise("regression", ...)`'s `ece`/`mce` are
  `vj.paper_quantile_calibration`'s (the README's ECE, 0.092, is the paper's quantile ECE),
  as results.json has them; truth of another shape is refused."""
  _, _, tasks, task_keys, _, per_task = regressor
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
def test_summarise_without_noise_std_says_which_function_and_argument(regressor, noise_std, got):
  """A missing, string or zero noise_std is refused in one line that starts "summarise:
  noise_std" and ends with the value given."""
  _, _, tasks, _, _, per_task = regressor
  with pytest.raises(
    InputError, match="^summarise: noise_std must be the likelihood's noise"
  ) as raised:
    vj.summarise("regression", per_task, tasks.query_y, noise_std=noise_std)
  assert _one_line(raised).endswith(f"got {got}")


def test_summary_of_a_perfectly_calibrated_regressor_is_the_diagonal():
  # Draws of the true function plus the true noise: the paper's metric (the
  # outputs' quantiles under the true distribution) is on the diagonal; so is
  # the PIT of the exact Gaussian predictive (one draw of the truth, noise added).
  rng = np.random.default_rng(0)
  tasks, functions = sine_line.sample_tasks_and_functions(jax.random.key(1), 400, num_query=10)
  truth = np.asarray(sine_line.evaluate_functions(functions, tasks.query_x))  # [400, 10, 1]
  outputs = truth[:, None] + 0.3 * rng.normal(size=(400, 500, 10, 1))
  targets = np.asarray(tasks.query_y)
  per_task = {  # the evaluator's scores of these predictions, which summarise checks
    **summary_inputs.regression_scores(outputs, targets, 0.3),
    "predictions": outputs,
    "targets": targets,
    "truth": truth,
  }
  summary = kinds.summarise("regression", per_task, noise_std=0.3)
  paper = summary.calibration["quantile_calibration"]
  np.testing.assert_allclose(paper.levels, np.linspace(0, 1, 11))
  # Inner levels within 0.01; the ends (min and max of 500 draws) near 0 and 1.
  np.testing.assert_allclose(paper.observed[1:-1], paper.levels[1:-1], atol=0.01)
  assert paper.observed[0] < 0.01 and paper.observed[-1] > 0.99
  exact = dict(per_task, predictions=truth[:, None])
  exact.update(summary_inputs.regression_scores(truth[:, None], targets, 0.3))
  pit = kinds.summarise("regression", exact, noise_std=0.3).calibration["pit_calibration"]
  np.testing.assert_allclose(pit.observed, pit.levels, atol=0.025)  # 4000 points: 3 sigma
  record = json.loads(json.dumps(calibration.to_record(paper)))
  np.testing.assert_array_equal(calibration.from_record(record).observed, paper.observed)


def test_an_unknown_kind_is_refused_naming_the_choices():
  with pytest.raises(ConfigError, match="classification, regression"):
    kinds.get("ranking")


def test_which_score_is_better():
  assert kinds.CLASSIFICATION.better(0.9, 0.8) and not kinds.CLASSIFICATION.better(0.7, 0.8)
  assert kinds.REGRESSION.better(1.0, 2.0) and not kinds.REGRESSION.better(3.0, 2.0)
  assert all(kind.better(0.0, None) for kind in kinds.KINDS.values())


def test_predictive_outputs():
  logits = jnp.log(jnp.array([[[0.9, 0.1]], [[0.1, 0.9]]]))  # [draws 2, query 1, classes 2]
  draws = kinds.CLASSIFICATION.draws(logits)
  np.testing.assert_allclose(draws, [[[0.9, 0.1]], [[0.1, 0.9]]], rtol=1e-6)
  np.testing.assert_allclose(kinds.CLASSIFICATION.predictive(draws), [[0.5, 0.5]], rtol=1e-6)
  samples = jnp.arange(6.0).reshape(3, 2, 1)
  np.testing.assert_array_equal(
    kinds.REGRESSION.predictive(kinds.REGRESSION.draws(samples)), samples
  )


def test_support_targets_each_kind_accepts():
  kinds.CLASSIFICATION.check_support_y("f", np.array([1, 0, 2]), 3, 3)
  with pytest.raises(InputError, match="covering every class 0..2"):
    kinds.CLASSIFICATION.check_support_y("f", np.array([1, 0, 1]), 3, 3)
  kinds.REGRESSION.check_support_y("f", np.zeros((3, 1), np.float32), 3, 1)
  with pytest.raises(InputError, match=r"support_y must be \[3, 1\] targets"):
    kinds.REGRESSION.check_support_y("f", np.zeros(3, np.float32), 3, 1)


def test_a_new_kind_is_one_definition(tmp_path, monkeypatch):
  """A kind defined here, registered once, trains, validates and tests through the loop."""
  from experiments import regression

  absolute = kinds.REGRESSION._replace(
    name="absolute_error",
    score="mae",
    summarise=lambda per_task, num_bins, noise_std: (
      {
        "mae": float(np.mean(np.abs(per_task["predictions"].mean(1) - per_task["targets"]))),
        "mae_ci95": 0.0,
      },
      {},
    ),
    make_evaluator=lambda learner, noise_std, **kw: _with_mae(
      vj.make_regression_evaluator(learner, noise_std, **kw)
    ),
    summary_line=lambda test: f"test MAE {test['mae']:.3f}",
    columns=(("MAE", "mae", 1.0),),
  )
  monkeypatch.setitem(kinds.KINDS, "absolute_error", absolute)
  config = tiny_regression_config("maml", num_meta_steps=2, hidden_sizes=(8,))
  problem = regression.make_problem(config)._replace(kind="absolute_error")
  results = vj.train_and_evaluate(
    problem, config, tmp_path, progress=False, print_fn=lambda m: None
  )
  assert results["kind"] == "absolute_error" and results["best_validation"]["metric"] == "mae"
  assert kinds.test_summary_line(results["test"], results["kind"]).startswith("test MAE ")
  assert "'absolute_error'" in results["recalibration"]["skipped"]  # no map for a new kind


def test_a_regression_summary_counts_tasks_that_ran_away_and_gives_the_median():
  """A regression summary counts the tasks that ran away and gives the median beside the mean
  (here one task at 1e14).

  Targets span [-2, 3], so predictions within their range score at most 5^2 = 25: a task
  above that (or not finite) ran away. Task 1 is off by 4 everywhere (16, within the
  bound), task 2 by 1e7.
  """
  targets = np.array([[-2.0, 0.0, 3.0], [1.0, 1.0, 1.0], [0.0, 2.0, 1.0], [0.5, 0.5, 0.5]])
  predictions = targets + np.array([[1.0], [4.0], [1e7], [0.0]])
  per_task = _regression_tasks(predictions, targets)
  summary = vj.summarise("regression", per_task, targets[..., None], noise_std=0.3)
  assert summary.metrics["num_ran_away"] == 1
  assert summary.metrics["mse_median"] == pytest.approx(np.median([1.0, 16.0, 1e14, 0.0]))
  assert summary.metrics["mse"] == pytest.approx(np.mean([1.0, 16.0, 1e14, 0.0]))
  line = kinds.test_summary_line(summary.metrics, "regression")
  assert line.startswith("test MSE 25000000000004.250 +- ") and "(median 8.500; 1 ran away)" in line
  # A task at the bound does not count, one just above it does.
  for offset, ran_away in ((5.0, 0), (5.01, 1)):
    per_task = _regression_tasks(targets + np.array([[offset], [1.0], [2.0], [0.0]]), targets)
    edge = vj.summarise("regression", per_task, targets[..., None], noise_std=0.3)
    assert edge.metrics["num_ran_away"] == ran_away
  # A task whose predictions are not finite is no mean's: the summary names it.
  per_task = _regression_tasks(targets + np.array([[1.0], [1.0], [np.nan], [0.0]]), targets)
  with pytest.raises(vj.InputError, match=r"must be finite, .*tasks \[2\]"):
    vj.summarise("regression", per_task, targets[..., None], noise_std=0.3)
  # Results written before issue 50 still print their line.
  old = {k: v for k, v in summary.metrics.items() if k not in ("mse_median", "num_ran_away")}
  assert kinds.test_summary_line(old, "regression").startswith("test MSE 25000000000004.250 +- ")


def test_summarise_in_one_call_equals_the_dict_form_and_wants_targets_once():
  from vampire_jax.data import sine_line

  apply_fn, params, _ = _small_regression()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), num_inner_steps=1, num_mc_query=2)
  meta_params = learner.init(params, jax.random.key(1))
  tasks = sine_line.sample_tasks(jax.random.key(5), 4)
  per_task = vj.make_regression_evaluator(learner, 0.3)(meta_params, tasks, jax.random.key(2))
  one_call = vj.summarise("regression", per_task, tasks.query_y, noise_std=0.3)
  as_dict = vj.summarise(
    "regression", dict(per_task._asdict(), targets=tasks.query_y), noise_std=0.3
  )
  assert one_call.metrics == as_dict.metrics
  with pytest.raises(InputError, match="summarise: targets must be given once"):
    vj.summarise("regression", dict(per_task._asdict(), targets=tasks.query_y), tasks.query_y)
  with pytest.raises(InputError, match="summarise: targets must be the tasks' query labels"):
    vj.summarise("regression", per_task, noise_std=0.3)


def test_the_printed_mce_names_the_size_of_the_bin_that_sets_it():
  """The printed MCE names the size of the bin that sets it: here one prediction, "MCE 0.5500
  (bin of 1)"."""
  # 3 tasks x 4 queries of 2 classes. 11 predictions at 0.9, 10 right (gap 0.009); one at
  # 0.55 and wrong (gap 0.55): the MCE is that single prediction's.
  probabilities = np.full((3, 4, 2), 0.1)
  probabilities[..., 0] = 0.9
  probabilities[2, 3] = [0.55, 0.45]
  targets = np.zeros((3, 4), int)
  targets[0, 0] = 1
  targets[2, 3] = 1
  picked = np.take_along_axis(probabilities, targets[..., None], axis=-1)[..., 0]
  per_task = dict(
    accuracy=np.array([0.75, 1.0, 0.75]),
    nll=-np.mean(np.log(picked), axis=1),  # as the evaluator's, which summarise checks
    probabilities=probabilities,
  )
  metrics = vj.summarise("classification", per_task, targets, num_bins=10).metrics
  assert metrics["mce"] == pytest.approx(0.55) and metrics["mce_bin_count"] == 1
  assert "MCE 0.5500 (bin of 1)" in kinds.CLASSIFICATION.summary_line(metrics)


def test_the_test_line_says_n_a_for_the_mutual_information_of_a_point_estimate():
  targets = np.array([[0, 1, -1, -1]])
  per_task = {
    "targets": targets,
    "max_prob": np.array([[0.9, 0.8, 0.6, 0.5]]),
    "entropy": np.array([[0.1, 0.2, 0.4, 0.5]]),
    "mutual_information": np.zeros((1, 4)),  # one weight draw: MAML, ProtoNet
    "correct": np.array([[True, True, False, False]]),
  }
  open_set = vj.open_set_summary(per_task)
  test = dict(accuracy=1.0, accuracy_ci95=0.0, nll=0.1, ece=0.0, mce=0.0, aurc=0.0, num_tasks=1)
  line = vj.test_summary_line(dict(test, open_set=open_set))
  assert line.endswith("open-set AUROC (max prob / MI) 1.000 / n/a  (1 tasks)")
  assert kinds.auroc_text(open_set, "mutual_information", "misclassification_auroc") == "n/a"
