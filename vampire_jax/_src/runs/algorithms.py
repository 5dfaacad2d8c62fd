"""Every algorithm by name, with its settings: how a `RunConfig` builds its `MetaLearner`.

Each `Algorithm` says, in one place:
  - how to build the learner from a config (`build`), which fields it reads;
  - `config_defaults`: the settings a config takes when it selects the
    algorithm (point estimates: no KL term, one weight draw);
  - `inner_kl`: whether its inner loop takes KL steps, so that the step
    factor inner_lr * kl_weight / sigma_p^2 must stay below 2
    (`gaussian.kl_step_factor`); PLATIPUS has a KL term only in its
    meta-loss, which the meta-optimiser takes, so it has no such limit;
  - `ignores`: the config fields it never reads (MAML's `kl_weight`, another
    algorithm's options). A config may hold only their neutral value (the
    algorithm's `config_defaults`, else the config class's default):
    `check_settings` refuses any other in one line naming the flag, and
    `drop_ignored` resets them (saying what it dropped), so a run never
    records a setting that had no effect. `configure` leaves them neutral.
    Settings that contradict each other (`--first-order` with
    `--second-order-steps`) are refused too.

    learner = algorithms.learner_from_config(config, apply_fn, nll,
                                             num_mc_train=1, num_mc_query=1)
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from vampire_jax import baselines
from vampire_jax._src.core import backend_defaults, learners, losses, meta_step, models
from vampire_jax._src.core.errors import ConfigError
from vampire_jax._src.core.gaussian import kl_step_factor
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax._src.runs import kinds, protonet_settings, simpa_settings
from vampire_jax._src.runs import run_config as config_lib

PyTree = Any
# build(config, apply_fn, nll, num_mc_train, num_mc_query, unroll_steps) -> MetaLearner
Builder = Callable[[Any, losses.ApplyFn, losses.Likelihood, int, int, bool], MetaLearner]


def sample_batching(config) -> str:
  """The config's Monte-Carlo batching, 'auto' resolved by `backend_defaults`."""
  return backend_defaults.sample_batching(config.sample_batching)


def draw_outputs(config):
  """The output sampler `local_reparameterization` asks for (VAMPIRE's and ABML's), or None."""
  return models.local_reparameterization if config.local_reparameterization else None


class Algorithm(NamedTuple):
  """A registered algorithm.

  Attributes:
    build: makes the learner from a config (see `Builder`).
    has_kl: it keeps Gaussians over the weights weighted by `kl_weight`.
    inner_kl: its inner loop takes KL steps (stability limit on the step factor).
    config_defaults: fields set on a config that selects it.
    description: one line for `--help` and the docs.
    ignores: config fields it never reads, with why (`{field: reason}`).
    embedding: its network is an embedding without a head (ProtoNet; `network_outputs`).
    kl_target: its inner KL's target: 'prior', or 'standard_normal' (Vampire2).
    optimizer: `optimizer(config) -> optax transformation`, for an algorithm whose
      meta-parameters are not all stepped alike (SImPa: one Adam per network); None:
      `meta_step.meta_optimizer` from the config (`make_optimizer`).
  """

  build: Builder
  has_kl: bool
  inner_kl: bool
  config_defaults: dict
  description: str
  ignores: dict = {}
  embedding: bool = False
  kl_target: str = "prior"
  optimizer: Optional[Callable[[Any], optax.GradientTransformation]] = None


def _vampire(config, apply_fn, nll, num_mc_train, num_mc_query, unroll, kl_target="prior"):
  # Vampire2 (kl_target N(0, I)) adds the posterior's KL to the meta-loss, --outer-kl-weight.
  outer = getattr(config, "outer_kl_weight", None)
  outer = config.kl_weight if outer is None else outer
  return learners.vampire(
    apply_fn,
    nll,
    num_inner_steps=config.num_inner_steps,
    inner_lr=config.inner_lr,
    kl_weight=config.kl_weight,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    first_order=config.first_order,
    log_std_init=tuple(config.log_std_init),
    sample_batching=sample_batching(config),
    unroll_steps=unroll,
    remat=config.remat,
    second_order_steps=config.second_order_steps,
    draw_outputs=draw_outputs(config),
    kl_target=kl_target,
    outer_kl_weight=0.0 if kl_target == "prior" else outer,
    backtracking=config.inner_backtracking,
  )


def _maml(first_order: bool):
  def build(config, apply_fn, nll, num_mc_train, num_mc_query, unroll):
    del num_mc_train, num_mc_query  # a point estimate: one prediction
    return learners.maml(
      apply_fn,
      nll,
      num_inner_steps=config.num_inner_steps,
      inner_lr=config.inner_lr,
      first_order=config.first_order or first_order,
      unroll_steps=unroll,
      remat=config.remat,
      second_order_steps=config.second_order_steps,
      backtracking=config.inner_backtracking,
    )

  return build


