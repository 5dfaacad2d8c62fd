"""One frozen spec per algorithm: its factory's arguments, with the factory's defaults.

    spec = vj.specs.Maml(inner_lr=0.1)
    learner = spec.learner(apply_fn, nll, vj.specs.Context(tasks_per_step=32))

A spec holds what its factory (`vj.vampire`, `vj.maml`, `vj.baselines.bmaml`, ...) takes
besides the network, the likelihood and the speed settings (which the run's `Speed` part
gives through `Context`), plus the few settings of a run that only it reads: its test-time
draws (`num_mc_test`, which a resumed run may change) and, for the algorithms with log-stds,
how the meta-optimiser treats them. An option of one algorithm is no field of another:
`Vampire(num_particles=8)` is refused, naming BMAML.

A user's own algorithm is a subclass: a frozen dataclass with a `name`, its fields
(`option(...)`), and `learner(...)`. `vj.train_and_evaluate` trains it, `vj.load_run` reads
it back (the run records the spec by its class's import path and its fields).

Traits a run reads (class attributes):
  has_kl: it keeps Gaussians over the weights weighted by `kl_weight` (reports say its KL);
  inner_kl: its inner loop takes KL steps to the prior, so inner_lr * kl_weight / sigma_p^2
    must stay below 2 (`gaussian.kl_step_factor`);
  embedding: its network is an embedding without a head (ProtoNet);
  kl_target: its inner KL's target, 'prior' or 'standard_normal' (Vampire2).
"""

import dataclasses
import math
from typing import Any, Callable, ClassVar, NamedTuple, Optional

import optax

from vampire_jax import baselines
from vampire_jax.baselines.simpa import EPSILON, NUM_KL_SAMPLES, PHI_INNER_LR, PHI_LR
from vampire_jax._src.core import learners, losses, meta_optimizer, models
from vampire_jax._src.core.errors import ConfigError
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax.runs.settings import (
  Settings,
  check_bool,
  check_choices,
  check_count,
  check_rate,
)


class Context(NamedTuple):
  """What a run adds to a spec's own fields when it builds the learner.

  Attributes:
    tasks_per_step: T, the tasks of one meta-step (SImPa's hyper-prior term counts them).
    ways: the classes of a classification task, or None (ProtoNet's prototypes).
    sample_batching: how Monte-Carlo draws (or particles) are batched, resolved
      ('vmap', 'map', 'remat_map', 'unroll').
    unroll_steps: unroll the inner loop instead of `lax.scan`.
    remat: recompute each inner step in the backward pass.
  """

  tasks_per_step: int = 1
  ways: Optional[int] = None
  sample_batching: str = "vmap"
  unroll_steps: bool = False
  remat: bool = False


# -- Fields and their checks ------------------------------------------------------------


def option(
  default: Any,
  help: str,
  check: Optional[Callable[[str, Any], None]] = None,
  *,
  resumable: bool = False,
  choices=None,
) -> Any:
  """A spec's field: its default, one line of help, and the check `validate` runs on it."""
  return dataclasses.field(
    default=default,
    metadata={
      "help": help,
      "check": check,
      "resumable": resumable,
      "choices": tuple(choices) if choices else None,
    },
  )


def count(lowest: int):
  """A check: an integer >= `lowest`."""
  return lambda name, value: check_count(name, value, lowest)


def rate(*, positive: bool):
  """A check: a finite number > 0 (`positive`) or >= 0."""
  return lambda name, value: check_rate(name, value, positive=positive)


def optional(check):
  """A check that lets None through (None: the factory's default)."""
  return lambda name, value: None if value is None else check(name, value)


def boolean(name: str, value) -> None:
  """A check: True or False."""
  check_bool(name, value)


def log_std_range(name: str, value) -> None:
  """A check: two finite numbers LOW <= HIGH."""
  ok = isinstance(value, (tuple, list)) and len(value) == 2
  ok = ok and all(
    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
  )
  if not ok or value[0] > value[1]:
    raise ConfigError(
      f"{name} must be two finite numbers LOW <= HIGH, got {value!r}", fields=(name,)
    )


