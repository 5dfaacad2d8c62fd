"""`convolution.conv2d` equals XLA's convolution in value and in its first three derivatives.

The cases cover what the custom gradient has to get right: 'SAME', 'VALID' and
asymmetric padding, strides 1 to 4, odd sizes and non-square kernels (where the
padded input has rows or columns past the last window: the re-padding branch
of `convolution.input_gradient`), and second order through two layers and a
max-pool, where the meta-gradient runs through the input gradient.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from vampire_jax._src.core import convolution, models


def xla_conv(x, kernel, stride, padding):
  return lax.conv_general_dilated(
    x, kernel, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
  )


CASES = [  # (height, width, in, out, stride): odd and even sizes, where 'SAME' pads unevenly
  (7, 7, 3, 4, 2),
  (8, 6, 2, 3, 2),
  (5, 5, 2, 2, 1),
  (6, 6, 1, 10, 2),  # Conv4's first layer: fewer taps x channels in (9) than out
]


# (height, width, in, out, kernel, stride, padding): 'VALID' and asymmetric explicit
# padding, strides 1-4, odd sizes; most leave rows or columns past the last window.
PADDED_CASES = [
  (9, 9, 2, 3, (3, 3), 1, "VALID"),
  (8, 8, 2, 3, (3, 3), 2, "VALID"),
  (11, 10, 3, 2, (3, 3), 3, "VALID"),
  (13, 9, 2, 2, (3, 3), 4, "VALID"),
  (7, 9, 2, 3, (3, 2), 2, ((0, 1), (1, 0))),
  (10, 7, 2, 3, (3, 3), 3, ((2, 0), (0, 1))),
  (9, 11, 2, 2, (2, 3), 4, ((1, 0), (2, 1))),
  (5, 6, 2, 2, (3, 3), 1, ((0, 1), (2, 0))),
  (9, 8, 1, 7, (2, 3), 3, "VALID"),  # 6 taps x 1 channel in, 7 out
]


def _padding(height, width, kernel, stride, padding):
  if isinstance(padding, str):
    return tuple(lax.padtype_to_pads((height, width), kernel, (stride, stride), padding))
  return padding


def _inputs(case, seed=0):
  if len(case) == 5:  # the 'SAME' cases with a 3x3 kernel
    height, width, channels_in, channels_out, stride = case
    case = (height, width, channels_in, channels_out, (3, 3), stride, "SAME")
  height, width, channels_in, channels_out, kernel_size, stride, padding = case
  kx, kk, kg = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(kx, (2, height, width, channels_in), jnp.float64)
  kernel = jax.random.normal(kk, kernel_size + (channels_in, channels_out), jnp.float64)
  return x, kernel, stride, _padding(height, width, kernel_size, stride, padding), kg


def _rows_and_columns_past_the_last_window(case):
  x, kernel, stride, padding, _ = _inputs(case)
  extra = []
  for axis in (0, 1):
    padded = x.shape[1 + axis] + sum(padding[axis])
    out = (padded - kernel.shape[axis]) // stride + 1
    extra.append(padded - ((out - 1) * stride + kernel.shape[axis]))
  return extra


@pytest.fixture(autouse=True)
def float64():
  with jax.enable_x64(True):
    yield


def _assert_trees_close(ours, theirs, tolerance):
  for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
    np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)


def _two_layer_net(conv):
  """conv 3x3 stride 1 (asymmetric padding) -> tanh -> 2x2 max-pool -> conv 3x3 stride 2 'VALID'."""

  def apply(kernels, x):
    h = jnp.tanh(conv(x, kernels[0], 1, ((1, 0), (0, 1))))
    h = models.max_pool_2x2(h)
    return jnp.tanh(conv(h, kernels[1], 2, ((0, 0), (0, 0))))

  return apply


def _as_float64(tree):
  return jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), tree)


def test_the_padded_cases_run_the_re_padding_branch():
  """'SAME' pads to exactly the last window; these cases leave rows and columns past it."""
  assert all(_rows_and_columns_past_the_last_window(case) == [0, 0] for case in CASES)
  extra = [_rows_and_columns_past_the_last_window(case) for case in PADDED_CASES]
  assert sum(rows > 0 for rows, _ in extra) >= 3 and sum(cols > 0 for _, cols in extra) >= 4


@pytest.mark.parametrize("case", CASES + PADDED_CASES)
def test_value_and_gradients_match_xla(case):
  x, kernel, stride, padding, key = _inputs(case)
  theirs = xla_conv(x, kernel, stride, padding)
  ours = jax.jit(convolution.conv2d, static_argnums=(2, 3))(x, kernel, stride, padding)
  np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)

  weights = jax.random.normal(key, theirs.shape, jnp.float64)  # a generic scalar readout

  def gradients(conv):
    loss = lambda x, kernel: jnp.sum(weights * jnp.tanh(conv(x, kernel, stride, padding)))
    return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, kernel)

  _assert_trees_close(gradients(convolution.conv2d), gradients(xla_conv), 1e-10)


@pytest.mark.parametrize("case", CASES[:2] + PADDED_CASES[1:3] + PADDED_CASES[5:7])
def test_second_order_matches_xla(case):
  """The meta-gradient differentiates through a gradient step: grad of (loss after one step)."""
  x, kernel, stride, padding, key = _inputs(case, seed=1)
  target = jax.random.normal(key, xla_conv(x, kernel, stride, padding).shape, jnp.float64)

  def meta_gradient(conv):
    def inner_loss(x, kernel):
      return jnp.sum((jnp.tanh(conv(x, kernel, stride, padding)) - target) ** 2)

    def outer(x, kernel):
      adapted = kernel - 0.1 * jax.grad(inner_loss, argnums=1)(x, kernel)
      return inner_loss(x * 0.5, adapted)

    return jax.jit(jax.grad(outer, argnums=(0, 1)))(x, kernel)

  _assert_trees_close(meta_gradient(convolution.conv2d), meta_gradient(xla_conv), 1e-9)


@pytest.mark.parametrize("case", [CASES[0], PADDED_CASES[4]])
def test_third_order_matches_xla(case):
  """d/d(x, kernel) of a directional second derivative: three nested reverse passes."""
  x, kernel, stride, padding, key = _inputs(case, seed=2)
  kw, ku, kv = jax.random.split(key, 3)
  weights = jax.random.normal(kw, xla_conv(x, kernel, stride, padding).shape, jnp.float64)
  u, v = (jax.random.normal(k, kernel.shape, jnp.float64) for k in (ku, kv))

  def third(conv):
    def loss(x, kernel):
      return jnp.sum(weights * jnp.tanh(conv(x, kernel, stride, padding)))

    def second(x, kernel):  # v' H u, H the Hessian in the kernel
      first = lambda x, kernel: jnp.vdot(jax.grad(loss, argnums=1)(x, kernel), u)
      return jnp.vdot(jax.grad(first, argnums=1)(x, kernel), v)

    return jax.jit(jax.grad(second, argnums=(0, 1)))(x, kernel)

  _assert_trees_close(third(convolution.conv2d), third(xla_conv), 1e-9)


def test_patch_chunk_takes_cache_sized_chunks_of_large_patches_only():
  mib = 2**20
  assert convolution.patch_chunk(75, 113 * 2**10) == 75  # Omniglot's largest: 8.5 MB, one product
  assert convolution.patch_chunk(5, 2 * mib) == 5  # a support set: 10 MB
  assert (
    convolution.patch_chunk(75, 2032128) == 1
  )  # mini-ImageNet's conv1: 2 an image fit, 1 divides
  assert convolution.patch_chunk(75, 1016064) == 3  # its conv0: 4 fit, 3 divides 75
  assert convolution.patch_chunk(75, 508032) == 5  # its conv2: 8 fit, 5 divides 75
  assert convolution.patch_chunk(97, mib // 2) == 8  # 97 is prime: 8, and 7 zero images added


@pytest.mark.parametrize("batch", [6, 7])  # chunks of 3: that divide 6; with two zero images for 7
@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[3], PADDED_CASES[4]])
def test_chunked_filter_gradient_matches_xla_to_second_order(case, batch, monkeypatch):
  """The patches a chunk of images at a time: the same filter gradient, and the same rules."""
  x, kernel, stride, padding, key = _inputs(case, seed=3)
  x = jax.random.normal(key, (batch,) + x.shape[1:], jnp.float64)
  out = xla_conv(x, kernel, stride, padding)
  per_image = out.shape[1] * out.shape[2] * kernel.shape[0] * kernel.shape[1] * x.shape[3] * 8
  monkeypatch.setattr(convolution, "PATCH_CHUNKING_ABOVE_BYTES", per_image)
  monkeypatch.setattr(convolution, "PATCH_CHUNK_BYTES", 3 * per_image)
  assert convolution.patch_chunk(batch, per_image) == 3
  weights = jax.random.normal(key, out.shape, jnp.float64)

  def loss(conv, x, kernel):
    return jnp.sum(weights * jnp.tanh(conv(x, kernel, stride, padding)))

  grad = jax.grad(lambda k: loss(convolution.conv2d, x, k))
  assert "while" in jax.jit(grad).lower(kernel).as_text()  # the chunks' loop runs
  np.testing.assert_allclose(
    jax.jit(grad)(kernel), jax.grad(lambda k: loss(xla_conv, x, k))(kernel), rtol=1e-12, atol=1e-12
  )

  def meta_gradient(conv):  # through the filter gradient's own rule
    def outer(x, kernel):
      adapted = kernel - 0.1 * jax.grad(loss, argnums=2)(conv, x, kernel)
      return loss(conv, x * 0.5, adapted)

    return jax.jit(jax.grad(outer, argnums=(0, 1)))(x, kernel)

  _assert_trees_close(meta_gradient(convolution.conv2d), meta_gradient(xla_conv), 1e-9)


def test_chunked_filter_gradient_sums_bfloat16_chunks_in_float32(monkeypatch):
  x, kernel, stride, padding, key = _inputs(CASES[2], seed=4)
  x = jax.random.normal(key, (64,) + x.shape[1:], jnp.float64)
  grad = jax.random.normal(key, xla_conv(x, kernel, stride, padding).shape, jnp.float64)
  exact = convolution.filter_gradient(x, grad, kernel.shape, stride, padding)
  low = (x.astype(jnp.bfloat16), grad.astype(jnp.bfloat16), kernel.shape, stride, padding)
  one_product = convolution.filter_gradient(*low)
  monkeypatch.setattr(convolution, "PATCH_CHUNKING_ABOVE_BYTES", 0)
  monkeypatch.setattr(convolution, "PATCH_CHUNK_BYTES", 1)  # one image a chunk
  chunked = convolution.filter_gradient(*low)
  assert chunked.dtype == jnp.bfloat16
  # Each image's product rounded to bfloat16 and summed there would be further off.
  error = lambda result: float(jnp.max(jnp.abs(result.astype(jnp.float64) - exact)))
  assert error(chunked) <= 2 * error(one_product)


def test_second_order_through_two_layers_and_max_pool_matches_xla():
  """A meta-gradient in every kernel: the first layer's inner gradient runs through the
  second layer's input gradient, and the outer gradient differentiates that again."""
  k = jax.random.split(jax.random.PRNGKey(3), 6)
  support, query = (jax.random.normal(key, (3, 11, 11, 2), jnp.float64) for key in k[:2])
  kernels = (
    jax.random.normal(k[2], (3, 3, 2, 3), jnp.float64),
    jax.random.normal(k[3], (3, 3, 3, 2), jnp.float64),
  )
  # 11x11 -> conv 11x11 -> pool 5x5 (odd: one row and column dropped) -> conv 2x2
  targets = [jax.random.normal(key, (3, 2, 2, 2), jnp.float64) for key in k[4:]]

  def meta_gradient(conv):
    apply = _two_layer_net(conv)

    def loss(kernels, x, target):
      return jnp.sum((apply(kernels, x) - target) ** 2)

    def after_two_steps(kernels, query):
      for _ in range(2):
        kernels = jax.tree_util.tree_map(
          lambda w, g: w - 0.05 * g, kernels, jax.grad(loss)(kernels, support, targets[0])
        )
      return loss(kernels, query, targets[1])

    return jax.jit(jax.grad(after_two_steps, argnums=(0, 1)))(kernels, query)

  ours, theirs = meta_gradient(convolution.conv2d), meta_gradient(xla_conv)
  assert float(jnp.max(jnp.abs(theirs[0][0]))) > 1e-3  # the first layer's meta-gradient is not ~0
  _assert_trees_close(ours, theirs, 1e-9)


