"""Diagnostics: does the inner loop work on real data, and where does a NaN come from?

`check_inner_loop(learner, meta_params, task, key)` runs the learner's
inner loop once on a real support set and reports whether the support loss
falls and stays finite. If it does not, it measures the support loss's
curvature (the largest eigenvalue of its Hessian in the weights, by power
iteration on Hessian-vector products) and says which knob to turn and a
value that works: plain gradient steps on a loss of curvature lambda are
stable only for inner_lr < 2 / lambda. Beside the data term it reports the
KL term's step factor (`gaussian.kl_step_factor`), whose limit is also 2.

`debug_nonfinite(fn)` runs `fn` under `jax.experimental.checkify` and
raises `FloatingPointError` naming the first operation that made a NaN or
divided by zero: an opt-in debug mode, slower than `fn`.
"""

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import checkify

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.gaussian import (
  Gaussian,
  kl_step_factor,
  sample,
  standard_normal_like,
)
from vampire_jax._src.core.learners import MetaLearner, check_meta_params_kind, check_settings
from vampire_jax._src.core.tasks import Task

PyTree = Any


class InnerLoopReport(NamedTuple):
  """What one inner loop on a real support set did.

  Attributes:
    loss_before: the support NLL at the meta-parameters: for a Gaussian
      (VAMPIRE, ABML) averaged over 16 weight draws of the prior; for point
      weights at them; over the particles, for BMAML.
    loss_after: the support NLL after the learner's inner loop: for a
      Gaussian posterior the mean over 8 inner loops (each with its own
      draws) scored on the same 16 draws of the noise as `loss_before`, so
      that the comparison measures the inner loop, not the sampling noise.
    curvature: the largest Hessian eigenvalue of the support loss at the
      meta-parameters' means; measured only when the loop failed.
    stable_inner_lr: 2 / curvature, the largest stable step (when measured).
    kl_factor: inner_lr * kl_weight / sigma_p^2 at the prior (VAMPIRE-like
      learners), stable below 2.
    advice: empty when the loop works; else what to change, with a value.
  """

  loss_before: float
  loss_after: float
  curvature: Optional[float]
  stable_inner_lr: Optional[float]
  kl_factor: Optional[float]
  advice: str

  @property
  def ok(self) -> bool:
    return not self.advice


def _support_nll(learner: MetaLearner, params: PyTree, task: Task, key: jax.Array) -> jax.Array:
  outputs = learner.predict(params, task.support_x, key)
  return jnp.mean(jax.vmap(learner.nll, in_axes=(0, None))(outputs, task.support_y))


def _central_weights(meta_params: PyTree) -> PyTree:
  """The point weights of meta-parameters: a Gaussian's (or PLATIPUS's) means, else themselves."""
  return getattr(meta_params, "mean", meta_params)


# Weight draws that score a distribution's support loss before and after the inner loop,
# and inner loops (each with its own draws) whose results are averaged.
NUM_CHECK_DRAWS = 16
NUM_CHECK_LOOPS = 8


def _expected_loss(loss_fn, dist: Gaussian, task: Task, key: jax.Array) -> jax.Array:
  """The support loss averaged over `NUM_CHECK_DRAWS` draws of `dist` from `key`."""
  draws = sample(dist, key, NUM_CHECK_DRAWS)
  return jnp.mean(jax.vmap(loss_fn, in_axes=(0, None, None))(draws, task.support_x, task.support_y))


