"""Flax NNX and Equinox networks through `vj.from_nnx` / `vj.from_equinox`.

VAMPIRE meta-trains on each (the held-out query loss falls), and adapting a converted
network gives the numbers that adapting the same weights as a linen module gives.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vampire_jax as vj
from vampire_jax._src.core.errors import InputError

HIDDEN = (40, 40)


class NnxMLP(nnx.Module):
  """The NNX twin of `vj.MLP(HIDDEN, 1)`: Linear layers with ReLU between them."""

  def __init__(self, sizes, rngs):
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])

  def __call__(self, x):
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    return self.layers[-1](x)


def _sample_tasks(data, task_keys):
  """Shifted sines `sin(x) + b`, b ~ U(-1, 1), noise 0.3: 5 support and 10 query points.

  A family a network meta-learns in a hundred steps, so the test shows the loss falling
  in seconds (on sine/line tasks it takes thousands).
  """
  del data

  def one(key):
    shift_key, x_key, noise_key = jax.random.split(key, 3)
    shift = jax.random.uniform(shift_key, (), minval=-1.0, maxval=1.0)
    x = jax.random.uniform(x_key, (15, 1), minval=-5.0, maxval=5.0)
    y = jnp.sin(x) + shift + 0.3 * jax.random.normal(noise_key, x.shape)
    return vj.Task(x[:5], y[:5], x[5:], y[5:])

  return jax.vmap(one)(task_keys)


def _held_out_loss(learner, meta_params, tasks):
  def one(task, key):
    return vj.query_loss(learner, meta_params, task, key)[0]

  keys = jax.random.split(jax.random.key(99), tasks.support_x.shape[0])
  return float(jnp.mean(jax.jit(jax.vmap(one))(tasks, keys)))


def _meta_train(params, apply_fn, num_calls=4):
  """100 steps of VAMPIRE at the factory's defaults: the held-out query NLL before and after."""
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), num_mc_train=2, num_mc_query=2)
  optimizer = vj.meta_optimizer(1e-2, tasks_per_step=8)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  step = jax.jit(
    vj.make_train_step(learner, optimizer, _sample_tasks, tasks_per_step=8, steps_per_call=25)
  )
  held_out = _sample_tasks(None, jax.random.split(jax.random.key(123), 64))
  before = _held_out_loss(learner, state.meta_params, held_out)
  for call in range(num_calls):
    state, metrics = step(state, None, jax.random.key(10 + call))
    assert bool(metrics["finite"].all())
  return before, _held_out_loss(learner, state.meta_params, held_out), metrics


def _linen_params_of(nnx_params):
  """The NNX MLP's weights as `vj.MLP(HIDDEN, 1)`'s params tree (same layout, renamed)."""
  return {f"Dense_{i}": dict(layer) for i, layer in nnx_params["layers"].items()}


def _equinox_mlp(key):
  eqx = pytest.importorskip("equinox")
  return eqx.nn.MLP(1, 1, width_size=HIDDEN[0], depth=len(HIDDEN), activation=jax.nn.relu, key=key)


