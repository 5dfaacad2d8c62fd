"""Task adaptation: VAMPIRE's variational inner loop and MAML's point estimate.

Both run `num_steps` plain gradient steps from the meta-parameters with
`lax.scan`, and both are differentiable with respect to the meta-parameters
through every step (second order) unless `first_order=True`, in which case
each inner gradient is treated as a constant (d task_params / d meta = I).
`second_order_steps=k` is the authors' code's middle way: the likelihood's
gradient is differentiated in the first k steps only and is a constant in
the later ones; the KL term's gradient (VAMPIRE) stays differentiable.

`remat=True` wraps each inner step in `jax.checkpoint`: the meta-gradient's
backward pass stores only the parameters between steps and recomputes each
step's activations, trading compute for memory.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from vampire_jax._src.core import batching
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.gaussian import (
  Gaussian,
  check_gaussian,
  kl_divergence,
  kl_step_factor,
  sample,
)
from vampire_jax._src.core.inner_steps import backtracking_step, first_scale, sgd_step
from vampire_jax._src.core.losses import ApplyFn, LossFn, PyTree


def _check_support(
  where: str, loss_fn: LossFn, params: PyTree, support_x, support_y, params_name: str
) -> None:
  """Trace-time checks of a support set: arrays, examples match, and the network and loss take them.

  Concrete labels are checked against the network's classes too (`checks.loss_fits`).
  """
  checks.array(where, "support_x", support_x)
  checks.array(where, "support_y", support_y)
  checks.examples(where, ("support_x", "support_y"), support_x, support_y)
  checks.loss_fits(
    where, ("support_x", "support_y"), loss_fn, params, support_x, support_y, params_name
  )


def check_inputs(where: str, x) -> None:
  """Refuses an input batch `x` without a leading axis of at least one example."""
  checks.array(where, "x", x)
  if jnp.ndim(x) < 1 or jnp.shape(x)[0] < 1:
    raise checks.fail(
      where, "x", "an array of at least one example [batch, ...]", checks.describe(x)
    )


def _check_steps(num_steps: int, where: str = "adapt") -> None:
  checks.step_count(where, "num_steps", num_steps, 0)


def _check_num_samples(num_mc_samples: int, where: str = "adapt") -> None:
  checks.step_count(where, "num_mc_samples", num_mc_samples, 1)


def _scan_steps(
  step: Callable, init: PyTree, xs, length: int, unroll_steps: bool, remat: bool
) -> PyTree:
  if remat:  # common-subexpression elimination is safe inside scan, not when unrolled
    step = jax.checkpoint(step, prevent_cse=bool(unroll_steps))
  final, _ = jax.lax.scan(step, init, xs, length=length, unroll=bool(unroll_steps))
  return final


def _check_second_order_steps(second_order_steps: Optional[int], where: str = "adapt") -> None:
  if second_order_steps is not None:
    checks.step_count(where, "second_order_steps", second_order_steps, 0)


def _split_steps(num_steps: int, second_order_steps: Optional[int]) -> tuple[int, int]:
  """`(differentiated, constant)`: steps whose likelihood gradient is differentiated, then not."""
  if second_order_steps is None:
    return num_steps, 0
  differentiated = min(int(second_order_steps), num_steps)
  return differentiated, num_steps - differentiated


def _two_phase_scan(
  make_step: Callable[[bool], Callable],
  init: PyTree,
  xs,
  num_steps: int,
  second_order_steps: Optional[int],
  unroll_steps: bool,
  remat: bool,
) -> PyTree:
  """The first steps with `make_step(True)`, the rest with `make_step(False)`, as two loops.

  Two loops rather than one with a switch: a constant gradient then costs no
  second-order work at all (a `where` inside one loop would still compute it).
  """
  first, rest = _split_steps(num_steps, second_order_steps)
  carry = init
  if first:
    head = jax.tree_util.tree_map(lambda x: x[:first], xs)
    carry = _scan_steps(make_step(True), carry, head, first, unroll_steps, remat)
  if rest:
    tail = jax.tree_util.tree_map(lambda x: x[first:], xs)
    carry = _scan_steps(make_step(False), carry, tail, rest, unroll_steps, remat)
  return carry


# draw_outputs(dist, x, key, num_samples) -> [num_samples, batch, ...]: the network's
# outputs under `num_samples` draws from `dist`, each example's exactly distributed as
# under a weight draw (e.g. `models.local_reparameterization`).
OutputSampler = Callable[[Gaussian, jax.Array, jax.Array, int], jax.Array]


def expected_nll(
  dist: Gaussian,
  x: jax.Array,
  y: jax.Array,
  key: jax.Array,
  *,
  loss_fn: LossFn,
  num_mc_samples: int,
  sample_batching: batching.Batching = "vmap",
  draw_outputs: Optional[OutputSampler] = None,
  nll: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
) -> jax.Array:
  """Monte-Carlo estimate of E_{w~dist}[loss_fn(w, x, y)], reparameterised.

  Args:
    dist: the distribution over weights.
    x, y: a batch of data, `[batch, ...]`.
    key: PRNG key for the weight draws.
    loss_fn: `loss_fn(params, x, y)`, the mean NLL under one weight sample.
    num_mc_samples: number of weight draws L.
    sample_batching: how the L forward passes are batched (see `batching`).
    draw_outputs: optional: draw the L outputs with it instead of drawing
      weights (the local reparameterisation trick); `nll(outputs, y)` then
      scores each. The loss is a mean over examples, so its expectation needs
      only each example's marginal: the estimate is unbiased, with less variance.
    nll: the likelihood on outputs, with `draw_outputs`.

  Returns:
    The mean of `loss_fn` over the L draws, a scalar.
  """
  if draw_outputs is not None:
    outputs = draw_outputs(dist, x, key, num_mc_samples)
    return jnp.mean(jax.vmap(nll, in_axes=(0, None))(outputs, y))
  weights = sample(dist, key, num_mc_samples)
  if num_mc_samples == 1:  # no batching needed: keeps convolutions ungrouped
    return loss_fn(jax.tree_util.tree_map(lambda w: w[0], weights), x, y)
  losses = batching.batched_map(
    lambda w: loss_fn(w, x, y), weights, strategy=sample_batching, chunk_size=num_mc_samples
  )
  return jnp.mean(losses)


def variational_free_energy(
  posterior: Gaussian,
  prior: Gaussian,
  x: jax.Array,
  y: jax.Array,
  key: jax.Array,
  *,
  loss_fn: LossFn,
  num_mc_samples: int,
  kl_weight: float,
  sample_batching: batching.Batching = "vmap",
) -> jax.Array:
  """VFE = E_q[NLL(x, y | w)] + kl_weight * KL(q || prior), the inner-loop loss."""
  nll = expected_nll(
    posterior,
    x,
    y,
    key,
    loss_fn=loss_fn,
    num_mc_samples=num_mc_samples,
    sample_batching=sample_batching,
  )
  return nll + kl_weight * kl_divergence(posterior, prior)


def adapt(
  prior: Gaussian,
  support_x: jax.Array,
  support_y: jax.Array,
  key: jax.Array,
  *,
  loss_fn: LossFn,
  num_steps: int,
  inner_lr: float,
  num_mc_samples: int = 1,
  kl_weight: float = 1.0,
  first_order: bool = False,
  sample_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
  remat: bool = False,
  second_order_steps: Optional[int] = None,
  draw_outputs: Optional[OutputSampler] = None,
  nll: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
  kl_target: Optional[Gaussian] = None,
  backtracking: bool = False,
) -> Gaussian:
  """VAMPIRE's task adaptation (Alg. 1, lines 5-7).

  Starting from q = prior, each step draws `num_mc_samples` weights from q
  and moves both q.mean and q.log_std by `-inner_lr * grad VFE(q)`, where
  VFE(q) = E_q[NLL] + kl_weight * KL(q || kl_target), the target the prior
  unless given (Vampire2: N(0, I), `gaussian.standard_normal_like(prior)`).

  Args:
    prior: the meta-learned Gaussian p(w; theta).
    support_x: `[num_support, ...]` inputs.
    support_y: `[num_support, ...]` targets.
    key: PRNG key; step s uses the s-th of `num_steps` split keys.
    loss_fn: `loss_fn(params, x, y)`, mean NLL of (x, y) under one weight draw.
    num_steps: S, number of gradient steps (0 returns the prior).
    inner_lr: alpha, the inner learning rate.
    num_mc_samples: L_t, weight draws per step.
    kl_weight: beta, weight of KL(q || prior) in the VFE.
    first_order: treat each inner gradient as a constant w.r.t. the prior.
    sample_batching: how the L_t forward passes are batched.
    unroll_steps: unroll the scan over steps (faster on some backends,
      longer compile).
    remat: recompute each step in the backward pass (`jax.checkpoint`)
      instead of storing its activations.
    second_order_steps: None differentiates every step at second order
      (Alg. 1); k treats the likelihood's gradient as a constant after the
      first k steps, as the authors' code does with k = 1 (the KL's
      gradient stays differentiable).
    draw_outputs, nll: optional: the local reparameterisation trick (see
      `expected_nll`), e.g. `draw_outputs=vj.local_reparameterization` with
      `nll=vj.gaussian_nll(0.3)` for a `vj.MLP`.
    kl_target: the Gaussian the KL term pulls q toward (None: the prior,
      Alg. 1); the authors' 2021 code (Vampire2) takes N(0, I).
    backtracking: not the paper's (off by default): a step that raises the
      VFE on its own weight draws, or makes it non-finite, is not taken, and
      the steps after it are halved. A guard for tasks whose support loss is
      too curved for `inner_lr` (e.g. sine/line supports clustered near
      x = -5 or 5); a stable step is taken as without it.

  Returns:
    The task posterior q(w; lambda), a `Gaussian` with the prior's structure.

  Raises:
    InputError: (while traced) arrays of the wrong kind or shape, one task's
      support set expected (a leading task axis is refused by the networks:
      vmap over tasks), parameters that do not fit the network, a key that is
      not a PRNG key, non-integer or traced step counts; where concrete, a
      negative or non-finite `inner_lr` or `kl_weight` and labels outside
      the network's classes. Under `jit` with traced labels, an out-of-range
      label makes the posterior NaN (see `losses.categorical_nll`).

  Examples:
    Five steps on one regression task's support set lower its loss:

    >>> model = vj.MLP((16,), 1)
    >>> apply_fn = vj.pure_apply(model)
    >>> prior = vj.gaussian_from_params(
    ...   vj.init_params(model, jax.random.key(0), (1, 1)), jax.random.key(1)
    ... )
    >>> nll = vj.gaussian_nll(0.3)
    >>> loss_fn = vj.loss_from_apply(apply_fn, nll)
    >>> support_x = jnp.linspace(-1.0, 1.0, 5)[:, None]
    >>> support_y = 2.0 * support_x
    >>> posterior = vj.adapt(prior, support_x, support_y, jax.random.key(2), loss_fn=loss_fn,
    ...                      num_steps=5, inner_lr=nll.default_inner_lr)
    >>> before, after = (float(loss_fn(d.mean, support_x, support_y)) for d in (prior, posterior))
    >>> after < before  # the support loss under the mean weights
    True
  """
  if (draw_outputs is None) != (nll is None):
    raise ValueError("adapt: draw_outputs and nll go together (the local reparameterisation)")
  check_gaussian(prior, "adapt")
  checks.flags(
    "adapt",
    first_order=first_order,
    unroll_steps=unroll_steps,
    remat=remat,
    backtracking=backtracking,
  )
  _check_steps(num_steps)
  _check_num_samples(num_mc_samples)
  _check_second_order_steps(second_order_steps)
  checks.rate("adapt", "inner_lr", inner_lr, positive=True)
  checks.rate("adapt", "kl_weight", kl_weight, positive=False)
  checks.prng_key("adapt", "key", key)
  _check_support("adapt", loss_fn, prior.mean, support_x, support_y, "prior")
  target = prior if kl_target is None else kl_target
  check_gaussian(target, "adapt")

  nll_grad = jax.grad(expected_nll)
  kl_grad = jax.grad(kl_divergence)
  without_kl = checks.concrete(kl_weight) and float(kl_weight) == 0.0

  data_options = dict(
    loss_fn=loss_fn,
    num_mc_samples=num_mc_samples,
    sample_batching=sample_batching,
    draw_outputs=draw_outputs,
    nll=nll,
  )

  def sampled_vfe(posterior, step_key):  # what a step descends, on the step's draws
    data = expected_nll(posterior, support_x, support_y, step_key, **data_options)
    return data if without_kl else data + kl_weight * kl_divergence(posterior, target)

  def make_step(differentiated: bool):
    def gradient(posterior, step_key):
      data_grads = nll_grad(posterior, support_x, support_y, step_key, **data_options)
      if not differentiated:  # the authors' steps 2..S: the likelihood's gradient is a constant
        data_grads = jax.lax.stop_gradient(data_grads)
      if without_kl:  # not 0 * KL gradient: that is NaN where a prior's KL overflows
        return data_grads
      return jax.tree_util.tree_map(
        lambda g, k: g + kl_weight * k, data_grads, kl_grad(posterior, target)
      )

    if backtracking:
      return backtracking_step(gradient, sampled_vfe, inner_lr, first_order)

    def step(posterior, step_key):
      return sgd_step(posterior, gradient(posterior, step_key), inner_lr, first_order), None

    return step

  if num_steps == 0:
    return prior
  posterior = _two_phase_scan(
    make_step,
    (prior, first_scale(prior, support_x)) if backtracking else prior,
    jax.random.split(key, num_steps),
    num_steps,
    second_order_steps,
    unroll_steps,
    remat,
  )
  posterior = posterior[0] if backtracking else posterior
  _refuse_nonfinite_posterior(posterior, prior, target, support_x, num_steps, inner_lr, kl_weight)
  return posterior


def _all_finite(tree: PyTree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree_util.tree_leaves(tree))


def _refuse_nonfinite_posterior(
  posterior: Gaussian, prior: Gaussian, target: Gaussian, support_x, num_steps, inner_lr, kl_weight
) -> None:
  """Where concrete: InputError if the inner loop made a finite prior non-finite.

  Under `jit` the values are tracers and nothing is checked here: a meta-step
  flags the NaN in `metrics["finite"]` and the training loop stops on it.
  """
  arrays = (posterior, prior, support_x, inner_lr, kl_weight)
  if not all(checks.concrete(a) for a in arrays) or _all_finite(posterior):
    return
  if not (_all_finite(prior) and _all_finite(support_x)):
    return  # a NaN that came in goes out; the caller's own inputs say why
  factor = float(kl_step_factor(target, float(inner_lr), float(kl_weight)))
  if not factor < 2:
    cause = (
      f"the KL term's step factor inner_lr * kl_weight / sigma_p^2 is {factor:.3g} at the "
      "KL target's narrowest weight (stable below 2): widen the prior's log-stds, or lower "
      "kl_weight or inner_lr"
    )
  else:
    cause = "the likelihood's steps diverge: lower inner_lr"
  raise InputError(
    f"adapt: the posterior is not finite after {num_steps} steps from a finite prior; {cause} "
    "(vj.check_inner_loop gives values that work)"
  )


def maml_adapt(
  params: PyTree,
  support_x: jax.Array,
  support_y: jax.Array,
  *,
  loss_fn: LossFn,
  num_steps: int,
  inner_lr: float,
  first_order: bool = False,
  unroll_steps: bool = False,
  remat: bool = False,
  second_order_steps: Optional[int] = None,
  backtracking: bool = False,
) -> PyTree:
  """MAML's task adaptation: `num_steps` SGD steps on the support loss.

  Args:
    params: the meta-learned initial weights theta.
    support_x: `[num_support, ...]` inputs.
    support_y: `[num_support, ...]` targets.
    loss_fn: `loss_fn(params, x, y)`, the mean loss on (x, y).
    num_steps: number of SGD steps (0 returns `params`).
    inner_lr: the inner learning rate.
    first_order: drop the second-order terms (FOMAML).
    unroll_steps: unroll the scan over steps.
    remat: recompute each step in the backward pass (`jax.checkpoint`).
    second_order_steps: None differentiates every step at second order; k
      treats the gradient as a constant after the first k steps.
    backtracking: not the paper's (off by default): a step that raises the
      support loss, or makes it non-finite, is not taken, and the steps after
      it are halved (see `adapt`).

  Returns:
    The adapted weights, a tree like `params`.
  """
  checks.flags(
    "maml_adapt",
    first_order=first_order,
    unroll_steps=unroll_steps,
    remat=remat,
    backtracking=backtracking,
  )
  _check_steps(num_steps, "maml_adapt")
  _check_second_order_steps(second_order_steps, "maml_adapt")
  checks.float_leaves("maml_adapt", "params", params)
  checks.rate("maml_adapt", "inner_lr", inner_lr, positive=True)
  _check_support("maml_adapt", loss_fn, params, support_x, support_y, "params")
  loss_grad = jax.grad(loss_fn)

  def make_step(differentiated: bool):
    def gradient(task_params, _):
      grads = loss_grad(task_params, support_x, support_y)
      return grads if differentiated else jax.lax.stop_gradient(grads)

    if backtracking:
      support_loss = lambda task_params, _: loss_fn(task_params, support_x, support_y)
      return backtracking_step(gradient, support_loss, inner_lr, first_order)

    def step(task_params, _):
      return sgd_step(task_params, gradient(task_params, None), inner_lr, first_order), None

    return step

  if num_steps == 0:
    return params
  init = (params, first_scale(params, support_x)) if backtracking else params
  adapted = _two_phase_scan(
    make_step, init, None, num_steps, second_order_steps, unroll_steps, remat
  )
  return adapted[0] if backtracking else adapted


def check_prediction(
  where: str, posterior: Gaussian, x, key, apply_fn: ApplyFn, num_mc_samples: int
) -> None:
  """`predict`'s checks of its arguments, at trace time; errors name `where`."""
  check_gaussian(posterior, where)
  check_inputs(where, x)
  _check_num_samples(num_mc_samples, where)
  checks.prng_key(where, "key", key)
  checks.network_fits(where, ("posterior", "x"), apply_fn, posterior.mean, x)


