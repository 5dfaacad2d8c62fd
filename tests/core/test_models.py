"""Models: both Conv4 variants, the im2col convolution, batch-statistics norm; no TF on import."""

import math
import subprocess
import sys

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import _conv4, _images
from vampire_jax._src.core import adaptation, models


def _pool_chain(pool, x):
  """Four 2x2 poolings, 84 -> 42 -> 21 -> 10 -> 5 (odd sizes drop their last row and column)."""
  outputs = []
  for _ in range(4):
    x = pool(x)
    outputs.append(x)
  return outputs


def _prior(hidden=(16, 16), log_std=(-1.5, -0.5), seed=0):
  model = vj.MLP(hidden, 1)
  params = vj.init_params(model, jax.random.key(seed), (1, 1))
  return model, vj.gaussian_from_params(params, jax.random.key(seed + 1), log_std)


def _weight_draws(model, dist, x, key, num):
  return vj.predict(dist, x, key, apply_fn=vj.pure_apply(model), num_mc_samples=num)


def _abml_and_task(draw_outputs, num_mc=8):
  model, _ = _prior()
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  learner = vj.baselines.abml(
    vj.pure_apply(model),
    vj.gaussian_nll(0.3),
    num_mc_train=num_mc,
    num_mc_query=num_mc,
    inner_lr=1e-3,
    kl_weight=0.1,
    log_std_init=(-2.0, -1.0),
    draw_outputs=draw_outputs,
  )
  x = jnp.linspace(-5.0, 5.0, 10)[:, None]
  task = vj.Task(x[:5], jnp.sin(x[:5]), x[5:], jnp.sin(x[5:]))
  return learner, learner.init(params, jax.random.key(1)), task


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


def _plain_batch_norm(x, scale, offset, epsilon=1e-5):
  """Batch norm as plain operations, for autodiff to differentiate."""
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axis=axes, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
  normalised = (x - mean) * jax.lax.rsqrt(var + epsilon)
  return normalised if scale is None else normalised * scale + offset


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_forward_is_the_plain_formula_bit_for_bit(affine):
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (5, 6, 6, 4)) * 3.0 + 2.0
  scale, offset = (jax.random.normal(keys[1], (4,)), jax.random.normal(keys[2], (4,)))
  if not affine:
    scale = offset = None
  ours = models.batch_stat_norm(x, scale, offset, 1e-5)
  np.testing.assert_array_equal(ours, _plain_batch_norm(x, scale, offset))


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_gradient_rule_equals_autodiff_to_second_order(affine):
  """`batch_stat_norm`'s own rule against autodiff of the plain formula, float64: the
  gradient, the gradient of a function of the gradient (the second-order meta-gradient's
  kind), and both under vmap."""
  with jax.enable_x64(True):
    keys = jax.random.split(jax.random.key(1), 5)
    x = jax.random.normal(keys[0], (3, 5, 4, 3), jnp.float64) * 2.0 + 1.0
    scale = jax.random.normal(keys[1], (3,), jnp.float64)
    offset = jax.random.normal(keys[2], (3,), jnp.float64)
    readout = jax.random.normal(keys[3], x.shape, jnp.float64)
    if not affine:
      scale = offset = None

    def loss(norm, x, scale, offset):  # non-linear, so the second order is not trivial
      return jnp.sum(jnp.sin(norm(x, scale, offset)) * readout)

    def ours(x, scale, offset):
      return models.batch_stat_norm(x, scale, offset, 1e-5)

    def gradient_norm(norm, x, scale):  # a function of the gradient, as a meta-loss is
      grads = jax.grad(loss, argnums=(1, 2, 3) if affine else 1)(norm, x, scale, offset)
      return sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads))

    argnums = (1, 2) if affine else 1
    for order in (
      lambda norm, x, scale: jax.grad(loss, argnums=(1, 2, 3))(norm, x, scale, offset),
      lambda norm, x, scale: jax.grad(gradient_norm, argnums=argnums)(norm, x, scale),
    ):
      chex.assert_trees_all_close(
        order(ours, x, scale), order(_plain_batch_norm, x, scale), rtol=1e-12, atol=1e-12
      )
      batched_x = jnp.stack([x, 2.0 * x + 1.0])
      vmapped = lambda norm: jax.vmap(lambda x: order(norm, x, scale))(batched_x)
      chex.assert_trees_all_close(vmapped(ours), vmapped(_plain_batch_norm), rtol=1e-12, atol=1e-12)


