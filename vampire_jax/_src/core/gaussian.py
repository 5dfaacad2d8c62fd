"""Diagonal Gaussian distributions over parameter pytrees.

A distribution over a network's weights is two trees with the network's
structure: the means and the log standard deviations (`sigma = exp(log_std)`,
the paper's `rho`). `jax.grad`, `vmap` and optax see it as a plain pytree.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.distrax_import import import_distrax
from vampire_jax._src.core.errors import InputError

PyTree = Any


class Gaussian(NamedTuple):
  """N(mean, diag(exp(log_std))^2) over a parameter tree.

  Attributes:
    mean: tree of arrays, the network's parameter structure.
    log_std: tree with exactly the structure and shapes of `mean`.
  """

  mean: PyTree
  log_std: PyTree


def check_gaussian(dist: Gaussian, where: str = "check_gaussian") -> None:
  """Raises ValueError unless `mean` and `log_std` are trees of equal shapes.

  Every leaf must be float32 or wider (`InputError` names the first that is
  not): an integer cannot take a gradient step, and in bfloat16 or float16 a
  step of 1e-3 on a log-std near -3.5 rounds to no change, so the
  uncertainty would stay frozen while the means move (issue 40). Keep the
  distribution in float32 and compute the network in low precision with
  `vj.mixed_precision`.
  """
  if not isinstance(dist, Gaussian):
    raise TypeError(f"expected a vampire_jax.Gaussian, got {type(dist).__name__}")
  mean_def = jax.tree_util.tree_structure(dist.mean)
  std_def = jax.tree_util.tree_structure(dist.log_std)
  if mean_def != std_def:
    raise ValueError(
      "Gaussian.mean and Gaussian.log_std must have the same tree structure;"
      f" got {mean_def} and {std_def}"
    )
  for path, m, s in zip(
    jax.tree_util.tree_leaves_with_path(dist.mean),
    jax.tree_util.tree_leaves(dist.mean),
    jax.tree_util.tree_leaves(dist.log_std),
  ):
    if jnp.shape(m) != jnp.shape(s):
      raise ValueError(
        f"Gaussian leaf {jax.tree_util.keystr(path[0])}: mean has shape"
        f" {jnp.shape(m)} but log_std has shape {jnp.shape(s)}"
      )
  check_float32_or_wider(where, "mean", dist.mean)
  check_float32_or_wider(where, "log_std", dist.log_std)


def check_float32_or_wider(where: str, name: str, tree: PyTree) -> None:
  """InputError naming the first leaf of `tree` that is not a float of 32 bits or more."""
  checks.float_leaves(where, name, tree)
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    dtype = jnp.result_type(leaf)
    if jnp.finfo(dtype).bits < 32:
      raise InputError(
        f"{where}: {name}{jax.tree_util.keystr(path)} is {dtype}, where gradient steps on a "
        "log-std round to no change; keep the distribution in float32 "
        "(vj.gaussian_from_params does) and compute in low precision with vj.mixed_precision"
      )


def gaussian_from_params(
  params: PyTree, key: jax.Array, log_std_range: tuple[float, float] = (-4.0, -3.0)
) -> Gaussian:
  """Wraps a point estimate as a Gaussian with small random spread.

  Args:
    params: tree of arrays, used as the means.
    key: PRNG key for the log-stds.
    log_std_range: log-stds are drawn uniformly in `[low, high)`; the
      authors' code uses [-4, -3].

  Returns:
    `Gaussian(mean=params, log_std=...)` with `log_std` leaves of the means'
    shapes and dtypes, except that bfloat16 and float16 leaves become float32,
    means and log-stds alike: steps on a log-std round away at that precision
    (see `check_gaussian`). Compute in low precision with `vj.mixed_precision`.

  Raises:
    InputError: a non-finite or reversed `log_std_range`, or a leaf that is
      not a float.

  Examples:
    >>> params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
    >>> prior = vj.gaussian_from_params(params, jax.random.key(0))
    >>> prior.mean["w"].shape, -4.0 <= float(prior.log_std["w"].min()) <= -3.0
    ((3, 2), True)
  """
  low, high = log_std_range
  if not (math.isfinite(low) and math.isfinite(high) and low <= high):
    raise InputError(
      f"gaussian_from_params: log_std_range must be finite (low, high) with low <= high, "
      f"got {log_std_range}"
    )
  leaves, treedef = jax.tree_util.tree_flatten(params)
  checks.float_leaves("gaussian_from_params", "params", params)
  leaves = [
    jnp.asarray(leaf, jnp.float32) if jnp.finfo(jnp.result_type(leaf)).bits < 32 else leaf
    for leaf in leaves
  ]
  params = jax.tree_util.tree_unflatten(treedef, leaves)
  keys = jax.random.split(key, max(len(leaves), 1))
  log_std = [
    jax.random.uniform(k, jnp.shape(leaf), jnp.result_type(leaf), low, high)
    for k, leaf in zip(keys, leaves)
  ]
  return Gaussian(params, jax.tree_util.tree_unflatten(treedef, log_std))


def point_mass(params: PyTree, log_std: float = -30.0) -> Gaussian:
  """A Gaussian so narrow that its samples are `params` to float precision."""
  return Gaussian(params, jax.tree_util.tree_map(lambda p: jnp.full_like(p, log_std), params))


def _normal_like(key: jax.Array, tree: PyTree, num_samples: int) -> PyTree:
  """Standard normal noise with a leading [num_samples] axis on every leaf.

  One draw for the whole tree, sliced into leaves. The draw runs in a loop
  of two halves on purpose: XLA fuses a random-number generator into every
  operation that reads its output, so inside a meta-gradient (where the noise
  is read by each leaf's forward, backward and second-order terms) one
  generator became about 160 copies, tripling compile time and costing 40 %
  of a CPU step (docs/performance.md). A loop's output is a buffer that
  cannot be fused into its readers, and a loop of one trip would be removed.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  sizes = [int(np.prod(jnp.shape(leaf))) for leaf in leaves]
  dtype = jnp.result_type(*leaves) if leaves else jnp.float32
  total = num_samples * max(sum(sizes), 1)
  half = -(-total // 2)
  flat = jax.lax.map(lambda k: jax.random.normal(k, (half,), dtype), jax.random.split(key, 2))
  flat = flat.reshape(-1)[:total].reshape(num_samples, -1)
  offsets = np.cumsum([0] + sizes)
  noise = [
    flat[:, start:stop].reshape((num_samples,) + jnp.shape(leaf)).astype(jnp.result_type(leaf))
    for leaf, start, stop in zip(leaves, offsets[:-1], offsets[1:])
  ]
  return jax.tree_util.tree_unflatten(treedef, noise)


def sample(dist: Gaussian, key: jax.Array, num_samples: int) -> PyTree:
  """Draws weights with the reparameterisation trick.

  w = mean + eps * exp(log_std),  eps ~ N(0, I), so gradients flow into both
  `mean` and `log_std`.

  Args:
    dist: the distribution.
    key: PRNG key.
    num_samples: number of draws, a Python int >= 1.

  Returns:
    A tree with the structure of `dist.mean`, each leaf `[num_samples, *shape]`.

  Examples:
    >>> prior = vj.gaussian_from_params({"w": jnp.zeros((3, 2))}, jax.random.key(0))
    >>> vj.sample(prior, jax.random.key(1), num_samples=5)["w"].shape  # [samples, 3, 2]
    (5, 3, 2)
  """
  if int(num_samples) < 1:
    raise ValueError(f"num_samples must be >= 1, got {num_samples}")
  eps = _normal_like(key, dist.mean, int(num_samples))
  return jax.tree_util.tree_map(lambda m, s, e: m + e * jnp.exp(s), dist.mean, dist.log_std, eps)


def kl_divergence(q: Gaussian, p: Gaussian) -> jax.Array:
  """KL(q || p) between diagonal Gaussians, summed over every weight.

  KL = sum[ log s_p - log s_q + (s_q^2 + (m_q - m_p)^2) / (2 s_p^2) - 1/2 ]

  Args:
    q: the first distribution (e.g. a task posterior).
    p: the second (e.g. the meta-learned prior), with q's tree structure.

  Returns:
    A float scalar.

  Examples:
    >>> q = vj.Gaussian(mean={"w": jnp.ones(4)}, log_std={"w": jnp.zeros(4)})
    >>> p = vj.Gaussian(mean={"w": jnp.zeros(4)}, log_std={"w": jnp.zeros(4)})
    >>> float(vj.kl_divergence(q, p))  # 4 weights, each (1 - 0)**2 / 2
    2.0
  """

  def leaf_kl(m_q, s_q, m_p, s_p):
    # Written with exp(2 (s_q - s_p)) so that very narrow distributions do not
    # overflow the variance ratio.
    var_ratio = jnp.exp(2.0 * (s_q - s_p))
    mean_term = jnp.square((m_q - m_p) * jnp.exp(-s_p))
    return jnp.sum(s_p - s_q + 0.5 * (var_ratio + mean_term) - 0.5)

  _check_same_shapes(q, p)
  per_leaf = jax.tree_util.tree_map(leaf_kl, q.mean, q.log_std, p.mean, p.log_std)
  return sum(jax.tree_util.tree_leaves(per_leaf), jnp.zeros(()))


def standard_normal_like(dist: Gaussian) -> Gaussian:
  """N(0, I) over `dist`'s weights: zero means and zero log-stds, leaf by leaf.

  The KL target of Vampire2 (the authors' 2021 VAMPIRE, `vj.vampire(...,
  kl_target="standard_normal")`): `kl_divergence(q, standard_normal_like(q))`
  is KL(q || N(0, I)) = sum[(m_q^2 + s_q^2 - 1) / 2 - log s_q], summed over
  every weight. The authors' `KL_divergence_standard_normal` subtracts, instead
  of 1 per weight, the number n of weight tensors once per tensor (n^2 in all,
  then halved): a constant, so every gradient is the same, and only the value
  differs, by (n^2 - number of weights) / 2.
  """
  return jax.tree_util.tree_map(jnp.zeros_like, dist)


def _check_same_shapes(q: Gaussian, p: Gaussian) -> None:
  """InputError unless q's and p's means and log-stds have one structure and equal shapes
  leaf by leaf (a KL of broadcast leaves sums over elements neither distribution has)."""
  structures = {
    name: jax.tree_util.tree_structure(tree)
    for name, tree in (("q.mean", q.mean), ("q.log_std", q.log_std), ("p.mean", p.mean))
  }
  structures["p.log_std"] = jax.tree_util.tree_structure(p.log_std)
  reference = structures["q.mean"]
  for name, structure in structures.items():
    if structure != reference:
      raise InputError(
        f"kl_divergence: {name} has another tree structure than q.mean ({structure.num_leaves} "
        f"leaves against {reference.num_leaves}); q and p must describe the same weights"
      )
  leaves = [jax.tree_util.tree_leaves_with_path(t) for t in (q.mean, q.log_std, p.mean, p.log_std)]
  for (path, m_q), (_, s_q), (_, m_p), (_, s_p) in zip(*leaves):
    shapes = [jnp.shape(x) for x in (m_q, s_q, m_p, s_p)]
    if len(set(shapes)) > 1:
      raise InputError(
        f"kl_divergence: the leaf {jax.tree_util.keystr(path)} has shapes {shapes[0]} "
        f"(q.mean), {shapes[1]} (q.log_std), {shapes[2]} (p.mean), {shapes[3]} "
        "(p.log_std); they must be equal (no broadcasting)"
      )


def to_distrax(dist: Gaussian) -> PyTree:
  """The same distribution as a tree of `distrax.Normal`, one per weight leaf.

  Each leaf is `distrax.Normal(mean, exp(log_std))` of the leaf's shape and
  dtype; `gaussian_from_distrax` inverts it. distrax's `kl_divergence` of two
  such trees, summed, is `vj.kl_divergence`, and its `log_prob` scores
  `vj.sample`'s draws, to float rounding (`tests/metrics/test_predictive.py`).
  """
  distrax = import_distrax()  # on first use (seconds): not with `import vampire_jax`

  if not isinstance(dist, Gaussian):
    raise checks.fail(
      "vj.to_distrax", "dist", "a vj.Gaussian(mean, log_std)", checks.describe(dist)
    )
  check_gaussian(dist, "vj.to_distrax")
  return jax.tree_util.tree_map(lambda m, s: distrax.Normal(m, jnp.exp(s)), dist.mean, dist.log_std)


def gaussian_from_distrax(tree: PyTree) -> Gaussian:
  """A `Gaussian` from a tree of `distrax.Normal` leaves (`to_distrax`'s inverse).

  Each leaf's `loc` and `scale` are broadcast to its batch shape and keep
  their dtype (float64 stays float64 under x64), except that bfloat16 and
  float16 become float32, as in `gaussian_from_params`.

  Raises:
    InputError: a leaf that is not a `distrax.Normal`, or (where concrete,
      i.e. outside `jit`) a scale that is not finite and > 0 or a loc that is
      not finite: log(scale) would be -inf or NaN.
  """
  distrax = import_distrax()
  where = "vj.gaussian_from_distrax"

  def is_normal(x) -> bool:
    return isinstance(x, distrax.Normal)

  leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_normal)
  others = [leaf for leaf in leaves if not is_normal(leaf)]
  if not leaves or others:
    got = f"a leaf {checks.describe(others[0])}" if others else "no leaves"
    raise checks.fail(where, "tree", "a tree of distrax.Normal leaves only (vj.to_distrax's)", got)

  def wide_float(x, shape):
    x = jnp.broadcast_to(jnp.asarray(x), shape)
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating) or jnp.finfo(dtype).bits < 32:
      x = x.astype(jnp.float32)
    return x

  for path, leaf in jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_normal):
    if not checks.concrete((leaf.loc, leaf.scale)):
      continue  # under jit: a NaN log-std shows in the caller's metrics
    scale, loc = np.asarray(leaf.scale, np.float64), np.asarray(leaf.loc, np.float64)
    name = f"tree{jax.tree_util.keystr(path)}"
    if not np.all(np.isfinite(scale) & (scale > 0)):
      bad = scale[~(np.isfinite(scale) & (scale > 0))]
      raise checks.fail(
        where,
        f"{name}.scale",
        "finite and > 0 (its log is the log-std)",
        f"{bad.size} values such as {float(bad.reshape(-1)[0])}",
      )
    if not np.all(np.isfinite(loc)):
      raise checks.fail(where, f"{name}.loc", "finite", f"{np.sum(~np.isfinite(loc))} NaN or inf")
  mean = jax.tree_util.tree_map(lambda d: wide_float(d.loc, d.batch_shape), tree, is_leaf=is_normal)
  log_std = jax.tree_util.tree_map(
    lambda d: jnp.log(wide_float(d.scale, d.batch_shape)), tree, is_leaf=is_normal
  )
  return Gaussian(mean, log_std)


