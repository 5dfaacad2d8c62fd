"""Epistemic uncertainty, AUROC, open-set episodes, the regression variance split, and the
Omniglot training set without held-out alphabets (issue 23)."""

import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax.runs import experiment_configs
from vampire_jax import data
from vampire_jax._src.metrics import predictive_uncertainty, summary_inputs
from vampire_jax._src.core.errors import ConfigError

from conftest import needs_omniglot
from experiments import cli


def _h(p):  # binary entropy in nats
  return -(p * math.log(p) + (1 - p) * math.log(1 - p))


# -- vj.uncertainty --------------------------------------------------------------------


def test_uncertainty_hand_example():
  draws = jnp.array([[[0.9, 0.1]], [[0.1, 0.9]]])  # [2 draws, 1 query, 2 ways]
  u = vj.uncertainty(draws)
  np.testing.assert_allclose(u.total, [math.log(2)], rtol=1e-6)
  np.testing.assert_allclose(u.aleatoric, [_h(0.9)], rtol=1e-6)
  np.testing.assert_allclose(u.epistemic, [math.log(2) - _h(0.9)], rtol=1e-5)
  assert u.epistemic.shape == (1,)


def test_a_point_estimate_has_zero_epistemic_uncertainty():
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (1, 7, 5)), axis=-1)
  u = vj.uncertainty(probs)
  np.testing.assert_allclose(u.epistemic, np.zeros(7), atol=1e-7)
  np.testing.assert_allclose(u.total, u.aleatoric, rtol=1e-6)
  # Identical draws are a point estimate too.
  np.testing.assert_allclose(
    vj.uncertainty(jnp.repeat(probs, 4, axis=0)).epistemic, np.zeros(7), atol=1e-6
  )


def test_uncertainty_is_finite_at_probabilities_zero():
  draws = jnp.array([[[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]]])
  u = vj.uncertainty(draws)
  np.testing.assert_allclose(u.total, [math.log(2)], rtol=1e-6)
  np.testing.assert_allclose(u.aleatoric, [0.0], atol=0)
  np.testing.assert_allclose(u.epistemic, [math.log(2)], rtol=1e-6)
  grad = jax.grad(lambda d: jnp.sum(vj.uncertainty(d).epistemic))(draws)
  assert np.all(np.isfinite(grad))


def test_uncertainty_refuses_a_mean_without_its_draws():
  with pytest.raises(vj.InputError, match="draws must be"):
    vj.uncertainty(jnp.full((4, 5), 0.2))


def test_regression_uncertainty_is_the_law_of_total_variance():
  draws = jnp.array([[[1.0], [0.0]], [[3.0], [0.0]]])  # [2 draws, 2 queries, 1]
  u = vj.regression_uncertainty(draws, noise_std=0.5)
  np.testing.assert_allclose(u.epistemic, [1.0, 0.0])
  np.testing.assert_allclose(u.aleatoric, [0.25, 0.25])
  np.testing.assert_allclose(u.total, [1.25, 0.25])


def test_regression_summary_splits_the_predictive_variance():
  # Two tasks, 3 draws, 2 queries: variances across draws by hand.
  predictions = np.array(
    [[[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 4.0]]]
  )[..., None]
  targets = np.zeros((2, 2, 1))
  per_task = {  # the evaluator's scores of these predictions, which summarise checks
    **summary_inputs.regression_scores(predictions, targets, 0.3),
    "predictions": predictions,
    "targets": targets,
  }
  metrics = vj.summarise("regression", per_task, noise_std=0.3).metrics
  epistemic = np.mean([8 / 3, 0.0, 0.0, 2.0])  # np.var of (0,2,4), (1,1,1), (1,1,1), (1,1,4)
  assert metrics["epistemic_variance"] == pytest.approx(epistemic)
  assert metrics["aleatoric_variance"] == pytest.approx(0.09)
  assert metrics["predictive_variance"] == pytest.approx(epistemic + 0.09)
  assert metrics["epistemic_fraction"] == pytest.approx(epistemic / (epistemic + 0.09))


# -- AUROC ---------------------------------------------------------------------------------


def _brute_force_auroc(scores, positives):
  pairs = [(p, n) for p, n in itertools.product(scores[positives], scores[~positives])]
  return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])


def test_auroc_hand_example():
  # Pairs (positive, negative): (0.35, 0.1) yes, (0.35, 0.4) no, (0.8, .) yes twice: 3/4.
  assert vj.auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
  # A tie counts one half.
  assert vj.auroc([1.0, 1.0, 0.0], [True, False, False]) == 0.75
  assert vj.auroc(np.zeros(6), [True, False] * 3) == 0.5
  assert math.isnan(vj.auroc([0.1, 0.2], [True, True]))


