"""The predictive distributions, distrax's with a `log_prob` that refuses what it cannot score.

distrax broadcasts a value against the batch shape: a regression predictive
of batch `[Q]` and event `[1]` given targets `[Q]` scored each query's
mixture on all Q targets, and a classifier's of batch `[Q]` given labels
`[Q, 1]` returned `[Q, Q]`; a label 1.5 or 7 of 5 classes was read as a
class. These subclasses take exactly the shape of the evaluator's targets
(`[Q, 1]` for one regression task, `[Q]` integer labels for one classifier's
task; with a leading task axis for a predictive made under `vmap`) and refuse
anything else in one line. Everything else (`sample`, `entropy`, `probs`,
`mean`, `variance`, `jit`, `vmap`) is distrax's.

A third, `RecalibratedPredictive`, is a regressor's mixture under a quantile map R
(`vj.recalibrate(..., method="quantile")`): CDF R(F(y)), density R'(F(y)) f(y), quantiles
F^-1(R^-1(p)) (`quantile_map` has the maths); its samples are quantiles at uniform levels,
its mean and variance exact sums over R's bins.

Imported on first use, with distrax (`distrax_import`).
"""

import jax
import jax.numpy as jnp

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.distrax_import import import_distrax
from vampire_jax._src.core.errors import InputError

distrax = import_distrax()

_SAMPLES_HINT = "for a leading axis of samples, jax.vmap(dist.log_prob)"


def _check_shape(where: str, name: str, value, wanted: tuple, what: str) -> None:
  if not (hasattr(value, "shape") and hasattr(value, "dtype")):
    raise checks.fail(
      where, name, f"an array of {what}, shaped {list(wanted)}", checks.describe(value)
    )
  if tuple(value.shape) != tuple(wanted):
    raise checks.fail(
      where,
      name,
      f"shaped {list(wanted)} as the evaluator's targets ({what}; {_SAMPLES_HINT})",
      checks.describe(value),
    )


class PredictiveCategorical(distrax.Categorical):
  """A classifier's predictive: the mean over weight draws of their softmax.

  `log_prob` and `prob` take integer labels shaped like the batch, each in
  `[0, classes)` (checked where the labels are concrete; under `jit` a label
  outside them scores distrax's -inf). Class labels are not numbers, so there is no `mean` or
  `variance`: `probs` is the expected one-hot label, `mode()` the predicted
  class, `entropy()` the total uncertainty.
  """

  def _check_labels(self, where: str, value) -> None:
    classes = self.num_categories
    what = f"integer class indices in [0, {classes}); of one-hot labels y, jnp.argmax(y, -1)"
    _check_shape(where, "value", value, self.batch_shape, what)
    if not jnp.issubdtype(value.dtype, jnp.integer):
      raise checks.fail(where, "value", what, checks.describe(value))
    checks.labels_in_range(where, "value", value, classes)

  def log_prob(self, value):
    """`log p(value)` of each query: `value` is `[batch]` integer labels."""
    self._check_labels("PredictiveCategorical.log_prob", value)
    return super().log_prob(value)

  def prob(self, value):
    """`p(value)` of each query: `value` is `[batch]` integer labels."""
    self._check_labels("PredictiveCategorical.prob", value)
    return super().prob(value)

  def _sample_n_and_log_prob(self, key, n):
    samples = self._sample_n(key, n)  # [n, batch]: scored unchecked, they are the labels
    return samples, super().log_prob(samples)

  def mean(self):
    raise NotImplementedError(
      "PredictiveCategorical.mean: class labels have no mean; use .probs (the expected "
      "one-hot label), .mode() (the predicted class) or .entropy() (the uncertainty)"
    )

  def variance(self):
    raise NotImplementedError(
      "PredictiveCategorical.variance: class labels have no variance; use .entropy() (total "
      "uncertainty) or vj.uncertainty(run.predict_draws(...)) for its epistemic part"
    )

  def __getitem__(self, index):
    return PredictiveCategorical(probs=super().__getitem__(index).probs)


