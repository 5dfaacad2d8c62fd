"""What a prediction knows it does not know: total, aleatoric and epistemic uncertainty.

A Bayesian meta-learner predicts with L weight draws w_l. For a query x the
draws give class probabilities p_l = softmax(f_{w_l}(x)); the predictive is
their mean p = mean_l p_l. In nats, with H the entropy:

    total     = H[p]                 entropy of the mean
    aleatoric = mean_l H[p_l]        mean of the entropies
    epistemic = total - aleatoric    mutual information I(y; w | x) >= 0

A point estimate (one draw, e.g. MAML) has zero epistemic uncertainty. For
regression with a Gaussian likelihood N(f_w(x), sigma^2) the predictive
variance splits the same way (law of total variance): the variance of the
means across draws (epistemic) plus sigma^2 (aleatoric).

    draws = run.predict_draws(support_x, support_y, query_x, key)  # [L, num_query, ways]
    u = vj.uncertainty(draws)        # u.total, u.aleatoric, u.epistemic: [num_query]

Host-side (numpy) scores of how well an uncertainty separates two groups:
`auroc` (rank-based, ties count one half) and `roc_curve`; and
`open_set_summary`, the open-set and misclassification AUROCs of a test
run's open-set episodes (`evaluation.make_open_set_evaluator`).
"""

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from vampire_jax._src.core import input_checks as checks

__all__ = (
  "Uncertainty",
  "entropy",
  "uncertainty",
  "regression_uncertainty",
  "auroc",
  "roc_curve",
  "open_set_summary",
  "OPEN_SET_SCORES",
)


class Uncertainty(NamedTuple):
  """Uncertainty of each query's prediction, in nats (classification) or squared units.

  Attributes:
    total: `[num_query]`, the predictive's entropy (or variance).
    aleatoric: `[num_query]`, what the draws agree is noise: the mean entropy
      of the draws (or the likelihood's noise variance).
    epistemic: `[num_query]`, `total - aleatoric`: the mutual information
      between the label and the weights (or the variance of the means).
  """

  total: jax.Array
  aleatoric: jax.Array
  epistemic: jax.Array


def entropy(probabilities: jax.Array, axis: int = -1) -> jax.Array:
  """-sum p log p along `axis`, in nats; 0 log 0 = 0 (finite at probabilities 0)."""
  p = jnp.asarray(probabilities)
  # where() on both sides: neither the value nor the gradient sees log(0).
  safe = jnp.where(p > 0, p, 1.0)
  return -jnp.sum(jnp.where(p > 0, p * jnp.log(safe), 0.0), axis=axis)


def uncertainty(draws: jax.Array) -> Uncertainty:
  """Total, aleatoric and epistemic uncertainty of per-draw class probabilities.

  Args:
    draws: `[num_draws, num_query, ways]`, the class probabilities of each
      weight draw (`Run.predict_draws` of a classifier, or `jax.nn.softmax`
      of `vj.predict`'s logits): non-negative, each row summing to 1.

  Returns:
    `Uncertainty` of three `[num_query]` arrays in nats: total = H[mean_l p_l],
    aleatoric = mean_l H[p_l], epistemic = total - aleatoric (clipped at 0
    against rounding; the mutual information is never negative).

  Raises:
    InputError: `draws` of another rank, or (where concrete, i.e. outside
      `jit`) not probabilities: negative values (logits) or rows that do not
      sum to 1 within 1e-3 (logits, or a regression run's draws: use
      `vj.regression_uncertainty`). Under `jit` the values are not checked.
  """
  checks.not_a_distribution(
    "vj.uncertainty", "draws", "per-draw class probabilities (Run.predict_draws)", draws
  )
  if jnp.ndim(draws) != 3 or jnp.shape(draws)[0] < 1:
    raise checks.fail(
      "vj.uncertainty",
      "draws",
      "[num_draws >= 1, num_query, ways] class probabilities",
      checks.describe(draws),
    )
  checks.probabilities(
    "vj.uncertainty",
    "draws",
    draws,
    "from Run.predict_draws of a classifier, or jax.nn.softmax of vj.predict's logits; "
    "a regression run's draws go to vj.regression_uncertainty",
  )
  draws = jnp.asarray(draws)
  total = entropy(jnp.mean(draws, axis=0))
  aleatoric = jnp.mean(entropy(draws), axis=0)
  return Uncertainty(total, aleatoric, jnp.maximum(total - aleatoric, 0.0))


