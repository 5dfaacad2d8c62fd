"""Evaluation: per-task scores of a meta-learner, and their summary.

`make_classification_evaluator` / `make_regression_evaluator` build
`evaluate(meta_params, tasks, keys) -> per-task results` (prediction as in
the paper's App. C: adapt with L_t draws, average L_v predictions).

`evaluate_split` scores `num_tasks` tasks of a data split. Task i is drawn,
adapted and predicted with keys made from the evaluation key and i alone,
so a score does not depend on the batch size, the device count or any other
speed setting.

`kinds.summarise` turns per-task results into the reported numbers: mean +- 95%
CI, NLL, and calibration (classification: ECE/MCE and the risk-coverage
curve of selective prediction; regression: the paper's quantile
calibration, plus the PIT calibration of the predictive mixture, and the
predictive variance split into epistemic and aleatoric parts).

`make_open_set_evaluator` scores open-set episodes (extra queries from
classes outside the support set): each query's max probability, entropy
and mutual information, which `predictive_uncertainty.open_set_summary` turns into
AUROCs.
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vampire_jax._src.core import batching, losses, meta_step, sharding
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.learners import MetaLearner, adapt_to_task
from vampire_jax._src.core.tasks import Task, check_task_batch
from vampire_jax._src.metrics import calibration, predictive_uncertainty

PyTree = Any


class ClassificationEval(NamedTuple):
  """Per-task results of evaluating a classifier on a batch of tasks."""

  accuracy: jax.Array  # [tasks]
  nll: jax.Array  # [tasks], mean -log p(y|x) of the predictive
  probabilities: jax.Array  # [tasks, num_query, classes], averaged over draws


class RegressionEval(NamedTuple):
  """Per-task results of evaluating a regressor on a batch of tasks."""

  mse: jax.Array  # [tasks], squared error averaged over draws (the paper's)
  predictive_mean_mse: jax.Array  # [tasks], squared error of the predictive mean
  nll: jax.Array  # [tasks], -log of the Gaussian-mixture predictive
  predictions: jax.Array  # [tasks, num_samples, num_query, 1]


def per_task_keys(key: jax.Array, num_tasks: int) -> jax.Array:
  """`key` if it already holds one key per task, else `num_tasks` keys split from it."""
  wanted = "a PRNG key, jax.random.key(seed), or [tasks] of them"
  if not (hasattr(key, "shape") and hasattr(key, "dtype")):
    raise checks.fail("evaluate", "keys", wanted, type(key).__name__ if key is not None else "None")
  is_typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
  if not is_typed and (key.dtype != jnp.uint32 or key.ndim not in (1, 2) or key.shape[-1] != 2):
    raise checks.fail("evaluate", "keys", wanted, checks.describe(key))
  if is_typed and key.ndim > 1:
    raise checks.fail("evaluate", "keys", wanted, checks.describe_key(key))
  batched = key.ndim == (1 if is_typed else 2)
  if batched:
    if key.shape[0] != num_tasks:
      raise checks.fail(
        "evaluate", "keys", f"one key per task ({num_tasks})", f"{key.shape[0]} keys"
      )
    return key
  return jax.random.split(key, num_tasks)


def _map_tasks(learner, meta_params, tasks, keys, score, task_batching, chunk_size, mesh):
  num_tasks = check_task_batch(tasks, "evaluate")

  def one_task(meta_params, task, task_key):
    task_params, predict_key = adapt_to_task(
      learner, meta_params, task.support_x, task.support_y, task_key
    )
    return score(learner.predict(task_params, task.query_x, predict_key), task.query_y)

  map_tasks = functools.partial(
    batching.map_tasks, one_task, strategy=task_batching, chunk_size=chunk_size
  )

  task_keys = per_task_keys(keys, num_tasks)
  if mesh is None:
    results = map_tasks(meta_params, tasks, task_keys)
  else:
    sharding.check_divisible(num_tasks, mesh)
    results = sharding.map_over_task_shards(map_tasks, mesh)(meta_params, tasks, task_keys)
  # Every score is per task, in the tasks' order, whatever the batching or the devices.
  chex.assert_tree_shape_prefix(results, (num_tasks,))
  return results


def make_classification_evaluator(
  learner: MetaLearner,
  *,
  task_batching: batching.Batching = "vmap",
  chunk_size: int = 1,
  mesh: Optional[Mesh] = None,
):
  """Builds `evaluate(meta_params, tasks, keys) -> ClassificationEval`.

  `keys` is one PRNG key (split into one per task) or `[tasks]` keys, task
  i adapted and predicted with key i. Prediction follows the paper's App. C:
  adapt with L_t draws, then average the softmax of L_v draws (the learner's
  `num_mc_*` settings). With a `mesh` the tasks, and the per-task results,
  are split over its devices.
  """

  def score(logits, labels):
    probs = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
    # A query label outside [0, classes) has no probability (-1 would pick the last class).
    labelled = jnp.all((labels >= 0) & (labels < logits.shape[-1]))
    probs = jnp.where(labelled, probs, jnp.nan)
    accuracy = meta_step.accuracy(probs, labels)
    nll = -jnp.mean(losses.mixture_log_prob_categorical(logits, labels))
    return ClassificationEval(accuracy, jnp.where(labelled, nll, jnp.nan), probs)

  def evaluate(meta_params, tasks: Task, keys: jax.Array) -> ClassificationEval:
    return _map_tasks(learner, meta_params, tasks, keys, score, task_batching, chunk_size, mesh)

  return evaluate


class OpenSetEval(NamedTuple):
  """Per-query uncertainty of open-set episodes (known and unknown queries, predicted together)."""

  max_prob: jax.Array  # [tasks, queries], largest probability of the predictive
  entropy: jax.Array  # [tasks, queries], its entropy (total uncertainty), nats
  mutual_information: jax.Array  # [tasks, queries], epistemic uncertainty, nats
  correct: jax.Array  # [tasks, queries], argmax == label (False for unknown queries)


def make_open_set_evaluator(
  learner: MetaLearner,
  *,
  task_batching: batching.Batching = "vmap",
  chunk_size: int = 1,
  mesh: Optional[Mesh] = None,
):
  """Builds `evaluate(meta_params, tasks, keys) -> OpenSetEval`; arguments as above.

  The tasks are open-set episodes (`data.open_set_tasks_from_keys`: query
  label -1 for a class outside the support set). A task is adapted and its
  queries predicted as `make_classification_evaluator` does (the L_v softmax
  draws), and each query's uncertainty is taken from the draws
  (`vj.uncertainty`).
  """

  def score(logits, labels):
    draws = jax.nn.softmax(logits, axis=-1)  # [draws, queries, ways]
    u = predictive_uncertainty.uncertainty(draws)
    probs = jnp.mean(draws, axis=0)
    return OpenSetEval(
      jnp.max(probs, axis=-1), u.total, u.epistemic, jnp.argmax(probs, axis=-1) == labels
    )

  def evaluate(meta_params, tasks: Task, keys: jax.Array) -> OpenSetEval:
    return _map_tasks(learner, meta_params, tasks, keys, score, task_batching, chunk_size, mesh)

  return evaluate


def make_regression_evaluator(
  learner: MetaLearner,
  noise_std: float,
  *,
  task_batching: batching.Batching = "vmap",
  chunk_size: int = 1,
  mesh: Optional[Mesh] = None,
):
  """Builds `evaluate(meta_params, tasks, keys) -> RegressionEval`; arguments as above.

  The NLL is that of the predictive mixture mean_l N(f_l, noise_std^2); where the
  learner's likelihood carries a quantile map R (`learner.nll.quantile_map`: a run
  recalibrated by `vj.recalibrate(..., method="quantile")`), that of the recalibrated
  predictive, whose density is R'(F(y)) times the mixture's (`quantile_map`).
  """
  quantile_map = getattr(learner.nll, "quantile_map", None)

  def score(means, targets):
    # The paper's MSE (App. A) averages the squared error over the draws; the
    # predictive mean's error (what the mean prediction scores) is the extra.
    mse = jnp.mean(jnp.square(means - targets[None]))
    mean_mse = jnp.mean(jnp.square(jnp.mean(means, axis=0) - targets))
    log_density = losses.mixture_log_prob_gaussian(means, targets, noise_std)
    if quantile_map is not None:
      pit = losses.mixture_cdf_gaussian(means, targets, noise_std)
      log_density = log_density + quantile_map.log_slope(pit, xp=jnp)
    return RegressionEval(mse, mean_mse, -jnp.mean(log_density), means)

  def evaluate(meta_params, tasks: Task, keys: jax.Array) -> RegressionEval:
    return _map_tasks(learner, meta_params, tasks, keys, score, task_batching, chunk_size, mesh)

  return evaluate


# -- Scoring a split ------------------------------------------------------------

# `sample(data, task_keys [n]) -> Task [n, ...]`, as `meta_step.TaskSampler`.
SplitSampler = Callable[[PyTree, jax.Array], Task]


def index_keys(key: jax.Array, indices: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(sample_keys, predict_keys)` of the tasks numbered `indices`, from `key` alone."""
  sample_key, predict_key = jax.random.split(key)
  fold = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
  return fold(sample_key, indices), fold(predict_key, indices)