def _num_inner_steps():
  return option(5, "S, gradient steps of task adaptation", count(0))


def _inner_lr():
  return option(
    None,
    "alpha, the task-adaptation learning rate (None: the factory's default, lowered to the "
    "likelihood's where it has one)",
    optional(rate(positive=True)),
  )


def _kl_weight(default: float):
  return option(
    default, "beta, weight of KL(posterior || prior) against the mean NLL", rate(positive=False)
  )


def _draws(what: str):
  return option(1, what, count(1))


def _num_mc_test():
  return option(10, "L_t = L_v at validation and test time", count(1), resumable=True)


def _first_order(default: bool):
  return option(default, "stop gradients through the inner updates", boolean)


def _second_order_steps():
  return option(
    None,
    "inner steps whose likelihood gradient is differentiated (None: all, Alg. 1; 1: the "
    "authors' code)",
    optional(count(0)),
  )


def _backtracking():
  return option(
    False,
    "an inner step that raises the support loss (VAMPIRE: the VFE on the step's draws) or "
    "makes it non-finite is not taken, and the later steps are halved: a guard for tasks too "
    "curved for inner_lr (not the paper's)",
    boolean,
  )


def _log_std_init():
  return option((-4.0, -3.0), "range of the initial prior log-stds", log_std_range)


def _local_reparameterization():
  return option(
    False,
    "on an MLP: draw each layer's pre-activations instead of the weights (Kingma et al. "
    "2015): each example's outputs as under weight draws, fewer random numbers",
    boolean,
  )


def _log_std_weight_decay():
  return option(
    0.0,
    "weight decay on the prior's log-stds: lambda * log_std added to the clipped "
    "meta-gradient before Adam, which widens the prior (torch Adam's weight_decay, the "
    "authors' 2019 code: 1e-3; means untouched; 0: off)",
    rate(positive=False),
  )


def _meta_grad_clip_separately():
  return option(
    False,
    "clip the means' part and the log-stds' part of the meta-gradient each at "
    "meta_grad_clip_norm (the authors' 2019 VAMPIRE), instead of the whole",
    boolean,
  )


