"""SImPa's two networks: the generator of the base network's weights, and the PHI network.

The generator is SImPa's implicit task posterior q(w): latent noise z ~ U[0, 1)^128
goes through two ReLU layers (128 -> 256 -> 512) and one dense layer to every weight
of the base network, squashed by tanh (`Simpa.py`'s `FunctionalGenerator`). That last
layer maps 512 units to all P base weights: 512·P parameters (P = 7573 for Omniglot's
Conv4-16, about 57 M for Conv4-64). It is stored per base weight tensor, so the
weights it generates come out as the network's own tree, not as one flat vector to
cut up: `output_kernel` holds, for each base leaf of shape s, a `[512, *s]` array.
Mathematically it is the one dense layer of `Simpa.py`, whose rows are grouped by leaf.

The PHI network T_φ(w) (P -> 512 -> 256 -> 128 -> 1; batch norm on the batch's
statistics, no scale or offset, eps 0, then ReLU, after each of the first three
layers) makes `kl_lower_bound`, Donsker and Varadhan's lower bound on KL(q ‖ p) with
the prior p(w) = N(0, I). Its first layer is stored per base leaf too (`[*s, 512]`).

Both are initialised as `Simpa.py` initialises them (its `IdentityNet`):
Kaiming-normal kernels, std sqrt(2 / fan_in), and zero biases.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any

# Simpa.py's sizes: the latent noise, the generator's hidden layers, the PHI network's.
LATENT_DIM = 128
GENERATOR_HIDDEN = (256, 512)
PHI_HIDDEN = (512, 256, 128)


class Dense(NamedTuple):
  """A dense layer, `x @ kernel + bias`."""

  kernel: jax.Array  # [inputs, outputs]
  bias: jax.Array  # [outputs]


class Generator(NamedTuple):
  """z -> tanh(relu(relu(z W1 + b1) W2 + b2) W3 + b3): the base network's weights."""

  hidden: tuple  # Dense layers: [latent, 256], [256, 512]
  output_kernel: PyTree  # the base network's tree; a leaf of shape s is [512, *s]
  output_bias: PyTree  # the base network's tree; a leaf of shape s is [*s]


class PhiNetwork(NamedTuple):
  """T_φ(w): the PHI network whose Donsker-Varadhan bound lower-bounds KL(q ‖ p)."""

  input_kernel: PyTree  # the base network's tree; a leaf of shape s is [*s, 512]
  input_bias: jax.Array  # [512]
  hidden: tuple  # Dense layers: [512, 256], [256, 128]
  output: Dense  # [128, 1]


def _he_normal(key: jax.Array, shape: tuple, fan_in: int) -> jax.Array:
  """Kaiming-normal entries, std sqrt(2 / fan_in) (torch's `kaiming_normal_`, ReLU gain)."""
  return math.sqrt(2.0 / fan_in) * jax.random.normal(key, shape, jnp.float32)


def _dense_layers(key: jax.Array, sizes: tuple) -> tuple:
  keys = jax.random.split(key, len(sizes) - 1)
  return tuple(
    Dense(_he_normal(k, (fan_in, fan_out), fan_in), jnp.zeros((fan_out,), jnp.float32))
    for k, fan_in, fan_out in zip(keys, sizes[:-1], sizes[1:])
  )


