"""The settings of a meta-training run, as one dataclass.

`RunConfig` holds what every run needs: the algorithm and its
hyper-parameters, the schedule, evaluation and speed knobs. Experiments
subclass it with their data and network fields. Each field carries a
one-line help text (the command lines show it) and says whether it may
change when a run is resumed: schedule, evaluation and speed settings may,
anything that changes the model or the training data may not.

The defaults are the library's stable defaults, not a paper preset: at the
initial prior (log-std in [-4, -3]) inner_lr * kl_weight / sigma_p^2 is at
most 0.6, below the stability limit of 2 (see `gaussian.kl_step_factor`).
"""

import dataclasses
import math
from typing import Any, Optional, Sequence

from vampire_jax._src.core.errors import ConfigError, InputError


def setting(
  default: Any, help: str, *, resumable: bool = False, choices: Optional[Sequence[Any]] = None
) -> Any:
  """A dataclass field with its help text.

  Args:
    default: the default value (tuples are immutable, so no factory needed).
    help: one line for `--help`.
    resumable: whether a resumed run may use another value (schedule,
      evaluation and speed settings).
    choices: the allowed values, if they are a fixed set.
  """
  return dataclasses.field(
    default=default,
    metadata={"help": help, "resumable": resumable, "choices": tuple(choices) if choices else None},
  )