# -- The base ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec(Settings):
  """The base of every algorithm's spec (a frozen dataclass of its factory's arguments).

  A subclass sets `name` (and `description`), declares its fields with `option(...)` (or
  plain dataclass fields) and implements `learner`. Override `optimizer` for meta-parameters
  not all stepped alike (SImPa), `check_run` for a constraint on the rest of the run.
  """

  name: ClassVar[str] = ""
  description: ClassVar[str] = ""
  has_kl: ClassVar[bool] = False
  inner_kl: ClassVar[bool] = False
  embedding: ClassVar[bool] = False
  kl_target: ClassVar[str] = "prior"

  def learner(
    self,
    apply_fn: losses.ApplyFn,
    nll: losses.Likelihood,
    context: Context = Context(),
    *,
    num_mc: Optional[int] = None,
  ) -> MetaLearner:
    """The `MetaLearner` for a network and a likelihood.

    Args:
      apply_fn: the network, `apply_fn(params, x)`.
      nll: the likelihood, e.g. `vj.categorical_nll`.
      context: what the run adds (tasks per step, ways, speed settings).
      num_mc: draws on the support and query sets instead of training's (a test's
        `num_mc_test`); ignored by algorithms without draws.
    """
    raise NotImplementedError(f"{type(self).__name__} must implement learner(...)")

  def optimizer(self, schedule) -> optax.GradientTransformation:
    """The meta-optimiser: Adam with the schedule's rate, decay and clipping, and the spec's
    log-std settings where it has them."""
    return meta_optimizer.meta_optimizer(
      schedule.meta_lr,
      tasks_per_step=schedule.tasks_per_step,
      decay_rate=schedule.meta_lr_decay,
      clip_norm=schedule.meta_grad_clip_norm,
      clip_separately=getattr(self, "meta_grad_clip_separately", False),
      log_std_weight_decay=getattr(self, "log_std_weight_decay", 0.0),
    )

  @property
  def test_draws(self) -> Optional[int]:
    """Draws at validation and test (`num_mc_test`), or None for an algorithm without draws."""
    return getattr(self, "num_mc_test", None)

  def training_ways(self, ways: int) -> int:
    """Classes per training episode, given the test's `ways` (ProtoNet may train on more)."""
    return ways

  def settings(self) -> dict[str, Any]:
    """`{field: value}`."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  def validate(self) -> None:
    """Raises ConfigError, naming the field, for an impossible value."""
    for f in dataclasses.fields(self):
      check = f.metadata.get("check")
      if check is not None:
        check(f.name, getattr(self, f.name))
    check_choices(self)
    if (
      getattr(self, "first_order", False) and getattr(self, "second_order_steps", None) is not None
    ):
      raise ConfigError(
        f"second_order_steps {self.second_order_steps} has no effect with first_order=True "
        "(every inner step is then first-order); set one of them",
        fields=("second_order_steps", "first_order"),
      )

  def check_run(self, config) -> None:
    """Raises ConfigError where the rest of the run does not suit this algorithm."""
    del config

  @classmethod
  def unknown_field(cls, name: str) -> str:
    owners = algorithms_with_field(name)
    where = f"; {owners_phrase(owners)}" if owners else ""
    return (
      f"{name} is not a setting of {cls.name or cls.__name__} ({cls.__name__}: "
      f"{', '.join(cls.field_names()) or 'no fields'}){where}"
    )


# -- The algorithms -----------------------------------------------------------------------


def _draw_outputs(spec):
  return models.local_reparameterization if spec.local_reparameterization else None


def _draws_of(spec, num_mc: Optional[int]) -> tuple[int, int]:
  if num_mc is None:
    return spec.num_mc_train, spec.num_mc_query
  return num_mc, num_mc


def _vampire_arguments(spec, context: Context, num_mc: Optional[int]) -> dict[str, Any]:
  """The arguments `vj.vampire` and `vj.vampire2` share, from a spec of either."""
  num_mc_train, num_mc_query = _draws_of(spec, num_mc)
  return dict(
    num_inner_steps=spec.num_inner_steps,
    inner_lr=spec.inner_lr,
    kl_weight=spec.kl_weight,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    first_order=spec.first_order,
    log_std_init=tuple(spec.log_std_init),
    sample_batching=context.sample_batching,
    unroll_steps=context.unroll_steps,
    remat=context.remat,
    second_order_steps=spec.second_order_steps,
    draw_outputs=_draw_outputs(spec),
    backtracking=spec.backtracking,
  )


@dataclasses.dataclass(frozen=True)
class Vampire(AlgorithmSpec):
  """VAMPIRE (this paper, Alg. 1): `vj.vampire`'s arguments and defaults."""

  name: ClassVar[str] = "vampire"
  description: ClassVar[str] = "VAMPIRE: Gaussian prior, variational inner loop (this paper)"
  has_kl: ClassVar[bool] = True
  inner_kl: ClassVar[bool] = True

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  kl_weight: float = _kl_weight(learners.DEFAULT_KL_WEIGHT)
  num_mc_train: int = _draws("L_t, weight draws per inner step in training")
  num_mc_query: int = _draws("L_v, weight draws on the query set in training")
  num_mc_test: int = _num_mc_test()
  first_order: bool = _first_order(False)
  second_order_steps: Optional[int] = _second_order_steps()
  log_std_init: tuple[float, float] = _log_std_init()
  local_reparameterization: bool = _local_reparameterization()
  backtracking: bool = _backtracking()
  log_std_weight_decay: float = _log_std_weight_decay()
  meta_grad_clip_separately: bool = _meta_grad_clip_separately()

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    return learners.vampire(apply_fn, nll, **_vampire_arguments(self, context, num_mc))


