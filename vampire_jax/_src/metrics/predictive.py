"""The predictive distribution of an adapted learner, as a distrax distribution.

A Bayesian learner predicts a query's target by averaging the likelihood over
its weight draws: p(y | x) = mean_l p(y | f_l(x)). Here that average is a
distrax distribution over the query targets, one per query point:

- classification: `PredictiveCategorical`, a `distrax.Categorical(probs=mean_l
  softmax(logits_l))`, with `log_prob`, `sample`, `probs`, `mode` and
  `entropy` (class labels have no mean or variance);
- regression: `PredictiveMixture`, a `distrax.MixtureSameFamily` with equal
  weights over the draws, each draw's likelihood (`Normal(f_l(x),
  noise_std)`, or the family of a `vj.distribution_nll`) as a component, with
  `log_prob`, `sample`, `mean`, `variance`, `stddev`.

`log_prob` of the query targets is the log of the Monte-Carlo predictive that
the evaluators score (their NLL is its negated mean); it takes exactly the
shape of the evaluator's targets and refuses others, which distrax would
broadcast (`predictive_distributions`). Samples carry the likelihood's
noise, and a mixture's `variance` is Var_l[f_l(x)] (epistemic) plus the mean
noise variance (aleatoric), as `vj.regression_uncertainty` and the
regression summary split it.

distrax loads TFP's JAX substrate (about 10 s): it is imported on the first
call, not with `import vampire_jax`, and without TensorFlow (`distrax_import`).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core import losses
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.learners import MetaLearner, adapt_to_task

PyTree = Any


def predictive_distribution(outputs: jax.Array, nll: losses.Likelihood):
  """The predictive distribution of per-draw network outputs under a likelihood.

  Args:
    outputs: `[num_draws, num_query, ...]`, the network's outputs under each
      weight draw (`learner.predict`, `Run.predict_function_draws`): logits
      for `vj.categorical_nll` (`[num_draws, num_query, classes]`; not
      probabilities: their logits are `jnp.log(p)`), means for
      `vj.gaussian_nll`, the distribution's parameters for
      `vj.distribution_nll`.
    nll: the likelihood the learner trained on (`learner.nll`).

  Returns:
    A distrax distribution of batch shape `[num_query]`:
    `PredictiveCategorical` (a `distrax.Categorical`) for
    `vj.categorical_nll`, whose `log_prob` takes `[num_query]` integer
    labels; else a `PredictiveMixture` (a `distrax.MixtureSameFamily`) over
    the draws whose event is one query's target (`[outputs]`), whose
    `log_prob` takes `[num_query, outputs]` float targets; under a likelihood
    with a quantile map (a run recalibrated by `vj.recalibrate(...,
    method="quantile")`), that mixture under the map, a
    `RecalibratedPredictive` (its CDF R(F(y)), with `log_prob`, `cdf`,
    `quantile`, `sample`, `mean`, `variance`). Either refuses
    (`InputError`) a value of another shape or dtype, which distrax would
    broadcast.

  Raises:
    InputError: `outputs` without a draw and a query axis; for
      `vj.categorical_nll`, outputs without a class axis, or (where concrete)
      rows that are already probabilities (in [0, 1], summing to 1), which a
      second softmax would flatten; a likelihood that names no distribution
      (one written by hand: wrap it in `vj.distribution_nll`), a distrax class
      in its place, or a `vj.distribution_nll` whose family is not one scalar
      distribution per output (a `distrax.Categorical` over the last axis).
  """
  from vampire_jax._src.metrics import predictive_distributions as dists

  where = "vj.predictive_distribution"
  dists.refuse_not_a_likelihood(where, nll)
  if not hasattr(outputs, "shape") or jnp.ndim(outputs) < 2 or jnp.shape(outputs)[0] < 1:
    raise checks.fail(
      where, "outputs", "[num_draws >= 1, num_query, ...]", checks.describe(outputs)
    )
  if nll is losses.categorical_nll:
    if jnp.ndim(outputs) < 3:
      raise checks.fail(
        where, "outputs", "[num_draws, num_query, classes] logits", checks.describe(outputs)
      )
    _refuse_probabilities(where, outputs)
    return dists.categorical(jnp.mean(jax.nn.softmax(outputs, axis=-1), axis=0))
  make = getattr(nll, "distribution", None)
  if make is None:
    raise InputError(
      f"{where}: the likelihood {getattr(nll, '__name__', nll)!r} names no distribution; "
      "use vj.categorical_nll, vj.gaussian_nll or vj.distribution_nll"
    )
  per_query = jnp.moveaxis(outputs, 0, 1)  # [num_query, num_draws, ...]: draws as components
  components = make(per_query, batch_ndims=2)  # batch [num_query, num_draws], event a target
  family = getattr(components, "distribution", components)
  if tuple(family.batch_shape) != tuple(per_query.shape):
    raise InputError(
      f"{where}: nll's distribution must be one scalar distribution per network output "
      f"(batch shape {tuple(per_query.shape)}), got {type(family).__name__} of batch shape "
      f"{tuple(family.batch_shape)}; for class labels use vj.categorical_nll"
    )
  mixture = dists.mixture(components, jnp.result_type(per_query))
  quantile_map = getattr(nll, "quantile_map", None)  # a recalibrated run's (vj.recalibrate)
  return mixture if quantile_map is None else dists.recalibrated(mixture, quantile_map)


def _refuse_probabilities(where: str, logits: jax.Array) -> None:
  """Where concrete: refuses rows that are exactly probabilities (a second softmax flattens them)."""
  if not checks.concrete(logits) or jnp.shape(logits)[-1] < 2:
    return
  values = np.asarray(logits, np.float64)
  if (
    values.size
    and np.all((values >= 0) & (values <= 1))
    and np.allclose(values.sum(axis=-1), 1.0, rtol=0, atol=1e-5)
  ):
    raise checks.fail(
      where,
      "outputs",
      "logits (vj.categorical_nll takes their softmax; for probabilities p pass jnp.log(p))",
      f"{checks.describe(logits)} whose every row is in [0, 1] and sums to 1",
    )


def predictive(
  learner: MetaLearner,
  meta_params: PyTree,
  support_x: jax.Array,
  support_y: jax.Array,
  query_x: jax.Array,
  key: jax.Array,
):
  """Adapts `learner` to a support set and returns its predictive over the queries.

  The key is split as the evaluators split a task's key (adaptation, then
  prediction), so the same key gives the draws the evaluators score. Jittable.

  Args:
    learner: a `MetaLearner` (`vj.vampire`, `vj.maml`, the baselines).
    meta_params: its meta-parameters (`state.meta_params`, `run.meta_params`).
    support_x, support_y: one task's support set.
    query_x: `[num_query, ...]` inputs to predict.
    key: PRNG key of the adaptation and prediction draws.

  Returns:
    `predictive_distribution(learner.predict(...), learner.nll)`.

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((16,), 1)
    >>> learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_mc_query=8)
    >>> meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)),
    ...                            jax.random.key(1))
    >>> task = jax.tree.map(lambda field: field[0],
    ...                     sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 1)))
    >>> dist = vj.predictive(learner, meta_params, task.support_x, task.support_y,
    ...                      task.query_x, jax.random.key(3))
    >>> dist.batch_shape, dist.event_shape, dist.log_prob(task.query_y).shape
    ((10,), (1,), (10,))
    >>> bool(jnp.all(dist.stddev() >= 0.3))  # the noise, plus the draws' spread
    True
  """
  checks.prng_key("vj.predictive", "key", key)
  task_params, predict_key = adapt_to_task(learner, meta_params, support_x, support_y, key)
  return predictive_distribution(learner.predict(task_params, query_x, predict_key), learner.nll)


def predictive_interval(distribution, level: float = 0.9, num_bisections: int = 60):
  """The central `level` interval of each query's predictive, `(lower, upper)`.

  For a mixture whose components have a `cdf` (a regression predictive of
  `vj.gaussian_nll`, or of a `vj.distribution_nll` family with one), the
  interval's ends are the (1 - level) / 2 and (1 + level) / 2 quantiles,
  found by bisection on the mixture's CDF; under a quantile map R (a
  recalibrated run's predictive), F^-1(R^-1((1 -+ level) / 2)). The bracket starts at the
  components' means +- 12 standard deviations (where they are finite: a
  Student-t of df <= 2 has an infinite one) and is widened until the
  mixture's CDF brackets the level, so heavy tails get their true interval.

  Jittable, with `level` and `num_bisections` static:
  `jax.jit(vj.predictive_interval, static_argnames=("level", "num_bisections"))`.

  Args:
    distribution: from `predictive_distribution` / `vj.predictive` /
      `Run.predictive`, of a regression run (also one made under `vmap`, of
      batch `[tasks, num_query]`).
    level: a number in (0, 1), static.
    num_bisections: halvings of the bracket, an integer >= 1 (60: below
      float32 resolution).

  Returns:
    Two arrays shaped like a sample, `batch + event` (`[num_query, outputs]`).

  Raises:
    InputError: a level that is not a number in (0, 1) or is traced, fewer
      than one bisection, or a distribution that is not a mixture of
      components with a `cdf`.
  """
  where = "vj.predictive_interval"
  _check_level(where, level)
  checks.step_count(where, "num_bisections", num_bisections, 1)
  quantile_map = getattr(distribution, "quantile_map", None)
  mixture = (
    getattr(distribution, "base", distribution) if quantile_map is not None else distribution
  )
  components = getattr(mixture, "components_distribution", None)
  inner = getattr(components, "distribution", components)
  if components is None or not hasattr(inner, "cdf"):
    raise checks.fail(
      where,
      "distribution",
      "a regression predictive (a mixture over weight draws of components with a cdf; "
      "a classifier's has no interval)",
      checks.describe(distribution),
    )
  if hasattr(distribution, "check_shapes"):
    distribution.check_shapes(where)
  from vampire_jax._src.metrics import predictive_distributions as dists

  ends = (0.5 * (1.0 - float(level)), 0.5 * (1.0 + float(level)))
  if quantile_map is not None:  # the recalibrated CDF R(F) reaches p where F reaches R^-1(p)
    ends = tuple(float(u) for u in quantile_map.inverse(np.asarray(ends)))
  return tuple(dists.mixture_quantile(mixture, q, num_bisections) for q in ends)


def _check_level(where: str, level) -> None:
  if isinstance(level, jax.core.Tracer):
    raise checks.fail(
      where,
      "level",
      "a static number in (0, 1): under jit, close over it or mark it static "
      '(jax.jit(vj.predictive_interval, static_argnames="level"))',
      f"a traced {checks.describe(level)}",
    )
  is_number = isinstance(level, (int, float, np.integer, np.floating)) or (
    hasattr(level, "dtype") and np.ndim(level) == 0 and jnp.issubdtype(level.dtype, jnp.floating)
  )
  if isinstance(level, (bool, np.bool_)) or not is_number:
    raise checks.fail(where, "level", "a number in (0, 1), e.g. 0.9", checks.describe(level))
  if not 0.0 < float(level) < 1.0:
    raise checks.fail(where, "level", "a number in (0, 1), e.g. 0.9", repr(float(level)))