def test_auroc_equals_brute_force_over_all_pairs_with_ties():
  rng = np.random.default_rng(0)
  for _ in range(20):
    n = int(rng.integers(2, 40))
    scores = rng.integers(0, 5, n).astype(float)  # many ties
    positives = rng.random(n) < 0.4
    if positives.all() or not positives.any():
      continue
    assert vj.auroc(scores, positives) == pytest.approx(_brute_force_auroc(scores, positives))
    # The trapezoidal area under the ROC curve is the same number.
    fpr, tpr = vj.roc_curve(scores, positives)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(vj.auroc(scores, positives))


def test_open_set_summary_by_hand():
  # One task, 2 ways x 2 queries known, then 1 unknown class x 2 queries.
  targets = np.array([[0, 0, 1, 1, -1, -1]])
  per_task = {
    "targets": targets,
    "max_prob": np.array([[0.9, 0.8, 0.7, 0.95, 0.6, 0.5]]),
    "entropy": np.array([[0.1, 0.2, 0.3, 0.05, 0.4, 0.5]]),
    "mutual_information": np.zeros((1, 6)),  # a point estimate
    "correct": np.array([[True, True, False, True, False, False]]),
  }
  summary = vj.open_set_summary(per_task)
  # Issue 59: a point estimate's MI is 0 for every query; it ranks none, so its AUROC is
  # not applicable (None, named in `not_applicable`), not 0.5, "at chance".
  assert summary["auroc"] == {"max_prob": 1.0, "entropy": 1.0, "mutual_information": None}
  assert list(summary["not_applicable"]) == ["mutual_information"]
  # Known queries: the one mistake (0.7) is the least confident.
  assert summary["misclassification_auroc"]["max_prob"] == 1.0
  assert summary["misclassification_auroc"]["mutual_information"] is None
  assert (
    summary["num_unknown_classes"],
    summary["num_known_queries"],
    summary["num_unknown_queries"],
    summary["known_accuracy"],
  ) == (1, 4, 2, 0.75)
  roc = summary["roc"]["mutual_information"]
  np.testing.assert_allclose(roc["true_positive_rate"], roc["false_positive_rate"])
  # Mean uncertainty per group, in nats: a point estimate has no epistemic part.
  assert summary["uncertainty"]["known"] == pytest.approx(
    {"total": 0.1625, "epistemic": 0.0, "aleatoric": 0.1625}
  )
  assert summary["uncertainty"]["unknown"]["total"] == pytest.approx(0.45)
  per_task["mutual_information"] = np.array([[0.05, 0.1, 0.1, 0.0, 0.3, 0.2]])
  varied = vj.open_set_summary(per_task)
  assert varied["not_applicable"] == {} and varied["auroc"]["mutual_information"] == 1.0
  split = varied["uncertainty"]
  assert split["unknown"] == pytest.approx({"total": 0.45, "epistemic": 0.25, "aleatoric": 0.2})
  json.dumps(summary)  # JSON-ready


# -- Open-set episodes ---------------------------------------------------------------------


def _labelled_images(num_classes=12, examples=6, size=4):
  """uint8 [C, E, size, size]: every image of class c is the constant c + 1 (rotation-proof)."""
  values = np.arange(1, num_classes + 1, dtype=np.uint8)[:, None, None, None]
  return jnp.asarray(np.broadcast_to(values, (num_classes, examples, size, size)).copy())


@pytest.mark.parametrize("class_sampling", ["character", "class"])
def test_open_set_episode_is_the_task_plus_unknown_queries(class_sampling):
  images = _labelled_images()
  keys = jax.random.split(jax.random.key(3), 8)
  spec = dict(ways=3, shots=1, query=2, rotate=True, class_sampling=class_sampling)
  tasks = data.tasks_from_keys(keys, images, **spec)
  open_set = data.open_set_tasks_from_keys(keys, images, **spec, num_unknown=4)
  # The known part is exactly the closed-set task: same support, same known queries.
  np.testing.assert_array_equal(open_set.support_x, tasks.support_x)
  np.testing.assert_array_equal(open_set.support_y, tasks.support_y)
  np.testing.assert_array_equal(open_set.query_x[:, :6], tasks.query_x)
  np.testing.assert_array_equal(open_set.query_y[:, :6], tasks.query_y)
  np.testing.assert_array_equal(open_set.query_y[:, 6:], data.UNKNOWN_LABEL)
  assert open_set.query_x.shape[1] == (3 + 4) * 2
  class_of = np.round(np.asarray(open_set.query_x)[..., 0, 0, 0] * 255).astype(int)
  for t in range(8):
    known = set(np.round(np.asarray(tasks.support_x)[t, :, 0, 0, 0] * 255).astype(int))
    unknown = class_of[t, 6:]
    values, counts = np.unique(unknown, return_counts=True)
    if class_sampling == "character":  # other characters, `query` queries each
      assert not known & set(values.tolist()) and len(values) == 4 and set(counts) == {2}
    else:  # other (character, turn) classes: 4 x 2 unknown queries
      assert len(unknown) == 8