@dataclasses.dataclass(frozen=True)
class Vampire2(AlgorithmSpec):
  """Vampire2, the authors' VAMPIRE of 2021 (`Vampire2.py`): `vj.vampire2`'s arguments and
  defaults (their main.py's: KL weight 1e-6, first order)."""

  name: ClassVar[str] = "vampire2"
  description: ClassVar[str] = (
    "Vampire2: VAMPIRE with KL(q || N(0, I)) in the inner loop and the meta-loss (2021)"
  )
  has_kl: ClassVar[bool] = True
  inner_kl: ClassVar[bool] = True
  kl_target: ClassVar[str] = "standard_normal"

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  kl_weight: float = _kl_weight(learners.VAMPIRE2_KL_WEIGHT)
  outer_kl_weight: Optional[float] = option(
    None,
    "weight of KL(adapted posterior || N(0, I)) in each task's meta-loss (None: kl_weight, "
    "as the authors' Vampire2.py)",
    optional(rate(positive=False)),
  )
  num_mc_train: int = _draws("L_t, weight draws per inner step in training")
  num_mc_query: int = _draws("L_v, weight draws on the query set in training")
  num_mc_test: int = _num_mc_test()
  first_order: bool = _first_order(True)
  second_order_steps: Optional[int] = _second_order_steps()
  log_std_init: tuple[float, float] = _log_std_init()
  local_reparameterization: bool = _local_reparameterization()
  backtracking: bool = _backtracking()
  log_std_weight_decay: float = _log_std_weight_decay()
  meta_grad_clip_separately: bool = _meta_grad_clip_separately()

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    return learners.vampire2(
      apply_fn,
      nll,
      outer_kl_weight=self.outer_kl_weight,
      **_vampire_arguments(self, context, num_mc),
    )


@dataclasses.dataclass(frozen=True)
class Maml(AlgorithmSpec):
  """MAML (Finn et al. 2017), a point estimate: `vj.maml`'s arguments and defaults."""

  name: ClassVar[str] = "maml"
  description: ClassVar[str] = "MAML: point estimate, second-order meta-gradient"

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  first_order: bool = _first_order(False)
  second_order_steps: Optional[int] = _second_order_steps()
  backtracking: bool = _backtracking()

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    del num_mc  # a point estimate: one prediction
    return learners.maml(
      apply_fn,
      nll,
      num_inner_steps=self.num_inner_steps,
      inner_lr=self.inner_lr,
      first_order=self.first_order,
      unroll_steps=context.unroll_steps,
      remat=context.remat,
      second_order_steps=self.second_order_steps,
      backtracking=self.backtracking,
    )


@dataclasses.dataclass(frozen=True)
class Fomaml(AlgorithmSpec):
  """First-order MAML: `vj.maml(..., first_order=True)`."""

  name: ClassVar[str] = "fomaml"
  description: ClassVar[str] = "first-order MAML"

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  backtracking: bool = _backtracking()

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    del num_mc
    return learners.maml(
      apply_fn,
      nll,
      num_inner_steps=self.num_inner_steps,
      inner_lr=self.inner_lr,
      first_order=True,
      unroll_steps=context.unroll_steps,
      remat=context.remat,
      backtracking=self.backtracking,
    )


@dataclasses.dataclass(frozen=True)
class Platipus(AlgorithmSpec):
  """PLATIPUS (Finn et al. 2018): `vj.baselines.platipus`'s arguments and defaults."""

  name: ClassVar[str] = "platipus"
  description: ClassVar[str] = (
    "PLATIPUS: learned prior over the initial weights, mean-only adaptation"
  )
  has_kl: ClassVar[bool] = True

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  kl_weight: float = _kl_weight(1.0)
  num_mc_train: int = _draws("L_t, weight draws per inner step in training")
  num_mc_query: int = _draws("L_v, weight draws on the query set in training")
  num_mc_test: int = _num_mc_test()
  first_order: bool = _first_order(False)
  log_std_init: tuple[float, float] = _log_std_init()
  step_size_init: Optional[float] = option(
    None,
    "the initial learned step size of q's mean shift (None: the factory's)",
    optional(rate(positive=True)),
  )
  inference_data: str = option(
    "support_and_query",
    "data of q's gradient step",
    choices=("support_and_query", "query"),
  )
  log_std_weight_decay: float = _log_std_weight_decay()
  meta_grad_clip_separately: bool = _meta_grad_clip_separately()

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    num_mc_train, num_mc_query = _draws_of(self, num_mc)
    return baselines.platipus(
      apply_fn,
      nll,
      num_inner_steps=self.num_inner_steps,
      inner_lr=self.inner_lr,
      kl_weight=self.kl_weight,
      num_mc_train=num_mc_train,
      num_mc_query=num_mc_query,
      first_order=self.first_order,
      log_std_init=tuple(self.log_std_init),
      step_size_init=self.step_size_init,
      inference_data=self.inference_data,
      sample_batching=context.sample_batching,
      unroll_steps=context.unroll_steps,
    )


