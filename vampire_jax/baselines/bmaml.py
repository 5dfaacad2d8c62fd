"""BMAML (Yoon et al. 2018, "Bayesian Model-Agnostic Meta-Learning").

The meta-parameters are M particles Θ_0 = {θ^1..θ^M}: M weight trees stacked
on a leading `[M]` axis. Fast adaptation moves all of them by Stein
variational gradient descent (SVGD, Liu & Wang 2016) on the support set:

  θ_i ← θ_i + α φ(θ_i)
  φ(θ_i) = (1/M) Σ_j [ k(θ_j, θ_i) ∇ log p(θ_j | D_tr) + ∇_{θ_j} k(θ_j, θ_i) ]

with the tempered posterior log p(θ | D_tr) = −L(θ; D_tr) (L: mean NLL), the
RBF kernel on the squared distance D_ij = ‖θ_i − θ_j‖² (all weights),

  k(θ_j, θ_i) = exp(−D_ij / h),  ∇_{θ_j} k(θ_j, θ_i) = (2 / h) k(θ_j, θ_i) (θ_i − θ_j),

and the median heuristic h = median(D) / log M (median over the full M x M
matrix, diagonal included, as in the BMAML and SVGD reference code; h is a
constant for differentiation, as there). With one particle, k = 1 and the
repulsive term vanishes: SVGD is gradient descent (MAML).

Meta-loss, Bayesian fast adaptation (BFA, the default): the query
likelihood of the adapted particle ensemble, per query example,

  −(1/N) log[(1/M) Σ_m p(D_te | θ_n^m)],  p(D_te | θ) = exp(−N L(θ; D_te)).

Optional chaser loss (BMAML's meta-update): the leader Θ_{n+s} takes s more
SVGD steps on D_tr ∪ D_te from the follower Θ_n, and the loss is
Σ_m ‖θ_n^m − stop_gradient(θ_{n+s}^m)‖².
"""

import math
from typing import Any, Literal, Optional

import jax
import jax.numpy as jnp

from vampire_jax._src.core import adaptation, batching, losses
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.learners import MetaLearner, check_settings, default_inner_lr
from vampire_jax._src.core.tasks import Task
from vampire_jax.baselines import _ensemble

PyTree = Any


def pairwise_squared_distances(particles: PyTree) -> jax.Array:
  """D_ij = ‖θ_i − θ_j‖² summed over every weight; particles stacked on axis 0.

  Computed as ‖θ_i‖² + ‖θ_j‖² − 2 θ_i·θ_j from the Gram matrix, so no
  `[M, M, num_weights]` difference tensor is built (per task, under vmap).

  Returns:
    `[M, M]`, symmetric with an exactly zero diagonal.
  """
  flat = jnp.concatenate(
    [jnp.reshape(leaf, (jnp.shape(leaf)[0], -1)) for leaf in jax.tree_util.tree_leaves(particles)],
    axis=1,
  )
  squared_norms = jnp.sum(jnp.square(flat), axis=1)
  gram = flat @ flat.T
  distances = jnp.maximum(squared_norms[:, None] + squared_norms[None, :] - 2.0 * gram, 0.0)
  return jnp.where(jnp.eye(flat.shape[0], dtype=bool), 0.0, distances)


def median_bandwidth(squared_distances: jax.Array) -> jax.Array:
  """h = median(D) / log M, the median heuristic on squared distances.

  One particle, or particles that all coincide, have no scale: h = 1 then
  (every kernel value is 1 whatever h is). h carries no gradient.
  """
  num_particles = squared_distances.shape[0]
  if num_particles == 1:
    return jnp.ones((), squared_distances.dtype)
  median = jax.lax.stop_gradient(jnp.median(squared_distances))
  return jnp.where(median > 0, median, 1.0) / math.log(num_particles)


def rbf_kernel(particles: PyTree) -> tuple[jax.Array, jax.Array]:
  """The kernel matrix k_ij = exp(−D_ij / h) `[M, M]` and the bandwidth h."""
  squared_distances = pairwise_squared_distances(particles)
  bandwidth = median_bandwidth(squared_distances)
  return jnp.exp(-squared_distances / bandwidth), bandwidth


