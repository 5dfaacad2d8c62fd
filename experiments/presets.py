"""Every experiment's presets, in one place.

The config dataclasses (a `vampire_jax.RunConfig` plus the experiment's data
and network fields) live in the library, `vampire_jax.runs.experiment_configs`, so that a
trained run's config is read back (`vj.load_run`) with the library alone;
they are re-exported here. `get_config(experiment, preset, algorithm)` gives
a preset for an algorithm (the algorithm's own defaults come from
`vampire_jax.runs.algorithms`). Each preset's docstring line gives the command
that runs it.

Paper presets use the paper's hyper-parameters (PAPER_NOTES.md). VAMPIRE,
PLATIPUS and ABML use the authors' inner lr 0.01 with the paper's KL weight
0.1 (the authors' commands: vampire.py and, for their re-implementation of
PLATIPUS, platipus.py, both with inner_lr 1e-2 and kl_reweight 0.1). For
VAMPIRE and ABML, whose inner loop takes KL steps, at the initial prior
(log-std in [-4, -3]) inner_lr * kl_weight / sigma_p^2 reaches 3.0 at the
narrowest weights, above the stability limit of 2 for about a fifth of them
(the runner warns); that is what produced the measured Omniglot results.
PLATIPUS's KL term is in its meta-loss only, so no limit applies to it.
(The `vj.baselines.platipus` factory's own defaults, MAML's 0.1 and the
ELBO's 1, are for a user who builds it directly.) See docs/fidelity.md,
"Library defaults that converge".

The Omniglot paper presets train on the paper's training set: every
background character (`num_val_alphabets=0`) or all 1200 of the random
split (`num_val_characters=0`); validation then draws tasks from the
training characters (see `vampire_jax.data.split_indices`).
"""

import vampire_jax as vj
from vampire_jax import ConfigError
from vampire_jax.runs.experiment_configs import (
  FEATURE_CLASSES,
  MINI_IMAGENET_CLASSES,
  MINI_IMAGENET_IMAGES,
  OMNIGLOT_DRAWINGS,
  OMNIGLOT_SPLIT_CHARACTERS,
  ConvNetConfig,
  FeaturesConfig,
  MiniImagenetConfig,
  OmniglotConfig,
  RegressionConfig,
  check_episodes,
)
from vampire_jax.runs.run_config import RunConfig

# The authors' 2019 code (../shared/AUTHORS_CODE_2019.md; BUILD_NOTES.md, "The authors'
# 2019 code"): the settings it used that the paper's text does not state.
AUTHORS_LOG_STD_WEIGHT_DECAY = 1e-3  # torch Adam's weight_decay on VAMPIRE's prior log-stds
AUTHORS_KERNEL_INIT_GAIN = 1.0  # torch.nn.init.xavier_normal_(gain=1.) for every method's means
AUTHORS_MSE_LIKELIHOOD_STD = (
  0.5**0.5
)  # the MSE loss is the Gaussian NLL at this std, up to a constant


# The experiments' own setting of an option whose factory default differs: BMAML's particles.
EXPERIMENT_OPTIONS = {"bmaml": {"num_particles": 8}}


def for_algorithm(config: RunConfig, algorithm: str) -> RunConfig:
  """`config` for `algorithm`: its spec converted (`vj.specs.convert`: the inner loop's steps
  and rate, the draws... carried over; the options it does not take left behind), with the
  experiments' own settings of its options (`EXPERIMENT_OPTIONS`)."""
  spec = vj.specs.convert(config.algorithm, algorithm)
  return config.replace(algorithm=spec, **EXPERIMENT_OPTIONS.get(algorithm, {}))


def _build(cls, **settings) -> RunConfig:
  """An experiment's config with the given fields set, wherever they live (`RunConfig.replace`)."""
  return cls().replace(**settings)


