"""What differs between kinds of problem, as one definition per kind.

A `ProblemKind` holds everything the library does differently for
classification and regression: the likelihood, the metrics of a training
step, the evaluator, the summary of a split, the score that picks the best
checkpoint and which way is better, what `Run.predict` returns and what
support targets it accepts, and the line that reports a test. A `Problem`
and a run folder name their kind; `get(name)` gives its definition. A new
kind of problem is one more `ProblemKind` in `KINDS`.
"""

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core import losses, meta_step
from vampire_jax._src.core.errors import ConfigError
from vampire_jax._src.metrics import evaluation, summary_inputs


class ProblemKind(NamedTuple):
  """How one kind of problem is learned, scored and reported.

  Attributes:
    name: 'classification', 'regression'.
    likelihood: `likelihood(noise_std) -> nll` (`noise_std` None where unused).
    train_metrics: `metrics_fn(query_outputs, query_y) -> dict` of a meta-step, or None.
    make_evaluator: `make_evaluator(learner, noise_std, *, task_batching, chunk_size, mesh)
      -> evaluate(meta_params, tasks, keys)`, per-task results.
    check_summary: `check_summary(per_task, noise_std) -> per_task` as numpy arrays,
      refusing (InputError) results and targets that do not belong together.
    summarise: `summarise(per_task, num_bins, noise_std) -> (metrics, curves)`.
    score: the per-task result that picks the best checkpoint ('accuracy', 'mse').
    higher_is_better: whether a larger `score` is better.
    draws: `draws(outputs [draws, n, ...])`, each draw's prediction (`Run.predict_draws`).
    predictive: `predictive(draws)`, their combination (`Run.predict`).
    check_support_y: `check_support_y(where, support_y, num_support, num_outputs)`,
      host-side (raises InputError).
    summary_line: `summary_line(test_metrics) -> str`, one line of a test.
    columns: `(title, metric, scale)` of a results table; scale None: no CI.
    draw_per_task: whether a meta-step draws each task inside its loop over tasks
      (`make_train_step`'s `draw_per_task`): classes' examples are gathered, so one task at
      a time is the batch's task bit for bit; generated tasks compute in floating point.
  """

  name: str
  likelihood: Callable[[Optional[float]], losses.Likelihood]
  train_metrics: Optional[meta_step.MetricsFn]
  make_evaluator: Callable[..., Callable]
  check_summary: Callable[[dict, Optional[float]], dict]
  summarise: Callable[[dict, int, Optional[float]], tuple[dict, dict]]
  score: str
  higher_is_better: bool
  draws: Callable[[jax.Array], jax.Array]
  predictive: Callable[[jax.Array], jax.Array]
  check_support_y: Callable[[str, object, int, int], None]
  summary_line: Callable[[dict], str]
  columns: tuple[tuple[str, str, Optional[float]], ...]
  draw_per_task: bool = False

  def better(self, score: float, best: Optional[float]) -> bool:
    """Whether `score` beats `best` (None: nothing yet)."""
    if best is None:
      return True
    return score > best if self.higher_is_better else score < best


def _check_labels(where: str, support_y, num_support: int, ways: int) -> None:
  labels = np.asarray(support_y)
  if labels.shape != (num_support,) or not np.issubdtype(labels.dtype, np.integer):
    raise checks.fail(
      where, "support_y", f"[{num_support}] integer labels", checks.describe(labels)
    )
  present = sorted(set(labels.tolist()))
  if labels.min() < 0 or labels.max() >= ways or len(present) != ways:
    raise checks.fail(
      where,
      "support_y",
      f"labels covering every class 0..{ways - 1} of the run's {ways} ways",
      f"labels {present}",
    )


def _check_targets(where: str, support_y, num_support: int, num_outputs: int) -> None:
  if np.shape(support_y) != (num_support, num_outputs):
    raise checks.fail(
      where,
      "support_y",
      f"[{num_support}, {num_outputs}] targets (one row per support example)",
      checks.describe(support_y),
    )
  checks.floating(where, "support_y", support_y)


