"""Models: both Conv4 variants, the im2col convolution, batch-statistics norm; no TF on import."""

import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj


def test_import_does_not_load_tensorflow():
  code = ("import sys, vampire_jax, vampire_jax.data; "
          "loaded = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets')]; "
          "assert not loaded, loaded")
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
  assert set(params) == {"conv0", "conv1", "conv2", "conv3", "norm0", "norm1", "norm2", "norm3", "head"}


def test_patch_convolution_equals_xla_convolution_with_the_same_weights():
  xla = vj.Conv4(5, num_filters=16, conv_impl="xla")
  patches = vj.Conv4(5, num_filters=16, conv_impl="patches")
  params = vj.init_params(xla, jax.random.key(0), (1, 28, 28, 1))
  x = jax.random.normal(jax.random.key(1), (4, 28, 28, 1))
  np.testing.assert_allclose(vj.pure_apply(patches)(params, x), vj.pure_apply(xla)(params, x), atol=1e-4)


def test_batch_norm_uses_the_batch_statistics():
  norm = vj.models.BatchStatNorm()
  params = {"scale": jnp.array([2.0, 1.0]), "offset": jnp.array([0.5, 0.0])}
  x = jax.random.normal(jax.random.key(0), (50, 2)) * 3.0 + 7.0
  y = norm.apply({"params": params}, x)
  np.testing.assert_allclose(jnp.mean(y, 0), [0.5, 0.0], atol=1e-5)
  np.testing.assert_allclose(jnp.std(y, 0), [2.0, 1.0], rtol=1e-4)