class PredictiveMixture(distrax.MixtureSameFamily):
  """A regressor's predictive: equal weights over the draws' likelihoods.

  `log_prob` and `prob` take float targets shaped `batch + event` (`[Q, 1]`
  for one task: the evaluator's `query_y`).
  """

  def check_shapes(self, where: str) -> None:
    """InputError if the weights' batch is not the components' (a TFP family out of vmap)."""
    weights = tuple(self.mixture_distribution.batch_shape)
    if weights != tuple(self.batch_shape):
      raise InputError(
        f"{where}: this predictive's components have batch shape {tuple(self.batch_shape)} "
        f"and its weights {weights}: returned from jax.vmap, its family kept a batch shape "
        "of one task (distrax's Laplace and TFP's distributions do); call log_prob or "
        "vj.predictive_interval inside the vmapped function"
      )

  def _check_targets(self, where: str, value) -> None:
    self.check_shapes(where)
    wanted = tuple(self.batch_shape) + tuple(self.event_shape)
    _check_shape(where, "value", value, wanted, "float targets, one row per query")
    if not jnp.issubdtype(value.dtype, jnp.floating):
      raise checks.fail(where, "value", "float targets", checks.describe(value))

  def log_prob(self, value):
    """`log p(value)` of each query: `value` is `batch + event` float targets."""
    self._check_targets("PredictiveMixture.log_prob", value)
    return super().log_prob(value)

  def _sample_n_and_log_prob(self, key, n):
    samples = self._sample_n(key, n)
    return samples, super().log_prob(samples)

  def __getitem__(self, index):
    sliced = super().__getitem__(index)
    return PredictiveMixture(sliced.mixture_distribution, sliced.components_distribution)