def auroc_text(open_set: dict, score: str, which: str = "auroc") -> str:
  """An open-set summary's AUROC as the tables print it: "n/a" for a score that ranks
  nothing (the same for every query: MI without an epistemic part), "–" where a group
  was empty."""
  if score in open_set.get("not_applicable", {}):
    return "n/a"
  value = open_set[which][score]
  return "–" if value is None else f"{value:.3f}"


def _classification_line(test: dict) -> str:
  open_set = test.get("open_set", {})
  open_set_part = (
    ""
    if not open_set.get("auroc")
    else "  open-set AUROC (max prob / MI) "
    + " / ".join(auroc_text(open_set, k) for k in ("max_prob", "mutual_information"))
  )
  mce_bin = f" (bin of {test['mce_bin_count']})" if "mce_bin_count" in test else ""
  return (
    f"test accuracy {100 * test['accuracy']:.2f} +- {100 * test['accuracy_ci95']:.2f} %"
    f"  NLL {test['nll']:.4f}  ECE {test['ece']:.4f}  MCE {test['mce']:.4f}{mce_bin}"
    f"  AURC {test['aurc']:.4f}{open_set_part}  ({test['num_tasks']} tasks)"
  )


def _regression_line(test: dict) -> str:
  calibration_part = f"  ECE {test['ece']:.4f}  MCE {test['mce']:.4f}" if "ece" in test else ""
  # Results written before issue 50 have no median or runaway count.
  median_part = (
    f" (median {test['mse_median']:.3f}; {test['num_ran_away']} ran away)"
    if "mse_median" in test
    else ""
  )
  return (
    f"test MSE {test['mse']:.3f} +- {test['mse_ci95']:.3f}{median_part}  NLL {test['nll']:.3f}"
    f"{calibration_part}  ({test['num_tasks']} tasks)"
  )


def _regression_likelihood(noise_std: Optional[float]) -> losses.Likelihood:
  if noise_std is None:
    raise ConfigError("a regression problem needs the likelihood's noise_std")
  return losses.gaussian_nll(noise_std)


CLASSIFICATION = ProblemKind(
  name="classification",
  likelihood=lambda noise_std: losses.categorical_nll,
  train_metrics=meta_step.classification_metrics,
  make_evaluator=lambda learner, noise_std, **kw: evaluation.make_classification_evaluator(
    learner, **kw
  ),
  check_summary=summary_inputs.check_classification,
  summarise=lambda per_task, num_bins, noise_std: evaluation.classification_summary(
    per_task, num_bins
  ),
  score="accuracy",
  higher_is_better=True,
  draws=lambda logits: jax.nn.softmax(logits, axis=-1),
  predictive=lambda probabilities: jnp.mean(probabilities, axis=0),
  check_support_y=_check_labels,
  summary_line=_classification_line,
  columns=(
    ("accuracy (%)", "accuracy", 100.0),
    ("NLL", "nll", None),
    ("ECE", "ece", None),
    ("MCE", "mce", None),
    ("AURC", "aurc", None),
  ),
  draw_per_task=True,
)

REGRESSION = ProblemKind(
  name="regression",
  likelihood=_regression_likelihood,
  train_metrics=None,
  make_evaluator=evaluation.make_regression_evaluator,
  check_summary=summary_inputs.check_regression,
  summarise=lambda per_task, num_bins, noise_std: evaluation.regression_summary(
    per_task, noise_std
  ),
  score="mse",
  higher_is_better=False,
  draws=lambda samples: samples,
  predictive=lambda samples: samples,
  check_support_y=_check_targets,
  summary_line=_regression_line,
  columns=(
    ("MSE", "mse", 1.0),
    ("median MSE", "mse_median", None),
    ("ran away", "num_ran_away", None),
    ("NLL", "nll", None),
    ("ECE", "ece", None),
    ("MCE", "mce", None),
  ),
)

KINDS: dict[str, ProblemKind] = {kind.name: kind for kind in (CLASSIFICATION, REGRESSION)}


def get(name: str) -> ProblemKind:
  """The kind called `name`; ConfigError naming the choices otherwise."""
  if name not in KINDS:
    raise ConfigError(f"problem kind {name!r} is unknown; choose one of {', '.join(KINDS)}")
  return KINDS[name]


