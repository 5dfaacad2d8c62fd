"""Vampire2 and ProtoNet equal the authors' code at HEAD, re-expressed in PyTorch (issue 51).

    PYTHONPATH=$PWD:/work/torch_only python -m pytest tests/benchmark_scripts/test_authors_pytorch_head.py -s

Skipped where torch is not installed (CI has none). At identical weights (ours
converted to PyTorch's layout), identical tasks (NHWC -> NCHW) and identical weight
noise (our draws, replayed in the order the authors' loops consume them), one
meta-step's loss and meta-gradient, before the optimiser, of
`benchmarks/authors_pytorch_head.py` (Vampire2.py, ProtoNet.py and MLBaseClass.py
of cnguyen10/few_shot_meta_learning at d797d9d) equal our `make_meta_gradient`'s, to
float32 rounding:
  - Vampire2 first order (their default) and second order (`--no-first-order`), on a
    Conv4 as their `CNN(bn_affine=False)`: no batch-norm scale and offset, stride-2
    convolutions padded 1 on each side (`Conv4(padding="symmetric")`; once with XLA's
    'SAME', our default, on both sides), and on the regression MLP. Their loss carries a constant ours does not (their KL subtracts n
    per tensor pair, n pairs): the test adds it back, `authors_kl_constant`.
  - ProtoNet's logits, loss and gradient, with their Euclidean distance and with
    Snell et al.'s squared one; and with training episodes of more classes than the
    learner's `num_classes` (`train_num_classes`, the meta-loss's path).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from benchmarks import suite

torch = pytest.importorskip("torch")
from benchmarks import authors_pytorch as ap  # noqa: E402  (needs torch)
from benchmarks import authors_pytorch_head as head  # noqa: E402
from tests.benchmark_scripts.test_authors_pytorch import ReplayNoise, _torch_tasks, _worst_error  # noqa: E402

RTOL = 1e-4  # of the largest entry of the whole tree (or the loss): float32 rounding


# 3-way 1-shot, 2 queries per class, 28x28x1, Conv4-8 (stride 2), 2 tasks, S = 3, L = 2.
# (With 4 filters the two sides agree to 8e-8 in float64 but only to 3e-3 in float32: in so
# small a network a ReLU input near 0 takes either sign with the rounding.)
OMNIGLOT = dataclasses.replace(
  suite.SETTINGS["omniglot_5w1s"],
  tasks=2,
  ways=3,
  query=2,
  num_filters=8,
  inner_steps=3,
  mc_samples=2,
  inner_lr=0.1,
)


REGRESSION = dataclasses.replace(
  suite.SETTINGS["regression"], tasks=2, inner_steps=3, mc_samples=3, query=4, inner_lr=0.001
)


KL_WEIGHT = 0.01  # large enough that the KL terms and the authors' constant show


def _tasks(setting, num_tasks=None):
  tasks = suite.random_tasks(setting, jax.random.key(2), num_tasks or setting.tasks)
  return tasks, jax.random.split(jax.random.key(3), num_tasks or setting.tasks)


def _network(setting, num_classes, padding="symmetric"):
  """Our network and its PyTorch twin: Conv4 without batch-norm scale and offset, padded as
  the authors' `CommonModels.CNN` (1 on each side of every stride-2 convolution) unless
  `padding="same"` (XLA's, our default), or the MLP."""
  if setting.kind == "regression":
    model = vj.MLP((100, 100, 100), 1)
    input_shape = (1, 1)
    net = ap.mlp((100, 100, 100), 1, 1)
  else:
    model = vj.Conv4(
      num_classes=num_classes,
      num_filters=setting.num_filters,
      batch_norm_affine=False,
      padding=padding,
    )
    input_shape = (1,) + setting.image
    net = ap.conv4(
      num_classes,
      setting.image,
      setting.num_filters,
      False,
      batch_norm_affine=False,
      padding=padding,
    )
  return model, vj.init_params(model, jax.random.key(0), input_shape), net


def _relative(ours: float, theirs: float) -> float:
  return abs(ours - theirs) / abs(ours)


@pytest.mark.parametrize(
  "setting, first_order, padding",
  [
    (OMNIGLOT, True, "symmetric"),
    (OMNIGLOT, False, "symmetric"),
    (OMNIGLOT, True, "same"),
    (REGRESSION, True, None),
  ],
  ids=["conv4-first-order", "conv4-second-order", "conv4-xla-padding", "mlp-first-order"],
)
def test_vampire2_meta_step_equals_the_authors(setting, first_order, padding):
  model, params, net = _network(setting, setting.ways, padding)
  nll = vj.gaussian_nll(0.3) if setting.kind == "regression" else vj.categorical_nll
  learner = vj.vampire(
    vj.pure_apply(model),
    nll,
    num_inner_steps=setting.inner_steps,
    inner_lr=setting.inner_lr,
    kl_weight=KL_WEIGHT,
    num_mc_train=setting.mc_samples,
    num_mc_query=setting.mc_samples,
    first_order=first_order,
    kl_target="standard_normal",
    outer_kl_weight=KL_WEIGHT,
  )
  meta_params = learner.init(params, jax.random.key(1))
  tasks, task_keys = _tasks(setting)
  grads, metrics = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))(
    meta_params, tasks, task_keys
  )

  config = ap.Config(
    net,
    ap.likelihood(setting),
    setting.inner_steps,
    setting.inner_lr,
    kl_weight=KL_WEIGHT,
    num_mc_train=setting.mc_samples,
    num_mc_query=setting.mc_samples,
    second_order_steps=0 if first_order else None,  # 0: their --first-order
  )
  means = ap.torch_weights(net, meta_params.mean)
  log_stds = ap.torch_weights(net, meta_params.log_std)
  noise = ReplayNoise(
    net, meta_params.mean, task_keys, setting.inner_steps, setting.mc_samples, setting.mc_samples
  )
  loss = head.meta_loss(
    lambda task: head.vampire2_task_loss(config, means, log_stds, task, noise),
    _torch_tasks(tasks),
  )
  assert noise.used == len(noise.arrays)  # every draw of ours, no other
  raw = torch.autograd.grad(loss, means + log_stds)
  theirs = vj.Gaussian(
    ap.tree_from_torch(net, raw[: len(means)]), ap.tree_from_torch(net, raw[len(means) :])
  )
  constant = KL_WEIGHT * head.authors_kl_constant(means)
  ours_loss, their_loss = float(metrics["loss"]), loss.item()
  print(
    f"\nVampire2 {setting.kind} first_order={first_order}: loss ours {ours_loss:.6f}, theirs"
    f" {their_loss:.6f} = ours + their constant {constant:.4f} (error"
    f" {_relative(ours_loss, their_loss - constant):.1e}); gradient error"
    f" {_worst_error(grads, theirs):.1e} of its largest entry"
  )
  assert abs(constant) > 1e-3 * abs(ours_loss)  # the constant is there, and shows
  assert _relative(ours_loss, their_loss - constant) < RTOL
  assert _worst_error(grads, theirs) < RTOL