def kl_step_factor(prior: Gaussian, inner_lr: float, kl_weight: float) -> jax.Array:
  """Largest inner_lr * kl_weight / sigma_p^2 over all weights.

  Near the prior, the KL term alone moves a posterior mean by
  delta <- delta * (1 - inner_lr * kl_weight / sigma_p^2), so the inner loop
  is stable only while this factor is below 2 (and monotone below 1). The
  paper's Omniglot setting (inner_lr 0.1, kl_weight 0.1, sigma_p ~ e^-3.5)
  gives about 11-30: see docs/fidelity.md.
  """
  if not isinstance(prior, Gaussian):
    raise InputError(
      f"kl_step_factor: prior must be a vj.Gaussian (VAMPIRE's, ABML's or Vampire2's "
      f"meta-parameters), got a {type(prior).__name__}: only those learners take KL steps in "
      "their inner loop"
    )
  leaves = jax.tree_util.tree_leaves(prior.log_std)
  if not leaves:
    raise InputError("kl_step_factor: the prior has no weights (an empty tree)")
  largest_inv_var = jnp.exp(-2.0 * jnp.min(jnp.stack([jnp.min(s) for s in leaves])))
  # A KL weight of 0 takes no KL step, also where a point mass's 1 / sigma_p^2 overflows.
  return jnp.where(kl_weight == 0, 0.0, inner_lr * kl_weight * largest_inv_var)
