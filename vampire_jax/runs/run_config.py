"""The settings of a meta-training run: a `RunConfig` made of parts.

    config = vj.RunConfig(
        algorithm=vj.specs.Maml(inner_lr=0.1),
        schedule=vj.Schedule(tasks_per_step=16, num_meta_steps=2000),
        evaluation=vj.Evaluation(num_test_tasks=600),
    )
    config = config.replace(eval_every=100)   # a field of any part, by its name

- `algorithm`: the algorithm's spec (`vj.specs`), its factory's arguments and nothing else;
- `schedule`: tasks per meta-step, the run's length and the meta-optimiser's rate;
- `evaluation`: validation, test, logging and checkpoints;
- `speed`: how the work is batched and compiled; none of it changes a result beyond
  float rounding.

`seed` sits beside the parts. Experiments subclass `RunConfig` with their data and network
fields and their own defaults for the parts (`experiment_configs`).

Each field carries a one-line help text and says whether a resumed run may change it
(`setting(..., resumable=True)`): the evaluation and speed settings and the run's length
may change, anything that changes the model or the training data may not. Field names are
unique across the parts, so `replace` and the command lines address a field by its name.
Messages name fields, never a command line's flags.
"""

import dataclasses
from typing import Any, Optional

from vampire_jax._src.core.errors import ConfigError, InputError
from vampire_jax.runs import specs
from vampire_jax.runs.settings import (
  Settings,
  check_bool,
  check_choices,
  check_count,
  check_rate,
  is_number,
  part,
  setting,
)

# The largest seed whose every bit reaches `jax.random.key` (its seed is 32 bits wide).
MAX_SEED = 2**32 - 1


@part
class Schedule(Settings):
  """Meta-training's length, its tasks per meta-step and the meta-optimiser (Adam) (paper,
  Alg. 1, lines 8-11: gamma = 1e-3, x0.99 every 10 000 tasks)."""

  tasks_per_step: int = setting(32, "T, tasks per meta-update")
  num_meta_steps: int = setting(
    15_000, "meta-updates to train for (a resumed run may extend it)", resumable=True
  )
  meta_lr: float = setting(1e-3, "gamma, Adam's learning rate")
  meta_lr_decay: float = setting(0.99, "gamma's factor after every 10 000 tasks")
  meta_grad_clip_norm: Optional[float] = setting(
    10.0, "clip the meta-gradient's norm (None: no clipping)"
  )

  def validate(self) -> None:
    for name in ("tasks_per_step", "num_meta_steps"):
      check_count(name, getattr(self, name), 1)
    check_rate("meta_lr", self.meta_lr, positive=True)
    decay = self.meta_lr_decay
    if not is_number(decay) or not 0.0 < decay <= 1.0:
      raise ConfigError(
        f"meta_lr_decay must be in (0, 1], got {decay!r}", fields=("meta_lr_decay",)
      )
    if self.meta_grad_clip_norm is not None:
      check_rate("meta_grad_clip_norm", self.meta_grad_clip_norm, positive=True)


@part
class Evaluation(Settings):
  """Validation, the test, logging and checkpoints: all may change on resuming."""

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

  def validate(self) -> None:
    for name in (
      "num_val_tasks",
      "num_test_tasks",
      "eval_batch_tasks",
      "eval_every",
      "checkpoint_every",
      "log_every",
      "num_bins",
    ):
      check_count(name, getattr(self, name), 1)
    check_choices(self)


TASK_BATCHING = ("auto", "host_chunked", "vmap", "map", "unroll", "chunked_unroll", "chunked_vmap")