def kernel_gradient(particles: PyTree, kernel: jax.Array, bandwidth: jax.Array) -> PyTree:
  """Σ_j ∇_{θ_j} k(θ_j, θ_i) = (2 / h) (θ_i Σ_j k_ij − Σ_j k_ij θ_j), for every i.

  The gradient of exp(−‖θ_j − θ_i‖² / h) with respect to θ_j: the same
  squared distance as the kernel, hence the factor 2.
  """
  kernel_sums = jnp.sum(kernel, axis=1)

  def leaf_gradient(leaf):
    sums = jnp.reshape(kernel_sums, (-1,) + (1,) * (leaf.ndim - 1))
    return (2.0 / bandwidth) * (leaf * sums - jnp.tensordot(kernel, leaf, axes=1))

  return jax.tree_util.tree_map(leaf_gradient, particles)


def svgd_direction(particles: PyTree, log_prob_grads: PyTree) -> PyTree:
  """φ(θ_i) = (1/M) Σ_j [k_ij ∇ log p(θ_j) + ∇_{θ_j} k(θ_j, θ_i)], the ascent direction.

  Args:
    particles: weight trees stacked on a leading `[M]` axis.
    log_prob_grads: ∇ log p at each particle, stacked like `particles`.

  Returns:
    φ, stacked like `particles`.
  """
  kernel, bandwidth = rbf_kernel(particles)
  repulsion = kernel_gradient(particles, kernel, bandwidth)
  num_particles = kernel.shape[0]
  return jax.tree_util.tree_map(
    lambda g, r: (jnp.tensordot(kernel, g, axes=1) + r) / num_particles, log_prob_grads, repulsion
  )


def svgd_adapt(
  particles: PyTree,
  x: jax.Array,
  y: jax.Array,
  *,
  loss_fn: adaptation.LossFn,
  num_steps: int,
  inner_lr: float,
  first_order: bool = False,
  particle_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
) -> PyTree:
  """`num_steps` SVGD steps θ ← θ + inner_lr · φ(θ) towards exp(−loss_fn(θ; x, y)).

  Args:
    particles: weight trees stacked on a leading `[M]` axis.
    x, y: the data, `[batch, ...]`.
    loss_fn: `loss_fn(params, x, y)`, the mean NLL under one weight tree.
    num_steps: SVGD steps (0 returns `particles`).
    inner_lr: α.
    first_order: treat each SVGD direction as a constant of the particles.
    particle_batching: how the M gradient evaluations are batched.
    unroll_steps: unroll the scan over steps.

  Returns:
    The moved particles, stacked like `particles`.
  """
  checks.flags("svgd_adapt", first_order=first_order, unroll_steps=unroll_steps)
  if int(num_steps) != num_steps or num_steps < 0:
    raise ValueError(f"num_steps must be an integer >= 0, got {num_steps}")
  loss_grad = jax.grad(loss_fn)

  def step(current, _):
    log_prob_grads = jax.tree_util.tree_map(
      jnp.negative, _ensemble.map_members(lambda p: loss_grad(p, x, y), current, particle_batching)
    )
    direction = svgd_direction(current, log_prob_grads)
    if first_order:
      direction = jax.lax.stop_gradient(direction)
    return jax.tree_util.tree_map(lambda p, d: p + inner_lr * d, current, direction), None

  if num_steps == 0:
    return particles
  adapted, _ = jax.lax.scan(step, particles, None, length=num_steps, unroll=bool(unroll_steps))
  return adapted


def ensemble_nll(nll: losses.Likelihood, outputs: jax.Array, y: jax.Array) -> jax.Array:
  """BFA's loss −(1/N) log[(1/M) Σ_m exp(−N L_m)], L_m the m-th member's mean NLL.

  Args:
    nll: the likelihood, a mean over the N examples.
    outputs: `[M, N, ...]` network outputs of the M particles.
    y: `[N, ...]` targets.
  """
  num_examples = jnp.shape(y)[0]
  member_nll = jax.vmap(nll, in_axes=(0, None))(outputs, y)
  log_mean_likelihood = jax.nn.logsumexp(-num_examples * member_nll) - math.log(outputs.shape[0])
  return -log_mean_likelihood / num_examples


