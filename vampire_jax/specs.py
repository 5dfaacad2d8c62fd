"""The algorithms' specs: one frozen dataclass per algorithm, its factory's arguments.

    config = vj.RunConfig(algorithm=vj.specs.Maml(inner_lr=0.1))

A spec builds its `MetaLearner` (`spec.learner(apply_fn, nll, context)`); a run's
`vj.RunConfig` holds one. Subclass `AlgorithmSpec` for an algorithm of your own: the user
guide shows one that trains, saves and reloads a run folder.
"""

from vampire_jax.runs.specs import (
  SPECS,
  Abml,
  AlgorithmSpec,
  Bmaml,
  Context,
  Fomaml,
  Maml,
  Platipus,
  Protonet,
  Simpa,
  Vampire,
  Vampire2,
  convert,
  get,
  option,
)

__all__ = (
  "AlgorithmSpec",
  "Context",
  "option",
  "Vampire",
  "Vampire2",
  "Maml",
  "Fomaml",
  "Platipus",
  "Bmaml",
  "Abml",
  "Protonet",
  "Simpa",
  "SPECS",
  "get",
  "convert",
)
