"""The config dataclass of each experiment: a `RunConfig` plus its data and network fields.

A run folder's `run.json` names its config class, so `vampire_jax.load_run`
rebuilds the config from this module, with the library alone installed.
The presets (`get_config(experiment, preset, algorithm)`) and the commands
that run them are the experiments' (`experiments/presets.py`, in the
repository), which re-exports these classes. Nothing here loads data.

Runs recorded before these classes moved here name them `experiments.configs.<Class>`;
`recorded_class_name` maps such a name to this module's.
"""

import dataclasses
import math
from typing import Optional

from vampire_jax._src import deprecations
from vampire_jax._src.core import models
from vampire_jax._src.core.errors import ConfigError
from vampire_jax.runs.run_config import (
  Evaluation,
  RunConfig,
  Schedule,
  Speed,
  check_rate,
  setting,
)
from vampire_jax.runs.specs import Vampire
from vampire_jax.data import episodes, mini_imagenet, omniglot

__all__ = (
  "ConvNetConfig",
  "OmniglotConfig",
  "MiniImagenetConfig",
  "FeaturesConfig",
  "RegressionConfig",
  "check_episodes",
  "open_set_classes",
  "test_query",
  "omniglot_split_characters",
  "recorded_class_name",
)

# The config classes, by name (the names run folders record).
_CLASSES = (
  "ConvNetConfig",
  "OmniglotConfig",
  "MiniImagenetConfig",
  "FeaturesConfig",
  "RegressionConfig",
)


@dataclasses.dataclass
class ConvNetConfig(RunConfig):
  """Fields of the Conv4 experiments (Omniglot, mini-ImageNet)."""

  kernel_init_gain: float = setting(
    math.sqrt(2.0),
    "Xavier-normal gain of the initial kernels, the means (the authors' 2019 code: 1)",
  )
  batch_norm_affine: bool = setting(
    True, "batch norm with scale and offset (the authors' has none)"
  )
  batch_norm_epsilon: float = setting(
    1e-5, "added to the batch variance in batch norm (the authors' 2019 code: 0)"
  )
  conv_impl: str = setting(
    "auto",
    "convolution: xla, patches (im2col), loop_safe (fast "
    "gradients inside loops on a CPU) or auto (where gradients run in loops: "
    "loop_safe on a CPU, patches on a GPU; else xla)",
    resumable=True,
    choices=("auto", "xla", "patches", "loop_safe"),
  )
  # Draws in lax.map on a CPU, each recomputed in the backward pass rather than stored
  # (`backend_defaults.sample_batching`); vmap elsewhere.
  speed: Speed = Speed(sample_batching="auto")

  def validate(self) -> None:
    super().validate()
    check_widths("num_filters", (self.num_filters,))
    check_rate("kernel_init_gain", self.kernel_init_gain, positive=True)
    eps = self.batch_norm_epsilon
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
      raise ConfigError(
        f"batch_norm_epsilon must be a finite number >= 0, got {eps!r}",
        fields=("batch_norm_epsilon",),
      )


_CACHE_HELP = (
  "cache folder (default: $VAMPIRE_JAX_CACHE, else $XDG_CACHE_HOME/vampire_jax, else "
  "~/.cache/vampire_jax)"
)
_OPEN_SET_HELP = (
  "unknown classes added to each test episode, as many queries each as a known "
  "class (none: as many as ways, at most the test classes left beside "
  "them; 0: no open-set episodes)"
)


def open_set_classes(config, test_classes: Optional[int] = None) -> int:
  """Unknown classes per open-set test episode: `num_open_set_classes`, None -> `ways`.

  Args:
    config: a classification config.
    test_classes: the classes the loaded test split has, if known. The
      default (None) then takes at most the classes left beside the task's
      `ways` (0: no open-set episodes, e.g. on a partial copy of the data).

  Raises:
    ConfigError: an explicit number the test split cannot give.
  """
  value = getattr(config, "num_open_set_classes", 0)
  if value is None:
    return (
      config.ways if test_classes is None else max(0, min(config.ways, test_classes - config.ways))
    )
  if value and test_classes is not None and config.ways + value > test_classes:
    raise ConfigError(
      f"num_open_set_classes {value}: an open-set test episode needs "
      f"ways + unknown = {config.ways + value} classes, but the test split has "
      f"{test_classes} (0 turns open-set episodes off)",
      fields=("num_open_set_classes", "ways"),
    )
  return value


