"""Every experiment's config and presets, in one place.

Each config is a `vampire_jax.RunConfig` plus the experiment's data and
network fields; `get_config(experiment, preset, algorithm)` gives a preset
for an algorithm (the algorithm's own defaults come from
`vampire_jax.algorithms`). Each preset's docstring line gives the command
that runs it. Nothing here loads data, so a trained run's config is read
back (`vj.load_run`) without the data set.

Paper presets use the paper's hyper-parameters (PAPER_NOTES.md). VAMPIRE,
PLATIPUS and ABML use the authors' inner lr 0.01 with the paper's KL weight
0.1: at the initial prior (log-std in [-4, -3]) inner_lr * kl_weight /
sigma_p^2 reaches 3.0 at the narrowest weights, above the stability limit
of 2 for about a fifth of them (the runner warns); that is what produced the
measured Omniglot results. See BUILD_NOTES.md, "The KL term".
"""

import dataclasses
from typing import Optional

from vampire_jax import algorithms
from vampire_jax.config import RunConfig, setting
from vampire_jax.data import episodes
from vampire_jax.errors import ConfigError


@dataclasses.dataclass
class ConvNetConfig(RunConfig):
  """Fields of the Conv4 experiments (Omniglot, mini-ImageNet)."""
  batch_norm_affine: bool = setting(True, "batch norm with scale and offset (the authors' has none)")
  conv_impl: str = setting("auto", "convolution: xla, patches (im2col), loop_safe (fast "
                           "gradients inside loops on a CPU) or auto (loop_safe on a CPU where "
                           "gradients run in loops, else xla)", resumable=True,
                           choices=("auto", "xla", "patches", "loop_safe"))
  sample_batching: str = setting("auto", "how Monte-Carlo draws are batched (auto: lax.map on a "
                                 "CPU, vmap elsewhere)", resumable=True,
                                 choices=("auto", "vmap", "map", "unroll"))


# -- Omniglot --------------------------------------------------------------------

# Characters per split part, with the default validation sizes (data.split_indices).
OMNIGLOT_SPLIT_CHARACTERS = {"original": {"train": 813, "val": 151, "test": 659},
                             "random": {"train": 1100, "val": 100, "test": 423}}
OMNIGLOT_DRAWINGS = 20


@dataclasses.dataclass
class OmniglotConfig(ConvNetConfig):
  ways: int = setting(5, "N, classes per task")
  shots: int = setting(1, "k, support examples per class")
  query: int = setting(15, "query examples per class")
  split: str = setting("original", "character split: original (background/evaluation) or random",
                       choices=("original", "random"))
  split_seed: int = setting(0, "seed of the random split")
  class_sampling: str = setting("character", "a task's classes: 'character' (MAML's: distinct "
                                "characters, each at a random rotation) or 'class' (distinct "
                                "(character, rotation) pairs)", choices=episodes.CLASS_SAMPLING)
  num_filters: int = setting(64, "Conv4 filters per layer")
  data_dir: Optional[str] = setting(None, "folder with the Omniglot zips (default: $OMNIGLOT_DIR; "
                                    "none: TFDS downloads)", resumable=True)
  data_source: str = setting("auto", "auto (zips if a folder is given, else TFDS), zip, tfds, "
                             "cache", resumable=True, choices=("auto", "zip", "tfds", "cache"))
  cache_dir: Optional[str] = setting(None, "cache folder (default: $VAMPIRE_JAX_CACHE or "
                                     "~/.cache/vampire_jax)", resumable=True)

  def validate(self) -> None:
    super().validate()
    check_episodes(self.ways, self.shots, self.query, OMNIGLOT_DRAWINGS,
                   {part: episodes.num_classes_available(count, rotate=True,
                                                         class_sampling=self.class_sampling)
                    for part, count in OMNIGLOT_SPLIT_CHARACTERS[self.split].items()},
                   what=f"the {self.split} split's")


OMNIGLOT_PRESETS = ("5way1shot", "5way5shot", "20way1shot", "20way5shot", "quick")