def of_results(results: dict) -> ProblemKind:
  """The kind of a run's `results` (`results.json`).

  Results written before they named their kind are told apart by their score.
  """
  if "kind" in results:
    return get(results["kind"])
  return next(kind for kind in KINDS.values() if kind.score in results["test"])


def summarise(
  kind: str,
  per_task,
  targets=None,
  *,
  num_bins: int = 15,
  noise_std: Optional[float] = None,
  truth=None,
) -> evaluation.Summary:
  """Mean +- 95% CI of the per-task scores, the NLL, and calibration, for a `kind` problem.

      per_task = evaluate(meta_params, tasks, key)
      summary = vj.summarise("classification", per_task, tasks.query_y)

  `per_task` is an evaluator's result (`vj.ClassificationEval`,
  `vj.RegressionEval`) or a dict of its fields; `targets` are the tasks'
  query labels (`[tasks, queries]` integers) or targets (`[tasks, queries,
  1]` or `[tasks, queries]` floats), unless the dict holds them under
  "targets" already. They must be those the evaluator scored: where the
  results allow it (a classifier's accuracy and NLL from its probabilities,
  a regressor's MSE and NLL from its predictions), they are recomputed from
  the targets given, and a mismatch is refused.

  Classification: accuracy, ECE/MCE of `num_bins` confidence bins (Guo et
  al.), and selective prediction (the area under the risk-coverage curve,
  and accuracy at 50/80/90% coverage). Regression (needs the evaluator's
  `noise_std`): the paper's MSE (squared error averaged over draws), the MSE
  of the predictive mean, the PIT calibration of the noisy predictive
  mixture (`pit_ece`, `pit_mce`), the predictive variance split into its
  epistemic part (the variance of the draws' means) and its aleatoric part
  (the noise variance): `predictive_variance`, `epistemic_variance`,
  `aleatoric_variance`, `epistemic_fraction`; and, given `truth` (the
  noiseless targets, `[tasks, queries, 1]`, e.g.
  `vj.data.sine_line.query_truth_from_keys`), the paper's quantile
  calibration as `ece` and `mce`: `vj.paper_quantile_calibration`'s, the
  ECE that the README, the docs and `results.json` report. Beside the mean
  MSE, its median (`mse_median`) and the tasks that ran away (`num_ran_away`:
  MSE not finite or above (max - min)^2 of the query targets, so that their
  predictions left the targets' range; one such task makes the mean
  meaningless).

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((16,), 1)
    >>> learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_mc_query=4)
    >>> meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)),
    ...                            jax.random.key(1))
    >>> evaluate = jax.jit(vj.make_regression_evaluator(learner, noise_std=0.3))
    >>> task_keys = jax.random.split(jax.random.key(2), 20)
    >>> tasks = sine_line.tasks_from_keys(task_keys)
    >>> per_task = evaluate(meta_params, tasks, jax.random.key(3))  # one score per task
    >>> per_task.mse.shape
    (20,)
    >>> summary = vj.summarise("regression", per_task, tasks.query_y, noise_std=0.3,
    ...                        truth=sine_line.query_truth_from_keys(task_keys))
    >>> summary.metrics["num_tasks"], sorted(summary.calibration)
    (20, ['pit_calibration', 'quantile_calibration'])
    >>> summary.metrics["ece"] == summary.calibration["quantile_calibration"].ece
    True
    >>> summary.metrics["num_ran_away"], summary.metrics["mse_median"] < summary.metrics["mse"]
    (0, True)
  """
  if not isinstance(kind, str) or kind not in KINDS:
    raise checks.fail("summarise", "kind", f"one of {', '.join(map(repr, KINDS))}", repr(kind))
  checks.step_count("summarise", "num_bins", num_bins, 1)
  definition = get(kind)
  per_task = summary_inputs.with_targets(per_task, targets, truth)
  per_task = definition.check_summary(per_task, noise_std)
  metrics, curves = definition.summarise(per_task, num_bins, noise_std)
  return evaluation.with_nll(metrics, curves, per_task)


def test_summary_line(test: dict, kind: Optional[str] = None) -> str:
  """One line of a run's test metrics (`results["test"]`), for its `kind` (default: by its score)."""
  return of_results({"test": test, **({"kind": kind} if kind else {})}).summary_line(test)
