"""Likelihoods on network outputs, and the `loss_fn` that `adapt` takes.

A likelihood here is `nll(outputs, y)`: the mean negative log-likelihood of
targets `y` given one network output batch. `gaussian_nll`'s and
`distribution_nll`'s also have `nll.distribution(outputs, batch_ndims=1)`, the
targets' distrax distribution, which `vj.predictive_distribution` mixes over
weight draws (a classifier's predictive is the Categorical of the mean softmax). `loss_from_apply` lifts it to
`loss_fn(params, x, y)` for a network `apply_fn(params, x)`. The `mixture_*`
functions score the Monte-Carlo predictive (the average over weight draws).
"""

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.distrax_import import import_distrax

PyTree = Any
# `apply_fn(params, x) -> outputs`: a network applied with one weight tree.
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]
# `loss_fn(params, x, y) -> scalar`: the mean NLL of (x, y) under one weight tree.
LossFn = Callable[[PyTree, jax.Array, jax.Array], jax.Array]
# `nll(outputs, y) -> scalar`: the mean NLL of targets given one output batch.
Likelihood = Callable[[jax.Array, jax.Array], jax.Array]


def _with_default_inner_lr(nll: Likelihood, inner_lr: float) -> Likelihood:
  nll.default_inner_lr = inner_lr
  return nll


def categorical_nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy; logits `[batch, classes]`, labels `[batch]` ints in `[0, classes)`.

  A label outside `[0, classes)` has no probability: -1 would index the last
  class and `classes` would give NaN. Concrete labels (called outside `jit`)
  are checked, and such a label is refused. Under `jit` the labels are
  tracers: the loss (and its gradient) is then NaN, so that a meta-step's
  `metrics["finite"]` is False and `vj.debug_nonfinite` names the step.

  Raises:
    InputError: labels that are not integers shaped like `logits[..., 0]`,
      or (concrete) outside `[0, classes)`.
  """
  if jnp.ndim(logits) < 1:
    raise checks.fail("categorical_nll", "logits", "[batch, classes]", checks.describe(logits))
  if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
    raise checks.fail("categorical_nll", "labels", "integer class indices", checks.describe(labels))
  if jnp.shape(labels) != jnp.shape(logits)[:-1]:
    raise checks.fail(
      "categorical_nll",
      "labels",
      f"shaped {list(jnp.shape(logits)[:-1])} for logits {checks.describe(logits)}",
      checks.describe(labels),
    )
  num_classes = jnp.shape(logits)[-1]
  checks.labels_in_range("categorical_nll", "labels", labels, num_classes)
  per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  # Traced labels out of range: NaN in the loss and in its gradient (x NaN, not a where).
  valid = (labels >= 0) & (labels < num_classes)
  return jnp.mean(per_example * jnp.where(valid, 1.0, jnp.nan).astype(per_example.dtype))


def _check_categorical_targets(outputs, labels) -> None:
  """`loss_fits`'s value check: concrete labels in `[0, classes)` of the outputs."""
  checks.labels_in_range("categorical_nll", "labels", labels, outputs.shape[-1])


# The learners' default inner learning rate for this likelihood (see `gaussian_nll`).
categorical_nll = _with_default_inner_lr(categorical_nll, 0.1)
categorical_nll.check_targets = _check_categorical_targets


def _check_targets(where: str, outputs: jax.Array, targets: jax.Array) -> None:
  checks.floating(where, "targets", targets)
  if jnp.shape(targets) != jnp.shape(outputs):
    raise checks.fail(
      where,
      "targets",
      f"shaped like the outputs {checks.describe(outputs)} (no broadcasting)",
      checks.describe(targets),
    )


def gaussian_nll(noise_std: float) -> Likelihood:
  """Mean NLL of targets under N(outputs, noise_std^2); both `[batch, 1]`.

  The returned function refuses targets of another shape than the outputs
  (a `[K]` target against `[K, 1]` outputs would broadcast to `[K, K]`).

  Its `default_inner_lr` attribute, `min(0.1, 0.005 * noise_std^2)`, is the
  inner learning rate the learners use unless given one: the NLL's curvature
  is 1 / noise_std^2, so a gradient step stays stable only below a rate
  proportional to noise_std^2 (measured for the regression MLP in docs/fidelity.md,
  "Defaults that hold").
  """
  checks.rate("gaussian_nll", "noise_std", noise_std, positive=True)
  log_norm = math.log(noise_std) + 0.5 * math.log(2.0 * math.pi)

  def nll(means, targets):
    _check_targets("gaussian_nll", means, targets)
    residual = (means - targets) / noise_std
    return jnp.mean(jnp.sum(0.5 * jnp.square(residual) + log_norm, axis=-1))

  def distribution(means: jax.Array, batch_ndims: int = 1):
    """The targets' distrax distribution: the first `batch_ndims` axes are batch."""
    distrax = import_distrax()  # on first use, without TensorFlow

    return distrax.Independent(distrax.Normal(means, noise_std), jnp.ndim(means) - batch_ndims)

  nll.noise_std = noise_std
  nll.distribution = distribution
  return _with_default_inner_lr(nll, min(0.1, 0.005 * noise_std**2))