@pytest.mark.parametrize("max_pool,size,channels", [(False, 14, 1), (True, 21, 1), (True, 21, 3)])
def test_loop_safe_conv4_equals_xla_conv4(max_pool, size, channels):
  """Same parameter tree, same outputs and meta-gradients (one inner step, second order):
  a checkpoint moves between implementations. Stride 2, or stride 1 with max-pool at odd
  sizes (21 -> 10 -> 5 -> 2 -> 1); three channels as mini-ImageNet's (`LoopSafeConv` pads
  them to four)."""
  kx, kq, kp = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.uniform(kx, (4, size, size, channels), jnp.float64)
  query = jax.random.uniform(kq, (6, size, size, channels), jnp.float64)
  labels_x, labels_q = jnp.arange(4) % 3, jnp.arange(6) % 3
  nets = [
    models.Conv4(num_classes=3, num_filters=4, max_pool=max_pool, conv_impl=impl)
    for impl in ("xla", "loop_safe")
  ]
  params = nets[0].init(kp, x.astype(jnp.float32))
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
    nets[1].init(kp, x.astype(jnp.float32))
  )
  params = _as_float64(params)
  np.testing.assert_allclose(
    jax.jit(nets[1].apply)(params, x), jax.jit(nets[0].apply)(params, x), rtol=1e-10, atol=1e-10
  )

  def meta_gradient(net):
    def loss(params, x, labels):
      logits = net.apply(params, x)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    def after_one_step(params):
      adapted = jax.tree_util.tree_map(
        lambda w, g: w - 0.1 * g, params, jax.grad(loss)(params, x, labels_x)
      )
      return loss(adapted, query, labels_q)

    return jax.jit(jax.grad(after_one_step))(params)

  _assert_trees_close(meta_gradient(nets[1]), meta_gradient(nets[0]), 1e-8)


