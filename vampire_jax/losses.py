"""Likelihoods on network outputs, and the `loss_fn` that `adapt` takes.

A likelihood here is `nll(outputs, y)`: the mean negative log-likelihood of
targets `y` given one network output batch. `loss_from_apply` lifts it to
`loss_fn(params, x, y)` for a network `apply_fn(params, x)`. The `mixture_*`
functions score the Monte-Carlo predictive (the average over weight draws).
"""

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

PyTree = Any
# `apply_fn(params, x) -> outputs`: a network applied with one weight tree.
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]
# `loss_fn(params, x, y) -> scalar`: the mean NLL of (x, y) under one weight tree.
LossFn = Callable[[PyTree, jax.Array, jax.Array], jax.Array]
# `nll(outputs, y) -> scalar`: the mean NLL of targets given one output batch.
Likelihood = Callable[[jax.Array, jax.Array], jax.Array]


def categorical_nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy; logits `[batch, classes]`, labels `[batch]` ints."""
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def gaussian_nll(noise_std: float) -> Likelihood:
  """Mean NLL of targets under N(outputs, noise_std^2); both `[batch, 1]`."""
  if noise_std <= 0:
    raise ValueError(f"noise_std must be > 0, got {noise_std}")
  log_norm = math.log(noise_std) + 0.5 * math.log(2.0 * math.pi)

  def nll(means, targets):
    residual = (means - targets) / noise_std
    return jnp.mean(jnp.sum(0.5 * jnp.square(residual) + log_norm, axis=-1))
  return nll


def loss_from_apply(apply_fn: ApplyFn, nll: Likelihood) -> LossFn:
  """`loss_fn(params, x, y) = nll(apply_fn(params, x), y)`."""
  def loss_fn(params, x, y):
    return nll(apply_fn(params, x), y)
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


def mixture_log_prob_gaussian(means: jax.Array, targets: jax.Array,
                              noise_std: float) -> jax.Array:
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
