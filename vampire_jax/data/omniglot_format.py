"""Omniglot's facts: its alphabets, its counts, where it is downloaded, and the arrays' container."""

import os
from typing import NamedTuple, Union

import numpy as np

PathLike = Union[str, os.PathLike]


BACKGROUND_ALPHABETS = (
  "Alphabet_of_the_Magi",
  "Anglo-Saxon_Futhorc",
  "Arcadian",
  "Armenian",
  "Asomtavruli_(Georgian)",
  "Balinese",
  "Bengali",
  "Blackfoot_(Canadian_Aboriginal_Syllabics)",
  "Braille",
  "Burmese_(Myanmar)",
  "Cyrillic",
  "Early_Aramaic",
  "Futurama",
  "Grantha",
  "Greek",
  "Gujarati",
  "Hebrew",
  "Inuktitut_(Canadian_Aboriginal_Syllabics)",
  "Japanese_(hiragana)",
  "Japanese_(katakana)",
  "Korean",
  "Latin",
  "Malay_(Jawi_-_Arabic)",
  "Mkhedruli_(Georgian)",
  "N_Ko",
  "Ojibwe_(Canadian_Aboriginal_Syllabics)",
  "Sanskrit",
  "Syriac_(Estrangelo)",
  "Tagalog",
  "Tifinagh",
)
EVALUATION_ALPHABETS = (
  "Angelic",
  "Atemayar_Qelisayer",
  "Atlantean",
  "Aurek-Besh",
  "Avesta",
  "Ge_ez",
  "Glagolitic",
  "Gurmukhi",
  "Kannada",
  "Keble",
  "Malayalam",
  "Manipuri",
  "Mongolian",
  "Old_Church_Slavonic_(Cyrillic)",
  "Oriya",
  "Sylheti",
  "Syriac_(Serto)",
  "Tengwar",
  "Tibetan",
  "ULOG",
)
# Global alphabet id = position here (background 0-29, evaluation 30-49).
ALPHABETS = BACKGROUND_ALPHABETS + EVALUATION_ALPHABETS

NUM_BACKGROUND_CHARACTERS = 964
NUM_EVALUATION_CHARACTERS = 659
NUM_CHARACTERS = NUM_BACKGROUND_CHARACTERS + NUM_EVALUATION_CHARACTERS
NUM_DRAWINGS = 20
IMAGE_SIZE = 28
NUM_RANDOM_TRAIN_CHARACTERS = 1200  # Vinyals et al. / MAML split.

CACHE_FILENAME = "omniglot28.npz"
SOURCES = ("auto", "tfds", "zip", "cache")
SPLITS = ("original", "random")

_CACHE_FORMAT = 2  # 2: with the provenance record
_SETS = (("images_background", True), ("images_evaluation", False))
_SMALL_ZIPS = ("images_background_small1.zip", "images_background_small2.zip")
_URL = "https://github.com/brendenlake/omniglot/raw/master/python/"
_HELP = (
  "Expected a folder holding images_background.zip and "
  "images_evaluation.zip (the TFDS source also needs "
  f"{_SMALL_ZIPS[0]} and {_SMALL_ZIPS[1]}). Download them from "
  f"{_URL}images_background.zip and {_URL}images_evaluation.zip, then pass "
  "the folder as `data_dir` or set the OMNIGLOT_DIR environment variable."
)


class OmniglotArrays(NamedTuple):
  """All of Omniglot, one row per character.

  Attributes:
    images: `[num_characters, 20, 28, 28]` uint8, strokes 255, background 0.
    alphabet: `[num_characters]` int32, index into `ALPHABETS`.
    is_background: `[num_characters]` bool, True for the background set's 964
      characters (which come first).
    provenance: where the arrays came from: `source` ('zip' or 'tfds'),
      `folder` (the data folder, None for a TFDS download), `fingerprint`
      (of the zips), `cache` (the cache file) and `loaded` ('cache' or 'built').
  """

  images: np.ndarray
  alphabet: np.ndarray
  is_background: np.ndarray
  provenance: dict = {}