@dataclasses.dataclass(frozen=True)
class Bmaml(AlgorithmSpec):
  """BMAML (Yoon et al. 2018), SVGD particles: `vj.baselines.bmaml`'s arguments and defaults."""

  name: ClassVar[str] = "bmaml"
  description: ClassVar[str] = "BMAML: SVGD particles, ensemble prediction"

  num_particles: int = option(10, "M, the particles (its draws at every step)", count(1))
  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  meta_objective: str = option("bfa", "the meta-loss", choices=("bfa", "mean_nll", "chaser"))
  num_leader_steps: int = option(1, "the leader's extra SVGD steps (chaser loss)", count(0))
  first_order: bool = _first_order(False)

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    del num_mc  # the particles are the meta-parameters: M is fixed
    return baselines.bmaml(
      apply_fn,
      nll,
      num_particles=self.num_particles,
      num_inner_steps=self.num_inner_steps,
      inner_lr=self.inner_lr,
      meta_objective=self.meta_objective,
      num_leader_steps=self.num_leader_steps,
      first_order=self.first_order,
      particle_batching=context.sample_batching,
      unroll_steps=context.unroll_steps,
    )


@dataclasses.dataclass(frozen=True)
class Abml(AlgorithmSpec):
  """ABML (Ravi & Beatson 2019): `vj.baselines.abml`'s arguments and defaults."""

  name: ClassVar[str] = "abml"
  description: ClassVar[str] = "ABML: VAMPIRE's inner loop, ELBO on support and query, hyper-prior"
  has_kl: ClassVar[bool] = True
  inner_kl: ClassVar[bool] = True

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  kl_weight: float = _kl_weight(learners.DEFAULT_KL_WEIGHT)
  num_mc_train: int = _draws("L_t, weight draws per inner step in training")
  num_mc_query: int = _draws("L_v, weight draws on the query set in training")
  num_mc_test: int = _num_mc_test()
  hyper_prior_weight: float = option(
    1e-4, "weight of -log p(theta), 0 = flat", rate(positive=False)
  )
  mean_prior_std: float = option(
    1.0, "the hyper-prior's std of the prior means", rate(positive=True)
  )
  precision_prior: tuple[float, float] = option(
    (1.0, 0.01), "the hyper-prior's Gamma(shape, rate) of the prior precisions"
  )
  first_order: bool = _first_order(False)
  log_std_init: tuple[float, float] = _log_std_init()
  local_reparameterization: bool = _local_reparameterization()
  log_std_weight_decay: float = _log_std_weight_decay()
  meta_grad_clip_separately: bool = _meta_grad_clip_separately()

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    num_mc_train, num_mc_query = _draws_of(self, num_mc)
    return baselines.abml(
      apply_fn,
      nll,
      num_inner_steps=self.num_inner_steps,
      inner_lr=self.inner_lr,
      kl_weight=self.kl_weight,
      num_mc_train=num_mc_train,
      num_mc_query=num_mc_query,
      hyper_prior_weight=self.hyper_prior_weight,
      mean_prior_std=self.mean_prior_std,
      precision_prior=tuple(self.precision_prior),
      first_order=self.first_order,
      log_std_init=tuple(self.log_std_init),
      sample_batching=context.sample_batching,
      unroll_steps=context.unroll_steps,
      draw_outputs=_draw_outputs(self),
    )