def _platipus(config, apply_fn, nll, num_mc_train, num_mc_query, unroll):
  return baselines.platipus(
    apply_fn,
    nll,
    num_inner_steps=config.num_inner_steps,
    inner_lr=config.inner_lr,
    kl_weight=config.kl_weight,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    first_order=config.first_order,
    log_std_init=tuple(config.log_std_init),
    inference_data=config.platipus_inference_data,
    sample_batching=sample_batching(config),
    unroll_steps=unroll,
  )


def _bmaml(config, apply_fn, nll, num_mc_train, num_mc_query, unroll):
  del num_mc_train, num_mc_query  # the particles are the meta-parameters: M is fixed
  return baselines.bmaml(
    apply_fn,
    nll,
    num_particles=config.num_particles,
    num_inner_steps=config.num_inner_steps,
    inner_lr=config.inner_lr,
    meta_objective=config.bmaml_meta_objective,
    num_leader_steps=config.bmaml_leader_steps,
    first_order=config.first_order,
    particle_batching=sample_batching(config),
    unroll_steps=unroll,
  )


def _abml(config, apply_fn, nll, num_mc_train, num_mc_query, unroll):
  return baselines.abml(
    apply_fn,
    nll,
    num_inner_steps=config.num_inner_steps,
    inner_lr=config.inner_lr,
    kl_weight=config.kl_weight,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    hyper_prior_weight=config.abml_hyper_prior_weight,
    first_order=config.first_order,
    log_std_init=tuple(config.log_std_init),
    sample_batching=sample_batching(config),
    unroll_steps=unroll,
    draw_outputs=draw_outputs(config),
  )


# Point estimates have no KL term and one weight draw.
_POINT_ESTIMATE = {"kl_weight": 0.0, "num_mc_train": 1, "num_mc_query": 1, "num_mc_test": 1}

# What an algorithm ignores, by family: `{config field: why it has no effect}`. A new
# field that some algorithms do not read is one line in the family that lacks it.
_NO_KL = {"kl_weight": "it has no KL term"}
_NO_LOG_STDS = {
  "log_std_init": "its weights have no log-stds",
  "log_std_weight_decay": "its meta-parameters have no log-stds to decay",
  "meta_grad_clip_separately": "its meta-parameters have no log-stds to clip apart",
}
_ONE_DRAW = {
  "num_mc_train": "it predicts with one weight tree, no draws",
  "num_mc_query": "it predicts with one weight tree, no draws",
  "num_mc_test": "it predicts with one weight tree, no draws",
}
_PARTICLES = {
  "num_mc_train": "its particles are its draws, --num-particles",
  "num_mc_query": "its particles are its draws, --num-particles",
  "num_mc_test": "its particles are its draws, --num-particles",
}
_NO_TRUNCATION = {"second_order_steps": "its inner loop does not truncate second-order terms"}
_NO_INNER_LOOP = {
  name: "it has no inner loop"
  for name in ("num_inner_steps", "inner_lr", "first_order", "second_order_steps")
}
# Options of some algorithms: every other algorithm ignores them.
_OPTIONS = {
  "num_particles": ("bmaml",),
  "bmaml_meta_objective": ("bmaml",),
  "bmaml_leader_steps": ("bmaml",),
  "platipus_inference_data": ("platipus",),
  "abml_hyper_prior_weight": ("abml",),
  "local_reparameterization": ("vampire", "abml", "vampire2"),
  "outer_kl_weight": ("vampire2",),
  "train_ways": ("protonet",),
  "protonet_distance": ("protonet",),
  "simpa_phi_lr": ("simpa",),
  "simpa_phi_inner_lr": ("simpa",),
  "simpa_epsilon": ("simpa",),
  "simpa_kl_samples": ("simpa",),
  "inner_backtracking": ("vampire", "vampire2", "maml", "fomaml"),
}


def _options_but(name: str) -> dict:
  return {
    field: f"it is an option of {' and '.join(owners)}"
    for field, owners in _OPTIONS.items()
    if name not in owners
  }