@dataclasses.dataclass
class RunConfig:
  """Settings shared by every experiment.

  `inner_lr` 0.01 and `kl_weight` 0.02 are `vj.vampire`'s defaults for a classifier
  (`vj.categorical_nll`). Unlike `vj.vampire` they do not follow the likelihood: with
  `vj.gaussian_nll(0.3)` the factory takes 0.00045, so a regression config sets its own
  (the experiments' `RegressionConfig` carries the paper's 0.001 and 1).
  """

  algorithm: str = setting("vampire", "meta-learning algorithm")
  tasks_per_step: int = setting(32, "T, tasks per meta-update")
  num_meta_steps: int = setting(
    15_000, "meta-updates to train for (a resumed run may extend it)", resumable=True
  )
  num_inner_steps: int = setting(5, "S, gradient steps of task adaptation")
  inner_lr: float = setting(0.01, "alpha, the task-adaptation learning rate")
  kl_weight: float = setting(0.02, "beta, weight of KL(posterior || prior) against the mean NLL")
  num_mc_train: int = setting(1, "L_t, weight draws per inner step in training")
  num_mc_query: int = setting(1, "L_v, weight draws on the query set in training")
  num_mc_test: int = setting(10, "L_t = L_v at validation and test time", resumable=True)
  first_order: bool = setting(False, "stop gradients through the inner updates")
  second_order_steps: Optional[int] = setting(
    None,
    "inner steps whose likelihood gradient is differentiated (none: all, Alg. 1; "
    "1: the authors' code)",
  )
  inner_backtracking: bool = setting(
    False,
    "VAMPIRE and MAML: an inner step that raises the support loss (VAMPIRE: the VFE on the "
    "step's draws) or makes it non-finite is not taken, and the later steps are halved: a "
    "guard for tasks too curved for --inner-lr (not the paper's)",
  )
  log_std_init: tuple[float, float] = setting((-4.0, -3.0), "range of the initial prior log-stds")
  local_reparameterization: bool = setting(
    False,
    "VAMPIRE and ABML on an MLP: draw each layer's pre-activations instead of the weights (Kingma "
    "et al. 2015): each example's outputs as under weight draws, fewer random numbers",
  )
  kernel_init_gain: float = setting(
    math.sqrt(2.0),
    "Xavier-normal gain of the initial kernels, the means (the authors' 2019 code: 1)",
  )
  # Options of single algorithms (used only by the algorithm named).
  num_particles: int = setting(8, "BMAML: number of particles M")
  bmaml_meta_objective: str = setting(
    "bfa", "BMAML: meta-loss", choices=("bfa", "mean_nll", "chaser")
  )
  bmaml_leader_steps: int = setting(1, "BMAML: the leader's extra SVGD steps (chaser loss)")
  platipus_inference_data: str = setting(
    "support_and_query",
    "PLATIPUS: data of q's gradient step",
    choices=("support_and_query", "query"),
  )
  abml_hyper_prior_weight: float = setting(1e-4, "ABML: weight of -log p(theta), 0 = flat")
  simpa_phi_lr: float = setting(1e-4, "SImPa: Adam's learning rate of the PHI network")
  simpa_phi_inner_lr: float = setting(
    5e-4, "SImPa: the PHI network's gradient-ascent step in each inner step"
  )
  simpa_epsilon: float = setting(0.1, "SImPa: epsilon of the bound terms, ln(n) / epsilon")
  simpa_kl_samples: int = setting(
    512, "SImPa: draws from the generator and from the prior in each KL lower bound"
  )
  outer_kl_weight: Optional[float] = setting(
    None,
    "Vampire2: weight of KL(adapted posterior || N(0, I)) in each task's meta-loss (none: "
    "--kl-weight, as the authors' Vampire2.py)",
  )
  train_ways: Optional[int] = setting(
    None,
    "ProtoNet: classes per training episode (none: --ways; Snell et al. trained "
    "1-shot with 30, 5-shot with 20)",
  )
  protonet_distance: str = setting(
    "squared_euclidean",
    "ProtoNet: the logits' distance to the prototypes: squared_euclidean (Snell et al.'s, "
    "under which a class's mean embedding is its best prototype) or euclidean (the VAMPIRE "
    "authors' ProtoNet.py, torch.norm; user guide, 'Where the experiments differ')",
    choices=("squared_euclidean", "euclidean"),
  )
  # The meta-optimiser.
  meta_lr: float = setting(1e-3, "gamma, Adam's learning rate")
  meta_lr_decay: float = setting(0.99, "gamma's factor after every 10 000 tasks")
  meta_grad_clip_norm: Optional[float] = setting(10.0, "clip the meta-gradient's norm (0: off)")
  meta_grad_clip_separately: bool = setting(
    False,
    "clip the means' part and the log-stds' part of the meta-gradient each at "
    "--meta-grad-clip-norm (the authors' 2019 VAMPIRE), instead of the whole",
  )
  log_std_weight_decay: float = setting(
    0.0,
    "weight decay on the prior's log-stds: lambda * log_std added to the clipped "
    "meta-gradient before Adam, which widens the prior (torch Adam's weight_decay, "
    "the authors' 2019 code: 1e-3; means untouched; 0: off)",
  )
  # Evaluation, logging, checkpoints.
  num_val_tasks: int = setting(200, "validation tasks at each evaluation", resumable=True)
  num_test_tasks: int = setting(1000, "test tasks of the final score", resumable=True)
  eval_batch_tasks: int = setting(20, "tasks per evaluation call (speed only)", resumable=True)
  eval_every: int = setting(500, "meta-steps between validations", resumable=True)
  checkpoint_every: int = setting(500, "meta-steps between checkpoints", resumable=True)
  log_every: int = setting(50, "meta-steps between logged training metrics", resumable=True)
  num_bins: int = setting(15, "confidence bins of ECE/MCE", resumable=True)
  test_parameters: str = setting(
    "best",
    "the meta-parameters tested: best (the best validation score) or final "
    "(the last step's, as the authors' 2019 code)",
    resumable=True,
    choices=("best", "final"),
  )
  seed: int = setting(0, "seed of the initialisation, tasks and draws (0 to 2**32 - 1)")
  # Speed knobs: none of them changes a result beyond float rounding.
  task_batching: str = setting(
    "auto",
    "how tasks are batched: auto, host_chunked, vmap, map, unroll, chunked_unroll, chunked_vmap",
    resumable=True,
  )
  chunk_size: int = setting(0, "tasks per chunk (0: the backend's default)", resumable=True)
  eval_task_batching: str = setting("auto", "task batching at evaluation", resumable=True)
  eval_chunk_size: int = setting(0, "tasks per evaluation chunk (0: default)", resumable=True)
  steps_per_call: int = setting(
    0, "meta-steps per jitted call, in lax.scan (0: the backend's default)", resumable=True
  )
  unroll_inner_steps: bool = setting(
    False, "unroll the inner loop instead of lax.scan (longer compile)", resumable=True
  )
  sample_batching: str = setting(
    "vmap",
    "how Monte-Carlo draws are batched: vmap, map, remat_map (map, each "
    "draw recomputed in the backward pass), unroll, or auto (remat_map on a "
    "CPU, where vmapped convolutions are slow; else vmap)",
    resumable=True,
    choices=("auto", "vmap", "map", "remat_map", "unroll"),
  )
  shard_tasks: str = setting(
    "auto", "split tasks over devices", resumable=True, choices=("auto", "on", "off")
  )
  remat: bool = setting(
    False, "recompute inner steps in the backward pass (less memory)", resumable=True
  )
  compute_dtype: str = setting(
    "float32",
    "dtype of the network's matmuls and convolutions",
    resumable=True,
    choices=("float32", "bfloat16"),
  )
  debug_nans: bool = setting(
    False,
    "debugging: check every operation of the meta-step and name the first that makes a NaN (slow)",
    resumable=True,
  )

  def validate(self) -> None:
    """Raises ConfigError for an impossible setting; subclasses add their own checks."""
    validate(self)


