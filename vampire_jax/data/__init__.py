"""Omniglot arrays, character splits and on-device few-shot task sampling.

Importing this package does not import TensorFlow; only `load_omniglot` with
the TFDS source does.
"""

from vampire_jax.data.episodes import check_episode_spec
from vampire_jax.data.episodes import NUM_ROTATIONS
from vampire_jax.data.episodes import sample_tasks
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

__all__ = (
    'ALPHABETS',
    'BACKGROUND_ALPHABETS',
    'EVALUATION_ALPHABETS',
    'NUM_ROTATIONS',
    'OmniglotArrays',
    'character_names',
    'check_episode_spec',
    'default_cache_dir',
    'load_omniglot',
    'make_split',
    'sample_tasks',
    'save_split_indices',
    'split_indices',
)