def omniglot_config(preset: str = "5way1shot", algorithm: str = "vampire") -> OmniglotConfig:
  """Omniglot presets.

  5way1shot, 5way5shot, 20way1shot, 20way5shot: the paper's Table 1 settings
    (`python -m experiments.omniglot --preset 20way1shot --algorithm vampire`).
  quick: the README's first run, a few CPU minutes: 5-way 1-shot, Conv4-32,
    a short schedule; learns well above chance (20 %).
  """
  if preset in ("5way1shot", "5way5shot", "20way1shot", "20way5shot"):
    ways, shots = int(preset.split("way")[0]), int(preset[-5])
    config = OmniglotConfig(ways=ways, shots=shots, tasks_per_step=32 if ways == 5 else 16,
                            inner_lr=0.1, kl_weight=0.1)
  elif preset == "quick":
    config = OmniglotConfig(ways=5, shots=1, tasks_per_step=8, num_meta_steps=200,
                            num_filters=16, num_val_tasks=40, num_test_tasks=200,
                            eval_batch_tasks=20, eval_every=100, checkpoint_every=100,
                            log_every=20, num_mc_test=4, inner_lr=0.1, kl_weight=0.001)
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {OMNIGLOT_PRESETS}")
  config = algorithms.configure(config, algorithm)
  if algorithms.get(algorithm).has_kl and preset != "quick":
    config.inner_lr = 0.01  # the authors' code; see the module docstring
  return config


# -- mini-ImageNet ---------------------------------------------------------------

MINI_IMAGENET_CLASSES = {"train": 64, "val": 16, "test": 20}
MINI_IMAGENET_IMAGES = 600


@dataclasses.dataclass
class MiniImagenetConfig(ConvNetConfig):
  ways: int = setting(5, "N, classes per task")
  shots: int = setting(1, "k, support examples per class")
  query: int = setting(15, "query examples per class")
  num_filters: int = setting(32, "Conv4 filters per layer")
  image_size: int = setting(84, "image side (84 in the paper; smaller only for fast tests)")
  data_dir: Optional[str] = setting(None, "mini-ImageNet folder (default: $MINI_IMAGENET_DIR)",
                                    resumable=True)
  cache_dir: Optional[str] = setting(None, "cache folder (default: $VAMPIRE_JAX_CACHE or "
                                     "~/.cache/vampire_jax)", resumable=True)
  source: str = setting("auto", "auto, folder, pickle, tfds or cache", resumable=True,
                        choices=("auto", "folder", "pickle", "tfds", "cache"))
  existing_only: bool = setting(False, "use only the images present (partial copies)")

  def validate(self) -> None:
    super().validate()
    if self.image_size < 8:
      raise ConfigError(f"--image-size must be at least 8, got {self.image_size}")
    images = None if self.existing_only else MINI_IMAGENET_IMAGES  # else checked on loading
    check_episodes(self.ways, self.shots, self.query, images, MINI_IMAGENET_CLASSES,
                   what="mini-ImageNet's")


MINI_IMAGENET_PRESETS = ("5way1shot", "5way5shot", "quick")


def mini_imagenet_config(preset: str = "5way1shot",
                         algorithm: str = "vampire") -> MiniImagenetConfig:
  """mini-ImageNet presets.

  5way1shot, 5way5shot: the paper's (T = 2, L_t = L_v = 10, inner lr 0.01,
    600 test tasks); 60 000 meta-steps (the paper gives no length).
  quick: a CPU smoke run that fits the 12-image sample (1 support + 5 query
    images per class, KL weight 0.001); far too short to learn (about 20 %).
  """
  if preset in ("5way1shot", "5way5shot"):
    config = MiniImagenetConfig(
        shots=int(preset[4]), tasks_per_step=2, num_meta_steps=60_000, inner_lr=0.01,
        kl_weight=0.1, num_mc_train=10, num_mc_query=10, num_mc_test=10, num_val_tasks=200,
        num_test_tasks=600, eval_batch_tasks=10, eval_every=2000, checkpoint_every=2000,
        log_every=100)
  elif preset == "quick":
    config = MiniImagenetConfig(
        shots=1, query=5, tasks_per_step=2, num_meta_steps=60, inner_lr=0.01, kl_weight=0.001,
        num_val_tasks=8, num_test_tasks=40, eval_batch_tasks=2, eval_every=60,
        checkpoint_every=60, log_every=10, num_mc_test=2, chunk_size=2, existing_only=True)
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {MINI_IMAGENET_PRESETS}")
  return algorithms.configure(config, algorithm)


