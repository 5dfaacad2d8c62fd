"""Meta-learning baselines on the core library: PLATIPUS, BMAML, ABML, ProtoNet, SImPa.

Each factory returns a `vampire_jax.MetaLearner` that works with
`make_meta_step`, `make_host_chunked_meta_step` and the evaluators as they
are. First-order MAML is `vampire_jax.maml(..., first_order=True)`. The
baselines::

  platipus  Finn, Xu, Levine 2018: learned Gaussian over the initial
            weights, mean-only adaptation, KL between inference and prior.
  bmaml     Yoon et al. 2018: M particles moved by SVGD; ensemble prediction.
  abml      Ravi & Beatson 2019: Gaussian task posteriors by gradient steps
            on the support ELBO; meta-loss on support ∪ query + hyper-prior.
  protonet  Snell et al. 2017: class prototypes, the mean support embeddings;
            logits minus the (squared) distance to each; no inner loop.
  simpa     Nguyen, Do, Carneiro: a generator of the weights (implicit
            posterior), a PHI network's KL lower bound, PAC-Bayes terms;
            trained with `simpa_optimizer` (its own Adam for each network).

`LEARNERS` maps an algorithm's name to its factory,
`factory(apply_fn, nll, **hyper_parameters) -> MetaLearner` (SImPa's also wants
`tasks_per_step`, the M of its hyper-prior term). ProtoNet is not
in it: it classifies only (no `nll` to choose) and needs the number of
classes, `protonet(embed_fn, num_classes=...)`.
"""

from vampire_jax.baselines.abml import abml, hyper_prior_nll
from vampire_jax.baselines.bmaml import (
  bmaml,
  ensemble_nll,
  init_particles,
  kernel_gradient,
  median_bandwidth,
  pairwise_squared_distances,
  rbf_kernel,
  svgd_adapt,
  svgd_direction,
)
from vampire_jax.baselines.platipus import PlatipusParams, platipus, shifted_mean
from vampire_jax.baselines.protonet import (
  Prototypes,
  class_prototypes,
  protonet,
  prototype_logits,
)
from vampire_jax.baselines.simpa import SimpaParams, simpa, simpa_optimizer

__all__ = (
  "LEARNERS",
  "PlatipusParams",
  "Prototypes",
  "SimpaParams",
  "abml",
  "bmaml",
  "class_prototypes",
  "ensemble_nll",
  "hyper_prior_nll",
  "init_particles",
  "kernel_gradient",
  "median_bandwidth",
  "pairwise_squared_distances",
  "platipus",
  "protonet",
  "prototype_logits",
  "rbf_kernel",
  "shifted_mean",
  "simpa",
  "simpa_optimizer",
  "svgd_adapt",
  "svgd_direction",
)

LEARNERS = {"platipus": platipus, "bmaml": bmaml, "abml": abml, "simpa": simpa}