def _where_taken(config: RunConfig, **settings) -> RunConfig:
  """`config` with those of `settings` that its algorithm's spec takes (the rest have no
  effect on it: SImPa's generated weights have no Xavier gain, MAML no log-stds)."""
  taken = set(config.algorithm.field_names())
  return config.replace(**{k: v for k, v in settings.items() if k in taken})


def follow_authors_code(config: RunConfig) -> RunConfig:
  """A paper preset where the paper's text is silent and the authors' 2019 code decides.

  The code tested the final parameters (every method), initialised every
  method's kernels Xavier-normal with gain 1, and gave VAMPIRE's meta-optimiser
  a weight decay of 1e-3 on the prior's log-stds with the means' and the
  log-stds' gradients clipped separately. Where the text and the code disagree
  (the learning-rate decay, L, the noise, second order against the code's
  truncation) the presets keep the text's.
  """
  config = config.replace(test_parameters="final")
  if config.algorithm.name != "simpa":  # SImPa's generated weights have no Xavier gain
    config = config.replace(kernel_init_gain=AUTHORS_KERNEL_INIT_GAIN)
  if config.algorithm.name == "vampire":
    config = config.replace(
      log_std_weight_decay=AUTHORS_LOG_STD_WEIGHT_DECAY, meta_grad_clip_separately=True
    )
  return config


# -- Omniglot --------------------------------------------------------------------

OMNIGLOT_PRESETS = ("5way1shot", "5way5shot", "20way1shot", "20way5shot", "quick")


def omniglot_config(preset: str = "5way1shot", algorithm: str = "vampire") -> OmniglotConfig:
  """Omniglot presets.

  5way1shot, 5way5shot, 20way1shot, 20way5shot: the paper's Table 1 settings
    (`python -m experiments.omniglot --preset 20way1shot --algorithm vampire`),
    the authors' code where the text is silent, except the log-std weight
    decay, which stalled 5-way 1-shot on a GPU (BUILD_NOTES.md).
  quick: the README's first run, a few CPU minutes: 5-way 1-shot, Conv4-32,
    a short schedule; learns well above chance (20 %).
  """
  if preset in ("5way1shot", "5way5shot", "20way1shot", "20way5shot"):
    ways, shots = int(preset.split("way")[0]), int(preset[-5])
    config = _build(
      OmniglotConfig,
      ways=ways,
      shots=shots,
      tasks_per_step=32 if ways == 5 else 16,
      inner_lr=0.1,
      kl_weight=0.1,
      num_val_alphabets=0,
      num_val_characters=0,
    )
  elif preset == "quick":
    config = _build(
      OmniglotConfig,
      ways=5,
      shots=1,
      tasks_per_step=8,
      num_meta_steps=200,
      num_filters=16,
      num_val_tasks=40,
      num_test_tasks=200,
      eval_batch_tasks=20,
      eval_every=40,
      checkpoint_every=100,
      log_every=10,
      num_mc_test=4,
      inner_lr=0.1,
      kl_weight=0.001,
    )
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {OMNIGLOT_PRESETS}")
  config = for_algorithm(config, algorithm)
  if preset != "quick":
    config = follow_authors_code(config)
    # Except the log-std weight decay: under Adam it widens the prior by about the meta lr
    # per step whatever the data say, and on one H100 the 5-way 1-shot preset with it
    # stalled at 35-40 % validation accuracy (log-std -3.45 -> -0.46 by step 4500); without
    # it the same seed learns (BUILD_NOTES.md, "The first GPU campaign"). `--log-std-weight-
    # decay 0.001` restores the authors' setting.
    config = _where_taken(config, log_std_weight_decay=0.0)
    if config.algorithm.has_kl:
      config = config.replace(inner_lr=0.01)  # the authors' code; see the module docstring
  return config


# -- mini-ImageNet ---------------------------------------------------------------

MINI_IMAGENET_PRESETS = ("5way1shot", "5way5shot", "quick", "authors2019")