# -- LEO features (tiered- or mini-ImageNet) -------------------------------------

FEATURE_CLASSES = {"tiered": {"train": 351, "val": 97, "test": 160},
                   "mini": {"train": 64, "val": 16, "test": 20}}


@dataclasses.dataclass
class FeaturesConfig(RunConfig):
  dataset: str = setting("tiered", "LEO features of tiered- or mini-ImageNet",
                         choices=("tiered", "mini"))
  crop: str = setting("center", "LEO's crop: center, or multiview (mini only)",
                      choices=("center", "multiview"))
  l2_normalize: bool = setting(True, "scale each embedding to unit norm, as LEO")
  ways: int = setting(5, "N, classes per task")
  shots: int = setting(1, "k, support examples per class")
  query: int = setting(15, "query examples per class")
  hidden_sizes: tuple[int, int] = setting((128, 32), "MLP hidden widths")
  data_dir: Optional[str] = setting(None, "LEO embeddings folder (default: $LEO_EMBEDDINGS_DIR)",
                                    resumable=True)
  # vmap over tasks: per-task MLP weights become batched matmuls, fast on a CPU too.
  task_batching: str = setting("vmap", "how tasks are batched", resumable=True)
  eval_task_batching: str = setting("vmap", "task batching at evaluation", resumable=True)

  def validate(self) -> None:
    super().validate()
    check_episodes(self.ways, self.shots, self.query, None, FEATURE_CLASSES[self.dataset],
                   what=f"{self.dataset}-ImageNet's")


FEATURES_PRESETS = ("5way1shot", "5way5shot", "quick")


def features_config(preset: str = "5way1shot", algorithm: str = "vampire") -> FeaturesConfig:
  """LEO-feature presets: MLP 128-32, inner lr 0.01, 5 steps, KL weight 0.1.

  5way1shot, 5way5shot: T = 16, L = 10, 30 000 steps, 5000 test tasks (the
    paper gives neither T, L nor the length for features).
  quick: 300 steps of 8 tasks with inner lr 0.1 and KL weight 0.001.
  """
  if preset in ("5way1shot", "5way5shot"):
    config = FeaturesConfig(
        shots=int(preset[4]), tasks_per_step=16, num_meta_steps=30_000, inner_lr=0.01,
        kl_weight=0.1, num_mc_train=10, num_mc_query=10, num_mc_test=10, num_val_tasks=500,
        num_test_tasks=5000, eval_batch_tasks=100, eval_every=1000, checkpoint_every=1000,
        log_every=100)
  elif preset == "quick":
    config = FeaturesConfig(
        tasks_per_step=8, num_meta_steps=300, inner_lr=0.1, kl_weight=0.001,
        num_val_tasks=100, num_test_tasks=500, eval_batch_tasks=50, eval_every=100,
        checkpoint_every=100, log_every=25, num_mc_test=4)
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {FEATURES_PRESETS}")
  return algorithms.configure(config, algorithm)


# -- Sine/line regression ---------------------------------------------------------