def test_conv4_takes_batch_norms_rule_with_the_loop_safe_convolution_only():
  """The rule is reverse mode only, as the loop-safe convolution is: Conv4 with XLA's
  convolution keeps forward mode (`jax.jvp`), and equals the loop-safe network's outputs
  and gradients."""
  x = jax.random.uniform(jax.random.key(0), (8, 16, 16, 1))  # 16 -> 8 -> 4 -> 2 -> 1
  xla_net, loop_safe_net = (models.Conv4(5, conv_impl=impl) for impl in ("xla", "loop_safe"))
  params = vj.init_params(xla_net, jax.random.key(0), x.shape)

  def loss(net):
    return lambda params: jnp.sum(jnp.tanh(vj.pure_apply(net)(params, x)))

  tangent = jax.tree_util.tree_map(jnp.ones_like, params)
  _, forward = jax.jit(lambda p, t: jax.jvp(loss(xla_net), (p,), (t,)))(params, tangent)
  xla_grad, loop_safe_grad = (
    jax.jit(jax.grad(loss(net)))(params) for net in (xla_net, loop_safe_net)
  )
  np.testing.assert_allclose(
    forward, sum(jnp.sum(g) for g in jax.tree_util.tree_leaves(xla_grad)), rtol=1e-4
  )
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jvp(loss(loop_safe_net), (params,), (tangent,))
  chex.assert_trees_all_close(loop_safe_grad, xla_grad, rtol=1e-4, atol=1e-5)


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


def test_one_layer_is_the_closed_form():
  # h = x W + b: mean x mu + m, variance x^2 s^2 + t^2, exactly.
  model, dist = _prior(hidden=())
  x = jnp.array([[-2.0], [0.5], [3.0]])
  draws = vj.local_reparameterization(dist, x, jax.random.key(2), 200_000)[..., 0]
  mean = (x @ dist.mean["Dense_0"]["kernel"] + dist.mean["Dense_0"]["bias"])[:, 0]
  var = (
    jnp.square(x) @ jnp.exp(2 * dist.log_std["Dense_0"]["kernel"])
    + jnp.exp(2 * dist.log_std["Dense_0"]["bias"])
  )[:, 0]
  np.testing.assert_allclose(draws.mean(0), mean, atol=4 * np.sqrt(var.max() / 200_000))
  np.testing.assert_allclose(draws.var(0), var, rtol=0.02)


def test_each_examples_outputs_are_distributed_as_under_weight_draws():
  # A 1-16-16-1 ReLU network with wide weights: the outputs are far from Gaussian, and
  # the marginal of each example (mean, spread, quantiles) must still match.
  model, dist = _prior()
  x = jnp.linspace(-4.0, 4.0, 5)[:, None]
  num = 40_000
  lrt = np.asarray(vj.local_reparameterization(dist, x, jax.random.key(3), num)[..., 0])
  weights = np.asarray(_weight_draws(model, dist, x, jax.random.key(4), num)[..., 0])
  spread = weights.std(0)
  assert spread.min() > 0.1  # a real spread to compare
  np.testing.assert_allclose(lrt.mean(0), weights.mean(0), atol=0.05 * spread.max())
  np.testing.assert_allclose(lrt.std(0), spread, rtol=0.05)
  levels = [0.1, 0.5, 0.9]
  np.testing.assert_allclose(
    np.quantile(lrt, levels, axis=0), np.quantile(weights, levels, axis=0), atol=0.06 * spread.max()
  )
  # What differs, by design: one weight draw ties the examples together; here they are
  # drawn independently.
  assert np.corrcoef(weights[:, 1], weights[:, 2])[0, 1] > 0.3
  assert abs(np.corrcoef(lrt[:, 1], lrt[:, 2])[0, 1]) < 0.03