def _check_open_set(config, test_classes: Optional[int], what: str) -> None:
  value = config.num_open_set_classes
  if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
    raise ConfigError(
      f"num_open_set_classes must be an integer >= 0, got {value!r}",
      fields=("num_open_set_classes",),
    )
  unknown = open_set_classes(config)
  if unknown and test_classes is not None and config.ways + unknown > test_classes:
    raise ConfigError(
      f"num_open_set_classes {unknown}: an open-set test episode needs "
      f"ways + unknown = {config.ways + unknown} distinct classes, but {what} "
      f"test part has only {test_classes} (0 turns open-set episodes off)",
      fields=("num_open_set_classes", "ways"),
    )


# -- Omniglot --------------------------------------------------------------------

# Characters per split part, with the default validation sizes (data.split_indices).
OMNIGLOT_SPLIT_CHARACTERS = {
  "original": {"train": 813, "val": 151, "test": 659},
  "random": {"train": 1100, "val": 100, "test": 423},
}
# The data set's facts live in its loader (`vampire_jax.data.omniglot`); named here for the configs.
OMNIGLOT_DRAWINGS = omniglot.NUM_DRAWINGS
# Characters of each background alphabet, in `data.BACKGROUND_ALPHABETS` order
# (tests/metrics/test_predictive_uncertainty.py checks them against the data); the original
# split validates on the last `num_val_alphabets`.
OMNIGLOT_BACKGROUND_ALPHABET_SIZES = (
  20,
  29,
  26,
  41,
  40,
  24,
  46,
  14,
  26,
  34,
  33,
  22,
  26,
  43,
  24,
  48,
  22,
  16,
  52,
  47,
  40,
  26,
  40,
  41,
  33,
  14,
  42,
  23,
  17,
  55,
)
OMNIGLOT_RANDOM_TRAIN_CHARACTERS = omniglot.NUM_RANDOM_TRAIN_CHARACTERS


def omniglot_split_characters(
  split: str, num_val_alphabets: int = 5, num_val_characters: int = 100
) -> dict[str, int]:
  """Characters in the train, val and test parts (as `data.split_indices` makes them).

  With no held-out validation (`num_val_alphabets` 0 for 'original',
  `num_val_characters` 0 for 'random') every training character trains and
  validation draws its tasks from the training characters.
  """
  if split == "original":
    held_out = (
      sum(
        OMNIGLOT_BACKGROUND_ALPHABET_SIZES[
          len(OMNIGLOT_BACKGROUND_ALPHABET_SIZES) - num_val_alphabets :
        ]
      )
      if num_val_alphabets
      else 0
    )
    train = sum(OMNIGLOT_BACKGROUND_ALPHABET_SIZES) - held_out
    return {"train": train, "val": held_out or train, "test": omniglot.NUM_EVALUATION_CHARACTERS}
  train = OMNIGLOT_RANDOM_TRAIN_CHARACTERS - num_val_characters
  test = omniglot.NUM_CHARACTERS - OMNIGLOT_RANDOM_TRAIN_CHARACTERS
  return {"train": train, "val": num_val_characters or train, "test": test}