@dataclasses.dataclass
class RegressionConfig(RunConfig):
  """The paper's regression settings (App. A, Table 6); the rest from RunConfig."""
  tasks_per_step: int = setting(10, "T, tasks per meta-update")
  num_meta_steps: int = setting(10_000, "meta-updates to train for", resumable=True)
  inner_lr: float = setting(0.001, "alpha, the task-adaptation learning rate")
  kl_weight: float = setting(1.0, "beta, weight of the KL term (1: the plain VFE)")
  num_mc_train: int = setting(128, "L_t, weight draws per inner step")
  num_mc_query: int = setting(128, "L_v, weight draws on the query set")
  num_mc_test: int = setting(128, "draws at validation and test", resumable=True)
  task_batching: str = setting("vmap", "how tasks are batched (vmap: fastest for an MLP)",
                               resumable=True)
  eval_task_batching: str = setting("vmap", "task batching at evaluation", resumable=True)
  eval_batch_tasks: int = setting(10, "tasks per evaluation call (x 128 draws: ~3 GB)",
                                  resumable=True)
  eval_every: int = setting(1000, "meta-steps between validations", resumable=True)
  checkpoint_every: int = setting(1000, "meta-steps between checkpoints", resumable=True)
  log_every: int = setting(100, "meta-steps between logged metrics", resumable=True)
  num_support: int = setting(5, "support points per task (k-shot)")
  num_query: int = setting(10, "query points per task (not given in the paper)")
  noise_std: float = setting(0.3, "the targets' noise standard deviation")
  hidden_sizes: tuple[int, int, int] = setting((100, 100, 100), "MLP hidden widths")
  num_plot_tasks: int = setting(4, "test tasks drawn in tasks.png", resumable=True)

  def validate(self) -> None:
    super().validate()
    for name in ("num_support", "num_query"):
      if getattr(self, name) < 1:
        raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
    if not self.noise_std > 0:
      raise ConfigError(f"--noise-std must be > 0, got {self.noise_std}")


REGRESSION_PRESETS = ("cpu", "paper", "quick")


def regression_config(preset: str = "cpu", algorithm: str = "vampire") -> RegressionConfig:
  """Sine/line presets; MAML gets the same schedule with one draw and no KL.

  paper: App. A (T = 10, L_t = L_v = 128) for the authors' 50 000 meta-steps;
    sized for a GPU.
  cpu: the default: L_t = L_v = 8 in training (128 at test), 3000 meta-steps.
  quick: 500 meta-steps, L = 8, 500 test tasks with 32 draws: minutes.
  """
  if preset == "paper":
    config = RegressionConfig(num_meta_steps=50_000, eval_every=2500, checkpoint_every=2500)
  elif preset == "cpu":
    config = RegressionConfig(num_meta_steps=3000, num_mc_train=8, num_mc_query=8,
                              num_val_tasks=100, eval_every=500, checkpoint_every=500)
  elif preset == "quick":
    config = RegressionConfig(num_meta_steps=500, num_mc_train=8, num_mc_query=8,
                              num_mc_test=32, num_val_tasks=100, num_test_tasks=500,
                              eval_every=250, checkpoint_every=250, log_every=50)
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {REGRESSION_PRESETS}")
  return algorithms.configure(config, algorithm)


# -- Shared ---------------------------------------------------------------------------

PRESETS = {"omniglot": OMNIGLOT_PRESETS, "mini_imagenet": MINI_IMAGENET_PRESETS,
           "features": FEATURES_PRESETS, "regression": REGRESSION_PRESETS}
_CONFIGS = {"omniglot": omniglot_config, "mini_imagenet": mini_imagenet_config,
            "features": features_config, "regression": regression_config}


def get_config(experiment: str, preset: str, algorithm: str = "vampire") -> RunConfig:
  """The config of `experiment`'s `preset` for `algorithm`."""
  if experiment not in _CONFIGS:
    raise ConfigError(f"unknown experiment {experiment!r}; expected one of {sorted(_CONFIGS)}")
  return _CONFIGS[experiment](preset, algorithm)


def check_episodes(ways: int, shots: int, query: int, examples: Optional[int],
                   classes: dict[str, int], *, what: str) -> None:
  """Raises ConfigError unless every split part can give the tasks asked for."""
  for name, value in (("ways", ways), ("shots", shots), ("query", query)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"--{name} must be an integer >= 1, got {value!r}")
  part, fewest = min(classes.items(), key=lambda item: item[1])
  if ways > fewest:
    raise ConfigError(f"--ways {ways}: a {ways}-way task needs {ways} distinct classes, but "
                      f"{what} {part} part has only {fewest}")
  if examples is not None and shots + query > examples:
    raise ConfigError(f"--shots {shots} --query {query}: each class needs shots + query = "
                      f"{shots + query} distinct examples, but has only {examples}")