def check_is_config(where: str, config) -> None:
  """Refuses, in one line, a config that is not a `RunConfig` instance (a dict, the class)."""
  if isinstance(config, RunConfig):
    return
  if isinstance(config, type):
    got = f"the class {config.__name__} itself"
  else:
    got = f"a {type(config).__name__}"
  fix = "vj.RunConfig(**config)" if isinstance(config, dict) else "vj.RunConfig(...)"
  raise InputError(
    f"{where}: config must be a vj.RunConfig (or an experiment's config), got {got}; "
    f"build one: {fix}"
  )


def field_help(config_cls) -> dict[str, str]:
  """`{field name: help text}` of a config dataclass."""
  return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(config_cls)}


def resumable_fields(config_cls) -> frozenset[str]:
  """Fields a resumed run may change (schedule, evaluation, speed, data location)."""
  return frozenset(f.name for f in dataclasses.fields(config_cls) if f.metadata.get("resumable"))


def config_differences(
  saved: dict, config, *, resumable: bool = False
) -> dict[str, tuple[Any, Any]]:
  """`{field: (saved, now)}` for the fields that a resumed run may not change.

  Args:
    saved: the fields of the config the run was started with (from JSON).
    config: the config of the run being resumed.
    resumable: compare the fields a resumed run may change too (a run that cannot be
      resumed: every difference is one).
  """
  allowed = frozenset() if resumable else resumable_fields(type(config))
  now = _jsonable(dataclasses.asdict(config))
  # A field added since the run was recorded had its default then.
  defaults = {
    f.name: _jsonable(f.default)
    for f in dataclasses.fields(config)
    if f.default is not dataclasses.MISSING
  }
  saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
  keys = (set(saved) | set(now)) - allowed
  return {k: (saved.get(k), now.get(k)) for k in sorted(keys) if saved.get(k) != now.get(k)}


def _jsonable(value):
  """Tuples as lists, as they come back from JSON."""
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


# The largest seed whose every bit reaches `jax.random.key` (its seed is 32 bits wide).
MAX_SEED = 2**32 - 1