@dataclasses.dataclass
class OmniglotConfig(ConvNetConfig):
  """Omniglot N-way k-shot classification with a Conv4 (paper Sec. 4.2, Table 1)."""

  ways: int = setting(5, "N, classes per task")
  shots: int = setting(1, "k, support examples per class")
  query: int = setting(15, "query examples per class")
  split: str = setting(
    "original",
    "character split: original (background/evaluation) or random",
    choices=("original", "random"),
  )
  split_seed: int = setting(0, "seed of the random split")
  num_val_alphabets: int = setting(
    5,
    "original split: background alphabets held out to "
    "validate (the last N; 0: all 964 background characters "
    "train and validation draws tasks from them)",
  )
  num_val_characters: int = setting(
    100,
    "random split: of its 1200 training characters, how "
    "many validate (0: all 1200 train and validation draws "
    "tasks from them)",
  )
  class_sampling: str = setting(
    "character",
    "a task's classes: 'character' (MAML's: distinct "
    "characters, each at a random rotation) or 'class' (distinct "
    "(character, rotation) pairs)",
    choices=episodes.CLASS_SAMPLING,
  )
  num_filters: int = setting(64, "Conv4 filters per layer")
  conv_padding: str = setting(
    "same",
    "stride-2 padding: same (XLA's: 0, 1 on even sizes) or symmetric (1, 1: the authors')",
    choices=models.PADDINGS,
  )
  data_dir: Optional[str] = setting(
    None,
    "folder with the Omniglot zips (default: $OMNIGLOT_DIR; none: TFDS downloads)",
    resumable=True,
  )
  data_source: str = setting(
    "auto",
    "auto (zips if a folder is given, else TFDS), zip, tfds, cache",
    resumable=True,
    choices=("auto", "zip", "tfds", "cache"),
  )
  cache_dir: Optional[str] = setting(None, _CACHE_HELP, resumable=True)
  num_open_set_classes: Optional[int] = setting(None, _OPEN_SET_HELP, resumable=True)

  def validate(self) -> None:
    super().validate()
    num_alphabets = len(OMNIGLOT_BACKGROUND_ALPHABET_SIZES)
    for name, value, below in (
      ("num_val_alphabets", self.num_val_alphabets, num_alphabets),
      ("num_val_characters", self.num_val_characters, OMNIGLOT_RANDOM_TRAIN_CHARACTERS),
    ):
      if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < below:
        raise ConfigError(
          f"{name} must be an integer in [0, {below}), got {value!r}", fields=(name,)
        )
    characters = omniglot_split_characters(
      self.split, self.num_val_alphabets, self.num_val_characters
    )
    classes = {
      part: episodes.num_classes_available(count, rotate=True, class_sampling=self.class_sampling)
      for part, count in characters.items()
    }
    check_episodes(
      self.ways,
      self.shots,
      self.query,
      OMNIGLOT_DRAWINGS,
      classes,
      what=f"the {self.split} split's",
    )
    check_train_ways(self, classes["train"], f"the {self.split} split's")
    _check_open_set(self, classes["test"], f"the {self.split} split's")


# -- mini-ImageNet ---------------------------------------------------------------

# From the loader (`vampire_jax.data.mini_imagenet`), the one home of the split's facts.
MINI_IMAGENET_CLASSES = mini_imagenet.NUM_CLASSES
MINI_IMAGENET_IMAGES = mini_imagenet.IMAGES_PER_CLASS


@dataclasses.dataclass
class MiniImagenetConfig(ConvNetConfig):
  """mini-ImageNet N-way k-shot classification with a Conv4 (paper Sec. 4.2, Table 3)."""

  ways: int = setting(5, "N, classes per task")
  shots: int = setting(1, "k, support examples per class")
  query: int = setting(15, "query examples per class")
  test_query: Optional[int] = setting(
    None,
    "query images per class in the test tasks and the calibration protocol (none: "
    "query; the authors' 2019 test: 20)",
    resumable=True,
  )
  num_filters: int = setting(32, "Conv4 filters per layer")
  image_size: int = setting(84, "image side (84 in the paper; smaller only for fast tests)")
  data_dir: Optional[str] = setting(
    None, "mini-ImageNet folder (default: $MINI_IMAGENET_DIR)", resumable=True
  )
  cache_dir: Optional[str] = setting(None, _CACHE_HELP, resumable=True)
  source: str = setting(
    "auto",
    "auto, folder, pickle, tfds or cache",
    resumable=True,
    choices=("auto", "folder", "pickle", "tfds", "cache"),
  )
  existing_only: bool = setting(False, "use only the images present (partial copies)")
  num_open_set_classes: Optional[int] = setting(None, _OPEN_SET_HELP, resumable=True)

  def validate(self) -> None:
    super().validate()
    if self.image_size < 8:
      raise ConfigError(
        f"image_size must be at least 8, got {self.image_size}", fields=("image_size",)
      )
    images = None if self.existing_only else MINI_IMAGENET_IMAGES  # else checked on loading
    if self.test_query is not None and (
      isinstance(self.test_query, bool)
      or not isinstance(self.test_query, int)
      or self.test_query < 1
    ):
      raise ConfigError(
        f"test_query must be an integer >= 1, got {self.test_query!r}", fields=("test_query",)
      )
    for query in {self.query, test_query(self)}:
      check_episodes(
        self.ways, self.shots, query, images, MINI_IMAGENET_CLASSES, what="mini-ImageNet's"
      )
    check_train_ways(self, MINI_IMAGENET_CLASSES["train"], "mini-ImageNet's")
    _check_open_set(self, MINI_IMAGENET_CLASSES["test"], "mini-ImageNet's")