def _losses(learner: MetaLearner, meta_params: PyTree, task: Task, key: jax.Array):
  adapt_key, predict_key = jax.random.split(key)
  task_params = learner.adapt(meta_params, task.support_x, task.support_y, adapt_key)
  settings = learner.settings
  if settings is not None and isinstance(meta_params, Gaussian):
    if isinstance(task_params, Gaussian):
      # The inner loop's expected effect: `NUM_CHECK_LOOPS` loops, each with its own weight
      # draws, and prior and posteriors scored on the same draws of the noise (common
      # random numbers). One loop scored by one posterior draw against the prior's mean
      # measured the sampling noise as much as the loop: a stable step "did not fall".
      def loss_after(loop_key):
        posterior = learner.adapt(meta_params, task.support_x, task.support_y, loop_key)
        return _expected_loss(settings.loss_fn, posterior, task, predict_key)

      loop_keys = jax.random.split(adapt_key, NUM_CHECK_LOOPS)
      return (
        _expected_loss(settings.loss_fn, meta_params, task, predict_key),
        jnp.mean(jax.vmap(loss_after)(loop_keys)),
      )
  if settings is not None:
    before = settings.loss_fn(_central_weights(meta_params), task.support_x, task.support_y)
  else:  # e.g. BMAML: the meta-parameters are the particles predict takes
    before = _support_nll(learner, meta_params, task, predict_key)
  return before, _support_nll(learner, task_params, task, predict_key)


# Compiled once per learner (a NamedTuple of functions, hashed by identity): checking
# many tasks with one learner compiles once.
_jitted_losses = jax.jit(_losses, static_argnums=0)


def _adapted_nll(learner: MetaLearner, meta_params: PyTree, task: Task, key: jax.Array):
  """The support NLL of the task parameters `adapt` returns (no inner step: nothing to compare)."""
  adapt_key, predict_key = jax.random.split(key)
  task_params = learner.adapt(meta_params, task.support_x, task.support_y, adapt_key)
  return _support_nll(learner, task_params, task, predict_key)


_jitted_adapted_nll = jax.jit(_adapted_nll, static_argnums=0)


def largest_curvature(
  loss_fn: Callable,
  weights: PyTree,
  x: jax.Array,
  y: jax.Array,
  key: jax.Array,
  num_iterations: int = 20,
) -> jax.Array:
  """The largest eigenvalue of the Hessian of `loss_fn(weights, x, y)` in `weights`.

  Power iteration on Hessian-vector products (reverse over reverse, so it
  works with custom-gradient convolutions too).
  """
  grad = jax.grad(loss_fn)

  def hvp(v):
    return jax.grad(lambda w: optax.tree_utils.tree_vdot(grad(w, x, y), v))(weights)

  leaves, treedef = jax.tree_util.tree_flatten(weights)
  keys = jax.random.split(key, len(leaves))
  v0 = jax.tree_util.tree_unflatten(
    treedef, [jax.random.normal(k, jnp.shape(w), jnp.result_type(w)) for k, w in zip(keys, leaves)]
  )

  def step(_, state):
    v, _ = state
    v = optax.tree_utils.tree_scale(1.0 / optax.tree_utils.tree_norm(v), v)
    hv = hvp(v)
    return hv, optax.tree_utils.tree_vdot(v, hv)

  dtype = jnp.result_type(*leaves) if leaves else jnp.float32  # float64 under x64
  _, eigenvalue = jax.lax.fori_loop(0, num_iterations, step, (v0, jnp.zeros((), dtype)))
  return eigenvalue


def _round_down(value: float) -> float:
  """`value` rounded down to one significant digit (0.00374 -> 0.003); 0 stays 0."""
  if not (math.isfinite(value) and value > 0):
    return 0.0 if math.isfinite(value) else value
  exponent = math.floor(math.log10(value))
  return math.floor(value / 10**exponent) * 10**exponent