def validate(config) -> None:
  """Raises ConfigError, naming the flag, for any impossible setting.

  Counts must be positive integers, rates finite and positive (weights
  finite and non-negative), choices one of theirs. Problem-specific checks
  (ways, shots, query against the data) are the experiment's; the algorithm's
  name is checked by `algorithms.get`.
  """
  positive = (
    "tasks_per_step",
    "num_meta_steps",
    "num_mc_train",
    "num_mc_query",
    "num_mc_test",
    "num_particles",
    "num_val_tasks",
    "num_test_tasks",
    "eval_batch_tasks",
    "eval_every",
    "checkpoint_every",
    "log_every",
    "num_bins",
  )
  non_negative = (
    "num_inner_steps",
    "chunk_size",
    "eval_chunk_size",
    "steps_per_call",
    "bmaml_leader_steps",
  )
  for name in positive + non_negative:
    value = getattr(config, name)
    lowest = 1 if name in positive else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
      raise ConfigError(f"{_flag(name)} must be an integer >= {lowest}, got {value!r}")
  seed = config.seed
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
    raise ConfigError(
      f"{_flag('seed')} must be an integer in [0, 2**32 - 1] (JAX's PRNG key holds 32 bits "
      f"of it: larger or negative seeds would repeat smaller ones), got {seed!r}"
    )
  for name in ("inner_lr", "meta_lr", "simpa_phi_lr", "simpa_phi_inner_lr", "simpa_epsilon"):
    _check_number(name, getattr(config, name), positive=True)
  kl_samples = config.simpa_kl_samples
  if isinstance(kl_samples, bool) or not isinstance(kl_samples, int) or kl_samples < 2:
    raise ConfigError(
      f"{_flag('simpa_kl_samples')} must be an integer >= 2 (batch norm over the draws "
      f"needs two), got {kl_samples!r}"
    )
  if config.algorithm == "simpa" and config.tasks_per_step < 2:
    raise ConfigError(
      f"{_flag('tasks_per_step')} {config.tasks_per_step}: SImPa's hyper-prior term divides "
      "by 2 (T - 1); use --tasks-per-step 2 or more"
    )
  for name in ("kl_weight", "abml_hyper_prior_weight", "log_std_weight_decay"):
    _check_number(name, getattr(config, name), positive=False)
  _check_number("kernel_init_gain", config.kernel_init_gain, positive=True)
  if config.outer_kl_weight is not None:
    _check_number("outer_kl_weight", config.outer_kl_weight, positive=False)
  train_ways = config.train_ways
  if train_ways is not None and (
    isinstance(train_ways, bool) or not isinstance(train_ways, int) or train_ways < 2
  ):
    raise ConfigError(f"{_flag('train_ways')} must be an integer >= 2, got {train_ways!r}")
  if not 0.0 < config.meta_lr_decay <= 1.0:
    raise ConfigError(f"{_flag('meta_lr_decay')} must be in (0, 1], got {config.meta_lr_decay!r}")
  if config.second_order_steps is not None and (
    isinstance(config.second_order_steps, bool)
    or not isinstance(config.second_order_steps, int)
    or config.second_order_steps < 0
  ):
    raise ConfigError(
      f"{_flag('second_order_steps')} must be an integer >= 0, got {config.second_order_steps!r}"
    )
  if config.meta_grad_clip_norm is not None:
    _check_number("meta_grad_clip_norm", config.meta_grad_clip_norm, positive=True)
  low, high = config.log_std_init
  if not (math.isfinite(low) and math.isfinite(high) and low <= high):
    raise ConfigError(
      f"{_flag('log_std_init')} must be two finite numbers LOW <= HIGH, got {config.log_std_init!r}"
    )
  for f in dataclasses.fields(config):
    choices = f.metadata.get("choices")
    if choices and getattr(config, f.name) not in choices:
      raise ConfigError(
        f"{_flag(f.name)} must be one of {', '.join(map(str, choices))}, "
        f"got {getattr(config, f.name)!r}"
      )


def _check_number(name: str, value, *, positive: bool) -> None:
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if not ok or value < 0 or (positive and value == 0):
    need = "a finite number > 0" if positive else "a finite number >= 0"
    raise ConfigError(f"{_flag(name)} must be {need}, got {value!r}")