class RecalibratedPredictive(distrax.Distribution):
  """A regressor's predictive mixture F under a quantile map R: the CDF R(F(y)).

  Attributes:
    base: the mixture (a `PredictiveMixture` of Gaussians, the variance-scaled one of a
      recalibrated run).
    quantile_map: R (`quantile_map.QuantileMap`; its knots are Python floats, static
      under `jit` and `vmap`).

  `log_prob` and `prob` take float targets shaped `batch + event`, as the mixture's;
  `cdf` too. `quantile(p)` is F^-1(R^-1(p)) by bisection on F; `sample` draws quantiles
  at uniform levels. `mean` and `variance` are exact: on bin j of R, between the PIT
  values u_j and u_(j+1), the density is R'_j f, so E[y^k] = sum_j R'_j int y^k f(y) dy
  over [F^-1(u_j), F^-1(u_(j+1))], each a Gaussian's partial moment in closed form.
  """

  def __init__(self, base: PredictiveMixture, quantile_map):
    super().__init__()
    self.base = base
    self.quantile_map = quantile_map

  @property
  def batch_shape(self):
    return self.base.batch_shape

  @property
  def event_shape(self):
    return self.base.event_shape

  @property
  def dtype(self):
    return self.base.dtype

  def check_shapes(self, where: str) -> None:
    self.base.check_shapes(where)

  def base_cdf(self, value):
    """F(value), the mixture's CDF before the map, `batch + event`."""
    return mixture_cdf(self.base, value)

  def cdf(self, value):
    """R(F(value)): `value` is `batch + event` float targets."""
    self.base._check_targets("RecalibratedPredictive.cdf", value)
    return self.quantile_map(self.base_cdf(value), xp=jnp)

  def log_prob(self, value):
    """log R'(F(value)) + log f(value) of each query: `value` is `batch + event` targets."""
    self.base._check_targets("RecalibratedPredictive.log_prob", value)
    return self._log_prob(value)

  def _log_prob(self, value):
    log_slope = self.quantile_map.log_slope(self.base_cdf(value), xp=jnp)
    event_axes = tuple(range(-len(self.event_shape), 0))
    return distrax.MixtureSameFamily.log_prob(self.base, value) + jnp.sum(log_slope, event_axes)

  def quantile(self, level, num_bisections: int = 60):
    """F^-1(R^-1(level)), `batch + event`; `level` in (0, 1), broadcast to that shape."""
    return mixture_quantile(self.base, self.quantile_map.inverse(level, xp=jnp), num_bisections)

  def _sample_n(self, key, n):
    shape = (n,) + tuple(self.batch_shape) + tuple(self.event_shape)
    tiny = jnp.finfo(self.dtype).eps
    levels = jax.random.uniform(key, shape, self.dtype, minval=tiny, maxval=1.0 - tiny)
    return jax.vmap(self.quantile)(levels)

  def _sample_n_and_log_prob(self, key, n):
    samples = self._sample_n(key, n)
    return samples, jax.vmap(self._log_prob)(samples)

  def _moments(self):
    """`(E[y - c], E[(y - c)^2])` and c, the mixture's mean (about which they are taken)."""
    qmap = self.quantile_map
    components = self.base.components_distribution
    inner = getattr(components, "distribution", components)
    draw_axis = len(self.batch_shape)
    centre = self.base.mean()  # batch + event
    loc = inner.loc - jnp.expand_dims(centre, draw_axis)  # batch + [draws] + event
    scale = jnp.broadcast_to(inner.scale, loc.shape)
    interior = jnp.asarray(qmap.pit[1:-1], self.dtype)
    ends = jax.vmap(lambda u: mixture_quantile(self.base, u))(interior)  # [K-1] + batch + event
    ends = jnp.expand_dims(ends - centre, draw_axis + 1)
    infinite = jnp.full((1,) + ends.shape[1:], jnp.inf, self.dtype)
    ends = jnp.concatenate([-infinite, ends, infinite])  # [K+1] + batch + [1] + event
    z = (ends - loc) / scale
    cdf, pdf = jax.scipy.stats.norm.cdf(z), jax.scipy.stats.norm.pdf(z)
    z_pdf = jnp.where(jnp.isfinite(z), z * pdf, 0.0)
    d_cdf, d_pdf, d_z_pdf = (jnp.diff(v, axis=0) for v in (cdf, pdf, z_pdf))  # [K] + ...
    # int y phi and int y^2 phi of N(loc, scale^2) between each bin's ends (y = loc + scale z)
    first = loc * d_cdf - scale * d_pdf
    second = (loc**2 + scale**2) * d_cdf - 2 * loc * scale * d_pdf - scale**2 * d_z_pdf
    pit, level = jnp.asarray(qmap.pit), jnp.asarray(qmap.level)
    slopes = (jnp.diff(level) / jnp.diff(pit)).astype(self.dtype)
    slopes = slopes.reshape((-1,) + (1,) * (first.ndim - 1))
    weights = jax.nn.softmax(self.base.mixture_distribution.logits, axis=-1)
    weights = weights.reshape(weights.shape + (1,) * len(self.event_shape))

    def expectation(partial):  # sum over bins of R'_j times the mixture's partial moment
      return jnp.sum(weights * jnp.sum(slopes * partial, axis=0), axis=draw_axis)

    return expectation(first), expectation(second), centre

  def mean(self):
    first, _, centre = self._moments()
    return centre + first

  def variance(self):
    first, second, _ = self._moments()
    return jnp.maximum(second - first**2, 0.0)


def mixture_cdf(distribution: PredictiveMixture, value):
  """The mixture's CDF at `value` (`batch + event`): its components' CDFs, weighted."""
  components = distribution.components_distribution
  inner = getattr(components, "distribution", components)
  draw_axis = len(distribution.batch_shape)  # components: batch + [draws] + event
  weights = jax.nn.softmax(distribution.mixture_distribution.logits, axis=-1)
  weights = weights.reshape(weights.shape + (1,) * len(distribution.event_shape))
  return jnp.sum(weights * inner.cdf(jnp.expand_dims(value, draw_axis)), axis=draw_axis)


