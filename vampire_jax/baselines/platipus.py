"""PLATIPUS (Finn, Xu, Levine 2018, "Probabilistic Model-Agnostic Meta-Learning").

A learned Gaussian over MAML's initial weights. With L(w; D) the mean NLL
of the data set D under weights w::

  prior      p(θ | D_tr)       = N(μ_θ − γ_p ⊙ ∇_μ L(μ_θ; D_tr), σ_θ²)
  inference  q(θ | D_tr, D_te) = N(μ_θ − γ_q ⊙ ∇_μ L(μ_θ; D_tr ∪ D_te), v_q)
  adaptation φ = θ − α ∇_θ L(θ; D_tr), repeated S times (MAML's steps)

Meta-training (Alg. 1) draws θ from q, adapts it on D_tr and minimises::

  mean_l L(φ_l; D_te) + kl_weight · KL(q(θ | D_tr, D_te) ‖ p(θ | D_tr)).

μ_θ, σ_θ, v_q and the per-weight step sizes γ_p, γ_q (learned as log γ) are
all meta-parameters.

Adaptation at test time (Alg. 2) draws θ from p(θ | D_tr) instead: only the
mean moves, the spread σ_θ stays as meta-learned. The task parameters are
the L adapted networks, stacked on a leading axis; prediction is their
ensemble.
"""

from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp

from vampire_jax._src.core import adaptation, batching, losses
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.gaussian import Gaussian, gaussian_from_params, kl_divergence, sample
from vampire_jax._src.core.learners import (
  InnerLoopSettings,
  MetaLearner,
  check_settings,
  default_inner_lr,
)
from vampire_jax._src.core.tasks import Task
from vampire_jax.baselines import _ensemble

PyTree = Any


class PlatipusParams(NamedTuple):
  """PLATIPUS's meta-parameters Θ; every field is a tree like the network's weights."""

  mean: PyTree  # μ_θ
  log_std: PyTree  # log σ_θ, the spread of the prior p(θ | D_tr)
  log_std_q: PyTree  # log sqrt(v_q), the spread of the inference distribution q
  log_step_p: PyTree  # log γ_p, per-weight step size of the prior's gradient step
  log_step_q: PyTree  # log γ_q, per-weight step size of q's gradient step


def shifted_mean(
  mean: PyTree,
  step_sizes: PyTree,
  x: jax.Array,
  y: jax.Array,
  *,
  loss_fn: adaptation.LossFn,
  first_order: bool = False,
) -> PyTree:
  """μ − γ ⊙ ∇_μ L(μ; x, y): one gradient step with per-weight step sizes γ."""
  checks.flag("shifted_mean", "first_order", first_order)
  grads = jax.grad(loss_fn)(mean, x, y)
  if first_order:
    grads = jax.lax.stop_gradient(grads)
  return jax.tree_util.tree_map(lambda m, g, s: m - s * g, mean, grads, step_sizes)