class EquinoxLayoutMLP(nn.Module):
  """A linen MLP holding its weights as `eqx.nn.MLP` does: `weight [out, in]` before `bias`.

  Its params tree lists the same arrays in the same order as the Equinox MLP's, so the
  same key draws the same noise for both.
  """

  sizes: tuple

  @nn.compact
  def __call__(self, x):
    for i, (fan_in, fan_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
      weight = self.param(f"layers_{i}_0weight", nn.initializers.zeros, (fan_out, fan_in))
      bias = self.param(f"layers_{i}_1bias", nn.initializers.zeros, (fan_out,))
      x = x @ weight.T + bias
      if i < len(self.sizes) - 2:
        x = jax.nn.relu(x)
    return x


def test_vampire_meta_trains_an_nnx_mlp():
  params, apply_fn = vj.from_nnx(NnxMLP((1, *HIDDEN, 1), nnx.Rngs(0)))
  before, after, _ = _meta_train(params, apply_fn)
  # 100 meta-steps take the held-out query NLL from 6.9 to 1.4 (measured); the bound leaves room.
  assert after < 0.4 * before, (before, after)


def test_adapting_an_nnx_mlp_equals_adapting_the_same_weights_in_linen():
  nnx_params, nnx_apply = vj.from_nnx(NnxMLP((1, *HIDDEN, 1), nnx.Rngs(0)))
  linen_params = _linen_params_of(nnx_params)
  linen_apply = vj.pure_apply(vj.MLP(HIDDEN, 1))
  task = jax.tree.map(lambda a: a[0], _sample_tasks(None, jax.random.split(jax.random.key(5), 1)))
  # The two trees list the same arrays in the same order, so the same key draws the same
  # log-stds and the same weight noise.
  prior_nnx = vj.gaussian_from_params(nnx_params, jax.random.key(1))
  prior_linen = vj.gaussian_from_params(linen_params, jax.random.key(1))
  outputs = {}
  for name, prior, apply_fn in (
    ("nnx", prior_nnx, nnx_apply),
    ("linen", prior_linen, linen_apply),
  ):
    posterior = vj.adapt(
      prior,
      task.support_x,
      task.support_y,
      jax.random.key(2),
      loss_fn=vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3)),
      num_steps=5,
      inner_lr=4.5e-4,
      num_mc_samples=4,
      kl_weight=0.02,
    )
    outputs[name] = (
      posterior,
      vj.predict(posterior, task.query_x, jax.random.key(3), apply_fn=apply_fn, num_mc_samples=8),
    )
  (post_nnx, pred_nnx), (post_linen, pred_linen) = outputs["nnx"], outputs["linen"]
  np.testing.assert_allclose(pred_nnx, pred_linen, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    post_nnx.mean["layers"][0]["kernel"], post_linen.mean["Dense_0"]["kernel"], rtol=1e-6
  )
  np.testing.assert_allclose(
    post_nnx.log_std["layers"][2]["bias"], post_linen.log_std["Dense_2"]["bias"], rtol=1e-6
  )
  # The adaptation moved the weights: the equality is not that of two untouched priors.
  assert not np.allclose(post_nnx.mean["layers"][0]["kernel"], nnx_params["layers"][0]["kernel"])


def test_from_nnx_refuses_another_tree_and_integer_inputs():
  params, apply_fn = vj.from_nnx(NnxMLP((1, 4, 1), nnx.Rngs(0)))
  assert apply_fn(params, jnp.ones((3, 1))).shape == (3, 1)
  with pytest.raises(vj.InputError, match=r"from_nnx: apply_fn: params must be a tree shaped"):
    apply_fn({"layers": params["layers"][0]}, jnp.ones((3, 1)))
  with pytest.raises(vj.InputError, match=r"x must be floating point"):
    apply_fn(params, jnp.ones((3, 1), jnp.int32))


def test_vampire_meta_trains_an_equinox_mlp():
  params, apply_fn = vj.from_equinox(_equinox_mlp(jax.random.key(0)))
  before, after, _ = _meta_train(params, apply_fn)
  assert after < 0.4 * before, (before, after)


def test_adapting_an_equinox_mlp_equals_adapting_the_same_weights_in_linen():
  eqx_params, eqx_apply = vj.from_equinox(_equinox_mlp(jax.random.key(0)))
  layers = eqx_params.layers
  sizes = (1, *HIDDEN, 1)
  linen_params = {}
  for i, layer in enumerate(layers):
    linen_params[f"layers_{i}_0weight"] = layer.weight
    linen_params[f"layers_{i}_1bias"] = layer.bias
  linen_apply = vj.pure_apply(EquinoxLayoutMLP(sizes))
  task = jax.tree.map(lambda a: a[0], _sample_tasks(None, jax.random.split(jax.random.key(5), 1)))
  assert [a.shape for a in jax.tree.leaves(eqx_params)] == [
    a.shape for a in jax.tree.leaves(linen_params)
  ]
  results = {}
  for name, params, apply_fn in (
    ("equinox", eqx_params, eqx_apply),
    ("linen", linen_params, linen_apply),
  ):
    prior = vj.gaussian_from_params(params, jax.random.key(1))
    posterior = vj.adapt(
      prior,
      task.support_x,
      task.support_y,
      jax.random.key(2),
      loss_fn=vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3)),
      num_steps=5,
      inner_lr=4.5e-4,
      num_mc_samples=4,
      kl_weight=0.02,
    )
    results[name] = (
      jax.tree.leaves(posterior),
      vj.predict(posterior, task.query_x, jax.random.key(3), apply_fn=apply_fn, num_mc_samples=8),
    )
  for got, want in zip(results["equinox"][0], results["linen"][0]):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(results["equinox"][1], results["linen"][1], rtol=1e-6, atol=1e-6)
  assert not np.allclose(results["equinox"][0][0], layers[0].weight)


