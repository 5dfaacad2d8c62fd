"""SImPa (Nguyen, Do, Carneiro, "PAC-Bayes meta-learning with implicit task-specific posteriors").

As the authors run it (`Simpa.py` of cnguyen10/few_shot_meta_learning, HEAD): the
meta-parameters are a generator G of the base network's weights (the implicit
posterior q: w = G(z), z ~ U[0, 1)^128) and a PHI network T_φ whose Donsker-Varadhan
bound `kl_lower_bound` estimates KL(q ‖ p), p(w) = N(0, I) (`_simpa_networks`).

Adaptation to a task (n = number of support targets, S inner steps), each step:

  1. g_nll = ∇_G of the support NLL averaged over L_t draws w = G(z), divided by L_t
     once more (`Simpa.py` divides each draw's loss and then its gradient by L_t);
  2. φ ← φ + phi_inner_lr · ∇_φ KL̂(G, φ) (one ascent step, a constant of φ);
  3. g_kl = ∇_G bound(KL̂(G, φ), n), a constant (no second-order term), counted only
     where the bound is defined;
  4. G ← G − inner_lr · (g_nll + g_kl),

with the PAC-Bayes term bound(KL, n) = sqrt((KL + ln(n) / ε) / (2 (n − 1))), ε = 0.1.
g_nll is differentiated through (second order) unless `first_order`, the authors' default.

One task's meta-loss, with G', φ' adapted and m query targets:

  −KL̂(G', φ')                       the PHI network's loss (it gets the gradient too)
  + min(query NLL, 1)               clipped at 1 in value, not in gradient
  + bound(KL̂(G', φ'), m)            0 where undefined
  + sqrt((KL_hp(G) + M ln(M) / ε) / (2 (M − 1)))   the hyper-prior, once per meta-step

(M tasks per meta-step; the mean over the M tasks counts this last term once, as the
authors add it once per meta-batch). A task whose first term is NaN is skipped, its
loss and gradient 0, as the authors skip it. The generator and the PHI network each
have their own Adam and clipping (`simpa_optimizer`). docs/fidelity.md lists
where the code and the paper differ and where ours cannot equal theirs.
"""

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vampire_jax._src.core import adaptation, batching, losses, meta_step
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.learners import MetaLearner, check_settings, default_inner_lr
from vampire_jax._src.core.tasks import Task
from vampire_jax.baselines import _ensemble
from vampire_jax.baselines._simpa_networks import (
  Generator,
  PhiNetwork,
  draw_latents,
  generate,
  hyper_prior_kl,
  init_generator,
  init_phi_network,
  kl_lower_bound,
  latent_dim,
)

PyTree = Any

# Simpa.py's constants.
EPSILON = 0.1  # ε of the bound terms
PHI_INNER_LR = 5e-4  # the PHI network's ascent step in adaptation
PHI_LR = 1e-4  # the PHI network's Adam
NUM_KL_SAMPLES = 512  # draws from q and from p in each KL estimate
INNER_LR = 0.01  # the authors' SImPa command (--inner-lr 0.01)
LOSS_CLIP = 1.0  # the query loss's value is clipped here


class SimpaParams(NamedTuple):
  """SImPa's meta-parameters (and a task's parameters: the two adapted)."""

  generator: Generator  # q: z -> the base network's weights
  phi: PhiNetwork  # T_φ of the KL lower bound


def bound_term(kl: jax.Array, num_examples: int, epsilon: float) -> tuple[jax.Array, jax.Array]:
  """`(sqrt((kl + ln(n) / ε) / (2 (n − 1))), defined)`: the PAC-Bayes term of n examples.

  Where the square root's argument is not positive (or NaN) the term is 0, with a
  gradient of 0, and `defined` False: `Simpa.py` skips the term there (its test is
  "NaN or negative"; at an argument of exactly 0 its gradient is infinite, ours 0).
  """
  argument = (kl + math.log(num_examples) / epsilon) / (2.0 * (num_examples - 1))
  defined = argument > 0  # False for NaN
  return jnp.where(defined, jnp.sqrt(jnp.where(defined, argument, 1.0)), 0.0), defined