def distribution_nll(make_distribution: Callable[[jax.Array], Any]) -> Likelihood:
  """The likelihood of any distribution of the network's output, e.g. a distrax one.

      nll = vj.distribution_nll(lambda out: distrax.Laplace(out, 0.3))

  `make_distribution(outputs)` must return an object with `log_prob(targets)`
  (distrax, TFP, or your own) whose batch shape is the outputs' shape: the
  NLL sums `-log_prob` over all but the leading axis and averages over it.
  Targets must be shaped like the outputs; `vj.predictive_distribution` makes
  the predictive a mixture of this family. It has no `default_inner_lr`:
  give the learners an `inner_lr`, and check it with `vj.check_inner_loop`.
  """

  def nll(outputs, targets):
    _check_targets("distribution_nll", outputs, targets)
    log_prob = make_distribution(outputs).log_prob(targets)
    if jnp.shape(log_prob) != jnp.shape(outputs):
      raise checks.fail(
        "distribution_nll",
        "make_distribution(outputs).log_prob(targets)",
        f"shaped like the outputs {checks.describe(outputs)}",
        checks.describe(log_prob),
      )
    return -jnp.mean(jnp.sum(log_prob.reshape(log_prob.shape[0], -1), axis=-1))

  def distribution(outputs: jax.Array, batch_ndims: int = 1):
    """`make_distribution(outputs)` as one event per index of the first `batch_ndims` axes."""
    distrax = import_distrax()  # on first use, without TensorFlow

    return distrax.Independent(make_distribution(outputs), jnp.ndim(outputs) - batch_ndims)

  nll.distribution = distribution
  return nll


def loss_from_apply(apply_fn: ApplyFn, nll: Likelihood) -> LossFn:
  """`loss_fn(params, x, y) = nll(apply_fn(params, x), y)`."""

  def loss_fn(params, x, y):
    return nll(apply_fn(params, x), y)

  # What `checks.loss_fits` traces apart, to blame a bad input on x and a bad target on y.
  loss_fn.apply_fn, loss_fn.nll = apply_fn, nll
  return loss_fn


def mixture_log_prob_categorical(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """log of the predictive p(y|x) = mean_l softmax(logits_l)[y].

  Args:
    logits: `[num_samples, batch, num_classes]`.
    labels: `[batch]` integers.

  Returns:
    `[batch]` log-probabilities of the labels under the averaged prediction.
  """
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(log_probs, labels[None, :, None], axis=-1)[..., 0]
  return jax.nn.logsumexp(picked, axis=0) - math.log(logits.shape[0])


def mixture_log_prob_gaussian(means: jax.Array, targets: jax.Array, noise_std: float) -> jax.Array:
  """log of the predictive mixture mean_l N(y; means_l, noise_std^2).

  Args:
    means: `[num_samples, batch, 1]` network outputs.
    targets: `[batch, 1]`.
    noise_std: the likelihood's noise standard deviation.

  Returns:
    `[batch]` log-densities.
  """
  z = (targets[None] - means) / noise_std
  log_pdf = -0.5 * jnp.square(z) - math.log(noise_std) - 0.5 * math.log(2.0 * math.pi)
  log_pdf = jnp.sum(log_pdf, axis=-1)
  return jax.nn.logsumexp(log_pdf, axis=0) - math.log(means.shape[0])


def mixture_cdf_gaussian(means: jax.Array, targets: jax.Array, noise_std: float) -> jax.Array:
  """The predictive mixture's CDF at the targets, mean_l Phi((y - means_l) / noise_std).

  Args:
    means: `[num_samples, batch, 1]` network outputs.
    targets: `[batch, 1]`.
    noise_std: the likelihood's noise standard deviation.

  Returns:
    `[batch]` PIT values F(y) (one output per example).
  """
  return jnp.mean(jax.scipy.stats.norm.cdf((targets[None] - means) / noise_std), axis=0)[..., 0]