def test_maml_on_an_equinox_mlp_equals_maml_on_vj_mlp_with_the_same_weights():
  """Against the library's own linen `vj.MLP` (kernels are the Equinox weights transposed)."""
  eqx_params, eqx_apply = vj.from_equinox(_equinox_mlp(jax.random.key(0)))
  linen_params = {
    f"Dense_{i}": {"kernel": layer.weight.T, "bias": layer.bias}
    for i, layer in enumerate(eqx_params.layers)
  }
  linen_apply = vj.pure_apply(vj.MLP(HIDDEN, 1))
  task = jax.tree.map(lambda a: a[0], _sample_tasks(None, jax.random.split(jax.random.key(5), 1)))
  adapted = {}
  for name, params, apply_fn in (
    ("equinox", eqx_params, eqx_apply),
    ("linen", linen_params, linen_apply),
  ):
    learner = vj.maml(apply_fn, vj.gaussian_nll(0.3))
    task_params = learner.adapt(params, task.support_x, task.support_y, jax.random.key(0))
    adapted[name] = (task_params, apply_fn(task_params, task.query_x))
  np.testing.assert_allclose(adapted["equinox"][1], adapted["linen"][1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    adapted["equinox"][0].layers[1].weight.T, adapted["linen"][0]["Dense_1"]["kernel"], rtol=1e-5
  )


def test_from_nnx_names_a_layer_in_training_mode_and_wrong_inputs():
  """from_nnx names a BatchNorm or Dropout in training mode and model.eval(); after eval,
  inputs of the wrong width are named as not fitting the module."""
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(1, 8, rngs=rngs)
      self.norm = nnx.BatchNorm(8, rngs=rngs)
      self.drop = nnx.Dropout(0.5, rngs=rngs)
      self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
      return self.out(self.drop(self.norm(self.dense(x))))

  model = Net(nnx.Rngs(0))
  with pytest.raises(
    InputError,
    match=r"from_nnx: (norm|drop) is an nnx.(BatchNorm|Dropout) in training mode.*model.eval\(\)",
  ):
    vj.from_nnx(model)
  model.drop.deterministic = True  # dropout off, batch norm still training: named as well
  with pytest.raises(InputError, match=r"from_nnx: norm is an nnx.BatchNorm in training mode"):
    vj.from_nnx(model)
  model.eval()
  params, apply_fn = vj.from_nnx(model)
  assert apply_fn(params, jnp.ones((3, 1))).shape == (3, 1)
  with pytest.raises(InputError, match=r"x float32\[3, 2\] does not fit the module"):
    apply_fn(params, jnp.ones((3, 2)))


def test_from_equinox_names_stateful_layers_and_weights_of_another_width():
  """from_equinox names a BatchNorm and a Dropout in training mode (and inference_mode);
  weights of another width are refused in one line naming both shapes."""
  eqx = pytest.importorskip("equinox")

  class Net(eqx.Module):
    dense: eqx.nn.Linear
    norm: eqx.nn.BatchNorm

    def __init__(self, key):
      self.dense = eqx.nn.Linear(1, 8, key=key)
      self.norm = eqx.nn.BatchNorm(8, axis_name="batch", mode="batch")

    def __call__(self, x, state=None):
      return self.norm(self.dense(x), state)[0]

  with pytest.raises(InputError, match=r"from_equinox: \.norm is an eqx.nn.BatchNorm"):
    vj.from_equinox(Net(jax.random.key(0)))
  with_dropout = eqx.nn.Sequential(
    [eqx.nn.Linear(1, 4, key=jax.random.key(0)), eqx.nn.Dropout(0.2)]
  )
  with pytest.raises(InputError, match=r"Dropout in training mode.*inference_mode"):
    vj.from_equinox(with_dropout)
  vj.from_equinox(eqx.nn.inference_mode(with_dropout))
  params, apply_fn = vj.from_equinox(eqx.nn.MLP(1, 1, 8, 2, key=jax.random.key(0)))
  wider, _ = vj.from_equinox(eqx.nn.MLP(1, 1, 16, 2, key=jax.random.key(0)))
  with pytest.raises(InputError) as raised:
    apply_fn(wider, jnp.ones((3, 1)))
  assert "has shape (16, 1), the module's has (8, 1)" in str(raised.value)
  assert len(str(raised.value).splitlines()) == 1