def mini_imagenet_config(
  preset: str = "5way1shot", algorithm: str = "vampire"
) -> MiniImagenetConfig:
  """mini-ImageNet presets.

  5way1shot, 5way5shot: the paper's (T = 2, L_t = L_v = 10, inner lr 0.01,
    600 test tasks); 60 000 meta-steps (the paper gives no length).
  quick: a CPU smoke run that fits the 12-image sample (1 support + 5 query
    images per class, KL weight 0.001); far too short to learn (about 20 %).
  authors2019: VAMPIRE 5-way 1-shot as the authors' 2019 code ran it (their
    commands: `--Lt=10 --Lv=10 --kl_reweight=1e-1 --minibatch_size=2
    --inner_lr=1e-2 --num_epochs=50`, tested at epoch 55 with `--Lt=11 --Lv=11
    --num_val_tasks=15504`): 55 epochs of 10 000 tasks (275 000 meta-steps),
    the log-std weight decay and separate clipping, no learning-rate decay,
    second order through the first inner step only, batch norm without scale,
    offset or epsilon, Xavier gain 1, 20 query images per class at test, 11
    draws, the final parameters. `python -m experiments.mini_imagenet --preset
    authors2019 --calibration-tasks all` also scores all C(20, 5) = 15 504 test
    tasks, as their test did. VAMPIRE only (their other files' mini-ImageNet
    commands are their own).
  The paper presets follow the authors' code where the text is silent
  (`follow_authors_code`).
  """
  if preset in ("5way1shot", "5way5shot"):
    config = _build(
      MiniImagenetConfig,
      shots=int(preset[4]),
      tasks_per_step=2,
      num_meta_steps=60_000,
      inner_lr=0.01,
      kl_weight=0.1,
      num_mc_train=10,
      num_mc_query=10,
      num_mc_test=10,
      num_val_tasks=200,
      num_test_tasks=600,
      eval_batch_tasks=10,
      eval_every=2000,
      checkpoint_every=2000,
      log_every=100,
    )
  elif preset == "quick":
    config = _build(
      MiniImagenetConfig,
      shots=1,
      query=5,
      tasks_per_step=2,
      num_meta_steps=60,
      inner_lr=0.01,
      kl_weight=0.001,
      num_val_tasks=8,
      num_test_tasks=40,
      eval_batch_tasks=2,
      eval_every=20,
      checkpoint_every=60,
      log_every=5,
      num_mc_test=2,
      chunk_size=2,
      existing_only=True,
    )
  elif preset == "authors2019":
    if algorithm != "vampire":
      raise ConfigError(
        f"--preset authors2019 is VAMPIRE's (vampire.py's commands); {algorithm!r} has "
        "no mini-ImageNet settings here: use --preset 5way1shot"
      )
    config = _build(
      MiniImagenetConfig,
      shots=1,
      query=15,
      test_query=20,
      tasks_per_step=2,
      num_meta_steps=55 * 5000,  # 55 epochs of 10 000 tasks
      inner_lr=0.01,
      kl_weight=0.1,
      num_mc_train=10,
      num_mc_query=10,
      num_mc_test=11,
      second_order_steps=1,
      meta_lr_decay=1.0,
      meta_grad_clip_separately=True,
      log_std_weight_decay=AUTHORS_LOG_STD_WEIGHT_DECAY,
      kernel_init_gain=AUTHORS_KERNEL_INIT_GAIN,
      batch_norm_affine=False,
      batch_norm_epsilon=0.0,
      test_parameters="final",
      num_val_tasks=100,
      num_test_tasks=600,
      eval_batch_tasks=10,
      eval_every=5000,  # the code validated every 10 000 tasks
      checkpoint_every=5000,
      log_every=500,
    )
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {MINI_IMAGENET_PRESETS}")
  config = for_algorithm(config, algorithm)
  return config if preset in ("quick", "authors2019") else follow_authors_code(config)


# -- LEO features (tiered- or mini-ImageNet) -------------------------------------

FEATURES_PRESETS = ("5way1shot", "5way5shot", "quick")


