"""The predictive distribution of an adapted learner, as a distrax distribution.

A Bayesian learner predicts a query's target by averaging the likelihood over
its weight draws: p(y | x) = mean_l p(y | f_l(x)). Here that average is a
distrax distribution over the query targets, one per query point, with
`log_prob`, `sample`, `mean`, `variance` (and `entropy` for a classifier):

- classification: `distrax.Categorical(probs=mean_l softmax(logits_l))`;
- regression: `distrax.MixtureSameFamily`, equal weights over the draws, each
  draw's likelihood (`Normal(f_l(x), noise_std)`, or the family of a
  `vj.distribution_nll`) as a component.

`log_prob` of the query targets is the log of the Monte-Carlo predictive that
the evaluators score (their NLL is its negated mean), samples carry the
likelihood's noise, and a mixture's `variance` is Var_l[f_l(x)] (epistemic)
plus the mean noise variance (aleatoric), as `vj.regression_uncertainty` and
the regression summary split it.

distrax loads TFP's JAX substrate (about 5 s): it is imported here, on the
first call, not with `import vampire_jax`.
"""

from typing import Any

import jax
import jax.numpy as jnp

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
      for `vj.categorical_nll`, means for `vj.gaussian_nll`, the
      distribution's parameters for `vj.distribution_nll`.
    nll: the likelihood the learner trained on (`learner.nll`).

  Returns:
    A distrax distribution of batch shape `[num_query]`: `Categorical` for
    `vj.categorical_nll` (event `[]`, integer labels), else a
    `MixtureSameFamily` over the draws whose event is one query's target
    (`[outputs]`).

  Raises:
    InputError: `outputs` without a draw and a query axis, or a likelihood
      that names no distribution (one written by hand: wrap it in
      `vj.distribution_nll`).
  """
  import distrax

  where = "vj.predictive_distribution"
  if jnp.ndim(outputs) < 2 or jnp.shape(outputs)[0] < 1:
    raise checks.fail(
      where, "outputs", "[num_draws >= 1, num_query, ...]", checks.describe(outputs)
    )
  if nll is losses.categorical_nll:
    return distrax.Categorical(probs=jnp.mean(jax.nn.softmax(outputs, axis=-1), axis=0))
  make = getattr(nll, "distribution", None)
  if make is None:
    raise InputError(
      f"{where}: the likelihood {getattr(nll, '__name__', nll)!r} names no distribution; "
      "use vj.categorical_nll, vj.gaussian_nll or vj.distribution_nll"
    )
  per_query = jnp.moveaxis(outputs, 0, 1)  # [num_query, num_draws, ...]: draws as components
  components = make(per_query, batch_ndims=2)  # batch [num_query, num_draws], event a target
  equal = jnp.zeros(per_query.shape[:2], per_query.dtype)
  return distrax.MixtureSameFamily(distrax.Categorical(logits=equal), components)


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
  found by bisection on the mixture's CDF to float precision.

  Args:
    distribution: from `predictive_distribution` / `vj.predictive` /
      `Run.predictive`, of a regression run.
    level: in (0, 1).
    num_bisections: halvings of the bracket (60: below float32 resolution).

  Returns:
    Two arrays shaped like a sample, `[num_query, outputs]`.

  Raises:
    InputError: a level outside (0, 1), or a distribution that is not a
      mixture of components with a `cdf`.
  """
  if not 0.0 < level < 1.0:
    raise checks.fail("vj.predictive_interval", "level", "a number in (0, 1)", repr(level))
  components = getattr(distribution, "components_distribution", None)
  inner = getattr(components, "distribution", components)
  if components is None or not hasattr(inner, "cdf"):
    raise InputError(
      "vj.predictive_interval: distribution must be a regression predictive (a mixture "
      "over weight draws of components with a cdf); a classifier's has no interval"
    )
  weights = jax.nn.softmax(distribution.mixture_distribution.logits, axis=-1)  # [query, draws]
  means, stds = inner.mean(), inner.stddev()  # [query, draws, outputs]
  lower0 = jnp.min(means - 12.0 * stds, axis=1)
  upper0 = jnp.max(means + 12.0 * stds, axis=1)

  def mixture_cdf(y):  # [query, outputs]
    return jnp.sum(weights[..., None] * inner.cdf(y[:, None]), axis=1)

  def quantile(q):
    def halve(_, bracket):
      low, high = bracket
      middle = 0.5 * (low + high)
      below = mixture_cdf(middle) < q
      return jnp.where(below, middle, low), jnp.where(below, high, middle)

    low, high = jax.lax.fori_loop(0, num_bisections, halve, (lower0, upper0))
    return 0.5 * (low + high)

  return quantile(0.5 * (1.0 - level)), quantile(0.5 * (1.0 + level))