def regression_uncertainty(draws: jax.Array, noise_std: float) -> Uncertainty:
  """The predictive variance of a Gaussian likelihood, split by the law of total variance.

  Args:
    draws: `[num_draws, num_query, 1]` (or `[num_draws, num_query]`), the
      network's output under each weight draw (`Run.predict_draws`).
    noise_std: the likelihood's noise standard deviation sigma.

  Returns:
    `Uncertainty` of `[num_query]` variances: epistemic = the variance of the
    means across draws (0 for one draw), aleatoric = sigma^2, total = their sum.
  """
  checks.not_a_distribution(
    "vj.regression_uncertainty",
    "draws",
    "the network's output per weight draw (Run.predict_function_draws)",
    draws,
  )
  draws = jnp.asarray(draws)
  if draws.ndim == 3:
    draws = draws[..., 0]
  if draws.ndim != 2:
    raise checks.fail(
      "vj.regression_uncertainty", "draws", "[num_draws, num_query, 1]", checks.describe(draws)
    )
  epistemic = jnp.var(draws, axis=0)
  aleatoric = jnp.full_like(epistemic, float(noise_std) ** 2)
  return Uncertainty(epistemic + aleatoric, aleatoric, epistemic)


# -- Separating two groups by a score (host side) ----------------------------------