@dataclasses.dataclass(frozen=True)
class Protonet(AlgorithmSpec):
  """Prototypical networks (Snell et al. 2017), no inner loop: `vj.baselines.protonet`'s
  arguments (the classes come from the run's `ways`)."""

  name: ClassVar[str] = "protonet"
  description: ClassVar[str] = (
    "ProtoNet: prototypes of the support embeddings, no inner loop (Snell et al. 2017)"
  )
  embedding: ClassVar[bool] = True

  num_classes: Optional[int] = option(
    None, "classes per task (None: the experiment's ways)", optional(count(2))
  )
  train_num_classes: Optional[int] = option(
    None,
    "classes per training episode (None: num_classes; Snell et al. trained 1-shot with "
    "30, 5-shot with 20)",
    optional(count(2)),
  )
  distance: str = option(
    "squared_euclidean",
    "the logits' distance to the prototypes: squared_euclidean (Snell et al.'s, under which "
    "a class's mean embedding is its best prototype) or euclidean (the VAMPIRE authors' "
    "ProtoNet.py, torch.norm)",
    choices=("squared_euclidean", "euclidean"),
  )

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    del nll, num_mc  # the categorical NLL; no draws, no inner loop
    ways = self.num_classes or context.ways
    if ways is None:
      raise ConfigError(
        "protonet classifies (its logits are distances to class prototypes): give its "
        "num_classes (vj.specs.Protonet(num_classes=N)), or run it in a classification "
        "experiment, whose ways it takes",
        fields=("num_classes",),
      )
    return baselines.protonet(
      apply_fn,
      num_classes=ways,
      train_num_classes=self.training_ways(ways),
      distance=self.distance,
    )

  def training_ways(self, ways: int) -> int:
    return self.train_num_classes or self.num_classes or ways

  def check_run(self, config) -> None:
    if self.num_classes is None and not hasattr(config, "ways"):
      raise ConfigError(
        f"algorithm protonet classifies (its logits are distances to class prototypes): it "
        f"needs its num_classes, or a classification experiment's config (omniglot, "
        f"mini_imagenet, tiered_imagenet), not a {type(config).__name__} without them",
        fields=("algorithm", "num_classes"),
      )
    ways = getattr(config, "ways", None)
    if ways is not None and self.num_classes is not None and self.num_classes != ways:
      raise ConfigError(
        f"num_classes {self.num_classes}: the experiment's tasks have ways {ways}; leave "
        "num_classes None (the experiment's)",
        fields=("num_classes", "ways"),
      )


@dataclasses.dataclass(frozen=True)
class Simpa(AlgorithmSpec):
  """SImPa (Nguyen et al. 2020, the authors' `Simpa.py`): `vj.baselines.simpa`'s arguments and
  defaults, and the PHI network's Adam rate (`vj.baselines.simpa_optimizer`)."""

  name: ClassVar[str] = "simpa"
  description: ClassVar[str] = (
    "SImPa: a generator of the weights, a PHI network's KL lower bound, PAC-Bayes terms"
  )

  num_inner_steps: int = _num_inner_steps()
  inner_lr: Optional[float] = _inner_lr()
  num_mc_train: int = _draws("L_t, weight draws per inner step in training")
  num_mc_query: int = _draws("L_v, weight draws on the query set in training")
  num_mc_test: int = _num_mc_test()
  first_order: bool = _first_order(True)
  phi_inner_lr: float = option(
    PHI_INNER_LR,
    "the PHI network's gradient-ascent step in each inner step",
    rate(positive=True),
  )
  epsilon: float = option(
    EPSILON,
    "epsilon of the bound terms, ln(n) / epsilon",
    rate(positive=True),
  )
  num_kl_samples: int = option(
    NUM_KL_SAMPLES,
    "draws from the generator and from the prior in each KL lower bound (batch norm over the "
    "draws needs two)",
    count(2),
  )
  phi_lr: float = option(PHI_LR, "Adam's learning rate of the PHI network", rate(positive=True))

  def learner(self, apply_fn, nll, context=Context(), *, num_mc=None):
    num_mc_train, num_mc_query = _draws_of(self, num_mc)
    return baselines.simpa(
      apply_fn,
      nll,
      tasks_per_step=context.tasks_per_step,
      num_inner_steps=self.num_inner_steps,
      inner_lr=self.inner_lr,
      num_mc_train=num_mc_train,
      num_mc_query=num_mc_query,
      first_order=self.first_order,
      phi_inner_lr=self.phi_inner_lr,
      epsilon=self.epsilon,
      num_kl_samples=self.num_kl_samples,
      sample_batching=context.sample_batching,
      unroll_steps=context.unroll_steps,
    )

  def optimizer(self, schedule) -> optax.GradientTransformation:
    """SImPa's two Adams: the generator's at the schedule's rate, the PHI network's at
    `phi_lr`, each clipped at the schedule's norm apart."""
    return baselines.simpa_optimizer(
      schedule.meta_lr,
      tasks_per_step=schedule.tasks_per_step,
      phi_learning_rate=self.phi_lr,
      decay_rate=schedule.meta_lr_decay,
      clip_norm=schedule.meta_grad_clip_norm,
    )

  def check_run(self, config) -> None:
    if config.schedule.tasks_per_step < 2:
      raise ConfigError(
        f"tasks_per_step {config.schedule.tasks_per_step}: SImPa's hyper-prior term divides "
        "by 2 (T - 1); use 2 or more",
        fields=("tasks_per_step",),
      )
    gain = getattr(config, "kernel_init_gain", DEFAULT_KERNEL_INIT_GAIN)
    if gain != DEFAULT_KERNEL_INIT_GAIN:
      raise ConfigError(
        f"kernel_init_gain {gain!r} has no effect with simpa: its weights "
        "come from the generator, not the network's initialisation; leave it at its default",
        fields=("kernel_init_gain",),
      )


