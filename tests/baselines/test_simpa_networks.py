import math

import jax
import numpy as np

import vampire_jax as vj
from tests.helpers import _flat, simpa_module
from vampire_jax.baselines import _simpa_networks as networks

NOISE_STD = 0.3


def _tiny(**settings):
  model = vj.MLP((6,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  options = dict(tasks_per_step=2, num_inner_steps=2, inner_lr=0.01, num_kl_samples=16)
  learner = vj.baselines.simpa(
    vj.pure_apply(model), vj.gaussian_nll(NOISE_STD), **{**options, **settings}
  )
  return learner, learner.init(params, jax.random.key(1)), params


def _flat_rows(tree, axis) -> np.ndarray:
  """`[N, P]`: every leaf's `axis` moved first, the rest flattened, leaves side by side."""
  return np.concatenate(
    [
      np.reshape(np.moveaxis(np.asarray(leaf), axis, 0), (np.shape(leaf)[axis], -1))
      for leaf in jax.tree_util.tree_leaves(tree)
    ],
    axis=1,
  )


def _numpy_phi(phi, x: np.ndarray) -> np.ndarray:
  """Simpa.py's PHI network on flat `[N, P]` inputs: [linear, BN eps 0, ReLU] x 3, linear."""
  layers = [(_flat_rows(phi.input_kernel, -1).T, phi.input_bias)]
  layers += [(layer.kernel, layer.bias) for layer in phi.hidden]
  x = x.astype(np.float64)
  for kernel, bias in layers:
    x = x @ np.asarray(kernel, np.float64) + np.asarray(bias)
    x = np.maximum((x - x.mean(0)) / np.sqrt(x.var(0)), 0.0)
  return (x @ np.asarray(phi.output.kernel, np.float64) + np.asarray(phi.output.bias))[:, 0]


def test_the_generator_is_one_dense_layer_over_every_base_weight():
  _, meta_params, params = _tiny()
  generator = meta_params.generator
  latents = networks.draw_latents(jax.random.key(3), 4, networks.LATENT_DIM)
  hidden = np.asarray(latents, np.float64)
  for layer in generator.hidden:
    hidden = np.maximum(hidden @ np.asarray(layer.kernel) + np.asarray(layer.bias), 0.0)
  # Simpa.py's last layer: one [P, 512] matrix on the flat weight vector.
  flat = np.tanh(hidden @ _flat_rows(generator.output_kernel, 0) + _flat(generator.output_bias))
  ours = _flat_rows(networks.generate(generator, latents), 0)
  np.testing.assert_allclose(ours, flat, atol=2e-6)
  assert flat.shape == (4, networks.num_weights(params)) == (4, 6 + 6 + 6 + 1)
  assert np.all(np.abs(ours) < 1)  # tanh


def test_initialisation_is_kaiming_normal_with_zero_biases():
  model = vj.MLP((64,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  generator = networks.init_generator(params, jax.random.key(1))
  phi = networks.init_phi_network(params, jax.random.key(2))
  num_weights = networks.num_weights(params)
  output = _flat_rows(generator.output_kernel, 0)
  np.testing.assert_allclose(output.std(), math.sqrt(2 / 512), rtol=0.02)
  np.testing.assert_allclose(
    _flat_rows(phi.input_kernel, -1).std(), math.sqrt(2 / num_weights), rtol=0.02
  )
  np.testing.assert_allclose(np.std(generator.hidden[0].kernel), math.sqrt(2 / 128), rtol=0.03)
  assert not _flat(generator.output_bias).any() and not np.any(phi.input_bias)


def test_the_kl_estimate_is_simpa_pys_formula():
  _, meta_params, _ = _tiny(num_kl_samples=64)
  key = jax.random.key(4)
  ours = float(networks.kl_lower_bound(meta_params.generator, meta_params.phi, key, 64))
  latent_key, prior_key = jax.random.split(key)
  latents = networks.draw_latents(latent_key, 64, networks.LATENT_DIM)
  from_q = _flat_rows(networks.generate(meta_params.generator, latents), 0)
  from_p = _flat_rows(networks.draw_prior(prior_key, meta_params.generator.output_bias, 64), 0)
  t_q, t_p = _numpy_phi(meta_params.phi, from_q), _numpy_phi(meta_params.phi, from_p)
  log_sum_exp = np.log(np.sum(np.exp(t_p - t_p.max()))) + t_p.max()
  # mean T(q) - logsumexp T(p) - log N: Donsker-Varadhan's estimate minus 2 log N.
  expected = t_q.mean() - log_sum_exp - math.log(64)
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
  donsker_varadhan = t_q.mean() - (log_sum_exp - math.log(64))
  np.testing.assert_allclose(ours + 2 * math.log(64), donsker_varadhan, rtol=1e-5, atol=1e-5)
  # The prior's draws are N(0, 1) and the latents U[0, 1).
  assert abs(from_p.mean()) < 0.05 and abs(from_p.std() - 1) < 0.05
  assert 0 <= float(latents.min()) and float(latents.max()) < 1


def test_the_hyper_prior_pairs_the_generators_tensors_as_simpa_py():
  _, meta_params, _ = _tiny()
  generator = meta_params.generator
  # Simpa.py's list: W1, b1, W2, b2, W3, b3 (W3 and b3 over every base weight); n = 3.
  tensors = [np.asarray(generator.hidden[0].kernel), np.asarray(generator.hidden[0].bias)]
  tensors += [np.asarray(generator.hidden[1].kernel), np.asarray(generator.hidden[1].bias)]
  tensors += [_flat_rows(generator.output_kernel, 0), _flat(generator.output_bias)]
  tensors = [t.astype(np.float64) for t in tensors]
  kl = 0.0
  for i in range(3):
    mean, log_std = tensors[i], tensors[3 + i]
    kl += np.sum(mean**2) + np.sum(np.exp(2 * log_std)) - 3 - 2 * np.sum(log_std)
  np.testing.assert_allclose(float(networks.hyper_prior_kl(generator)), kl / 2, rtol=1e-5)
  m = 2
  np.testing.assert_allclose(
    float(simpa_module.hyper_prior_term(generator, m, 0.1)),
    math.sqrt((kl / 2 + m * math.log(m) / 0.1) / (2 * (m - 1))),
    rtol=1e-5,
  )