def _check_arguments(learner: MetaLearner, meta_params: PyTree, task: Task, key) -> None:
  """What `check_inner_loop` cannot diagnose, refused in one line naming the real cause.

  A NaN or infinite value in the task or the meta-parameters makes the loss non-finite
  whatever the step size: it is named, rather than advised away as "lower inner_lr".
  """
  where = "check_inner_loop"
  checks.prng_key(where, "key", key)
  if not isinstance(task, Task):
    fix = " (wrap it: vj.Task(*task))" if isinstance(task, (tuple, list)) and len(task) == 4 else ""
    raise checks.fail(
      where,
      "task",
      "one vj.Task(support_x, support_y, query_x, query_y)",
      type(task).__name__ + fix,
    )
  checks.examples(where, ("task.support_x", "task.support_y"), task.support_x, task.support_y)
  central = _central_weights(meta_params)
  check_meta_params_kind(
    where, "meta_params", learner, meta_params, "pass learner.init(params, key)"
  )
  if learner.settings is not None:
    checks.loss_fits(
      where,
      ("task.support_x", "task.support_y"),
      learner.settings.loss_fn,
      central,
      task.support_x,
      task.support_y,
      params_name="meta_params",
    )
  checks.check_finite(where, {"task.support_x": task.support_x, "task.support_y": task.support_y})
  for path, leaf in jax.tree_util.tree_leaves_with_path(meta_params):
    # NaN only: a log-std of -inf is an exact point mass, which kl_weight 0 adapts finitely.
    values = np.asarray(leaf, np.float32) if jnp.issubdtype(leaf.dtype, jnp.floating) else None
    if values is not None and np.isnan(values).any():
      raise checks.fail(
        where,
        f"meta_params{jax.tree_util.keystr(path)}",
        "free of NaN (no step size helps NaN meta-parameters)",
        f"{int(np.isnan(values).sum())} NaN of {values.size}",
      )


