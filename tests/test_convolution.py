"""`convolution.conv2d` equals XLA's convolution in value and in its first and second derivatives."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from vampire_jax import convolution, models


def xla_conv(x, kernel, stride, padding):
  return lax.conv_general_dilated(x, kernel, (stride, stride), padding,
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


CASES = [  # (height, width, in, out, stride): odd and even sizes, where 'SAME' pads unevenly
    (7, 7, 3, 4, 2),
    (8, 6, 2, 3, 2),
    (5, 5, 2, 2, 1),
]


def _inputs(case, seed=0):
  height, width, channels_in, channels_out, stride = case
  kx, kk, kg = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(kx, (2, height, width, channels_in), jnp.float64)
  kernel = jax.random.normal(kk, (3, 3, channels_in, channels_out), jnp.float64)
  padding = convolution.same_padding(height, width, (3, 3), stride)
  return x, kernel, stride, padding, kg


@pytest.fixture(autouse=True)
def float64():
  with jax.enable_x64(True):
    yield


@pytest.mark.parametrize("case", CASES)
def test_value_and_gradients_match_xla(case):
  x, kernel, stride, padding, key = _inputs(case)
  ours = convolution.conv2d(x, kernel, stride, padding)
  theirs = xla_conv(x, kernel, stride, padding)
  np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)

  weights = jax.random.normal(key, theirs.shape, jnp.float64)  # a generic scalar readout
  def loss(conv):
    return lambda x, kernel: jnp.sum(weights * jnp.tanh(conv(x, kernel, stride, padding)))
  ours = jax.grad(loss(convolution.conv2d), argnums=(0, 1))(x, kernel)
  theirs = jax.grad(loss(xla_conv), argnums=(0, 1))(x, kernel)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES[:2])
def test_second_order_matches_xla(case):
  """The meta-gradient differentiates through a gradient step: grad of (loss after one step)."""
  x, kernel, stride, padding, key = _inputs(case, seed=1)
  target = jax.random.normal(key, xla_conv(x, kernel, stride, padding).shape, jnp.float64)

  def after_one_step(conv):
    def inner_loss(x, kernel):
      return jnp.sum((jnp.tanh(conv(x, kernel, stride, padding)) - target) ** 2)
    def outer(x, kernel):
      adapted = kernel - 0.1 * jax.grad(inner_loss, argnums=1)(x, kernel)
      return inner_loss(x * 0.5, adapted)
    return outer

  ours = jax.grad(after_one_step(convolution.conv2d), argnums=(0, 1))(x, kernel)
  theirs = jax.grad(after_one_step(xla_conv), argnums=(0, 1))(x, kernel)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_loop_safe_conv4_equals_xla_conv4():
  """Same parameter tree, same outputs: a checkpoint moves between implementations."""
  x = jax.random.uniform(jax.random.PRNGKey(0), (2, 14, 14, 1))
  xla_net = models.Conv4(num_classes=3, num_filters=4, conv_impl="xla")
  safe_net = models.Conv4(num_classes=3, num_filters=4, conv_impl="loop_safe")
  params = xla_net.init(jax.random.PRNGKey(1), x)
  assert (jax.tree_util.tree_structure(params)
          == jax.tree_util.tree_structure(safe_net.init(jax.random.PRNGKey(1), x)))
  np.testing.assert_allclose(safe_net.apply(params, x), xla_net.apply(params, x),
                             rtol=1e-5, atol=1e-5)
  grads = [jax.grad(lambda p: jnp.sum(net.apply(p, x) ** 2))(params) for net in (xla_net, safe_net)]
  for a, b in zip(*map(jax.tree_util.tree_leaves, grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_unknown_conv_impl_is_refused():
  with pytest.raises(ValueError, match="conv_impl"):
    models.Conv4(num_classes=5, conv_impl="cudnn").init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))


def test_auto_conv_impl_uses_loop_safe_where_gradients_run_in_loops():
  from experiments import configs
  from vampire_jax import training
  if jax.default_backend() != "cpu":
    assert models.auto_conv_impl(task_batching="map", inner_steps_unrolled=False,
                                 draws_mapped=True) == "xla"
    return
  assert models.auto_conv_impl(task_batching="host_chunked", inner_steps_unrolled=True,
                               draws_mapped=False) == "xla"
  for loops in [dict(task_batching="map", inner_steps_unrolled=True, draws_mapped=False),
                dict(task_batching="host_chunked", inner_steps_unrolled=False, draws_mapped=False),
                dict(task_batching="host_chunked", inner_steps_unrolled=True, draws_mapped=True)]:
    assert models.auto_conv_impl(**loops) == "loop_safe", loops
  quick = configs.omniglot_config("quick")
  assert training.conv_impl(quick) == "loop_safe"
  unrolled = dataclasses.replace(quick, task_batching="host_chunked", unroll_inner_steps=True)
  assert training.conv_impl(unrolled) == "xla"
  assert training.conv_impl(dataclasses.replace(quick, conv_impl="patches")) == "patches"