def hyper_prior_term(generator: Generator, tasks_per_step: int, epsilon: float) -> jax.Array:
  """sqrt((KL_hp + M ln(M) / ε) / (2 (M − 1))), the meta-level PAC-Bayes term (`hyper_prior_kl`)."""
  num_tasks = tasks_per_step
  argument = (hyper_prior_kl(generator) + num_tasks * math.log(num_tasks) / epsilon) / (
    2.0 * (num_tasks - 1)
  )
  return jnp.sqrt(argument)


def clipped_in_value(loss: jax.Array, ceiling: float = LOSS_CLIP) -> jax.Array:
  """min(loss, ceiling) in value with the gradient of `loss` (`Simpa.py` clamps `loss.data`)."""
  return loss + jax.lax.stop_gradient(jnp.minimum(loss, ceiling) - loss)


def _no_cotangent(x):
  if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(jnp.shape(x), jax.dtypes.float0)  # integer labels, PRNG keys


def _skippable(terms_fn):
  """`terms_fn(meta, task, key) -> (loss, skip, aux)` as `(loss, aux)`, 0 with 0 gradient where skip.

  The gradient is zeroed after it is computed: a skipped task's terms may be NaN, and
  a NaN inside them would reach the gradient through a plain `where` (0 · NaN).
  """

  @jax.custom_vjp
  def masked(meta, task, key):
    loss, skip, aux = terms_fn(meta, task, key)
    return jnp.where(skip, 0.0, loss), aux

  def forward(meta, task, key):
    loss, vjp_fn, (skip, aux) = jax.vjp(
      lambda m: (lambda r: (r[0], (r[1], r[2])))(terms_fn(m, task, key)), meta, has_aux=True
    )
    return (jnp.where(skip, 0.0, loss), aux), (vjp_fn, skip, task, key)

  def backward(residuals, cotangents):
    vjp_fn, skip, task, key = residuals
    (grads,) = vjp_fn(cotangents[0])
    grads = jax.tree_util.tree_map(lambda g: jnp.where(skip, jnp.zeros_like(g), g), grads)
    return grads, jax.tree_util.tree_map(_no_cotangent, task), _no_cotangent(key)

  masked.defvjp(forward, backward)
  return masked


