"""Few-shot data: Omniglot, mini-ImageNet, LEO embeddings; on-device tasks; preprocessing.

Importing this package does not import TensorFlow; only `load_omniglot` and
`load_mini_imagenet` with the TFDS source (and `mini_imagenet_builder_class`)
do.
"""

from vampire_jax.data.class_tasks import (
  class_combinations,
  combination_at,
  combination_ids,
  combination_tasks,
  num_combinations,
)
from vampire_jax.data.episodes import (
  CLASS_SAMPLING,
  NUM_ROTATIONS,
  UNKNOWN_LABEL,
  check_class_counts,
  check_episode_spec,
  num_classes_available,
  open_set_tasks_from_keys,
  sample_tasks,
  tasks_for_classes,
  tasks_from_keys,
  to_unit_range,
)
from vampire_jax.data.features import FeatureSplit, load_leo_embeddings
from vampire_jax.data.mini_imagenet import MiniImagenetSplit, load_mini_imagenet
from vampire_jax.data.mini_imagenet_tfds import mini_imagenet_builder_class
from vampire_jax.data.omniglot import (
  ALPHABETS,
  BACKGROUND_ALPHABETS,
  EVALUATION_ALPHABETS,
  OmniglotArrays,
  character_names,
  default_cache_dir,
  load_omniglot,
  make_split,
  save_split_indices,
  split_indices,
)
from vampire_jax.data.preprocessing import preprocess_mini_imagenet, preprocess_omniglot

__all__ = (
  "ALPHABETS",
  "BACKGROUND_ALPHABETS",
  "CLASS_SAMPLING",
  "EVALUATION_ALPHABETS",
  "FeatureSplit",
  "MiniImagenetSplit",
  "NUM_ROTATIONS",
  "OmniglotArrays",
  "character_names",
  "check_class_counts",
  "check_episode_spec",
  "class_combinations",
  "combination_at",
  "combination_ids",
  "combination_tasks",
  "default_cache_dir",
  "load_leo_embeddings",
  "load_mini_imagenet",
  "load_omniglot",
  "make_split",
  "mini_imagenet_builder_class",
  "num_classes_available",
  "num_combinations",
  "open_set_tasks_from_keys",
  "preprocess_mini_imagenet",
  "preprocess_omniglot",
  "sample_tasks",
  "save_split_indices",
  "split_indices",
  "tasks_for_classes",
  "tasks_from_keys",
  "to_unit_range",
  "UNKNOWN_LABEL",
)