DEFAULT_KERNEL_INIT_GAIN = math.sqrt(2.0)

# -- The registry ---------------------------------------------------------------------------

SPECS: dict[str, type] = {
  cls.name: cls for cls in (Vampire, Maml, Fomaml, Platipus, Bmaml, Abml, Vampire2, Protonet, Simpa)
}


def get(name: str) -> type:
  """The spec class of the registered algorithm `name`; ConfigError naming the choices."""
  if name not in SPECS:
    raise ConfigError(
      f"algorithm {name!r} is unknown; choose one of {', '.join(SPECS)}", fields=("algorithm",)
    )
  return SPECS[name]


def algorithms_with_field(name: str) -> list[str]:
  """The spec classes' names (`Maml`, ...) of the registered algorithms that take `name`."""
  return [cls.__name__ for cls in SPECS.values() if name in cls.field_names()]


def owners_phrase(owners: list[str]) -> str:
  """'an option of Bmaml' / 'an option of Vampire, Abml and Platipus'."""
  listed = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
  return f"it is an option of {listed}"


def convert(spec: AlgorithmSpec, target) -> AlgorithmSpec:
  """`target` (a spec class or a registered name) with the fields it shares with `spec`.

  A preset's VAMPIRE settings carried to another algorithm: the inner loop's steps and
  rate, the draws, ... ; the fields `target` does not take are dropped, and the ones its
  factory fixes by its own defaults (`OWN_DEFAULTS`: Vampire2's KL weight and first order,
  SImPa's first order) keep them.
  """
  cls = get(target) if isinstance(target, str) else target
  if type(spec) is cls:
    return spec
  own = OWN_DEFAULTS.get(cls.name, ())
  carried = {
    name: value
    for name, value in spec.settings().items()
    if name in cls.field_names() and name not in own
  }
  return cls(**carried)


# The fields an algorithm keeps at its own defaults when a spec is converted to it: the
# authors' Vampire2 main.py (d797d9d): --KL-weight 1e-6, --first-order; Simpa.py runs first
# order (main.py's default).
OWN_DEFAULTS = {"vampire2": ("kl_weight", "first_order"), "simpa": ("first_order",)}


def dropped_in_conversion(spec: AlgorithmSpec, target) -> dict[str, Any]:
  """`{field: value}` of `spec` that `convert(spec, target)` leaves behind: the fields the
  target does not take, where `spec` holds other than its class's default (a comparison
  says them)."""
  cls = get(target) if isinstance(target, str) else target
  defaults = {f.name: f.default for f in dataclasses.fields(type(spec))}
  return {
    name: value
    for name, value in spec.settings().items()
    if name not in cls.field_names() and value != defaults.get(name)
  }