def simpa(
  apply_fn: adaptation.ApplyFn,
  nll: losses.Likelihood,
  *,
  tasks_per_step: int,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  num_mc_train: int = 1,
  num_mc_query: int = 1,
  first_order: bool = True,
  phi_inner_lr: float = PHI_INNER_LR,
  epsilon: float = EPSILON,
  num_kl_samples: int = NUM_KL_SAMPLES,
  sample_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
) -> MetaLearner:
  """SImPa as a `MetaLearner`: `SimpaParams(generator, phi)`; train it with `simpa_optimizer`.

  Raises `InputError` naming the argument for a step size or ε that is not a finite
  number > 0, counts that are not integers in range, and `tasks_per_step` < 2 (the
  hyper-prior's term divides by 2 (M − 1)).

  Args:
    apply_fn: the base network, `apply_fn(params, x)`.
    nll: likelihood on outputs (a mean over examples), e.g. `vj.categorical_nll`.
    tasks_per_step: M, tasks per meta-step, which the hyper-prior's term counts.
    num_inner_steps: S.
    inner_lr: the generator's inner step; None: 0.01 (the authors' SImPa command), or
      the likelihood's lower `default_inner_lr`.
    num_mc_train: generated networks per inner step (the authors' `num_models`).
    num_mc_query: generated networks on the query set and at prediction.
    first_order: the inner NLL gradient is a constant (the authors' default, True);
      False differentiates through it. The KL terms' gradients are constants either way.
    phi_inner_lr: the PHI network's ascent step in each inner step (5e-4).
    epsilon: ε of the bound terms (0.1).
    num_kl_samples: draws from q and from N(0, I) in each KL estimate (512).
    sample_batching: how the generated networks' forward passes are batched.
    unroll_steps: unroll the inner loop.

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((8,), 1)
    >>> learner = vj.baselines.simpa(vj.pure_apply(model), vj.gaussian_nll(0.3),
    ...                              tasks_per_step=4, num_mc_query=3)
    >>> meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)),
    ...                            jax.random.key(1))
    >>> meta_params.generator.output_kernel["params"]["Dense_0"]["kernel"].shape  # [512, 1, 8]
    (512, 1, 8)
  """
  where = "simpa"
  checks.flags(where, first_order=first_order, unroll_steps=unroll_steps)
  check_settings(
    where,
    inner_lr,
    num_inner_steps=(num_inner_steps, 0),
    num_mc_train=(num_mc_train, 1),
    num_mc_query=(num_mc_query, 1),
    num_kl_samples=(num_kl_samples, 2),
    tasks_per_step=(tasks_per_step, 1),
  )
  if tasks_per_step < 2:
    raise InputError(
      f"{where}: tasks_per_step must be at least 2 (the hyper-prior's bound term divides by "
      f"2 (M - 1)), got {tasks_per_step!r}"
    )
  checks.rate(where, "phi_inner_lr", phi_inner_lr, positive=True)
  checks.rate(where, "epsilon", epsilon, positive=True)
  inner_lr = default_inner_lr(nll, INNER_LR) if inner_lr is None else inner_lr
  loss_fn = losses.loss_from_apply(apply_fn, nll)

  def num_targets(y, what: str, where: str) -> int:
    count = math.prod(jnp.shape(y))
    if count < 2:
      raise InputError(
        f"{where}: {what} has {count} target; SImPa's bound term divides by 2 (n - 1): "
        "give at least 2"
      )
    return count

  def check_network_fits(where: str, x_name: str, generator: Generator, x) -> None:
    """The base network takes `x` with a generated weight tree (one draw, traced only)."""
    drawn = jax.eval_shape(lambda g: draws(g, jax.random.key(0), 1), generator)
    one = jax.tree_util.tree_map(lambda w: jax.ShapeDtypeStruct(w.shape[1:], w.dtype), drawn)
    checks.network_fits(where, ("the generator's weights", x_name), apply_fn, one, x)

  def draws(generator: Generator, key, num_draws: int) -> PyTree:
    return generate(generator, draw_latents(key, num_draws, latent_dim(generator)))

  def support_nll(generator, x, y, key):
    weights = draws(generator, key, num_mc_train)
    per_draw = _ensemble.map_members(lambda w: loss_fn(w, x, y), weights, sample_batching)
    return jnp.mean(per_draw)

  def bound(generator, phi, key, n):
    return bound_term(kl_lower_bound(generator, phi, key, num_kl_samples), n, epsilon)

  def init(params, key):
    generator_key, phi_key = jax.random.split(key)
    return SimpaParams(init_generator(params, generator_key), init_phi_network(params, phi_key))

  def adapt(meta: SimpaParams, support_x, support_y, key):
    adaptation.check_inputs("simpa.adapt", support_x)
    n = num_targets(support_y, "support_y", "simpa.adapt")
    check_network_fits("simpa.adapt", "support_x", meta.generator, support_x)

    def step(carry, step_key):
      generator, phi = carry
      nll_key, phi_key, bound_key = jax.random.split(step_key, 3)
      # Constant gradients are taken at constant inputs: the same values, and no derivative
      # of the inner backward passes is traced (the meta-gradient's program stays small).
      fixed_generator, fixed_phi = jax.lax.stop_gradient((generator, phi))
      # Simpa.py divides each draw's loss by L and its gradient by L again: 1/L of the mean's.
      g_nll = jax.grad(support_nll)(
        fixed_generator if first_order else generator, support_x, support_y, nll_key
      )
      g_nll = jax.tree_util.tree_map(lambda g: g / num_mc_train, g_nll)
      phi_grad = jax.grad(lambda p: kl_lower_bound(fixed_generator, p, phi_key, num_kl_samples))(
        fixed_phi
      )
      phi = jax.tree_util.tree_map(lambda p, g: p + phi_inner_lr * g, phi, phi_grad)
      g_kl, defined = jax.grad(
        lambda g: bound(g, jax.lax.stop_gradient(phi), bound_key, n), has_aux=True
      )(fixed_generator)
      g_kl = jax.tree_util.tree_map(lambda g: jnp.where(defined, g, jnp.zeros_like(g)), g_kl)
      generator = jax.tree_util.tree_map(
        lambda w, a, b: w - inner_lr * (a + b), generator, g_nll, g_kl
      )
      return (generator, phi), None

    if num_inner_steps == 0:
      return meta
    (generator, phi), _ = jax.lax.scan(
      step,
      (meta.generator, meta.phi),
      jax.random.split(key, num_inner_steps),
      unroll=bool(unroll_steps),
    )
    return SimpaParams(generator, phi)

  def predict(task_params: SimpaParams, x, key):
    adaptation.check_inputs("simpa.predict", x)
    check_network_fits("simpa.predict", "x", task_params.generator, x)
    weights = draws(task_params.generator, key, num_mc_query)
    return _ensemble.apply_members(apply_fn, weights, x, sample_batching)

  def task_terms(meta: SimpaParams, task: Task, key):
    num_query = num_targets(task.query_y, "task.query_y", "simpa's meta-loss")
    adapt_key, predict_key, phi_key, bound_key = jax.random.split(key, 4)
    adapted = adapt(meta, task.support_x, task.support_y, adapt_key)
    kl_for_phi = kl_lower_bound(adapted.generator, adapted.phi, phi_key, num_kl_samples)
    outputs = predict(adapted, task.query_x, predict_key)
    query_loss = _ensemble.mean_member_nll(nll, outputs, task.query_y)
    task_bound, _ = bound(adapted.generator, adapted.phi, bound_key, num_query)
    loss = -kl_for_phi + clipped_in_value(query_loss) + task_bound
    # The authors skip a task whose PHI loss is NaN; a NaN query loss is reported (theirs raises).
    skip = jnp.isnan(kl_for_phi) & jnp.isfinite(query_loss)
    return loss, skip, outputs

  masked_terms = _skippable(task_terms)

  def meta_loss(meta: SimpaParams, task: Task, key):
    loss, outputs = masked_terms(meta, task, key)
    return loss + hyper_prior_term(meta.generator, tasks_per_step, epsilon), outputs

  return MetaLearner(init, adapt, predict, nll, meta_loss, tasks_per_step=tasks_per_step)