def features_config(preset: str = "5way1shot", algorithm: str = "vampire") -> FeaturesConfig:
  """LEO-feature presets: MLP 128-32, inner lr 0.01, 5 steps, KL weight 0.1.

  5way1shot, 5way5shot: T = 16, L = 10, 30 000 steps, 5000 test tasks (the
    paper gives neither T, L nor the length for features).
  quick: 300 steps of 8 tasks with inner lr 0.1 and KL weight 0.001.
  """
  if preset in ("5way1shot", "5way5shot"):
    config = _build(
      FeaturesConfig,
      shots=int(preset[4]),
      tasks_per_step=16,
      num_meta_steps=30_000,
      inner_lr=0.01,
      kl_weight=0.1,
      num_mc_train=10,
      num_mc_query=10,
      num_mc_test=10,
      num_val_tasks=500,
      num_test_tasks=5000,
      eval_batch_tasks=100,
      eval_every=1000,
      checkpoint_every=1000,
      log_every=100,
    )
  elif preset == "quick":
    config = _build(
      FeaturesConfig,
      tasks_per_step=8,
      num_meta_steps=300,
      inner_lr=0.1,
      kl_weight=0.001,
      num_val_tasks=100,
      num_test_tasks=500,
      eval_batch_tasks=50,
      eval_every=50,
      checkpoint_every=100,
      log_every=10,
      num_mc_test=4,
    )
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {FEATURES_PRESETS}")
  config = for_algorithm(config, algorithm)
  return config if preset == "quick" else follow_authors_code(config)


# -- Sine/line regression ---------------------------------------------------------

REGRESSION_PRESETS = ("cpu", "paper", "quick", "authors2019")

# The authors' 2019 regression commands and code, per method (AUTHORS_CODE_2019.md; for
# the baselines the heads of their own files at d386dfe): draws in training (L_t = L_v),
# meta-gradient clipping (None: none), the log-std weight decay, and the number of
# meta-steps (epochs of 10 000 tasks at T = 10). PLATIPUS's and ABML's commands give no
# length (the default, 1000 epochs, cannot be what ran): VAMPIRE's 52 is used.
AUTHORS2019_REGRESSION = {
  # algorithm: (L, clip norm, clip separately, log-std weight decay, meta-steps)
  "vampire": (32, 10.0, True, AUTHORS_LOG_STD_WEIGHT_DECAY, 52_000),
  "maml": (1, 10.0, False, 0.0, 30_000),
  "fomaml": (1, 10.0, False, 0.0, 30_000),
  "platipus": (32, None, False, 0.0, 52_000),
  "abml": (128, None, False, 0.0, 52_000),
  "bmaml": (1, None, False, 0.0, 10_000),
}