def init_particles(params: PyTree, key: jax.Array, num_particles: int) -> PyTree:
  """M particles from one initial weight tree, stacked on a leading `[M]` axis.

  Each particle's leaf is a random permutation of the entries of `params`'
  leaf: for an initialiser that draws a leaf's entries i.i.d. (Xavier/He
  normal, zeros, ones; all of this library's models) every particle is then
  distributed as a fresh initialisation, without needing the initialiser.
  """
  if int(num_particles) != num_particles or num_particles < 1:
    raise ValueError(f"num_particles must be an integer >= 1, got {num_particles}")
  leaves, treedef = jax.tree_util.tree_flatten(params)
  leaf_keys = jax.random.split(key, max(len(leaves), 1))

  def leaf_particles(leaf, leaf_key):
    flat = jnp.reshape(leaf, (-1,))
    permuted = jax.vmap(lambda k: jax.random.permutation(k, flat))(
      jax.random.split(leaf_key, num_particles)
    )
    return jnp.reshape(permuted, (num_particles,) + jnp.shape(leaf))

  return jax.tree_util.tree_unflatten(
    treedef, [leaf_particles(l, k) for l, k in zip(leaves, leaf_keys)]
  )


def bmaml(
  apply_fn: adaptation.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_particles: int = 10,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  meta_objective: Literal["bfa", "mean_nll", "chaser"] = "bfa",
  num_leader_steps: int = 1,
  first_order: bool = False,
  particle_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
) -> MetaLearner:
  """BMAML as a `MetaLearner`; meta-parameters are `num_particles` stacked weight trees.

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs, e.g. `losses.categorical_nll`.
    num_particles: M.
    num_inner_steps: n, SVGD steps on the support set.
    inner_lr: α, the SVGD step size.
    meta_objective: 'bfa', Bayesian fast adaptation (BMAML's meta-loss without chaser: the
      query likelihood of the particle ensemble, the default; the VAMPIRE
      paper trained BMAML without chaser loss); 'mean_nll', the particles'
      query NLLs averaged (the VAMPIRE authors' re-implementation); or
      'chaser', BMAML's chaser loss.
    num_leader_steps: s, the leader's extra SVGD steps on support ∪ query
      (chaser loss only).
    first_order: treat each SVGD direction as a constant.
    particle_batching: how the M particles' forward/backward passes are
      batched.
    unroll_steps: unroll the SVGD steps.
  """
  checks.flags("bmaml", first_order=first_order, unroll_steps=unroll_steps)
  check_settings(
    "bmaml",
    inner_lr,
    num_particles=(num_particles, 1),
    num_inner_steps=(num_inner_steps, 0),
    num_leader_steps=(num_leader_steps, 0),
  )
  inner_lr = default_inner_lr(nll, 0.1) if inner_lr is None else inner_lr
  if meta_objective not in ("bfa", "mean_nll", "chaser"):
    raise ValueError(
      f"meta_objective must be 'bfa', 'mean_nll' or 'chaser', got {meta_objective!r}"
    )
  loss_fn = losses.loss_from_apply(apply_fn, nll)

  def svgd(particles, x, y, num_steps):
    return svgd_adapt(
      particles,
      x,
      y,
      loss_fn=loss_fn,
      num_steps=num_steps,
      inner_lr=inner_lr,
      first_order=first_order,
      particle_batching=particle_batching,
      unroll_steps=unroll_steps,
    )

  def init(params, key):
    return init_particles(params, key, num_particles)

  def adapt(particles, support_x, support_y, key):
    del key  # SVGD is deterministic
    return svgd(particles, support_x, support_y, num_inner_steps)

  def predict(particles, x, key):
    del key
    return _ensemble.apply_members(apply_fn, particles, x, particle_batching)

  def meta_loss(particles, task: Task, key):
    follower = adapt(particles, task.support_x, task.support_y, key)
    outputs = predict(follower, task.query_x, key)
    if meta_objective == "bfa":
      return ensemble_nll(nll, outputs, task.query_y), outputs
    if meta_objective == "mean_nll":
      return _ensemble.mean_member_nll(nll, outputs, task.query_y), outputs
    leader = jax.lax.stop_gradient(
      svgd(
        follower,
        _ensemble.concat_examples(task.support_x, task.query_x),
        _ensemble.concat_examples(task.support_y, task.query_y),
        num_leader_steps,
      )
    )
    distance = sum(
      jnp.sum(jnp.square(f - l))
      for f, l in zip(jax.tree_util.tree_leaves(follower), jax.tree_util.tree_leaves(leader))
    )
    return distance, outputs

  return MetaLearner(init, adapt, predict, nll, meta_loss)
