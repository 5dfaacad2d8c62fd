"""A run's learner and meta-optimiser, from its config's algorithm spec and speed settings.

    learner = algorithms.make_learner(model, kind, noise_std, config)
    optimizer = algorithms.make_optimizer(config)

The spec (`specs`) says what the algorithm is; this module adds what the run knows: the
network in the config's precision, the problem's likelihood, the tasks per step, the ways
of a classifier and the speed settings, 'auto' resolved by `backend_defaults`.
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from vampire_jax._src.core import backend_defaults, losses, models
from vampire_jax._src.core.gaussian import kl_step_factor
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax.runs import kinds, specs

PyTree = Any

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def context(config) -> specs.Context:
  """What the run adds to its spec: the tasks per step, the ways, the speed settings."""
  return specs.Context(
    tasks_per_step=config.schedule.tasks_per_step,
    ways=getattr(config, "ways", None),
    sample_batching=backend_defaults.sample_batching(config.speed.sample_batching),
    unroll_steps=bool(config.speed.unroll_inner_steps),
    remat=bool(config.speed.remat),
  )


def network(model: nn.Module, compute_dtype: str = "float32") -> losses.ApplyFn:
  """`apply_fn(params, x)` of `model`, in bfloat16 mixed precision if asked."""
  apply_fn = models.pure_apply(model)
  if compute_dtype == "float32":
    return apply_fn
  return models.mixed_precision(apply_fn, COMPUTE_DTYPES[compute_dtype])


def likelihood(kind: str, noise_std: Optional[float]) -> losses.Likelihood:
  """The likelihood of a `kind` problem (`kinds.get(kind).likelihood`)."""
  return kinds.get(kind).likelihood(noise_std)


def make_learner(
  model: nn.Module,
  kind: str,
  noise_std: Optional[float],
  config,
  *,
  num_mc: Optional[int] = None,
) -> MetaLearner:
  """The config's algorithm on `model`: training's draws, or `num_mc` on support and query.

  The likelihood's noise is `config.likelihood_std` where a config has one set
  (regression: train on another noise than the data's, e.g. the authors' MSE), else
  `noise_std`.
  """
  likelihood_std = getattr(config, "likelihood_std", None)
  return config.algorithm.learner(
    network(model, config.speed.compute_dtype),
    likelihood(kind, noise_std if likelihood_std is None else likelihood_std),
    context(config),
    num_mc=num_mc,
  )


def make_optimizer(config) -> optax.GradientTransformation:
  """The config's meta-optimiser (`AlgorithmSpec.optimizer` of its schedule)."""
  return config.algorithm.optimizer(config.schedule)


def network_outputs(config) -> Optional[int]:
  """A classifier's outputs: `config.ways`, or None for an embedding without a head (ProtoNet)."""
  return None if config.algorithm.embedding else config.ways


def stability_factor(config, meta_params: PyTree, learner: Optional[MetaLearner] = None):
  """inner_lr * kl_weight / sigma_p^2 at `meta_params`, or None where it does not apply.

  The inner loop is stable only while this is below 2; see `gaussian.kl_step_factor`.
  A spec's `inner_lr` None is its factory's default, which `learner`'s settings hold.
  """
  spec = config.algorithm
  if not spec.inner_kl or getattr(spec, "kl_weight", 0) == 0:
    return None
  inner_lr = spec.inner_lr
  if inner_lr is None:
    if learner is None or learner.settings is None:
      raise ValueError("stability_factor: the spec's inner_lr is None; pass its learner")
    inner_lr = learner.settings.inner_lr
  if spec.kl_target == "standard_normal":  # the target's sigma is 1
    return float(inner_lr * spec.kl_weight)
  return float(jax.jit(kl_step_factor)(meta_params, inner_lr, spec.kl_weight))


def check_config(config) -> None:
  """Raises ConfigError, naming the field, for an impossible setting (`config.validate()`)."""
  config.validate()


def configure(config, name: str):
  """`config` for algorithm `name`: its spec converted (`specs.convert`), the settings it shares
  with the config's spec carried over."""
  return config.replace(algorithm=specs.convert(config.algorithm, name))