def mixture_quantile(distribution: PredictiveMixture, q, num_bisections: int = 60):
  """The mixture's `q`-quantile (`q` broadcast to `batch + event`), by bisection on its CDF.

  The bracket starts at the components' means +- 12 standard deviations (where they are
  finite: a Student-t of df <= 2 has an infinite one) and is widened until the CDF
  brackets q, so heavy tails get their true quantile.
  """
  components = distribution.components_distribution
  inner = getattr(components, "distribution", components)
  draw_axis = len(distribution.batch_shape)
  shape = tuple(distribution.batch_shape) + tuple(distribution.event_shape)
  q = jnp.broadcast_to(q, shape)

  def cdf(y):
    return mixture_cdf(distribution, y)

  centres, spreads = _finite_moments(inner, components)
  low0 = jnp.min(centres - 12.0 * spreads, axis=draw_axis)
  high0 = jnp.max(centres + 12.0 * spreads, axis=draw_axis)

  def misses(low, high):
    return (cdf(low) > q) | (cdf(high) < q)

  def widen(state):  # each miss at least doubles the bracket: ~130 reach float32's range
    low, high, count = state
    width = high - low
    low = jnp.where(cdf(low) > q, low - width, low)
    high = jnp.where(cdf(high) < q, high + width, high)
    return low, high, count + 1

  def keep_widening(state):
    low, high, count = state
    return (count < 256) & jnp.any(misses(low, high))

  low, high, _ = jax.lax.while_loop(keep_widening, widen, (low0, high0, 0))

  def halve(_, bracket):
    low, high = bracket
    middle = 0.5 * (low + high)
    below = cdf(middle) < q
    return jnp.where(below, middle, low), jnp.where(below, high, middle)

  low, high = jax.lax.fori_loop(0, num_bisections, halve, (low, high))
  return 0.5 * (low + high)


def _finite_moments(inner, components):
  """Each component's mean and standard deviation where finite (else 0 and 1), for a bracket."""
  shape = components.batch_shape + components.event_shape
  try:
    centres, spreads = inner.mean(), inner.stddev()
  except NotImplementedError:
    centres, spreads = jnp.zeros(shape), jnp.ones(shape)
  centres = jnp.broadcast_to(jnp.where(jnp.isfinite(centres), centres, 0.0), shape)
  usable = jnp.isfinite(spreads) & (spreads > 0)
  spreads = jnp.broadcast_to(jnp.where(usable, spreads, 1.0), shape)
  return centres, spreads


def recalibrated(mixture: PredictiveMixture, quantile_map) -> RecalibratedPredictive:
  """`mixture` under the quantile map R."""
  return RecalibratedPredictive(mixture, quantile_map)


def categorical(probabilities: jax.Array) -> PredictiveCategorical:
  """The predictive of `[..., classes]` mean probabilities."""
  return PredictiveCategorical(probs=probabilities)


def mixture(components, dtype) -> PredictiveMixture:
  """Equal weights (of `dtype`) over the last batch axis of `components` (the draws)."""
  equal = jnp.zeros(components.batch_shape, dtype)
  return PredictiveMixture(distrax.Categorical(logits=equal), _batched_parameters(components))


def _batched_parameters(components):
  """`components` with each parameter of fewer axes than the batch broadcast to it.

  A shared parameter (`Normal(means, 0.3)`'s scale) is an array of shape `[]`.
  Returned from `vmap` over tasks, each array gains a leading task axis, and that
  scale, now `[tasks]`, would broadcast against the means' last axis (an event of
  shape `[tasks]`). Broadcast to the batch first, every parameter gains its task axis
  in front.
  """
  family = getattr(components, "distribution", components)
  batch = tuple(family.batch_shape)

  def to_batch(leaf):
    if isinstance(leaf, jax.Array) and leaf.ndim < len(batch):
      return jnp.broadcast_to(leaf, batch[: len(batch) - leaf.ndim] + leaf.shape)
    return leaf

  return jax.tree_util.tree_map(to_batch, components)


def refuse_not_a_likelihood(where: str, nll) -> None:
  """A distrax class or distribution given where a likelihood function is wanted."""
  is_class = isinstance(nll, type) and issubclass(nll, distrax.Distribution)
  if is_class or isinstance(nll, distrax.Distribution):
    name = nll.__name__ if is_class else type(nll).__name__
    raise InputError(
      f"{where}: nll must be the learner's likelihood function (learner.nll), got the distrax "
      f"{'class' if is_class else 'distribution'} {name}; class labels: vj.categorical_nll; "
      "a family: vj.distribution_nll(lambda outputs: distrax.Laplace(outputs, 0.3))"
    )
