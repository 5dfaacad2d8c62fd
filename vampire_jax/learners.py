"""Meta-learners as NamedTuples of pure functions: VAMPIRE and MAML.

A `MetaLearner` says how to turn meta-parameters into task parameters
(`adapt`) and task parameters into predictions (`predict`). `vampire` and
`maml` build one (the baselines in `vampire_jax.baselines` too);
`meta_step.make_meta_step` and the evaluators work with any.

Defaults are stable: VAMPIRE's inner_lr 0.01 and kl_weight 0.02 give
inner_lr * kl_weight / sigma_p^2 <= 0.6 at the initial prior (log-std in
[-4, -3]), below the limit of 2 where the KL term makes the inner loop
oscillate (`gaussian.kl_step_factor`). kl_weight 0.02 is the paper's
beta = 0.1 on the summed NLL of a 5-example support set, expressed against
the mean NLL this library uses.
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from vampire_jax import adaptation, batching, losses
from vampire_jax.gaussian import gaussian_from_params
from vampire_jax.tasks import Task

PyTree = Any

# VAMPIRE's stable defaults (see the module docstring).
DEFAULT_INNER_LR = 0.01
DEFAULT_KL_WEIGHT = 0.02


class MetaLearner(NamedTuple):
  """A gradient-based meta-learning algorithm.

  Attributes:
    init: `init(params, key) -> meta_params` from a network's initial weights.
    adapt: `adapt(meta_params, support_x, support_y, key) -> task_params`.
    predict: `predict(task_params, x, key) -> outputs [num_samples, batch, ...]`.
    nll: `nll(outputs_one_sample, y) -> scalar`, the likelihood trained on.
    meta_loss: optional `meta_loss(meta_params, task, key) -> (loss, query_outputs)`,
      one task's meta-training loss, for algorithms whose meta-objective is not
      "adapt on support, NLL on query" (e.g. PLATIPUS, ABML). `None` means
      `query_loss`'s default.
  """
  init: Callable[[PyTree, jax.Array], PyTree]
  adapt: Callable[[PyTree, jax.Array, jax.Array, jax.Array], PyTree]
  predict: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  nll: losses.Likelihood
  meta_loss: Optional[Callable[[PyTree, Task, jax.Array], tuple[jax.Array, jax.Array]]] = None


def vampire(apply_fn: losses.ApplyFn, nll: losses.Likelihood, *,
            num_inner_steps: int = 5, inner_lr: float = DEFAULT_INNER_LR,
            kl_weight: float = DEFAULT_KL_WEIGHT, num_mc_train: int = 1,
            num_mc_query: int = 1, first_order: bool = False,
            log_std_init: tuple[float, float] = (-4.0, -3.0),
            sample_batching: batching.Batching = "vmap",
            unroll_steps: bool = False, remat: bool = False,
            second_order_steps: Optional[int] = None) -> MetaLearner:
  """VAMPIRE (Nguyen et al. 2020, Alg. 1): Gaussian prior, VI inner loop.

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs, e.g. `losses.categorical_nll`.
    num_inner_steps: S.
    inner_lr: alpha. The paper's 0.1 with kl_weight 0.1 diverges at the
      initial prior (kl_step_factor 11-30); see the module docstring.
    kl_weight: beta, the KL weight in the VFE, against the mean NLL.
    num_mc_train: L_t, weight draws per inner step.
    num_mc_query: L_v, weight draws on the query set (and for prediction).
    first_order: stop gradients through the inner updates.
    log_std_init: range of the uniform initial prior log-stds.
    sample_batching: how Monte-Carlo forward passes are batched.
    unroll_steps: unroll the inner loop.
    remat: recompute each inner step in the backward pass instead of storing
      its activations (`jax.checkpoint`): less memory, more compute.
    second_order_steps: None (Alg. 1) differentiates every inner step at
      second order; 1 is the authors' code (see `adaptation.adapt`).
  """
  loss_fn = losses.loss_from_apply(apply_fn, nll)

  def init(params, key):
    return gaussian_from_params(params, key, log_std_init)

  def adapt(prior, support_x, support_y, key):
    return adaptation.adapt(
        prior, support_x, support_y, key, loss_fn=loss_fn,
        num_steps=num_inner_steps, inner_lr=inner_lr,
        num_mc_samples=num_mc_train, kl_weight=kl_weight,
        first_order=first_order, sample_batching=sample_batching,
        unroll_steps=unroll_steps, remat=remat, second_order_steps=second_order_steps)

  def predict(posterior, x, key):
    return adaptation.predict(posterior, x, key, apply_fn=apply_fn,
                              num_mc_samples=num_mc_query,
                              sample_batching=sample_batching)

  return MetaLearner(init, adapt, predict, nll)


def maml(apply_fn: losses.ApplyFn, nll: losses.Likelihood, *,
         num_inner_steps: int = 5, inner_lr: float = 0.1,
         first_order: bool = False, unroll_steps: bool = False,
         remat: bool = False, second_order_steps: Optional[int] = None) -> MetaLearner:
  """MAML (Finn et al. 2017): the point-estimate special case; options as in `vampire`."""
  loss_fn = losses.loss_from_apply(apply_fn, nll)

  def init(params, key):
    del key
    return params

  def adapt(params, support_x, support_y, key):
    del key
    return adaptation.maml_adapt(
        params, support_x, support_y, loss_fn=loss_fn,
        num_steps=num_inner_steps, inner_lr=inner_lr, first_order=first_order,
        unroll_steps=unroll_steps, remat=remat, second_order_steps=second_order_steps)

  def predict(params, x, key):
    del key
    return apply_fn(params, x)[None]

  return MetaLearner(init, adapt, predict, nll)


def query_loss(learner: MetaLearner, meta_params: PyTree, task: Task,
               key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One task's meta-training loss: adapt on support, mean NLL on query.

  Args:
    learner: the algorithm.
    meta_params: its meta-parameters.
    task: one task (no leading task axis).
    key: PRNG key.

  Returns:
    `(loss, outputs)`: the query NLL averaged over weight draws (Alg. 1,
    line 9) and the query outputs `[num_samples, num_query, ...]`; or, if the
    learner defines its own `meta_loss`, what that returns.
  """
  if learner.meta_loss is not None:
    return learner.meta_loss(meta_params, task, key)
  adapt_key, query_key = jax.random.split(key)
  task_params = learner.adapt(meta_params, task.support_x, task.support_y, adapt_key)
  outputs = learner.predict(task_params, task.query_x, query_key)
  loss = jnp.mean(jax.vmap(learner.nll, in_axes=(0, None))(outputs, task.query_y))
  return loss, outputs

