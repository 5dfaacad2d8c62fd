"""ABML (Ravi & Beatson 2019, "Amortized Bayesian Meta-Learning").

Hierarchical model: hyper-prior p(θ) → task prior p(φ | θ) = N(μ_θ, σ_θ²)
→ data. The meta-parameters θ = (μ_θ, log σ_θ) are a point estimate (a Dirac
q(θ)); each task gets a Gaussian q(φ; λ), initialised at λ = θ and moved by
S gradient steps on the negative support ELBO,

  L_tr(λ) = E_q[L(φ; D_tr)] + kl_weight · KL(q(φ; λ) ‖ p(φ | θ)),

which is VAMPIRE's inner loop (`vampire_jax.adapt`). The meta-loss is the
negative ELBO on the whole task, support ∪ query, plus the hyper-prior:

  E_q[L(φ; D_tr ∪ D_te)] + kl_weight · KL(q(φ; λ_S) ‖ p(φ | θ))
    + hyper_prior_weight · (−log p(θ)),

with p(θ) = Π N(μ; 0, mean_prior_std²) · Gamma(τ; a, b) over every weight,
τ = σ_θ^−2 the prior's precision (density in (μ, τ), no Jacobian for the
log σ parameterisation). Prediction draws from q(φ; λ_S), as VAMPIRE.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.scipy import stats

from vampire_jax._src.core import adaptation, batching, losses
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.gaussian import Gaussian, kl_divergence
from vampire_jax._src.core.learners import (
  DEFAULT_INNER_LR,
  DEFAULT_KL_WEIGHT,
  MetaLearner,
  check_settings,
  default_inner_lr,
  vampire,
)
from vampire_jax._src.core.tasks import Task
from vampire_jax.baselines import _ensemble

PyTree = Any


def hyper_prior_nll(
  prior: Gaussian,
  *,
  mean_prior_std: float = 1.0,
  precision_prior: tuple[float, float] = (1.0, 0.01),
) -> jax.Array:
  """−log p(θ), summed over every weight.

  p(θ) = Π N(μ; 0, mean_prior_std²) · Gamma(τ; shape a, rate b), τ = exp(−2 log σ).

  Args:
    prior: the meta-learned task prior N(μ_θ, σ_θ²).
    mean_prior_std: standard deviation of the Normal hyper-prior on means.
    precision_prior: (a, b), shape and rate of the Gamma hyper-prior on
      precisions.

  Returns:
    A scalar.
  """
  shape, rate = precision_prior

  def leaf_nll(mean, log_std):
    precision = jnp.exp(-2.0 * log_std)
    log_p_mean = stats.norm.logpdf(mean, scale=mean_prior_std)
    log_p_precision = stats.gamma.logpdf(precision, shape, scale=1.0 / rate)
    return -jnp.sum(log_p_mean + log_p_precision)

  per_leaf = jax.tree_util.tree_map(leaf_nll, prior.mean, prior.log_std)
  return sum(jax.tree_util.tree_leaves(per_leaf), jnp.zeros(()))


def abml(
  apply_fn: adaptation.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  kl_weight: float = DEFAULT_KL_WEIGHT,
  num_mc_train: int = 1,
  num_mc_query: int = 1,
  hyper_prior_weight: float = 1e-4,
  mean_prior_std: float = 1.0,
  precision_prior: tuple[float, float] = (1.0, 0.01),
  first_order: bool = False,
  log_std_init: tuple[float, float] = (-4.0, -3.0),
  sample_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
  draw_outputs: Optional[adaptation.OutputSampler] = None,
) -> MetaLearner:
  """ABML as a `MetaLearner`: VAMPIRE's adaptation, ABML's meta-loss.

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs (a mean over examples).
    num_inner_steps: S, gradient steps on the support ELBO.
    inner_lr: α. With `kl_weight`, VAMPIRE's stable defaults: the inner loop
      is VAMPIRE's, and α·kl_weight/σ_p² must stay below 2 (see
      `vj.kl_step_factor`).
    kl_weight: weight of KL(q ‖ p(φ | θ)) in both ELBOs. ABML's ELBO sums
      the NLL over examples, which is kl_weight = 1 / (number of examples)
      on this library's mean NLL.
    num_mc_train: draws from q per inner step.
    num_mc_query: draws from q for the meta-loss and for prediction.
    hyper_prior_weight: weight of −log p(θ) in each task's meta-loss. ABML
      counts the hyper-prior once for all M training tasks, which per task
      and per example is kl_weight / M; 1e-4 is that for kl_weight 0.1 and
      M = 1000 (the VAMPIRE authors' re-implementation). 0 gives the flat hyper-prior the VAMPIRE paper trained ABML
      with for its regression comparison.
    mean_prior_std: standard deviation of the Normal hyper-prior on μ_θ.
    precision_prior: (shape, rate) of the Gamma hyper-prior on σ_θ^−2.
    first_order: stop gradients through the inner updates.
    log_std_init: range of the uniform initial prior log-stds.
    sample_batching: how Monte-Carlo forward passes are batched.
    unroll_steps: unroll the inner loop.
    draw_outputs: optional: draw outputs instead of weights, in the inner
      loop, the meta-loss and prediction (`vj.local_reparameterization` for
      a `vj.MLP`), as in `vampire`.
  """
  checks.flags("abml", first_order=first_order, unroll_steps=unroll_steps)
  check_settings(
    "abml",
    inner_lr,
    kl_weight,
    num_inner_steps=(num_inner_steps, 0),
    num_mc_train=(num_mc_train, 1),
    num_mc_query=(num_mc_query, 1),
  )
  checks.rate("abml", "hyper_prior_weight", hyper_prior_weight, positive=False)
  inner_lr = default_inner_lr(nll, DEFAULT_INNER_LR) if inner_lr is None else inner_lr
  base = vampire(
    apply_fn,
    nll,
    num_inner_steps=num_inner_steps,
    inner_lr=inner_lr,
    kl_weight=kl_weight,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    first_order=first_order,
    log_std_init=log_std_init,
    sample_batching=sample_batching,
    unroll_steps=unroll_steps,
    draw_outputs=draw_outputs,
  )

  def meta_loss(prior: Gaussian, task: Task, key):
    adapt_key, loss_key = jax.random.split(key)
    posterior = base.adapt(prior, task.support_x, task.support_y, adapt_key)
    x = _ensemble.concat_examples(task.support_x, task.query_x)
    y = _ensemble.concat_examples(task.support_y, task.query_y)
    outputs = base.predict(posterior, x, loss_key)  # [num_mc_query, support + query, ...]
    data_nll = _ensemble.mean_member_nll(nll, outputs, y)
    loss = data_nll + kl_weight * kl_divergence(posterior, prior)
    if hyper_prior_weight:
      loss += hyper_prior_weight * hyper_prior_nll(
        prior, mean_prior_std=mean_prior_std, precision_prior=precision_prior
      )
    return loss, outputs[:, jnp.shape(task.support_x)[0] :]

  return base._replace(meta_loss=meta_loss)