ALGORITHMS: dict[str, Algorithm] = {
  "vampire": Algorithm(
    _vampire,
    True,
    True,
    {},
    "VAMPIRE: Gaussian prior, variational inner loop (this paper)",
    _options_but("vampire"),
  ),
  "maml": Algorithm(
    _maml(False),
    False,
    False,
    dict(_POINT_ESTIMATE),
    "MAML: point estimate, second-order meta-gradient",
    {**_NO_KL, **_NO_LOG_STDS, **_ONE_DRAW, **_options_but("maml")},
  ),
  "fomaml": Algorithm(
    _maml(True),
    False,
    False,
    dict(_POINT_ESTIMATE),
    "first-order MAML",
    {
      **_NO_KL,
      **_NO_LOG_STDS,
      **_ONE_DRAW,
      "first_order": "it is first-order already",
      "second_order_steps": "it is first-order in every step",
      **_options_but("fomaml"),
    },
  ),
  "platipus": Algorithm(
    _platipus,
    True,
    False,
    {},
    "PLATIPUS: learned prior over the initial weights, mean-only adaptation",
    {**_NO_TRUNCATION, **_options_but("platipus")},
  ),
  "bmaml": Algorithm(
    _bmaml,
    False,
    False,
    {"kl_weight": 0.0},
    "BMAML: SVGD particles, ensemble prediction",
    {**_NO_KL, **_NO_LOG_STDS, **_PARTICLES, **_NO_TRUNCATION, **_options_but("bmaml")},
  ),
  "abml": Algorithm(
    _abml,
    True,
    True,
    {},
    "ABML: VAMPIRE's inner loop, ELBO on support and query, hyper-prior",
    {**_NO_TRUNCATION, **_options_but("abml")},
  ),
  # The authors' defaults, main.py at d797d9d: --KL-weight 1e-6, --first-order.
  "vampire2": Algorithm(
    functools.partial(_vampire, kl_target="standard_normal"),
    True,
    True,
    {"kl_weight": 1e-6, "first_order": True},
    "Vampire2: VAMPIRE with KL(q || N(0, I)) in the inner loop and the meta-loss (2021)",
    _options_but("vampire2"),
    kl_target="standard_normal",
  ),
  "protonet": Algorithm(
    protonet_settings.build,
    False,
    False,
    {**_POINT_ESTIMATE, "num_inner_steps": 0},
    "ProtoNet: prototypes of the support embeddings, no inner loop (Snell et al. 2017)",
    {**_NO_KL, **_NO_LOG_STDS, **_ONE_DRAW, **_NO_INNER_LOOP, **_options_but("protonet")},
    embedding=True,
  ),
  "simpa": Algorithm(
    simpa_settings.build,
    False,
    False,
    # Simpa.py runs first order (main.py's default); its KL terms have no weight.
    {"kl_weight": 0.0, "first_order": True},
    "SImPa: a generator of the weights, a PHI network's KL lower bound, PAC-Bayes terms",
    {
      "kl_weight": "its KL terms enter the PAC-Bayes bound unweighted (see --simpa-epsilon)",
      **_NO_LOG_STDS,
      **_NO_TRUNCATION,
      "kernel_init_gain": "its weights come from the generator, not the network's init",
      **_options_but("simpa"),
    },
    optimizer=simpa_settings.optimizer,
  ),
}


def get(name: str) -> Algorithm:
  """The registered algorithm `name`; raises ConfigError naming the choices."""
  if name not in ALGORITHMS:
    raise ConfigError(f"--algorithm {name!r} is unknown; choose one of {', '.join(ALGORITHMS)}")
  return ALGORITHMS[name]


def configure(config, name: str):
  """`config` for algorithm `name`: the algorithm set, with its `config_defaults`, and the
  fields it ignores at their neutral values (`drop_ignored`)."""
  configured = dataclasses.replace(config, algorithm=name, **get(name).config_defaults)
  return drop_ignored(configured)[0]


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _neutral(config, name: str):
  """The value of a field `config.algorithm` ignores that a run records: its default."""
  defaults = get(config.algorithm).config_defaults
  if name in defaults:
    return defaults[name]
  field = next(f for f in dataclasses.fields(config) if f.name == name)
  return field.default


def _same(a, b) -> bool:
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return list(a) == list(b)
  return a == b


def ignored_settings(config) -> dict[str, tuple[Any, Any, str]]:
  """`{field: (value, neutral value, why)}` of the settings `config.algorithm` would ignore."""
  names = {f.name for f in dataclasses.fields(config)}
  ignored = {}
  for name, why in get(config.algorithm).ignores.items():
    if name in names and not _same(getattr(config, name), _neutral(config, name)):
      ignored[name] = (getattr(config, name), _neutral(config, name), why)
  return ignored


def ignored_fields(name: str) -> frozenset[str]:
  """The config fields algorithm `name` never reads (a resumed run may differ in them)."""
  return frozenset(get(name).ignores)


def network_outputs(config) -> Optional[int]:
  """A classifier's outputs: `config.ways`, or None for an embedding without a head (ProtoNet)."""
  return None if get(config.algorithm).embedding else config.ways