def _exp(tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(jnp.exp, tree)


def platipus(
  apply_fn: adaptation.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  kl_weight: float = 1.0,
  num_mc_train: int = 1,
  num_mc_query: int = 1,
  first_order: bool = False,
  log_std_init: tuple[float, float] = (-4.0, -3.0),
  step_size_init: Optional[float] = None,
  inference_data: Literal["support_and_query", "query"] = "support_and_query",
  sample_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
) -> MetaLearner:
  """PLATIPUS as a `MetaLearner` (Alg. 1 for `meta_loss`, Alg. 2 for `adapt`).

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs, e.g. `losses.categorical_nll`.
    num_inner_steps: S, MAML steps from each weight draw.
    inner_lr: α, MAML's inner learning rate.
    kl_weight: weight of KL(q ‖ p) in the meta-loss; 1 is the paper's ELBO.
    num_mc_train: draws θ ~ q per task in the meta-loss.
    num_mc_query: draws θ ~ p(θ | D_tr) in `adapt`, the ensemble size of
      the prediction.
    first_order: treat every inner gradient (the γ steps and MAML's) as a
      constant of the meta-parameters.
    log_std_init: range of the uniform initial log σ_θ and log sqrt(v_q)
      (the library's VAMPIRE initialisation; the paper gives none).
    step_size_init: initial γ_p and γ_q for every weight; `None` uses
      `inner_lr` (the paper gives no value). They are learned as log γ, so
      they stay positive and Adam changes them by relative amounts.
    inference_data: what q's gradient step sees: 'support_and_query'
      (D_tr ∪ D_te, q conditioned on the whole task) or 'query' (D_te only,
      as Alg. 1 of the paper prints it).
    sample_batching: how the weight draws are batched.
    unroll_steps: unroll MAML's inner loop.
  """
  checks.flags("platipus", first_order=first_order, unroll_steps=unroll_steps)
  check_settings(
    "platipus",
    inner_lr,
    kl_weight,
    num_inner_steps=(num_inner_steps, 0),
    num_mc_train=(num_mc_train, 1),
    num_mc_query=(num_mc_query, 1),
  )
  inner_lr = default_inner_lr(nll, 0.1) if inner_lr is None else inner_lr
  if inference_data not in ("support_and_query", "query"):
    raise ValueError(
      f"inference_data must be 'support_and_query' or 'query', got {inference_data!r}"
    )
  loss_fn = losses.loss_from_apply(apply_fn, nll)
  initial_step = inner_lr if step_size_init is None else step_size_init
  if initial_step <= 0:
    raise ValueError(
      f"step sizes γ are learned in log space and must start > 0, got {initial_step}"
    )

  def prior(meta: PlatipusParams, support_x, support_y) -> Gaussian:
    mean = shifted_mean(
      meta.mean,
      _exp(meta.log_step_p),
      support_x,
      support_y,
      loss_fn=loss_fn,
      first_order=first_order,
    )
    return Gaussian(mean, meta.log_std)

  def adapt_draws(dist: Gaussian, support_x, support_y, key, num_draws):
    # θ_l ~ dist, then φ_l = S MAML steps from θ_l on the support set.
    draws = sample(dist, key, num_draws)
    return _ensemble.map_members(
      lambda theta: adaptation.maml_adapt(
        theta,
        support_x,
        support_y,
        loss_fn=loss_fn,
        num_steps=num_inner_steps,
        inner_lr=inner_lr,
        first_order=first_order,
        unroll_steps=unroll_steps,
      ),
      draws,
      sample_batching,
    )

  def init(params, key):
    prior_key, q_key = jax.random.split(key)
    log_steps = jax.tree_util.tree_map(lambda p: jnp.full_like(p, jnp.log(initial_step)), params)
    return PlatipusParams(
      mean=params,
      log_std=gaussian_from_params(params, prior_key, log_std_init).log_std,
      log_std_q=gaussian_from_params(params, q_key, log_std_init).log_std,
      log_step_p=log_steps,
      log_step_q=log_steps,
    )

  def adapt(meta: PlatipusParams, support_x, support_y, key):
    return adapt_draws(prior(meta, support_x, support_y), support_x, support_y, key, num_mc_query)

  def predict(task_params, x, key):
    del key  # the ensemble is fixed once adapted
    return _ensemble.apply_members(apply_fn, task_params, x, sample_batching)

  def meta_loss(meta: PlatipusParams, task: Task, key):
    if inference_data == "support_and_query":
      q_x = _ensemble.concat_examples(task.support_x, task.query_x)
      q_y = _ensemble.concat_examples(task.support_y, task.query_y)
    else:
      q_x, q_y = task.query_x, task.query_y
    q_mean = shifted_mean(
      meta.mean, _exp(meta.log_step_q), q_x, q_y, loss_fn=loss_fn, first_order=first_order
    )
    q = Gaussian(q_mean, meta.log_std_q)
    task_params = adapt_draws(q, task.support_x, task.support_y, key, num_mc_train)
    outputs = predict(task_params, task.query_x, key)
    query_nll = _ensemble.mean_member_nll(nll, outputs, task.query_y)
    kl = kl_divergence(q, prior(meta, task.support_x, task.support_y))
    return query_nll + kl_weight * kl, outputs

  # The inner loop is MAML's: its KL term is in the meta-loss (kl_weight 0 here).
  return MetaLearner(
    init,
    adapt,
    predict,
    nll,
    meta_loss,
    settings=InnerLoopSettings(loss_fn, inner_lr, 0.0, num_inner_steps),
  )