def make_split_evaluator(
  evaluate: Callable,
  sample_tasks: SplitSampler,
  data: PyTree,
  *,
  query_truth: Optional[SplitSampler] = None,
  mesh: Optional[Mesh] = None,
):
  """Builds `evaluate_indices(meta_params, key, indices) -> dict of per-task arrays`.

  Task i is `sample_tasks(data, sample_keys[i])`, scored by `evaluate` with
  `predict_keys[i]` (`index_keys`). Sampling and scoring are two jitted
  programs, so one compiled evaluator serves every split. The dict holds
  the evaluator's fields, `targets` (query labels or targets) and, with
  `query_truth` (regression: the noiseless function at the query inputs),
  `truth`.

  Args:
    evaluate: from `make_*_evaluator`, jitted (built with `mesh`, if any).
    sample_tasks: the task sampler (jitted here).
    data: the split's data, passed to `sample_tasks`.
    query_truth: optional `query_truth(data, task_keys)`.
    mesh: split each batch of tasks over the mesh's devices.
  """
  keys_of = jax.jit(index_keys)
  sample = jax.jit(sample_tasks)
  truth_of = None if query_truth is None else jax.jit(query_truth)

  def evaluate_indices(meta_params, key, indices):
    sample_keys, predict_keys = keys_of(key, indices)
    tasks = sample(data, sample_keys)
    if mesh is not None:
      tasks, predict_keys = sharding.distribute((tasks, predict_keys), mesh)
    result = dict(evaluate(meta_params, tasks, predict_keys)._asdict(), targets=tasks.query_y)
    if truth_of is not None:
      result["truth"] = truth_of(data, sample_keys)
    return result

  return evaluate_indices