def test_the_vfe_has_the_same_expectation():
  model, dist = _prior(log_std=(-2.0, -1.0))
  x = jax.random.uniform(jax.random.key(5), (5, 1), minval=-5, maxval=5)
  y = jnp.sin(x)
  nll = vj.gaussian_nll(0.3)
  loss_fn = vj.loss_from_apply(vj.pure_apply(model), nll)
  keys = jax.random.split(jax.random.key(6), 400)

  def estimate(key, local):
    return adaptation.expected_nll(
      dist,
      x,
      y,
      key,
      loss_fn=loss_fn,
      num_mc_samples=32,
      draw_outputs=vj.local_reparameterization if local else None,
      nll=nll if local else None,
    )

  weights = np.asarray(jax.jit(jax.vmap(lambda k: estimate(k, False)))(keys))
  local = np.asarray(jax.jit(jax.vmap(lambda k: estimate(k, True)))(keys))
  standard_error = np.hypot(weights.std(), local.std()) / np.sqrt(len(keys))
  assert abs(weights.mean() - local.mean()) < 4 * standard_error
  assert local.std() < weights.std()  # independent examples: less variance


def test_vampire_adapts_and_predicts_with_it():
  model, _ = _prior()
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  learner = vj.vampire(
    vj.pure_apply(model),
    vj.gaussian_nll(0.3),
    num_mc_train=8,
    num_mc_query=8,
    inner_lr=1e-3,
    kl_weight=0.1,
    draw_outputs=vj.local_reparameterization,
  )
  prior = learner.init(params, jax.random.key(1))
  x = jnp.linspace(-5, 5, 5)[:, None]
  posterior = learner.adapt(prior, x, jnp.sin(x), jax.random.key(2))
  assert jax.tree_util.tree_structure(posterior) == jax.tree_util.tree_structure(prior)
  assert learner.predict(posterior, x, jax.random.key(3)).shape == (8, 5, 1)


def test_a_network_that_is_no_mlp_is_refused():
  conv = vj.Conv4(num_classes=5, num_filters=4)
  params = vj.init_params(conv, jax.random.key(0), (1, 28, 28, 1))
  dist = vj.gaussian_from_params(params, jax.random.key(1))
  with pytest.raises(vj.InputError, match="local_reparameterization: dist must be a Gaussian"):
    vj.local_reparameterization(dist, jnp.zeros((2, 28, 28, 1)), jax.random.key(2), 2)


def test_abml_meta_loss_has_the_same_expectation_and_draws_examples_apart():
  # ABML with the trick (the authors2019 comparison's fast route): its meta-loss
  # (inner loop, support-and-query ELBO) estimates the same number as with weight draws,
  # and its query outputs come from the trick, each example drawn independently.
  keys = jax.random.split(jax.random.key(7), 300)
  estimates = {}
  for local in (False, True):
    learner, prior, task = _abml_and_task(vj.local_reparameterization if local else None)
    losses, outputs = jax.jit(jax.vmap(lambda k: learner.meta_loss(prior, task, k)))(keys)
    estimates[local] = np.asarray(losses)
    draws = np.asarray(outputs[:, :, :, 0]).reshape(-1, 5)  # [keys * draws, query points]
    correlation = np.corrcoef(draws[:, 1], draws[:, 2])[0, 1]
    assert (abs(correlation) < 0.1) if local else (correlation > 0.3)
  standard_error = np.hypot(estimates[False].std(), estimates[True].std()) / np.sqrt(len(keys))
  assert abs(estimates[False].mean() - estimates[True].mean()) < 4 * standard_error


@pytest.mark.parametrize("gain", [1.0, math.sqrt(2.0)])
def test_kernel_init_gain_is_xavier_normal(gain):
  params = vj.init_params(vj.MLP((300, 300), 1, kernel_init_gain=gain), jax.random.key(0), (1, 200))
  kernel = np.asarray(params["Dense_1"]["kernel"])
  assert kernel.std() == pytest.approx(gain * math.sqrt(2.0 / 600), rel=0.02)