@part
class Speed(Settings):
  """How the work is batched and compiled: none of it changes a result beyond float rounding,
  and a resumed run may change any of it."""

  task_batching: str = setting(
    "auto", f"how tasks are batched: {', '.join(TASK_BATCHING)}", resumable=True
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
  cpu_fusion_emitters: str = setting(
    "auto",
    "XLA:CPU's fusion emitters (on: its MLIR ones, XLA's own choice; the third: its older "
    "LLVM ones, less memory; auto: the processor's, vampire_jax.backend.cpu_row)",
    resumable=True,
    choices=("auto", "on", "off"),
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
    for name in ("chunk_size", "eval_chunk_size", "steps_per_call"):
      check_count(name, getattr(self, name), 0)
    for name in ("unroll_inner_steps", "remat", "debug_nans"):
      check_bool(name, getattr(self, name))
    check_choices(self)


# The parts, by the field of `RunConfig` that holds each.
PART_CLASSES = {"schedule": Schedule, "evaluation": Evaluation, "speed": Speed}
PARTS = tuple(PART_CLASSES)


def _default_algorithm():
  return specs.Vampire()


@dataclasses.dataclass
class RunConfig(Settings):
  """The settings of a run: the algorithm's spec, the schedule, the evaluation, the speed.

  The default algorithm is `vj.specs.Vampire()` with its factory's defaults. `algorithm`
  also takes a registered algorithm's name (`"maml"`), which is that spec with its
  defaults. A field of one algorithm is not a field here: `vj.RunConfig(kl_weight=0.1)`
  is refused, naming the algorithms that take it.
  """

  algorithm: Any = dataclasses.field(
    default_factory=_default_algorithm, metadata={"help": "the algorithm's spec"}
  )
  schedule: Schedule = dataclasses.field(
    default_factory=Schedule, metadata={"help": "the schedule and the meta-optimiser"}
  )
  evaluation: Evaluation = dataclasses.field(
    default_factory=Evaluation, metadata={"help": "validation, test, logging, checkpoints"}
  )
  speed: Speed = dataclasses.field(default_factory=Speed, metadata={"help": "speed settings"})
  seed: int = setting(0, "seed of the initialisation, tasks and draws (0 to 2**32 - 1)")

  def __post_init__(self):
    if isinstance(self.algorithm, str):
      self.algorithm = specs.get(self.algorithm)()
    elif not isinstance(self.algorithm, specs.AlgorithmSpec):
      raise ConfigError(
        f"algorithm must be an algorithm's spec (vj.specs.Vampire(), a subclass of "
        f"vj.AlgorithmSpec) or a registered name ({', '.join(specs.SPECS)}), got "
        f"{_described(self.algorithm)}",
        fields=("algorithm",),
      )
    for name, cls in PART_CLASSES.items():
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(
          f"{name} must be a vj.{cls.__name__}, got {_described(getattr(self, name))}",
          fields=(name,),
        )

  @classmethod
  def unknown_field(cls, name: str) -> str:
    owners = specs.algorithms_with_field(name)
    if owners:
      return (
        f"{name} is a setting of the algorithm's spec, not of {cls.__name__}: "
        f"{specs.owners_phrase(owners)}, e.g. algorithm=vj.specs.{owners[0]}({name}=...)"
      )
    part_of = part_of_field(cls, name)
    if part_of:
      return f"{name} is a field of {cls.__name__}'s {part_of}: use config.replace({name}=...)"
    return f"{cls.__name__} has no field {name!r}"

  # -- A field of any part, by name ---------------------------------------------------

  def flat(self) -> dict[str, Any]:
    """`{field: value}` over the config's own fields, its parts' and its algorithm's (by name;
    `algorithm` is the spec's name)."""
    values = {"algorithm": self.algorithm.name}
    for name in self.field_names():
      if name in PARTS:
        values.update(dataclasses.asdict(getattr(self, name)))
      elif name != "algorithm":
        values[name] = getattr(self, name)
    values.update(self.algorithm.settings())
    return values

  def replace(self, **changes) -> "RunConfig":
    """A copy with the named fields changed, wherever they live: this config's own, a part's,
    or the algorithm spec's (`config.replace(num_meta_steps=300, inner_lr=0.1)`).

    `algorithm=` takes a spec, or a registered name: the config's spec converted to that
    algorithm (`vj.specs.convert`: the settings the two share carried over); the other
    changes then apply to it.

    Raises:
      ConfigError: a name no part has, or an option the algorithm does not take (naming the
        algorithms that do).
    """
    algorithm = changes.pop("algorithm", self.algorithm)
    if isinstance(algorithm, str):
      algorithm = specs.convert(self.algorithm, algorithm)
    own, parts, spec_changes = {}, {name: {} for name in PARTS}, {}
    for name, value in changes.items():
      where = part_of_field(type(self), name)
      if where == "":
        own[name] = value
      elif where is not None:
        parts[where][name] = value
      elif name in algorithm.field_names():
        spec_changes[name] = value
      else:
        raise ConfigError(_not_a_setting(self, algorithm, name), fields=(name,))
    if spec_changes:
      algorithm = dataclasses.replace(algorithm, **spec_changes)
    for name, values in parts.items():
      if values:
        own[name] = dataclasses.replace(getattr(self, name), **values)
    return dataclasses.replace(self, algorithm=algorithm, **own)

  def resumable_names(self) -> frozenset[str]:
    """The fields, by name, that a resumed run may change: each part's own and the spec's."""
    names = set(type(self).resumable_fields())
    for name in PARTS:
      names |= getattr(self, name).resumable_fields()
    return frozenset(names | self.algorithm.resumable_fields())

  def validate(self) -> None:
    """Raises ConfigError, naming the field, for an impossible setting; experiments add their
    own checks (the data's ways, shots and queries)."""
    seed = self.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
      raise ConfigError(
        f"seed must be an integer in [0, 2**32 - 1] (JAX's PRNG key holds 32 bits of it: "
        f"larger or negative seeds would repeat smaller ones), got {seed!r}",
        fields=("seed",),
      )
    for name in PARTS:
      getattr(self, name).validate()
    check_choices(self)
    self.algorithm.validate()
    self.algorithm.check_run(self)


def part_of_field(cls, name: str) -> Optional[str]:
  """Where a config class keeps the field `name`: '' (its own), a part's name, or None."""
  own = {f.name for f in dataclasses.fields(cls)} - set(PARTS) - {"algorithm"}
  if name in own:
    return ""
  for part_name, part_cls in PART_CLASSES.items():
    if name in part_cls.field_names():
      return part_name
  return None


def _not_a_setting(config, algorithm, name: str) -> str:
  owners = specs.algorithms_with_field(name)
  if owners:
    return (
      f"{name} is not a setting of {algorithm.name} ({type(algorithm).__name__}); "
      f"{specs.owners_phrase(owners)}"
    )
  return (
    f"{type(config).__name__} has no field {name!r} in any part, nor does the "
    f"{algorithm.name} spec ({', '.join(algorithm.field_names()) or 'no fields'})"
  )


def _described(value) -> str:
  if isinstance(value, type):
    return f"the class {value.__name__} itself"
  return f"{repr(value)[:60]} (a {type(value).__name__})"


def check_is_config(where: str, config) -> None:
  """Refuses, in one line, a config that is not a `RunConfig` instance (a dict, the class)."""
  if isinstance(config, RunConfig):
    return
  if isinstance(config, type):
    got = f"the class {config.__name__} itself"
  else:
    got = f"a {type(config).__name__}"
  fix = "vj.RunConfig().replace(**config)" if isinstance(config, dict) else "vj.RunConfig(...)"
  raise InputError(
    f"{where}: config must be a vj.RunConfig (or an experiment's config), got {got}; "
    f"build one: {fix}"
  )


# -- Resuming: what differs -------------------------------------------------------------


def jsonable(value):
  """Tuples as lists, as they come back from JSON."""
  if isinstance(value, dict):
    return {k: jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(v) for v in value]
  return value


def config_differences(
  saved: dict, config: RunConfig, *, resumable: bool = False
) -> dict[str, tuple[Any, Any]]:
  """`{field: (saved, now)}` for the fields that a resumed run may not change.

  Args:
    saved: the config the run was started with, flat (`RunConfig.flat`, from JSON).
    config: the config of the run being resumed.
    resumable: compare the fields a resumed run may change too (a run that cannot be
      resumed: every difference is one).
  """
  allowed = frozenset() if resumable else config.resumable_names()
  now = jsonable(config.flat())
  # A field added since the run was recorded had its default then (the spec's: of the same
  # algorithm only).
  blank = type(config)()
  defaults = {k: v for k, v in blank.flat().items() if k not in blank.algorithm.settings()}
  if saved.get("algorithm") == config.algorithm.name:
    spec_fields = dataclasses.fields(config.algorithm)
    defaults.update(
      {f.name: f.default for f in spec_fields if f.default is not dataclasses.MISSING}
    )
  saved = {**jsonable(defaults), **saved}
  keys = (set(saved) | set(now)) - allowed
  if saved.get("algorithm") != now["algorithm"]:  # another algorithm: its name says it all
    keys = {k for k in keys if k == "algorithm" or (k in saved and k in now)}
  return {k: (saved.get(k), now.get(k)) for k in sorted(keys) if saved.get(k) != now.get(k)}
