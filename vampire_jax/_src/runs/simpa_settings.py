"""SImPa in a run: its learner and its two Adams from a config.

SImPa (`baselines.simpa`) steps its generator and its PHI network each with its
own Adam (`Algorithm.optimizer`); `--simpa-*` set the PHI network's rates, the
bound terms' epsilon and the draws of each KL estimate.
"""

import optax

from vampire_jax import baselines
from vampire_jax._src.core import backend_defaults


def build(config, apply_fn, nll, num_mc_train, num_mc_query, unroll):
  """`baselines.simpa` for `config` (its tasks per step, inner loop and `--simpa-*`)."""
  return baselines.simpa(
    apply_fn,
    nll,
    tasks_per_step=config.tasks_per_step,
    num_inner_steps=config.num_inner_steps,
    inner_lr=config.inner_lr,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    first_order=config.first_order,
    phi_inner_lr=config.simpa_phi_inner_lr,
    epsilon=config.simpa_epsilon,
    num_kl_samples=config.simpa_kl_samples,
    sample_batching=backend_defaults.sample_batching(config.sample_batching),
    unroll_steps=unroll,
  )


def optimizer(config) -> optax.GradientTransformation:
  """SImPa's two Adams (`baselines.simpa_optimizer`): the generator's at --meta-lr, the PHI
  network's at --simpa-phi-lr, each clipped at --meta-grad-clip-norm apart."""
  return baselines.simpa_optimizer(
    config.meta_lr,
    tasks_per_step=config.tasks_per_step,
    phi_learning_rate=config.simpa_phi_lr,
    decay_rate=config.meta_lr_decay,
    clip_norm=config.meta_grad_clip_norm,
  )
