"""Few-shot data: Omniglot, mini-ImageNet, LEO embeddings; on-device tasks; preprocessing.

Importing this package does not import TensorFlow; only `load_omniglot` and
`load_mini_imagenet` with the TFDS source (and `mini_imagenet_builder_class`)
do.
"""

from vampire_jax.data.class_tasks import class_combinations
from vampire_jax.data.class_tasks import combination_at
from vampire_jax.data.class_tasks import combination_ids
from vampire_jax.data.class_tasks import combination_tasks
from vampire_jax.data.class_tasks import num_combinations
from vampire_jax.data.episodes import CLASS_SAMPLING
from vampire_jax.data.episodes import check_class_counts
from vampire_jax.data.episodes import check_episode_spec
from vampire_jax.data.episodes import num_classes_available
from vampire_jax.data.episodes import open_set_tasks_from_keys
from vampire_jax.data.episodes import NUM_ROTATIONS
from vampire_jax.data.episodes import sample_tasks
from vampire_jax.data.episodes import tasks_for_classes
from vampire_jax.data.episodes import tasks_from_keys
from vampire_jax.data.episodes import to_unit_range
from vampire_jax.data.episodes import UNKNOWN_LABEL
from vampire_jax.data.features import FeatureSplit
from vampire_jax.data.features import load_leo_embeddings
from vampire_jax.data.mini_imagenet import load_mini_imagenet
from vampire_jax.data.mini_imagenet import mini_imagenet_builder_class
from vampire_jax.data.mini_imagenet import MiniImagenetSplit
from vampire_jax.data.omniglot import ALPHABETS
from vampire_jax.data.omniglot import BACKGROUND_ALPHABETS
from vampire_jax.data.omniglot import character_names
from vampire_jax.data.omniglot import default_cache_dir
from vampire_jax.data.omniglot import EVALUATION_ALPHABETS
from vampire_jax.data.omniglot import load_omniglot
from vampire_jax.data.omniglot import make_split
from vampire_jax.data.omniglot import OmniglotArrays
from vampire_jax.data.omniglot import save_split_indices
from vampire_jax.data.omniglot import split_indices
from vampire_jax.data.preprocessing import preprocess_mini_imagenet
from vampire_jax.data.preprocessing import preprocess_omniglot

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