@pytest.mark.parametrize(
  "kernel_size,strides,size,bias_channel",
  [((3, 3), 1, 9, True), ((3, 3), 2, 8, True), ((3, 3), 2, 7, True), ((2, 2), 1, 8, False)],
)
def test_three_channel_loop_safe_conv_equals_xla_conv_and_bias_to_second_order(
  kernel_size, strides, size, bias_channel
):
  """A three-channel `LoopSafeConv` against `nn.Conv` (kernel and bias alike), float64: the
  output, the gradients of kernel, bias and input, and the gradient of the gradient's
  squared norm. With the bias on the ones channel's centre tap and with the
  zero channel and the bias added after (a 2x2 kernel padded 'SAME', whose tap (1, 1) reads
  the padding at the last row)."""
  x = jax.random.uniform(jax.random.key(0), (3, size, size, 3), jnp.float64)
  ours_layer = models.LoopSafeConv(5, kernel_size, strides)
  theirs_layer = nn.Conv(5, kernel_size, strides, padding="SAME")
  params = _as_float64(ours_layer.init(jax.random.key(1), x.astype(jnp.float32)))
  params["params"]["bias"] = jax.random.normal(jax.random.key(2), (5,), jnp.float64)
  padding = convolution.same_padding(size, size, kernel_size, strides)
  assert convolution.centre_tap_inside((size, size), kernel_size, strides, padding) == bias_channel
  weights = jax.random.normal(jax.random.key(3), theirs_layer.apply(params, x).shape, jnp.float64)

  def derivatives(layer):
    loss = lambda p, x: jnp.sum(jnp.tanh(layer.apply(p, x)) * weights)  # noqa: E731
    grads = jax.grad(loss, argnums=(0, 1))
    squared = lambda p, x: sum(jnp.sum(g**2) for g in jax.tree.leaves(grads(p, x)))  # noqa: E731
    return layer.apply(params, x), grads(params, x), jax.grad(squared, argnums=(0, 1))(params, x)

  ours, theirs = jax.jit(derivatives, static_argnums=0)(ours_layer), derivatives(theirs_layer)
  assert float(jnp.abs(theirs[1][0]["params"]["bias"]).min()) > 1e-2  # the bias matters here
  _assert_trees_close(ours, theirs, 1e-10)