def check_settings(config) -> None:
  """Raises ConfigError, in one line naming the flags, for settings that would have no effect.

  A field the algorithm ignores at a value other than its neutral one
  (`--algorithm maml --kl-weight 0.5`), and settings that contradict each
  other (`--first-order --second-order-steps 1`: every step is first-order).
  """
  if get(config.algorithm).embedding:
    protonet_settings.check_classifies(config)
  ignored = ignored_settings(config)
  if ignored:
    listed = "; ".join(
      f"{_flag(name)} {value!r}: {why}" for name, (value, _, why) in ignored.items()
    )
    raise ConfigError(
      f"--algorithm {config.algorithm} ignores {listed}; leave "
      f"{'it' if len(ignored) == 1 else 'them'} out (a run records only settings that act)"
    )
  if (
    getattr(config, "first_order", False)
    and getattr(config, "second_order_steps", None) is not None
  ):
    raise ConfigError(
      f"--second-order-steps {config.second_order_steps} has no effect with --first-order "
      "(every inner step is then first-order); pass one of them"
    )


def drop_ignored(config):
  """`(config with the ignored fields at their neutral values, {field: (value, neutral, why)})`.

  For a comparison whose flags apply to every method: a method that ignores
  one (MAML and `--kl-weight`) records the neutral value, and the caller says so.
  """
  ignored = ignored_settings(config)
  neutral = {name: value for name, (_, value, _) in ignored.items()}
  return dataclasses.replace(config, **neutral), ignored


def learner_from_config(
  config,
  apply_fn: losses.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_mc_train: int,
  num_mc_query: int,
  unroll_steps: bool = False,
) -> MetaLearner:
  """The configured algorithm's learner with the given Monte-Carlo sample counts."""
  return get(config.algorithm).build(
    config, apply_fn, nll, num_mc_train, num_mc_query, unroll_steps
  )


def stability_factor(config, meta_params: PyTree) -> Optional[float]:
  """inner_lr * kl_weight / sigma_p^2 at `meta_params`, or None where it does not apply.

  The inner loop is stable only while this is below 2; see
  `gaussian.kl_step_factor`.
  """
  algorithm = get(config.algorithm)
  if not algorithm.inner_kl or config.kl_weight == 0:
    return None
  if algorithm.kl_target == "standard_normal":  # the target's sigma is 1
    return float(config.inner_lr * config.kl_weight)
  return float(jax.jit(kl_step_factor)(meta_params, config.inner_lr, config.kl_weight))


# -- Building a learner for a network and a likelihood (moved here from the loop) -----


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def network(model: nn.Module, compute_dtype: str = "float32") -> losses.ApplyFn:
  """`apply_fn(params, x)` of `model`, in bfloat16 mixed precision if asked."""
  apply_fn = models.pure_apply(model)
  if compute_dtype == "float32":
    return apply_fn
  return models.mixed_precision(apply_fn, COMPUTE_DTYPES[compute_dtype])


def likelihood(kind: str, noise_std: Optional[float]) -> losses.Likelihood:
  """The likelihood of a `kind` problem (`kinds.get(kind).likelihood`)."""
  return kinds.get(kind).likelihood(noise_std)


def unroll_inner_steps(config) -> bool:
  """Unroll the inner loop: the config's choice; by default no (a scan compiles faster)."""
  return bool(config.unroll_inner_steps)


def make_learner(
  model: nn.Module,
  kind: str,
  noise_std: Optional[float],
  config,
  *,
  num_mc_train: int,
  num_mc_query: int,
) -> MetaLearner:
  """The configured algorithm on `model`, with the given Monte-Carlo sample counts.

  The likelihood's noise is `config.likelihood_std` where a config has one
  set (regression: train on another noise than the data's, e.g. the authors'
  MSE), else `noise_std`.
  """
  likelihood_std = getattr(config, "likelihood_std", None)
  return learner_from_config(
    config,
    network(model, config.compute_dtype),
    likelihood(kind, noise_std if likelihood_std is None else likelihood_std),
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    unroll_steps=unroll_inner_steps(config),
  )


def make_optimizer(config) -> optax.GradientTransformation:
  """The config's meta-optimiser: Adam with its schedule, clipping and log-std weight decay
  (or the algorithm's own, `Algorithm.optimizer`)."""
  own = get(config.algorithm).optimizer
  if own is not None:
    return own(config)
  return meta_step.meta_optimizer(
    config.meta_lr,
    tasks_per_step=config.tasks_per_step,
    decay_rate=config.meta_lr_decay,
    clip_norm=config.meta_grad_clip_norm,
    clip_separately=config.meta_grad_clip_separately,
    log_std_weight_decay=config.log_std_weight_decay,
  )


def check_config(config) -> None:
  """Raises ConfigError for an impossible setting (the config's `validate`), or one that
  would have no effect (`check_settings`)."""
  get(config.algorithm)
  if hasattr(config, "validate"):
    config.validate()
  else:
    config_lib.validate(config)
  check_settings(config)