def predict(
  posterior: Gaussian,
  x: jax.Array,
  key: jax.Array,
  *,
  apply_fn: ApplyFn,
  num_mc_samples: int,
  sample_batching: batching.Batching = "vmap",
  draw_outputs: Optional[OutputSampler] = None,
) -> jax.Array:
  """Outputs of `apply_fn` under `num_mc_samples` weight draws.

  Args:
    posterior: a distribution over weights (usually from `adapt`).
    x: `[batch, ...]` inputs.
    key: PRNG key for the draws.
    apply_fn: `apply_fn(params, x)`, the network.
    num_mc_samples: L_v, number of draws.
    sample_batching: how the L_v forward passes are batched.
    draw_outputs: optional: draw the outputs with it instead of weights (the
      local reparameterisation trick): each example's outputs are
      distributed as under weight draws, the examples' draws independent.

  Returns:
    `[num_mc_samples, batch, ...]`: one network output per draw (logits for
    a classifier; average the softmax over axis 0 for the prediction).

  Examples:
    >>> model = vj.MLP((16,), 1)
    >>> posterior = vj.gaussian_from_params(
    ...   vj.init_params(model, jax.random.key(0), (1, 1)), jax.random.key(1)
    ... )
    >>> draws = vj.predict(posterior, jnp.zeros((7, 1)), jax.random.key(2),
    ...                    apply_fn=vj.pure_apply(model), num_mc_samples=10)
    >>> draws.shape  # one output per weight draw: [samples, batch, outputs]
    (10, 7, 1)
  """
  check_prediction("predict", posterior, x, key, apply_fn, num_mc_samples)
  if draw_outputs is not None:
    return draw_outputs(posterior, x, key, num_mc_samples)
  weights = sample(posterior, key, num_mc_samples)
  if num_mc_samples == 1:  # as in expected_nll: no vmap, so convolutions stay ungrouped
    return apply_fn(jax.tree_util.tree_map(lambda w: w[0], weights), x)[None]
  return batching.batched_map(
    lambda w: apply_fn(w, x), weights, strategy=sample_batching, chunk_size=num_mc_samples
  )