def test_loop_safe_is_reverse_mode_only():
  """`loop_safe` has no forward-mode rule (a `custom_vjp`): `jax.jvp`, `jacfwd` and
  `jax.hessian` raise, as the README and `convolution.conv2d` say; a Hessian by
  reverse over reverse (`jacrev(jacrev(f))`) works and equals XLA's forward-over-reverse."""
  x = jax.random.normal(jax.random.PRNGKey(4), (2, 6, 6, 1), jnp.float64)
  kernel = jax.random.normal(jax.random.PRNGKey(5), (3, 3, 1, 2), jnp.float64)
  padding = ((1, 1), (1, 1))

  def loss(conv):
    return lambda kernel: jnp.sum(jnp.tanh(conv(x, kernel, 2, padding)) ** 2)

  for forward_mode in (
    lambda f: jax.jvp(f, (kernel,), (kernel,)),
    lambda f: jax.jacfwd(f)(kernel),
    lambda f: jax.hessian(f)(kernel),
  ):
    with pytest.raises(TypeError, match="forward-mode"):
      forward_mode(loss(convolution.conv2d))
  reverse_over_reverse = jax.jit(jax.jacrev(jax.jacrev(loss(convolution.conv2d))))(kernel)
  np.testing.assert_allclose(
    reverse_over_reverse, jax.hessian(loss(xla_conv))(kernel), rtol=1e-10, atol=1e-10
  )