def test_symmetric_padding_pads_one_on_each_side_as_torch_padding_1():
  # The first block by hand: lax's convolution with ((1, 1), (1, 1)), then the batch norm.
  x = _images()
  model = _conv4("symmetric")
  params = vj.init_params(model, jax.random.key(1), (1, 28, 28, 1))
  kernel, bias = params["conv0"]["kernel"], params["conv0"]["bias"]
  first = jax.lax.conv_general_dilated(
    x, kernel, (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  first = first + bias
  captured = model.apply({"params": params}, x, capture_intermediates=True, mutable="intermediates")
  ours = captured[1]["intermediates"]["conv0"]["__call__"][0]
  assert ours.shape == (2, 14, 14, 4)  # 28 -> 14, as 'SAME' gives: the sizes do not change
  np.testing.assert_allclose(ours, first, rtol=1e-6, atol=1e-6)
  same = _conv4("same").apply(
    {"params": params}, x, capture_intermediates=True, mutable="intermediates"
  )
  assert np.abs(same[1]["intermediates"]["conv0"]["__call__"][0] - ours).max() > 1e-2


@pytest.mark.parametrize("conv", [models.PatchConv, models.LoopSafeConv])
def test_stride_two_pads_as_written_on_odd_and_even_sizes(conv):
  # Zeros padded by hand, then a 'VALID' convolution. XLA's 'SAME' pads 0 before and 1 after
  # on an even size (8 -> 4) but 1 on each side on an odd one (7 -> 4); "symmetric" pads 1 on
  # each side on both, as PyTorch's `padding=1`.
  for size, same in ((8, (0, 1)), (7, (1, 1))):
    x = _images(size, 2)
    for padding, pads in (("same", same), ("symmetric", (1, 1))):
      layer = conv(3, strides=2, padding=padding)
      params = layer.init(jax.random.key(1), x)["params"]
      padded = jnp.pad(x, ((0, 0), pads, pads, (0, 0)))
      expected = jax.lax.conv_general_dilated(
        padded, params["kernel"], (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
      )
      ours = layer.apply({"params": params}, x)
      assert ours.shape == (2, 4, 4, 3)
      np.testing.assert_allclose(ours, expected + params["bias"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # three convolutions' second-order programs to compile
@pytest.mark.parametrize("padding", models.PADDINGS)
def test_every_convolution_pads_alike_to_second_order(padding):
  # xla, patches and loop_safe (its hand-written gradient) give the same logits, gradient and
  # gradient of the gradient's norm, on 28 -> 14 -> 7 -> 4 -> 2 (odd sizes at the third).
  x, labels = _images(), jnp.array([0, 2])
  params = vj.init_params(_conv4(padding), jax.random.key(1), (1, 28, 28, 1))
  results = []
  for impl in models.CONV_IMPLS:
    apply = vj.pure_apply(_conv4(padding, impl))
    loss = lambda p: vj.categorical_nll(apply(p, x), labels)  # noqa: E731
    squared = lambda p: sum(jnp.sum(g**2) for g in jax.tree.leaves(jax.grad(loss)(p)))  # noqa: E731
    curvature = jax.grad(squared)(params)
    results.append((apply(params, x), jax.grad(loss)(params), curvature))
  for other in results[1:]:
    for first, second in zip(results[0], other):  # logits, gradient, curvature
      # Of the largest entry: the convolutions' bias gradients, before a batch norm, are 0
      # up to rounding.
      scale = max(float(jnp.abs(a).max()) for a in jax.tree.leaves(first))
      for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        assert float(jnp.abs(a - b).max()) / scale < 2e-4


def test_stride_one_pads_one_on_each_side_either_way():
  # mini-ImageNet's network (stride 1, max-pool): the two paddings are the same padding.
  x = _images(22, 3)
  params = vj.init_params(_conv4("same", max_pool=True), jax.random.key(1), (1, 22, 22, 3))
  same = _conv4("same", max_pool=True).apply({"params": params}, x)
  symmetric = _conv4("symmetric", max_pool=True).apply({"params": params}, x)
  np.testing.assert_array_equal(same, symmetric)