def evaluate_split(
  evaluate_indices: Callable,
  meta_params: PyTree,
  key: jax.Array,
  num_tasks: int,
  batch_tasks: int,
  *,
  on_batch: Optional[Callable[[int, int], None]] = None,
  refuse_non_finite: bool = True,
) -> dict:
  """Per-task results of tasks 0 .. num_tasks - 1, `batch_tasks` per call.

  The last batch is filled up with tasks past the end, which are dropped: a
  task's result depends only on `key` and its index.

  Args:
    evaluate_indices: from `make_split_evaluator`.
    meta_params: the meta-parameters to score.
    key: the evaluation's key.
    num_tasks: how many tasks.
    batch_tasks: tasks per call (a multiple of the devices, with a mesh).
    on_batch: called as `on_batch(done, total)` after each batch (progress).
    refuse_non_finite: raise FloatingPointError naming the tasks whose results
      hold NaN or inf (the default); False returns them as they are
      (`non_finite_tasks` finds them), for a caller that says what it does
      with them.

  Returns:
    `{field: numpy array [num_tasks, ...]}`, gathered from every host.
  """
  if num_tasks < 1 or batch_tasks < 1:
    raise ValueError(f"num_tasks and batch_tasks must be >= 1, got {num_tasks}, {batch_tasks}")
  outputs = []
  for start in range(0, num_tasks, batch_tasks):
    indices = jnp.arange(start, start + batch_tasks, dtype=jnp.uint32)
    outputs.append(sharding.gather(evaluate_indices(meta_params, key, indices)))
    if on_batch is not None:
      on_batch(min(start + batch_tasks, num_tasks), num_tasks)
  results = {
    name: np.concatenate([np.asarray(o[name]) for o in outputs])[:num_tasks] for name in outputs[0]
  }
  if refuse_non_finite:
    bad = non_finite_tasks(results)
    if bad.size:
      raise FloatingPointError(
        f"evaluate_split: {bad.size} of {num_tasks} tasks gave non-finite results (tasks "
        f"{bad[:10].tolist()}...): non-finite data in the split, or "
        "meta-parameters that diverged (vj.debug_nonfinite names the first NaN)"
      )
  return results


def non_finite_tasks(results: dict) -> np.ndarray:
  """The indices of the tasks any of whose floating-point results is NaN or infinite."""
  bad = np.zeros(len(next(iter(results.values()))), bool)
  for values in results.values():
    if np.issubdtype(values.dtype, np.floating):
      bad |= ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
  return np.flatnonzero(bad)


# -- Summaries --------------------------------------------------------------------