def regression_config(preset: str = "cpu", algorithm: str = "vampire") -> RegressionConfig:
  """Sine/line presets; MAML gets the same schedule with one draw and no KL.

  paper: App. A (T = 10, L_t = L_v = 128) for the authors' 50 000 meta-steps;
    sized for a GPU.
  cpu: the default: L_t = L_v = 8 in training (128 at test), 3000 meta-steps.
  quick: 500 meta-steps, L = 8, 500 test tasks with 32 draws: minutes.
  authors2019: what the authors' 2019 code ran for the paper's Fig. 2 and
    Table 6 (AUTHORS2019_REGRESSION; BUILD_NOTES.md has the table): noise of std
    0.09 added to the targets (the metric still assumes 0.3), the MSE loss, 5
    support and 15 query points, L_t = L_v = 32 for VAMPIRE, second order
    through the first inner step only, no learning-rate decay, Xavier gain 1,
    the log-std weight decay and separate clipping (VAMPIRE), 52 000 meta-steps,
    the final parameters tested on 1000 tasks with a 100-point query grid and
    128 draws. `python -m experiments.regression --preset authors2019
    --algorithms vampire` (about 90 minutes on a 2-core CPU is the goal; see
    BUILD_NOTES.md for what it took).
  paper and cpu follow the authors' code where the text is silent
  (`follow_authors_code`). ABML gets the flat hyper-prior (weight 0), as the
  paper trained it for regression.
  """
  if preset == "paper":
    config = _build(RegressionConfig, num_meta_steps=50_000, eval_every=2500, checkpoint_every=2500)
  elif preset == "cpu":
    config = _build(
      RegressionConfig,
      num_meta_steps=3000,
      num_mc_train=8,
      num_mc_query=8,
      num_val_tasks=100,
      eval_every=500,
      checkpoint_every=500,
    )
  elif preset == "quick":
    config = _build(
      RegressionConfig,
      num_meta_steps=500,
      num_mc_train=8,
      num_mc_query=8,
      num_mc_test=32,
      num_val_tasks=100,
      num_test_tasks=500,
      eval_every=50,
      checkpoint_every=250,
      log_every=10,
    )
  elif preset == "authors2019":
    config = _authors2019_regression(algorithm)
  else:
    raise ConfigError(f"--preset {preset!r} is unknown; choose one of {REGRESSION_PRESETS}")
  if preset != "authors2019":
    config = for_algorithm(config, algorithm)
  if preset in ("paper", "cpu"):
    config = follow_authors_code(config)
  if algorithm == "abml":
    # The paper trained ABML for regression with a uniform hyper-posterior
    # (PAPER_NOTES.md), which is the flat hyper-prior: weight 0.
    config = config.replace(hyper_prior_weight=0.0)
  return config


def _authors2019_regression(algorithm: str) -> RegressionConfig:
  if algorithm not in AUTHORS2019_REGRESSION:
    raise ConfigError(
      f"--preset authors2019 has no settings for {algorithm!r}; choose one of "
      f"{', '.join(AUTHORS2019_REGRESSION)}"
    )
  draws, clip_norm, clip_separately, weight_decay, steps = AUTHORS2019_REGRESSION[algorithm]
  config = for_algorithm(
    _build(
      RegressionConfig,
      num_meta_steps=steps,
      num_query=15,
      data_noise_std=0.09,
      likelihood_std=AUTHORS_MSE_LIKELIHOOD_STD,
      test_query_grid=100,
      # The authors' VAMPIRE, MAML, PLATIPUS and ABML differentiate the first inner step
      # only; our PLATIPUS, ABML and BMAML have no such option (all steps, Alg. 1).
      second_order_steps=1 if algorithm in ("vampire", "maml") else None,
      meta_lr_decay=1.0,
      kernel_init_gain=AUTHORS_KERNEL_INIT_GAIN,
      test_parameters="final",
      num_val_tasks=100,
      eval_every=2000,
      checkpoint_every=2000,
    ),
    algorithm,
  )
  config = config.replace(meta_grad_clip_norm=clip_norm)
  config = _where_taken(
    config,
    meta_grad_clip_separately=clip_separately,
    log_std_weight_decay=weight_decay,
    num_mc_train=draws,
    num_mc_query=draws,
  )
  if algorithm == "bmaml":
    config = config.replace(num_particles=10)
  return config


# -- Shared ---------------------------------------------------------------------------

PRESETS = {
  "omniglot": OMNIGLOT_PRESETS,
  "mini_imagenet": MINI_IMAGENET_PRESETS,
  "features": FEATURES_PRESETS,
  "regression": REGRESSION_PRESETS,
}
_CONFIGS = {
  "omniglot": omniglot_config,
  "mini_imagenet": mini_imagenet_config,
  "features": features_config,
  "regression": regression_config,
}


def get_config(experiment: str, preset: str, algorithm: str = "vampire") -> RunConfig:
  """The config of `experiment`'s `preset` for `algorithm`."""
  if experiment not in _CONFIGS:
    raise ConfigError(f"unknown experiment {experiment!r}; expected one of {sorted(_CONFIGS)}")
  return _CONFIGS[experiment](preset, algorithm)