def _check_scores(scores: ArrayLike, positives: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
  scores = np.asarray(scores, dtype=np.float64).reshape(-1)
  positives = np.asarray(positives).reshape(-1)
  if scores.shape != positives.shape:
    raise ValueError(
      f"scores and positives must have the same size, got {scores.size} and {positives.size}"
    )
  if not np.all(np.isfinite(scores)):
    raise ValueError(f"scores must be finite, got {int(np.sum(~np.isfinite(scores)))} non-finite")
  return scores, positives.astype(bool)


def auroc(scores: ArrayLike, positives: ArrayLike) -> float:
  """Area under the ROC curve: P(score of a positive > score of a negative), ties count 1/2.

  The Mann-Whitney statistic from mid-ranks (tied scores share the mean of
  their ranks), so it equals the count over all (positive, negative) pairs
  without building them.

  Args:
    scores: `[n]`, larger = more likely positive (e.g. an uncertainty).
    positives: `[n]` bool, which items are positive (e.g. unknown-class queries).

  Returns:
    The AUROC in [0, 1] (0.5: no better than chance, e.g. a constant score);
    NaN if either group is empty.
  """
  scores, positives = _check_scores(scores, positives)
  num_pos = int(positives.sum())
  num_neg = positives.size - num_pos
  if num_pos == 0 or num_neg == 0:
    return math.nan
  _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
  # Mid-rank of each distinct value (ranks from 1): the ranks below it, plus (count + 1) / 2.
  mid_ranks = np.cumsum(counts) - counts + (counts + 1) / 2.0
  rank_sum = float(np.sum(mid_ranks[inverse][positives]))
  return (rank_sum - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg)


def roc_curve(scores: ArrayLike, positives: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
  """`(false_positive_rate, true_positive_rate)` at every distinct threshold, from (0, 0) to (1, 1).

  Items are flagged positive when their score is at least the threshold;
  tied scores move together (one diagonal step), so the trapezoidal area
  under the curve equals `auroc`.
  """
  scores, positives = _check_scores(scores, positives)
  num_pos = max(int(positives.sum()), 1)
  num_neg = max(positives.size - int(positives.sum()), 1)
  order = np.argsort(-scores, kind="stable")
  scores, positives = scores[order], positives[order]
  last_of_group = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]
  true_pos = np.cumsum(positives)[last_of_group]
  false_pos = (last_of_group + 1) - true_pos
  return np.r_[0.0, false_pos / num_neg], np.r_[0.0, true_pos / num_pos]


# -- Open-set episodes -----------------------------------------------------------------

# Per-query scores of an open-set evaluation, each "larger = less sure": the
# negative max probability, the predictive entropy, the mutual information.
OPEN_SET_SCORES = ("max_prob", "entropy", "mutual_information")
_ROC_POINTS = 101  # a ROC curve is recorded at this many false-positive rates


def _unsureness(per_task: dict, name: str) -> np.ndarray:
  values = np.asarray(per_task[name], dtype=np.float64)
  return -values if name == "max_prob" else values


def _record_roc(scores: np.ndarray, positives: np.ndarray) -> dict:
  """A ROC curve as JSON lists, at `_ROC_POINTS` evenly spaced false-positive rates.

  Between the curve's points it is linear (tied scores: a diagonal step);
  where it rises vertically the top is kept.
  """
  fpr, tpr = roc_curve(scores, positives)
  last = np.r_[np.flatnonzero(np.diff(fpr)), fpr.size - 1]  # the top of each vertical run
  grid = np.linspace(0.0, 1.0, _ROC_POINTS)
  return {
    "false_positive_rate": grid.tolist(),
    "true_positive_rate": np.interp(grid, fpr[last], tpr[last]).tolist(),
  }


_CONSTANT_SCORE = (
  "the same for every query, so it ranks none: the method has no epistemic part "
  "(one weight draw or none)"
)


def _jsonable_auroc(value: float) -> Optional[float]:
  return None if math.isnan(value) else float(value)


def open_set_summary(per_task: dict) -> dict:
  """Open-set detection and misclassification detection AUROCs of open-set episodes.

  Args:
    per_task: from an open-set evaluation (`evaluation.make_open_set_evaluator`
      through `make_split_evaluator`): `max_prob`, `entropy`,
      `mutual_information`, `correct` (each `[tasks, queries]`) and `targets`
      (the query labels, -1 for a query of a class outside the support set).

  Returns:
    JSON-ready: `auroc` {score: AUROC of unknown (positive) against known
    queries}, `misclassification_auroc` {score: AUROC of wrong (positive)
    against right predictions, known queries only}, `roc` {score: the
    unknown-vs-known ROC curve}, `known_accuracy` (the known queries'
    accuracy in these episodes), and the counts (`num_unknown_classes` per
    episode, from the query counts: each class has the same number of
    queries). An AUROC is None when a group is empty (e.g. no mistakes), and
    when the score is the same for every query: it ranks none of them, so it
    is not applicable rather than at chance (a method without an epistemic
    part, one weight draw or none: MAML, ProtoNet, has a mutual information
    of 0 everywhere). `not_applicable` names those scores, with the reason.
    `uncertainty` {'known', 'unknown'}: the mean `total` entropy of the
    predictive, its `epistemic` part (the mutual information) and its
    `aleatoric` part (their difference), in nats, over each group's queries.
  """
  labels = np.asarray(per_task["targets"])  # [tasks, queries]
  targets = labels.reshape(-1)
  unknown = targets < 0
  known = ~unknown
  wrong = ~np.asarray(per_task["correct"], bool).reshape(-1)[known]
  result = {"auroc": {}, "misclassification_auroc": {}, "roc": {}, "not_applicable": {}}
  for name in OPEN_SET_SCORES:
    scores = _unsureness(per_task, name).reshape(-1)
    result["roc"][name] = _record_roc(scores, unknown)
    if scores.size and np.all(scores == scores[0]):  # ties everywhere: AUROC 0.5 by construction
      result["not_applicable"][name] = _CONSTANT_SCORE
      result["auroc"][name] = result["misclassification_auroc"][name] = None
      continue
    result["auroc"][name] = _jsonable_auroc(auroc(scores, unknown))
    result["misclassification_auroc"][name] = _jsonable_auroc(auroc(scores[known], wrong))
  ways = int(labels.max()) + 1 if known.any() else 0
  per_task_known = int(np.sum(labels[0] >= 0))
  num_unknown_classes = int(np.sum(labels[0] < 0)) * ways // per_task_known if per_task_known else 0
  entropy = np.asarray(per_task["entropy"], np.float64).reshape(-1)
  information = np.asarray(per_task["mutual_information"], np.float64).reshape(-1)
  result["uncertainty"] = {
    group: {
      "total": float(entropy[members].mean()),
      "epistemic": float(information[members].mean()),
      "aleatoric": float((entropy - information)[members].mean()),
    }
    for group, members in (("known", known), ("unknown", unknown))
    if members.any()
  }
  result.update(
    known_accuracy=float(1.0 - wrong.mean()) if wrong.size else None,
    num_unknown_classes=num_unknown_classes,
    num_known_queries=int(known.sum()),
    num_unknown_queries=int(unknown.sum()),
    num_tasks=int(np.shape(per_task["targets"])[0]),
  )
  return result