def test_unknown_conv_impl_is_refused():
  with pytest.raises(ValueError, match="conv_impl"):
    models.Conv4(num_classes=5, conv_impl="cudnn").init(
      jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1))
    )


def test_auto_conv_impl_uses_loop_safe_where_gradients_run_in_loops():
  from experiments import presets
  from vampire_jax._src.core import backend_defaults

  if jax.default_backend() != "cpu":
    assert (
      models.auto_conv_impl(task_batching="map", inner_steps_unrolled=False, draws_mapped=True)
      == "xla"
    )
    return
  assert (
    models.auto_conv_impl(
      task_batching="host_chunked", inner_steps_unrolled=True, draws_mapped=False
    )
    == "xla"
  )
  for loops in [
    dict(task_batching="map", inner_steps_unrolled=True, draws_mapped=False),
    dict(task_batching="host_chunked", inner_steps_unrolled=False, draws_mapped=False),
    dict(task_batching="host_chunked", inner_steps_unrolled=True, draws_mapped=True),
  ]:
    assert models.auto_conv_impl(**loops) == "loop_safe", loops
  quick = presets.omniglot_config("quick")
  assert backend_defaults.config_conv_impl(quick) == "loop_safe"
  unrolled = quick.replace(task_batching="host_chunked", unroll_inner_steps=True)
  assert backend_defaults.config_conv_impl(unrolled) == "xla"
  assert backend_defaults.config_conv_impl(quick.replace(conv_impl="patches")) == "patches"