def test_query(config) -> int:
  """Query examples per class in test tasks: `test_query` where a config has it set, else `query`."""
  value = getattr(config, "test_query", None)
  return config.query if value is None else value


# -- LEO features (tiered- or mini-ImageNet) -------------------------------------

FEATURE_CLASSES = {
  "tiered": {"train": 351, "val": 97, "test": 160},
  "mini": mini_imagenet.NUM_CLASSES,
}


@dataclasses.dataclass
class FeaturesConfig(RunConfig):
  """N-way k-shot classification of LEO's image embeddings with an MLP (tiered-ImageNet)."""

  dataset: str = setting(
    "tiered", "LEO features of tiered- or mini-ImageNet", choices=("tiered", "mini")
  )
  crop: str = setting(
    "center", "LEO's crop: center, or multiview (mini only)", choices=("center", "multiview")
  )
  l2_normalize: bool = setting(True, "scale each embedding to unit norm, as LEO")
  ways: int = setting(5, "N, classes per task")
  shots: int = setting(1, "k, support examples per class")
  query: int = setting(15, "query examples per class")
  hidden_sizes: tuple[int, int] = setting((128, 32), "MLP hidden widths")
  kernel_init_gain: float = setting(
    math.sqrt(2.0),
    "Xavier-normal gain of the initial kernels, the means (the authors' 2019 code: 1)",
  )
  data_dir: Optional[str] = setting(
    None, "LEO embeddings folder (default: $LEO_EMBEDDINGS_DIR)", resumable=True
  )
  num_open_set_classes: Optional[int] = setting(None, _OPEN_SET_HELP, resumable=True)

  def validate(self) -> None:
    super().validate()
    check_widths("hidden_sizes", self.hidden_sizes)
    check_rate("kernel_init_gain", self.kernel_init_gain, positive=True)
    check_episodes(
      self.ways,
      self.shots,
      self.query,
      None,
      FEATURE_CLASSES[self.dataset],
      what=f"{self.dataset}-ImageNet's",
    )
    check_train_ways(self, FEATURE_CLASSES[self.dataset]["train"], f"{self.dataset}-ImageNet's")
    _check_open_set(self, FEATURE_CLASSES[self.dataset]["test"], f"{self.dataset}-ImageNet's")


# -- Sine/line regression ---------------------------------------------------------


@dataclasses.dataclass
class RegressionConfig(RunConfig):
  """The paper's regression settings (App. A, Table 6); the rest from RunConfig."""

  schedule: Schedule = Schedule(tasks_per_step=10, num_meta_steps=10_000)
  # The paper's: inner lr 0.001, the plain VFE (KL weight 1), L_t = L_v = 128 draws.
  algorithm: Vampire = Vampire(
    inner_lr=0.001, kl_weight=1.0, num_mc_train=128, num_mc_query=128, num_mc_test=128
  )
  # 10 tasks an evaluation call x 128 draws: ~3 GB.
  evaluation: Evaluation = Evaluation(
    eval_batch_tasks=10, eval_every=1000, checkpoint_every=1000, log_every=100
  )
  num_support: int = setting(5, "support points per task (k-shot)")
  num_query: int = setting(10, "query points per task (not given in the paper)")
  noise_std: float = setting(
    0.3,
    "the targets' noise std: what the calibration metric and the NLL assume, and the "
    "likelihood's and the data's unless likelihood_std / data_noise_std say otherwise",
  )
  likelihood_std: Optional[float] = setting(
    None,
    "the Gaussian likelihood's std in training and adaptation (none: noise_std; "
    "0.7071: the authors' MSE loss, up to a constant)",
  )
  data_noise_std: Optional[float] = setting(
    None,
    "the std of the noise added to the targets (none: noise_std; the authors' 2019 "
    "code added 0.3^2 = 0.09, a bug fixed two months later)",
  )
  test_query_grid: int = setting(
    0,
    "test tasks' query points: 0: num_query drawn at random, as in training; N: an "
    "even grid of N over [-5, 5] (the authors' 2019 test: 100)",
    resumable=True,
  )
  hidden_sizes: tuple[int, int, int] = setting((100, 100, 100), "MLP hidden widths")
  kernel_init_gain: float = setting(
    math.sqrt(2.0),
    "Xavier-normal gain of the initial kernels, the means (the authors' 2019 code: 1)",
  )
  num_plot_tasks: int = setting(4, "test tasks drawn in tasks.png", resumable=True)

  def validate(self) -> None:
    super().validate()
    check_widths("hidden_sizes", self.hidden_sizes)
    check_rate("kernel_init_gain", self.kernel_init_gain, positive=True)
    for name in ("num_support", "num_query"):
      if getattr(self, name) < 1:
        raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", fields=(name,))
    for name in ("noise_std", "likelihood_std"):
      value = getattr(self, name)
      if (value is not None or name == "noise_std") and not 0 < value < math.inf:
        raise ConfigError(f"{name} must be > 0 and finite, got {value}", fields=(name,))
    if self.data_noise_std is not None and not 0 <= self.data_noise_std < math.inf:
      raise ConfigError(
        f"data_noise_std must be >= 0 and finite, got {self.data_noise_std}",
        fields=("data_noise_std",),
      )
    grid = self.test_query_grid
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 0:
      raise ConfigError(
        f"test_query_grid must be an integer >= 0, got {grid!r}", fields=("test_query_grid",)
      )