def _per_leaf(key: jax.Array, params: PyTree, make) -> PyTree:
  """`make(leaf_key, leaf)` for every leaf of `params`, each with its own key."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(key, max(len(leaves), 1))
  return jax.tree_util.tree_unflatten(treedef, [make(k, leaf) for k, leaf in zip(keys, leaves)])


def num_weights(params: PyTree) -> int:
  """P, the number of weights of a tree."""
  return sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params))


def init_generator(
  params: PyTree, key: jax.Array, latent_dim: int = LATENT_DIM, hidden=GENERATOR_HIDDEN
) -> Generator:
  """A generator of weight trees shaped like `params` (whose values it does not use)."""
  hidden_key, output_key = jax.random.split(key)
  width = hidden[-1]
  return Generator(
    _dense_layers(hidden_key, (latent_dim, *hidden)),
    _per_leaf(output_key, params, lambda k, leaf: _he_normal(k, (width, *jnp.shape(leaf)), width)),
    jax.tree_util.tree_map(lambda leaf: jnp.zeros(jnp.shape(leaf), jnp.float32), params),
  )


def init_phi_network(params: PyTree, key: jax.Array, hidden=PHI_HIDDEN) -> PhiNetwork:
  """A PHI network on weight trees shaped like `params`."""
  input_key, hidden_key, output_key = jax.random.split(key, 3)
  fan_in = num_weights(params)
  return PhiNetwork(
    _per_leaf(
      input_key, params, lambda k, leaf: _he_normal(k, (*jnp.shape(leaf), hidden[0]), fan_in)
    ),
    jnp.zeros((hidden[0],), jnp.float32),
    _dense_layers(hidden_key, hidden),
    _dense_layers(output_key, (hidden[-1], 1))[0],
  )


def latent_dim(generator: Generator) -> int:
  return generator.hidden[0].kernel.shape[0]


def draw_latents(key: jax.Array, num_draws: int, size: int) -> jax.Array:
  """z ~ U[0, 1)^size, `[num_draws, size]` (`Simpa.py`: `torch.rand(num_draws, 128)`)."""
  return jax.random.uniform(key, (num_draws, size), jnp.float32)


def draw_prior(key: jax.Array, like: PyTree, num_draws: int) -> PyTree:
  """w ~ N(0, I), a tree shaped like `like` with a leading `[num_draws]` axis on every leaf."""
  return _per_leaf(
    key, like, lambda k, leaf: jax.random.normal(k, (num_draws, *jnp.shape(leaf)), jnp.float32)
  )


def generate(generator: Generator, latents: jax.Array) -> PyTree:
  """The weights of each latent draw: a base tree, every leaf `[num_draws, *shape]`.

  Args:
    generator: the generator.
    latents: `[num_draws, latent_dim]`.
  """
  hidden = latents
  for layer in generator.hidden:
    hidden = jax.nn.relu(hidden @ layer.kernel + layer.bias)
  return jax.tree_util.tree_map(
    lambda kernel, bias: jnp.tanh(jnp.tensordot(hidden, kernel, axes=1) + bias),
    generator.output_kernel,
    generator.output_bias,
  )


def _batch_norm(x: jax.Array) -> jax.Array:
  """(x - mean) / std over the batch (axis 0), biased variance, eps 0, no scale or offset."""
  mean = jnp.mean(x, axis=0)
  variance = jnp.mean(jnp.square(x - mean), axis=0)
  return (x - mean) / jnp.sqrt(variance)


def phi_outputs(phi: PhiNetwork, weights: PyTree) -> jax.Array:
  """T_φ(w) of a batch of weight trees (every leaf `[batch, *shape]`): `[batch]`.

  Batch norm uses this batch's statistics, so the result depends on the whole
  batch, as `Simpa.py`'s (each of its batches is 512 draws of one distribution).
  """
  pre_activation = phi.input_bias + sum(
    jnp.tensordot(w, k, axes=jnp.ndim(k) - 1)
    for w, k in zip(jax.tree_util.tree_leaves(weights), jax.tree_util.tree_leaves(phi.input_kernel))
  )
  hidden = jax.nn.relu(_batch_norm(pre_activation))
  for layer in phi.hidden:
    hidden = jax.nn.relu(_batch_norm(hidden @ layer.kernel + layer.bias))
  return (hidden @ phi.output.kernel + phi.output.bias)[:, 0]


def kl_lower_bound(
  generator: Generator, phi: PhiNetwork, key: jax.Array, num_samples: int = 512
) -> jax.Array:
  """`Simpa.py`'s estimate of KL(q ‖ p): E_q[T] − log Σ_p exp(T) − log N.

  With N draws w_i = G(z_i) from the generator and N draws w'_j ~ N(0, I):

    mean_i T(w_i) − logsumexp_j T(w'_j) − log N.

  Donsker and Varadhan's bound is KL ≥ E_q[T] − log E_p[exp T], whose estimate is
  mean_i T(w_i) − logsumexp_j T(w'_j) + log N; `Simpa.py`'s `estimate_KL_lower_bound`
  subtracts log N where the bound adds it, so its value is the bound minus 2 log N
  (12.48 for N = 512). That changes no gradient of the bound, but it shifts the bound
  terms' square roots and where they are defined (`simpa.bound_term`); we compute what
  `Simpa.py` computes.

  Args:
    generator: q's generator.
    phi: the PHI network.
    key: the draws' key, split into the latents' and the prior's.
    num_samples: N, draws from q and from p (`Simpa.py`: 512).
  """
  latent_key, prior_key = jax.random.split(key)
  from_q = generate(generator, draw_latents(latent_key, num_samples, latent_dim(generator)))
  from_prior = draw_prior(prior_key, generator.output_bias, num_samples)
  return (
    jnp.mean(phi_outputs(phi, from_q))
    - jax.nn.logsumexp(phi_outputs(phi, from_prior))
    - math.log(num_samples)
  )


def hyper_prior_kl(generator: Generator) -> jax.Array:
  """`Simpa.py`'s KL of the generator to its hyper-prior, as the code computes it.

  `KL_divergence_standard_normal` takes the generator's six tensors in their order
  (W1, b1, W2, b2, W3, b3) and reads the first half as the means and the second half
  as the log-stds of a diagonal Gaussian, which it compares with N(0, I):

    ½ [Σ W1² + Σ b1² + Σ W2² + Σ (exp(2 s) − 2 s) over s in b2, W3, b3] − 9/2,

  the −9/2 being its "− n" for each of the 3 pairs, with n = 3 pairs, not a count of
  elements (a constant: it changes no gradient). W3 and b3 are the output layer, here
  every leaf of `output_kernel` and `output_bias`.
  """
  tensors = [t for layer in generator.hidden for t in layer]  # W1, b1, W2, b2
  tensors += [generator.output_kernel, generator.output_bias]  # W3, b3: one tree each
  num_pairs = len(tensors) // 2
  total = lambda tree, f: sum(jnp.sum(f(leaf)) for leaf in jax.tree_util.tree_leaves(tree))
  square_sum = sum(total(m, jnp.square) for m in tensors[:num_pairs])
  spread_sum = sum(total(s, lambda s: jnp.exp(2.0 * s) - 2.0 * s) for s in tensors[num_pairs:])
  return 0.5 * (square_sum + spread_sum - num_pairs * num_pairs)
