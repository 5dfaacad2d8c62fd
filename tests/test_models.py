"""Models: both Conv4 variants, the im2col convolution, batch-statistics norm; no TF on import."""

import subprocess
import sys

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from vampire_jax._src.core import models


def test_import_does_not_load_tensorflow():
  code = (
    "import sys, vampire_jax, vampire_jax.data; "
    "loaded = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets')]; "
    "assert not loaded, loaded"
  )
  subprocess.run([sys.executable, "-c", code], check=True)


def test_conv4_variants_shapes_and_parameter_counts():
  omniglot = vj.conv4_omniglot(5)
  params = vj.init_params(omniglot, jax.random.key(0), (2, 28, 28, 1))
  chex.assert_shape(vj.pure_apply(omniglot)(params, jnp.zeros((3, 28, 28, 1))), (3, 5))
  # 28 -> 14 -> 7 -> 4 -> 2 with stride-2 SAME convolutions: 2*2*64 features into the head.
  chex.assert_shape(params["head"]["kernel"], (256, 5))
  mini = vj.conv4_mini_imagenet(5)
  params = vj.init_params(mini, jax.random.key(0), (2, 84, 84, 3))
  chex.assert_shape(vj.pure_apply(mini)(params, jnp.zeros((2, 84, 84, 3))), (2, 5))
  # 84 -> 42 -> 21 -> 10 -> 5 with 2x2 max-pooling: 5*5*32 features.
  chex.assert_shape(params["head"]["kernel"], (800, 5))
  chex.assert_shape(params["conv0"]["kernel"], (3, 3, 3, 32))
  assert set(params) == {
    "conv0",
    "conv1",
    "conv2",
    "conv3",
    "norm0",
    "norm1",
    "norm2",
    "norm3",
    "head",
  }


def test_patch_convolution_equals_xla_convolution_with_the_same_weights():
  xla = vj.Conv4(5, num_filters=16, conv_impl="xla")
  patches = vj.Conv4(5, num_filters=16, conv_impl="patches")
  params = vj.init_params(xla, jax.random.key(0), (1, 28, 28, 1))
  x = jax.random.normal(jax.random.key(1), (4, 28, 28, 1))
  np.testing.assert_allclose(
    vj.pure_apply(patches)(params, x), vj.pure_apply(xla)(params, x), atol=1e-4
  )


def test_batch_norm_uses_the_batch_statistics():
  norm = models.BatchStatNorm()
  params = {"scale": jnp.array([2.0, 1.0]), "offset": jnp.array([0.5, 0.0])}
  x = jax.random.normal(jax.random.key(0), (50, 2)) * 3.0 + 7.0
  y = norm.apply({"params": params}, x)
  np.testing.assert_allclose(jnp.mean(y, 0), [0.5, 0.0], atol=1e-5)
  np.testing.assert_allclose(jnp.std(y, 0), [2.0, 1.0], rtol=1e-4)


def _pool_chain(pool, x):
  """Four 2x2 poolings, 84 -> 42 -> 21 -> 10 -> 5 (odd sizes drop their last row and column)."""
  outputs = []
  for _ in range(4):
    x = pool(x)
    outputs.append(x)
  return outputs


def test_max_pool_2x2_equals_flax_max_pool_at_odd_sizes():
  flax_pool = lambda x: flax.linen.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
  x = jax.random.normal(jax.random.key(0), (2, 84, 84, 3))  # continuous: no tied maxima
  ours, theirs = _pool_chain(models.max_pool_2x2, x), _pool_chain(flax_pool, x)
  assert [o.shape[1:3] for o in ours] == [(42, 42), (21, 21), (10, 10), (5, 5)]
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)
  # A non-square odd input, and the gradient of a generic readout through all four.
  x = jax.random.normal(jax.random.key(1), (2, 84, 43, 2))
  weights = jax.random.normal(jax.random.key(2), (2, 5, 2, 2))

  def readout(pool):
    return jax.jit(jax.grad(lambda x: jnp.sum(weights * jnp.tanh(_pool_chain(pool, x)[-1]))))

  grad = readout(models.max_pool_2x2)(x)
  np.testing.assert_allclose(grad, readout(flax_pool)(x), rtol=1e-6, atol=1e-7)
  assert int(jnp.sum(grad != 0)) == weights.size  # one maximum per window reaches the output


def test_max_pool_2x2_splits_the_gradient_equally_between_tied_maxima():
  window = jnp.array([[3.0, 3.0], [1.0, 3.0]])  # three tied maxima
  x = jnp.zeros((1, 3, 5, 1)).at[0, :2, 2:4, 0].set(window)  # odd: row 2 and column 4 dropped
  y = models.max_pool_2x2(x)
  np.testing.assert_array_equal(y[0, :, :, 0], [[0.0, 3.0]])
  grad = jax.grad(lambda x: jnp.sum(models.max_pool_2x2(x) * jnp.array([2.0, 6.0])[:, None]))(x)
  expected = jnp.zeros((3, 5)).at[:2, :2].set(2.0 / 4)  # a window of four zeros: a quarter each
  expected = expected.at[:2, 2:4].set(jnp.array([[2.0, 2.0], [0.0, 2.0]]))  # 6 / 3 to each maximum
  np.testing.assert_allclose(grad[0, :, :, 0], expected)


def test_vmapped_gradient_through_max_pool_equals_one_network_at_a_time():
  """Conv4 with max-pool, three weight sets: the jitted gradient of the vmapped loss equals
  the gradients taken one weight set at a time. With max-pool as a max over a reshaped
  window, XLA:CPU's algebraic simplifier miscompiled the vmapped gradient (errors of the
  order of the gradient itself in conv0-2 and norm0-2; right eagerly and with the pass off)."""
  model = vj.Conv4(num_classes=3, num_filters=4, max_pool=True, conv_impl="xla")
  apply_fn = vj.pure_apply(model)
  params = vj.init_params(model, jax.random.key(0), (1, 16, 16, 1))
  weights = jax.tree_util.tree_map(lambda p: jnp.stack([p, 1.1 * p, 1.2 * p]), params)
  x = jax.random.uniform(jax.random.key(1), (6, 16, 16, 1))
  loss = lambda w: vj.categorical_nll(apply_fn(w, x), jnp.arange(6) % 3)
  one_at_a_time = jax.tree_util.tree_map(
    lambda *g: jnp.stack(g),
    *[jax.grad(loss)(jax.tree_util.tree_map(lambda w, i=i: w[i], weights)) for i in range(3)],
  )
  vmapped = jax.jit(jax.grad(lambda w: jnp.sum(jax.vmap(loss)(w))))(weights)
  chex.assert_trees_all_close(vmapped, one_at_a_time, atol=1e-5, rtol=1e-4)