def check_inner_loop(
  learner: MetaLearner, meta_params: PyTree, task: Task, key: jax.Array
) -> InnerLoopReport:
  """Runs the learner's inner loop once on `task`'s support set and reports.

  Args:
    learner: the algorithm (`vj.vampire(...)`, `vj.maml(...)`, ...).
    meta_params: its meta-parameters (e.g. at initialisation).
    task: one task, no leading task axis.
    key: PRNG key of the draws.

  Returns:
    An `InnerLoopReport`; `.ok` is True when the support loss stayed finite
    and fell, and the KL step factor (if any) is below 2. Otherwise
    `.advice` names the knob and a value that works.

  Raises:
    InputError: the learner's settings have a non-finite or negative step
      size or KL weight (no step size makes such a loop stable, so none is
      advised); or the arguments cannot be checked as they are (`_check_arguments`):
      a task that is not one `vj.Task`, NaN or infinite values in it or in
      `meta_params`, meta-parameters of another kind than `learner.init` makes.

  A learner without an inner loop by design (no inner steps and an inner lr of
  0: ProtoNet) has no loop to fail: the report holds its support NLL, before
  and after alike, and no advice.

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((16,), 1)
    >>> params = vj.init_params(model, jax.random.key(0), (1, 1))
    >>> tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 1))
    >>> task = jax.tree.map(lambda field: field[0], tasks)  # one task, no task axis
    >>> learner = vj.maml(vj.pure_apply(model), vj.gaussian_nll(0.3))
    >>> report = vj.check_inner_loop(learner, learner.init(params, None), task, jax.random.key(3))
    >>> report.ok, report.advice
    (True, '')

    Where the support loss does not fall, `report.ok` is False and `report.advice`
    names a smaller `inner_lr` (e.g. `vj.maml(..., inner_lr=0.5)` on this task).
  """
  settings = learner.settings
  # No inner steps and an inner lr of 0: no loop by design (ProtoNet), and no step to check.
  without_loop = settings is not None and settings.num_inner_steps == 0 and settings.inner_lr == 0
  if settings is not None and not without_loop:
    check_settings("check_inner_loop: learner.settings", settings.inner_lr, settings.kl_weight)
  _check_arguments(learner, meta_params, task, key)
  if without_loop:
    loss = float(_jitted_adapted_nll(learner, meta_params, task, key))
    return InnerLoopReport(loss, loss, None, None, None, "")
  if settings is not None and settings.num_inner_steps == 0:
    before = float(_jitted_losses(learner, meta_params, task, key)[0])
    advice = (
      "the learner takes no inner steps (num_inner_steps 0), so the support loss cannot "
      "fall: there is no inner loop to check (build it with num_inner_steps >= 1 to adapt)"
    )
    return InnerLoopReport(before, before, None, None, None, advice)
  before, after = (float(v) for v in _jitted_losses(learner, meta_params, task, key))
  kl_factor = None
  if settings is not None and settings.kl_weight and isinstance(meta_params, Gaussian):
    # The KL term's target sets the factor: the prior's sigma_p, or N(0, I)'s sigma of 1.
    target = standard_normal_like(meta_params) if settings.kl_target != "prior" else meta_params
    kl_factor = float(kl_step_factor(target, settings.inner_lr, settings.kl_weight))
  finite, fell = math.isfinite(after), math.isfinite(after) and after < before
  if finite and fell and (kl_factor is None or kl_factor < 2):
    return InnerLoopReport(before, after, None, None, kl_factor, "")

  what = ("went non-finite" if not finite else "did not fall") + f" ({before:.4g} -> {after:.4g})"
  curvature = stable = None
  advice = [f"the support loss {what} in the inner loop"]
  if settings is not None:
    curvature = float(
      jax.jit(largest_curvature, static_argnums=0)(
        settings.loss_fn, _central_weights(meta_params), task.support_x, task.support_y, key
      )
    )
    if curvature > 0 and math.isfinite(curvature):
      stable = 2.0 / curvature
      # Advise a step only where it is lower than the one taken: a loop that failed below the
      # data term's limit failed for another reason (the KL factor, below), never for want
      # of a larger step.
      if settings.inner_lr >= stable:
        advice.append(
          f"the loss's curvature is {curvature:.4g}, so gradient steps are stable "
          f"only below inner_lr {stable:.3g}: use inner_lr "
          f"{_round_down(stable / 2):g} (now {settings.inner_lr:g})"
        )
  if kl_factor is not None and not kl_factor < 2:
    narrowest = float(min(jnp.min(s) for s in jax.tree_util.tree_leaves(meta_params.log_std)))
    suggested = _round_down(settings.kl_weight / kl_factor) if math.isfinite(kl_factor) else 0.0
    if suggested > 0 and narrowest > -20:
      fix = f"use kl_weight {suggested:g} or lower inner_lr"
    else:  # a point mass or near one: no KL weight but 0 makes a step stable
      fix = (
        f"the prior is too narrow for KL steps (narrowest log-std {narrowest:.3g}): widen it "
        "(e.g. vj.gaussian_from_params's log-stds in [-4, -3]) or use kl_weight 0 (MAML)"
      )
    advice.append(
      f"the KL term's step factor inner_lr * kl_weight / sigma_p^2 is "
      f"{kl_factor:.3g} (stable below 2): {fix}"
    )
  if len(advice) == 1:
    advice.append("lower inner_lr (e.g. tenfold)")
  if finite and fell:  # only the KL factor is off
    advice = advice[1:]
  return InnerLoopReport(before, after, curvature, stable, kl_factor, "; ".join(advice))


def debug_nonfinite(fn: Callable) -> Callable:
  """`fn`, jitted and checked: raises FloatingPointError at the first NaN or division by zero.

      train_step = vj.debug_nonfinite(vj.make_train_step(learner, optimizer, sample_tasks, ...))

  The message names the operation (e.g. `nan generated by primitive:
  dot_general`) and where it was called. For debugging: checks make the
  program slower. Do not wrap a function that is already jitted with
  donated arguments.
  """
  checked = jax.jit(checkify.checkify(fn, errors=checkify.float_checks))

  def run(*args, **kwargs):
    error, out = checked(*args, **kwargs)
    message = error.get()
    if message:
      raise FloatingPointError(message)
    return out

  return run