# -- Shared ---------------------------------------------------------------------------


def check_widths(name: str, widths) -> None:
  """ConfigError unless every layer width is a whole number >= 1 (a width of 0 has no units)."""
  for width in widths:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
      raise ConfigError(
        f"{name} must be whole numbers >= 1 (units per layer), got {list(widths)}",
        fields=(name,),
      )


def check_episodes(
  ways: int, shots: int, query: int, examples: Optional[int], classes: dict[str, int], *, what: str
) -> None:
  """Raises ConfigError unless every split part can give the tasks asked for."""
  for name, value in (("ways", ways), ("shots", shots), ("query", query)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"{name} must be an integer >= 1, got {value!r}", fields=(name,))
  if ways < 2:
    raise ConfigError(
      f"ways {ways}: a task needs at least 2 classes (with one, every prediction is right "
      "and accuracy, NLL and ECE say nothing); use ways 2 or more",
      fields=("ways",),
    )
  part, fewest = min(classes.items(), key=lambda item: item[1])
  if ways > fewest:
    raise ConfigError(
      f"ways {ways}: a {ways}-way task needs {ways} distinct classes, but "
      f"{what} {part} part has only {fewest}",
      fields=("ways",),
    )
  if examples is not None and shots + query > examples:
    raise ConfigError(
      f"shots {shots}, query {query}: each class needs shots + query = "
      f"{shots + query} distinct examples, but has only {examples}",
      fields=("shots", "query"),
    )


def check_train_ways(config, train_classes: int, what: str) -> None:
  """ConfigError unless the training part's `train_classes` can give the algorithm's training
  episodes (ProtoNet's `train_num_classes`)."""
  ways = config.algorithm.training_ways(config.ways)
  if ways > train_classes:
    raise ConfigError(
      f"train_num_classes {ways}: a {ways}-way training episode needs {ways} distinct "
      f"classes, but {what} train part has only {train_classes}",
      fields=("train_num_classes",),
    )


# -- Run folders written before the classes moved here ------------------------------

# Where run folders of earlier versions say the config classes live: the experiments,
# then `vampire_jax.configs` (before the layers moved under `_src/`, issue 43).
_LEGACY_MODULES = (
  "experiments.configs",
  "vampire_jax.configs",
  "vampire_jax._src.runs.experiment_configs",  # before the run harness became public
)


def recorded_class_name(name: str) -> str:
  """The importable name of a config class as a run folder records it.

  Run folders written before the experiments' configs moved into the
  library name them `experiments.configs.<Class>`, and those written before
  the library's layers moved under `_src/` `vampire_jax.configs.<Class>`; both
  map to this module's class of the same name, silently (loading them does
  not import the experiments or warn). Any other name is returned as it is.

  Args:
    name: `run.json`'s `config_class`, e.g. `experiments.configs.OmniglotConfig`.

  Returns:
    e.g. `vampire_jax.runs.experiment_configs.OmniglotConfig`.
  """
  module_name, _, class_name = name.rpartition(".")
  if module_name in _LEGACY_MODULES and class_name in _CLASSES:
    return f"{__name__}.{class_name}"
  return deprecations.current_path(name)  # e.g. vampire_jax.config.RunConfig