def test_the_authors_padding_is_not_xlas_and_the_port_sees_it():
  # Stride 2 on 28 x 28: theirs pads 1 on each side, XLA's 'SAME' 0 before and 1 after. The
  # same weights give other embeddings, so the tests above, padded as theirs, check it.
  setting = OMNIGLOT
  x = jax.random.uniform(jax.random.key(4), (3,) + setting.image)
  ours = {}
  for padding in ("same", "symmetric"):
    model, params, net = _network(setting, None, padding)
    channels, height, width = net.head_input  # ours flattens NHWC, the port NCHW
    embedding = np.asarray(vj.pure_apply(model)(params, x)).reshape(3, height, width, channels)
    embedding = embedding.transpose(0, 3, 1, 2).reshape(3, -1)
    torch_x = torch.tensor(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))
    port = net.apply(ap.torch_weights(net, params), torch_x).detach().numpy()
    np.testing.assert_allclose(port, embedding, rtol=1e-4, atol=1e-4)
    ours[padding] = embedding
  assert np.abs(ours["same"] - ours["symmetric"]).max() > 0.1


@pytest.mark.parametrize("distance", ["euclidean", "squared_euclidean"])
def test_protonet_episode_equals_the_authors(distance):
  setting = OMNIGLOT
  model, params, net = _network(setting, None)
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=setting.ways, distance=distance)
  tasks, task_keys = _tasks(setting)
  grads, metrics = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))(
    params, tasks, task_keys
  )
  weights = ap.torch_weights(net, params)
  torch_distance = {
    "euclidean": head.euclidean_distance,
    "squared_euclidean": head.squared_euclidean_distance,
  }[distance]
  torch_tasks = _torch_tasks(tasks)
  for t, task in enumerate(torch_tasks):  # each episode's logits
    ours = learner.predict(
      learner.adapt(params, tasks.support_x[t], tasks.support_y[t], task_keys[t]),
      tasks.query_x[t],
      task_keys[t],
    )[0]
    theirs = head.protonet_logits(net, weights, task, torch_distance).detach().numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5 * float(jnp.abs(ours).max()))
  loss = head.meta_loss(
    lambda task: head.protonet_task_loss(net, weights, task, torch_distance), torch_tasks
  )
  theirs = ap.tree_from_torch(net, torch.autograd.grad(loss, weights))
  print(
    f"\nProtoNet {distance}: loss ours {float(metrics['loss']):.6f} theirs {loss.item():.6f};"
    f" gradient error {_worst_error(grads, theirs):.1e} of its largest entry"
  )
  assert _relative(float(metrics["loss"]), loss.item()) < RTOL
  assert _worst_error(grads, theirs) < RTOL


def test_protonet_trained_on_more_ways_equals_the_authors_on_those_episodes():
  # Training episodes of 3 ways for a learner that tests 2-way (`train_num_classes`): the
  # meta-loss builds 3 prototypes, as the authors' code does for any episode it is given.
  setting = OMNIGLOT
  model, params, net = _network(setting, None)
  learner = vj.baselines.protonet(
    vj.pure_apply(model), num_classes=2, train_num_classes=3, distance="euclidean"
  )
  assert learner.meta_loss is not None
  tasks, task_keys = _tasks(setting)
  grads, metrics = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))(
    params, tasks, task_keys
  )
  weights = ap.torch_weights(net, params)
  loss = head.meta_loss(
    lambda task: head.protonet_task_loss(net, weights, task), _torch_tasks(tasks)
  )
  theirs = ap.tree_from_torch(net, torch.autograd.grad(loss, weights))
  assert _relative(float(metrics["loss"]), loss.item()) < RTOL
  assert _worst_error(grads, theirs) < RTOL