def test_open_set_episode_needs_enough_classes():
  with pytest.raises(ValueError, match="needs 13 distinct classes"):
    data.open_set_tasks_from_keys(
      jax.random.split(jax.random.key(0), 2),
      _labelled_images(),
      ways=5,
      shots=1,
      query=2,
      num_unknown=8,
    )


def test_open_set_evaluator_scores_each_query():
  # A fixed 'network' whose logits are the input's first pixel times a matrix: the
  # evaluator's max_prob and MI are those of the draws' softmax.
  def apply_fn(params, x):
    return x.reshape(x.shape[0], -1)[:, :1] * params["w"]

  learner = vj.maml(apply_fn, vj.categorical_nll, num_inner_steps=0)
  params = {"w": jnp.array([[1.0, -1.0, 0.5]])}
  task = vj.Task(
    jnp.ones((1, 3, 2)),
    jnp.zeros((1, 3), jnp.int32),
    jnp.array([[[0.0, 0], [2.0, 0]]]),
    jnp.array([[0, -1]]),
  )
  result = jax.jit(vj.make_open_set_evaluator(learner))(params, task, jax.random.key(0))
  probs = jax.nn.softmax(jnp.array([[0.0, 0, 0], [2.0, -2.0, 1.0]]), axis=-1)
  np.testing.assert_allclose(result.max_prob[0], probs.max(axis=-1), rtol=1e-6)
  np.testing.assert_allclose(result.entropy[0], predictive_uncertainty.entropy(probs), rtol=1e-6)
  np.testing.assert_allclose(result.mutual_information, 0.0, atol=1e-6)
  np.testing.assert_array_equal(result.correct, [[True, False]])


# -- A trained run: predict_draws and the open-set results ------------------------------------


