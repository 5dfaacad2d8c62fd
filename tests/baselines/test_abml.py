import chex
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

import vampire_jax as vj
from tests.helpers import _check_gradient_by_finite_differences, _tiny_hidden_mlp
from vampire_jax import baselines


def _sine_tasks(key, num_tasks, shots=5, query=10, dtype=jnp.float32):
  k_amp, k_phase, k_x = jax.random.split(key, 3)
  amp = jax.random.uniform(k_amp, (num_tasks, 1, 1), dtype, minval=0.5, maxval=3.0)
  phase = jax.random.uniform(k_phase, (num_tasks, 1, 1), dtype, maxval=jnp.pi)
  x = jax.random.uniform(k_x, (num_tasks, shots + query, 1), dtype, minval=-5.0, maxval=5.0)
  y = amp * jnp.sin(x + phase)
  return vj.Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


def _one_task(key, dtype=jnp.float32):
  return jax.tree_util.tree_map(lambda a: a[0], _sine_tasks(key, 1, dtype=dtype))


def test_hyper_prior_is_normal_on_means_and_gamma_on_precisions():
  prior = vj.Gaussian(
    {"w": jnp.array([0.3, -1.2]), "b": jnp.array([2.0])},
    {"w": jnp.array([-1.0, 0.5]), "b": jnp.array([-3.0])},
  )
  means, log_stds = np.array([0.3, -1.2, 2.0]), np.array([-1.0, 0.5, -3.0])
  expected = -np.sum(
    scipy.stats.norm.logpdf(means, scale=2.0)
    + scipy.stats.gamma.logpdf(np.exp(-2 * log_stds), 1.5, scale=1 / 0.01)
  )
  hyper_prior_nll = jax.jit(
    lambda p: baselines.hyper_prior_nll(p, mean_prior_std=2.0, precision_prior=(1.5, 0.01))
  )
  np.testing.assert_allclose(hyper_prior_nll(prior), expected, rtol=1e-5)


def test_abml_meta_loss_is_the_whole_task_elbo_plus_hyper_prior():
  params, apply_fn, nll, loss_fn = _tiny_hidden_mlp()
  task = _one_task(jax.random.key(1))
  prior = vj.gaussian_from_params(params, jax.random.key(2), (-2.0, -1.5))
  learner = baselines.abml(
    apply_fn,
    nll,
    num_inner_steps=2,
    inner_lr=0.05,
    kl_weight=0.2,
    num_mc_train=2,
    num_mc_query=3,
    hyper_prior_weight=0.01,
  )
  key = jax.random.key(3)

  @jax.jit
  def losses(prior):
    adapt_key, loss_key = jax.random.split(key)
    posterior = vj.adapt(
      prior,
      task.support_x,
      task.support_y,
      adapt_key,
      loss_fn=loss_fn,
      num_steps=2,
      inner_lr=0.05,
      num_mc_samples=2,
      kl_weight=0.2,
    )
    x = jnp.concatenate([task.support_x, task.query_x])
    y = jnp.concatenate([task.support_y, task.query_y])
    outputs = vj.predict(posterior, x, loss_key, apply_fn=apply_fn, num_mc_samples=3)
    data_nll = jnp.mean(jnp.stack([nll(o, y) for o in outputs]))
    kl = vj.kl_divergence(posterior, prior)
    expected = data_nll + 0.2 * kl + 0.01 * baselines.hyper_prior_nll(prior)
    adapted = learner.adapt(prior, task.support_x, task.support_y, adapt_key)
    return (
      learner.meta_loss(prior, task, key),
      (expected, outputs[:, task.support_x.shape[0] :]),
      kl,
      (adapted, posterior),
    )

  (loss, outputs), (expected_loss, expected_outputs), kl, (adapted, posterior) = losses(prior)
  assert float(kl) > 1e-3
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  np.testing.assert_allclose(outputs, expected_outputs, rtol=1e-6)
  chex.assert_trees_all_close(adapted, posterior)  # adaptation is VAMPIRE's


def test_abml_meta_gradient_matches_finite_differences():
  with jax.enable_x64(True):
    params, apply_fn, nll, _ = _tiny_hidden_mlp(jnp.float64)
    task = _one_task(jax.random.key(1), jnp.float64)
    prior = vj.gaussian_from_params(params, jax.random.key(2), (-2.0, -1.0))
    learner = baselines.abml(
      apply_fn,
      nll,
      num_inner_steps=2,
      inner_lr=0.05,
      num_mc_train=2,
      num_mc_query=2,
      hyper_prior_weight=0.01,
    )
    _check_gradient_by_finite_differences(
      lambda p: learner.meta_loss(p, task, jax.random.key(7))[0], prior
    )
