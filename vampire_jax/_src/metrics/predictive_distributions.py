"""The two predictive distributions, distrax's with a `log_prob` that refuses what it cannot score.

distrax broadcasts a value against the batch shape: a regression predictive
of batch `[Q]` and event `[1]` given targets `[Q]` scored each query's
mixture on all Q targets, and a classifier's of batch `[Q]` given labels
`[Q, 1]` returned `[Q, Q]`; a label 1.5 or 7 of 5 classes was read as a
class. These subclasses take exactly the shape of the evaluator's targets
(`[Q, 1]` for one regression task, `[Q]` integer labels for one classifier's
task; with a leading task axis for a predictive made under `vmap`) and refuse
anything else in one line. Everything else (`sample`, `entropy`, `probs`,
`mean`, `variance`, `jit`, `vmap`) is distrax's.

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