@needs_omniglot
def test_predict_draws_are_what_predict_averages(tiny_omniglot_run):
  workdir, config, _ = tiny_omniglot_run
  run = vj.load_run(workdir)
  rng = np.random.default_rng(0)
  support_x = rng.random((5, 28, 28, 1), dtype=np.float32)
  query_x = rng.random((7, 28, 28, 1), dtype=np.float32)
  support_y = np.arange(5)
  key = jax.random.key(1)
  draws = run.predict_draws(support_x, support_y, query_x, key)
  assert draws.shape == (config.algorithm.num_mc_test, 7, 5)
  np.testing.assert_allclose(np.sum(draws, axis=-1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(
    run.predict(support_x, support_y, query_x, key), jnp.mean(draws, axis=0)
  )
  u = vj.uncertainty(draws)
  assert np.all(np.asarray(u.epistemic) > 0)  # VAMPIRE's draws disagree
  with pytest.raises(vj.InputError, match="Run.predict_draws: support_y"):
    run.predict_draws(support_x, support_y[:4], query_x, key)


@needs_omniglot
def test_a_classification_run_reports_open_set_aurocs(tiny_omniglot_run):
  workdir, config, results = tiny_omniglot_run
  open_set = results["test"]["open_set"]
  for group in ("auroc", "misclassification_auroc", "roc"):
    assert set(open_set[group]) == {"max_prob", "entropy", "mutual_information"}
  # As many unknown classes as ways (the default), `query` queries each, on every test task.
  assert open_set["num_unknown_classes"] == config.ways
  assert (
    open_set["num_unknown_queries"]
    == open_set["num_known_queries"]
    == config.evaluation.num_test_tasks * config.ways * config.query
  )
  # The numbers are those of the saved per-query scores.
  per_task = np.load(workdir / "test_per_task.npz")
  unknown = per_task["open_set_targets"] < 0
  assert open_set["auroc"]["entropy"] == pytest.approx(
    vj.auroc(per_task["open_set_entropy"], unknown)
  )
  assert open_set["auroc"]["max_prob"] == pytest.approx(
    vj.auroc(-per_task["open_set_max_prob"], unknown)
  )
  saved = json.loads((workdir / "results.json").read_text())
  assert saved["test"]["open_set"]["auroc"] == open_set["auroc"]


# -- Configs: open-set classes, the Omniglot training set, PLATIPUS's preset ------------------


def test_open_set_config_checks():
  from experiments import presets

  config = presets.get_config("mini_imagenet", "5way1shot")
  assert experiment_configs.open_set_classes(config) == 5  # default: as many as ways
  for value, message, as_flags in (
    (
      16,
      "num_open_set_classes 16: an open-set test episode needs ways \\+ unknown = 21",
      "--num-open-set-classes 16: an open-set test episode needs --ways + unknown = 21",
    ),
    (
      -1,
      "num_open_set_classes must be an integer >= 0, got -1",
      "--num-open-set-classes must be an integer >= 0",
    ),
  ):
    with pytest.raises(ConfigError, match=message) as refused:
      config.replace(num_open_set_classes=value).validate()
    assert as_flags in str(cli.as_flags(refused.value))  # as a command says it
  assert experiment_configs.open_set_classes(config.replace(num_open_set_classes=0)) == 0
  # A partial copy with 7 test classes: the default takes the 2 left beside the 5 ways, an
  # explicit number it cannot give fails before training.
  assert experiment_configs.open_set_classes(config, test_classes=7) == 2
  assert experiment_configs.open_set_classes(config, test_classes=5) == 0
  with pytest.raises(ConfigError, match="test split has 7"):
    experiment_configs.open_set_classes(config.replace(num_open_set_classes=3), 7)


def test_platipus_presets_are_the_authors_commands():
  # The VAMPIRE authors' platipus.py commands: inner_lr 1e-2, kl_reweight 0.1 for images;
  # inner_lr 1e-3, kl_reweight 1 for sine/line (BUILD_NOTES, "Library defaults").
  from experiments import presets

  for experiment in ("omniglot", "mini_imagenet", "features"):
    config = presets.get_config(experiment, "5way1shot", "platipus")
    assert (config.algorithm.inner_lr, config.algorithm.kl_weight) == (0.01, 0.1), experiment
  config = presets.get_config("regression", "cpu", "platipus")
  assert (config.algorithm.inner_lr, config.algorithm.kl_weight) == (0.001, 1.0)


def test_omniglot_validation_size_config():
  from experiments import presets

  assert presets.get_config("omniglot", "5way1shot").num_val_alphabets == 0  # the paper's
  assert presets.get_config("omniglot", "20way5shot").num_val_characters == 0
  assert presets.get_config("omniglot", "quick").num_val_alphabets == 5
  assert experiment_configs.omniglot_split_characters("original", 0) == {
    "train": 964,
    "val": 964,
    "test": 659,
  }
  assert experiment_configs.omniglot_split_characters("original", 5) == {
    "train": 813,
    "val": 151,
    "test": 659,
  }
  config = presets.get_config("omniglot", "quick")
  for name, value in (("num_val_alphabets", 30), ("num_val_characters", -1)):
    with pytest.raises(ConfigError, match=f"{name} must be .*got {value}") as refused:
      config.replace(**{name: value}).validate()
    assert str(cli.as_flags(refused.value)).startswith(cli.flag(name))  # as a command says it


@needs_omniglot
def test_omniglot_without_held_out_alphabets_trains_on_all_964(omniglot_cache):
  arrays = data.load_omniglot(cache_dir=omniglot_cache, source="cache")
  background = np.flatnonzero(arrays.is_background)
  sizes = [int(np.sum(arrays.alphabet[background] == a)) for a in range(30)]
  assert tuple(sizes) == experiment_configs.OMNIGLOT_BACKGROUND_ALPHABET_SIZES
  split = data.split_indices(arrays, "original", num_val_alphabets=0)
  assert len(split["train"]) == 964
  np.testing.assert_array_equal(split["train"], background)
  # Validation never touches the evaluation alphabets, nor does training.
  for part in ("train", "val"):
    assert np.all(arrays.is_background[split[part]])
    assert set(arrays.alphabet[split[part]]) <= set(range(30))
  assert not set(split["test"]) & set(split["val"])
  default = data.split_indices(arrays, "original")
  assert (len(default["train"]), len(default["val"])) == (813, 151)
  random = data.split_indices(arrays, "random", num_val_characters=0)
  assert len(random["train"]) == 1200 and not set(random["test"]) & set(random["val"])