def _check_simpa_params(where: str, name: str, params) -> None:
  """Refuses another learner's meta-parameters (a VAMPIRE `Gaussian`, MAML's weights)."""
  if not isinstance(params, SimpaParams):
    raise checks.fail(
      where,
      name,
      "SImPa's meta-parameters (vj.baselines.SimpaParams, from vj.baselines.simpa(...).init); "
      "another learner's take vj.meta_optimizer",
      f"a {type(params).__name__}",
    )


class SimpaOptState(NamedTuple):
  """`simpa_optimizer`'s state: each network's Adam."""

  generator: optax.OptState
  phi: optax.OptState


def simpa_optimizer(
  learning_rate: float = 1e-3,
  *,
  tasks_per_step: int,
  phi_learning_rate: float = PHI_LR,
  decay_rate: float = 0.99,
  decay_every_tasks: int = 10_000,
  clip_norm: Optional[float] = 10.0,
) -> meta_step.MetaOptimizer:
  """Two `vj.meta_optimizer` instances: the generator's, and the PHI network's at its own rate.

  `Simpa.py` clips each network's gradient at norm 10 apart and steps each with its
  own Adam: the generator at the meta learning rate, the PHI network at 1e-4. Both
  decay as `vj.meta_optimizer` says (`decay_rate` 1: none, as the authors).

  Args:
    learning_rate: the generator's Adam.
    tasks_per_step: T, tasks per meta-step (the schedule's count).
    phi_learning_rate: the PHI network's Adam.
    decay_rate, decay_every_tasks: the schedule of both (`vj.meta_lr_schedule`).
    clip_norm: each network's gradient is clipped to this global norm (None: off).
  """
  shared = dict(
    tasks_per_step=tasks_per_step,
    decay_rate=decay_rate,
    decay_every_tasks=decay_every_tasks,
    clip_norm=clip_norm,
  )
  generator_opt = meta_step.meta_optimizer(learning_rate, **shared)
  phi_opt = meta_step.meta_optimizer(phi_learning_rate, **shared)

  def init(params: SimpaParams) -> SimpaOptState:
    _check_simpa_params("simpa_optimizer.init", "params", params)
    return SimpaOptState(generator_opt.init(params.generator), phi_opt.init(params.phi))

  def update(grads: SimpaParams, state: SimpaOptState, params=None, **extra_args):
    del extra_args
    _check_simpa_params("simpa_optimizer.update", "updates", grads)
    part = lambda name: None if params is None else getattr(params, name)
    generator, generator_state = generator_opt.update(
      grads.generator, state.generator, part("generator")
    )
    phi, phi_state = phi_opt.update(grads.phi, state.phi, part("phi"))
    return SimpaParams(generator, phi), SimpaOptState(generator_state, phi_state)

  return meta_step.MetaOptimizer(init, update, tasks_per_step=tasks_per_step)
