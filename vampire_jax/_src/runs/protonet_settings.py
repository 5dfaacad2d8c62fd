"""ProtoNet in a run: its learner from a config, and the ways of its training episodes.

ProtoNet classifies by distances to class prototypes, so it needs a
classification config (`ways`): `check_classifies` refuses any other in one
line. Its network is an embedding without a head (`algorithms.network_outputs`),
and its training episodes may have more classes than the test's
(`--train-ways`, Snell et al.'s 30-way episodes for 1-shot): `train_ways`.
"""

from vampire_jax import baselines
from vampire_jax._src.core.errors import ConfigError


def train_ways(config) -> int:
  """Classes per training episode: `train_ways` where set (ProtoNet), else `ways`."""
  return getattr(config, "train_ways", None) or config.ways


def check_classifies(config) -> None:
  """ConfigError unless `config` is a classification config (it has `ways`)."""
  if not hasattr(config, "ways"):
    raise ConfigError(
      f"--algorithm {config.algorithm} classifies (its logits are distances to class "
      f"prototypes): it needs a classification experiment (omniglot, mini_imagenet, "
      f"tiered_imagenet), not a {type(config).__name__}; leave it out of this one"
    )


def build(config, apply_fn, nll, num_mc_train, num_mc_query, unroll):
  """`baselines.protonet` for `config`: its ways, `--train-ways`, `--protonet-distance`."""
  del nll, num_mc_train, num_mc_query, unroll  # the categorical NLL; no draws, no inner loop
  check_classifies(config)
  return baselines.protonet(
    apply_fn,
    num_classes=config.ways,
    train_num_classes=train_ways(config),
    distance=config.protonet_distance,
  )


def check_train_ways(config, train_classes: int, what: str) -> None:
  """ConfigError unless the training part's `train_classes` can give `--train-ways` episodes."""
  ways = getattr(config, "train_ways", None)
  if ways is not None and ways > train_classes:
    raise ConfigError(
      f"--train-ways {ways}: a {ways}-way training episode needs {ways} distinct classes, "
      f"but {what} train part has only {train_classes}"
    )