class Summary(NamedTuple):
  """What a split's evaluation reports.

  Attributes:
    metrics: JSON-ready numbers (accuracy or MSE with 95% CI, NLL, ECE, MCE...).
    calibration: `{name: calibration result}` for plots (`ReliabilityBins`,
      `RiskCoverage` or `QuantileCalibration`).
  """

  metrics: dict
  calibration: dict


def with_nll(metrics: dict, curves: dict, per_task: dict) -> Summary:
  """The summary of a split: `metrics` with the NLL's mean and CI and the task count."""
  nll_mean, nll_half = calibration.mean_confidence_interval(per_task["nll"])
  metrics.update(nll=nll_mean, nll_ci95=nll_half, num_tasks=int(len(per_task["nll"])))
  return Summary(metrics, curves)


def classification_summary(per_task: dict, num_bins: int) -> tuple[dict, dict]:
  """Accuracy with its CI, ECE/MCE, risk-coverage: `(metrics, curves)` (see `kinds.summarise`)."""
  mean, half = calibration.mean_confidence_interval(per_task["accuracy"])
  bins = calibration.classification_calibration(
    per_task["probabilities"], per_task["targets"], num_bins=num_bins
  )
  selective = calibration.risk_coverage(per_task["probabilities"], per_task["targets"])
  metrics = dict(
    accuracy=mean,
    accuracy_ci95=half,
    ece=bins.ece,
    mce=bins.mce,
    # The predictions in the bin that sets the MCE: a bin of a handful explains a large MCE.
    mce_bin_count=int(bins.count[bins.mce_bin]),
    aurc=selective.aurc,
    **{
      f"accuracy_at_{int(100 * c)}_coverage": float(selective.accuracy_at(c))
      for c in (0.5, 0.8, 0.9)
    },
  )
  return metrics, {"reliability": bins, "risk_coverage": selective}


def regression_summary(per_task: dict, noise_std: Optional[float]) -> tuple[dict, dict]:
  """The paper's MSE, the predictive mean's, quantile and PIT calibration (see `kinds.summarise`).

  Beside the mean MSE, its median and the tasks that ran away: a task's MSE not finite
  or above (max - min)^2 of the split's query targets, which predictions anywhere within
  the targets' range cannot exceed. It happens when the inner loop's step is unstable on
  that task's support (the user guide, "A guard against runaway tasks"); one such task makes the
  mean meaningless, which the median beside it shows.
  """
  if noise_std is None:
    raise ValueError("regression summaries need the likelihood's noise_std")
  metrics = {}
  for name in ("mse", "predictive_mean_mse"):
    mean, half = calibration.mean_confidence_interval(per_task[name])
    metrics.update({name: mean, f"{name}_ci95": half})
  mse = np.asarray(per_task["mse"], np.float64)
  targets = np.asarray(per_task["targets"], np.float64)
  span = float(np.max(targets) - np.min(targets)) if targets.size else 0.0
  ran_away = ~np.isfinite(mse) | ((mse > span**2) if span > 0 else False)
  metrics.update(mse_median=float(np.median(mse)), num_ran_away=int(ran_away.sum()))
  predictions = per_task["predictions"][..., 0]  # [tasks, samples, query]
  pit = calibration.regression_quantile_calibration(
    predictions, per_task["targets"][..., 0], noise_std
  )
  metrics.update(pit_ece=pit.ece, pit_mce=pit.mce)
  metrics.update(_variance_split(per_task["predictions"], noise_std))
  curves = {"pit_calibration": pit}
  if "truth" in per_task:
    paper = calibration.paper_quantile_calibration(
      predictions, per_task["truth"][..., 0], noise_std
    )
    metrics.update(ece=paper.ece, mce=paper.mce)
    curves["quantile_calibration"] = paper
  return metrics, curves


def _variance_split(predictions: np.ndarray, noise_std: float) -> dict:
  """The predictive variance, mean over queries and tasks, split into its two parts.

  With draws f_l(x) and noise sigma the predictive mixture's variance is
  Var_l[f_l(x)] (epistemic: the weights' disagreement) + sigma^2 (aleatoric).
  """
  predictions = np.asarray(predictions, np.float64)[..., 0]  # [tasks, draws, query]
  epistemic = float(np.mean(np.var(predictions, axis=1)))
  aleatoric = float(noise_std) ** 2
  total = epistemic + aleatoric
  return dict(
    predictive_variance=total,
    epistemic_variance=epistemic,
    aleatoric_variance=aleatoric,
    epistemic_fraction=epistemic / total,
  )
