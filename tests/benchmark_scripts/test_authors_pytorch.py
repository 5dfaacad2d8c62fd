"""The PyTorch harness of the authors' algorithm computes our meta-loss and meta-gradient.

    PYTHONPATH=.:$TORCH_ONLY .venv/bin/python -m pytest tests/benchmark_scripts/test_authors_pytorch.py -s

Skipped where torch is not installed (CI has none): `benchmarks/authors_pytorch.py`
runs with a PyTorch interpreter, and this check needs one Python with both
(BUILD_NOTES.md, "Side by side with the authors' algorithm in PyTorch").

At identical weights (ours converted to PyTorch's layout by
`to_torch_layout`), identical tasks (NHWC -> NCHW) and, for VAMPIRE,
identical weight noise (our draws, replayed in the order the authors' loops
consume them), the PyTorch meta-loss and meta-gradient (before clipping and
Adam) equal our `make_meta_gradient`'s for the learner `benchmarks.suite`
times, to float32 rounding: MAML second order, VAMPIRE with the authors'
truncation (`second_order_steps=1`, both ways of taking the inner gradients)
and fully second order, on the Omniglot network (stride 2, padded as XLA
pads), the mini-ImageNet network (max-pool, odd sizes) and the regression
MLP; and a test episode's predictive probabilities equal our evaluator's.
The settings are tiny (3 ways, 2 queries per class, 8 or 4 filters, 3
inner steps, 2 tasks, L = 2) and use the authors' stable inner lr where ours
diverges; `test_rows_use_the_settings_we_time` checks that the harness's
rows take the settings of `benchmarks.suite`.
"""

import dataclasses

import jax
import numpy as np
import optax
import pytest

import vampire_jax as vj
from benchmarks import side_by_side, suite
from tests.helpers import check_page_out_drops_a_files_pages
from vampire_jax._src.core import gaussian

torch = pytest.importorskip("torch")
from benchmarks import authors_pytorch as ap  # noqa: E402  (needs torch)

TINY = dict(tasks=2, ways=3, query=2, inner_steps=3, mc_samples=2, conv_impl="loop_safe")


OMNIGLOT = dataclasses.replace(
  suite.SETTINGS["omniglot_5w1s"], num_filters=8, inner_lr=0.01, **TINY
)


# 22 -> 11 -> 5 -> 2 -> 1: odd sizes, whose last row and column the 2x2 pool drops.
MINI_IMAGENET = dataclasses.replace(
  suite.SETTINGS["mini_imagenet_5w1s"], num_filters=4, image=(22, 22, 3), **TINY
)


REGRESSION = dataclasses.replace(
  suite.SETTINGS["regression"], tasks=2, inner_steps=3, mc_samples=3, query=4
)


RTOL = 1e-4  # of each leaf's largest entry: float32 rounding through S second-order steps


def _ours(setting, algorithm, second_order_steps):
  """Our learner as `benchmarks.suite` builds it, its meta-parameters, tasks and task keys."""
  apply_fn, params, nll = suite.network(setting)
  learner = suite.make_learner(
    setting,
    algorithm,
    apply_fn,
    nll,
    unroll_steps=False,
    remat=False,
    second_order_steps=second_order_steps,
  )
  meta_params = learner.init(params, jax.random.key(1))
  tasks = suite.random_tasks(setting, jax.random.key(2), setting.tasks)
  task_keys = jax.random.split(jax.random.key(3), setting.tasks)
  return learner, meta_params, tasks, task_keys


def _torch_field(array):
  """One field of one task as the harness takes it: images NHWC -> NCHW, labels int64."""
  array = np.asarray(array)
  if array.ndim == 4:  # [examples, H, W, C] -> [examples, C, H, W]
    array = array.transpose(0, 3, 1, 2)
  if np.issubdtype(array.dtype, np.integer):
    return torch.tensor(array, dtype=torch.int64)
  return torch.tensor(np.ascontiguousarray(array, np.float32))


def _torch_tasks(tasks) -> list:
  """Our `Task` batch as the harness's tasks: images NHWC -> NCHW, labels int64."""
  return [
    ap.Task(*(_torch_field(getattr(tasks, field)[t]) for field in tasks._fields))
    for t in range(tasks.support_x.shape[0])
  ]


class ReplayNoise:
  """Our weight noise, in the order the harness draws it: per task, per inner step, per draw, per weight."""

  def __init__(self, net, mean_tree, task_keys, num_steps, num_train, num_query):
    self.arrays = []
    for key in task_keys:  # as `learners.query_loss` and `adaptation.adapt` split the keys
      adapt_key, query_key = jax.random.split(key)
      for step_key in jax.random.split(adapt_key, num_steps):
        self._add(net, gaussian._normal_like(step_key, mean_tree, num_train), num_train)
      self._add(net, gaussian._normal_like(query_key, mean_tree, num_query), num_query)
    self.used = 0

  def _add(self, net, eps, num_draws):
    for draw in range(num_draws):
      for name in net.names:
        module, leaf = name.split("/")
        self.arrays.append(ap.to_torch_layout(net, name, np.asarray(eps[module][leaf][draw])))

  def __call__(self, like):
    array = self.arrays[self.used]
    assert array.shape == tuple(like.shape), (array.shape, like.shape)
    self.used += 1
    return torch.tensor(np.ascontiguousarray(array))


def _worst_error(ours, theirs) -> float:
  """The largest |ours - theirs|, relative to the largest |ours| of the whole tree.

  Of the whole tree, not of each leaf: a convolution's bias before batch norm
  has a gradient of zero (the norm subtracts the mean), ~1e-7 of rounding on
  either side. A `Gaussian`'s means and log-stds are scaled apart.
  """
  if isinstance(ours, vj.Gaussian):
    return max(_worst_error(a, b) for a, b in zip(ours, theirs))
  pairs = [
    (np.asarray(a, np.float64), np.asarray(b, np.float64))
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs))
  ]
  assert all(a.shape == b.shape for a, b in pairs)
  scale = max(float(np.max(np.abs(a))) for a, _ in pairs)
  return max(float(np.max(np.abs(a - b))) for a, b in pairs) / scale


def _compare(setting, algorithm, second_order_steps, split_grads=True):
  learner, meta_params, tasks, task_keys = _ours(setting, algorithm, second_order_steps)
  grads, metrics = jax.jit(vj.make_meta_gradient(learner, task_batching="map"))(
    meta_params, tasks, task_keys
  )
  net = ap.network(setting)
  config = ap.Config(
    net,
    ap.likelihood(setting),
    setting.inner_steps,
    setting.inner_lr,
    num_mc_train=setting.mc_samples,
    num_mc_query=setting.mc_samples,
    second_order_steps=second_order_steps,
    split_grads=split_grads,
  )
  torch_tasks = _torch_tasks(tasks)
  if algorithm == "maml":
    weights = ap.torch_weights(net, meta_params)
    loss, nan_tasks = ap.meta_loss(
      lambda task: ap.maml_task_loss(config, weights, task), torch_tasks
    )
    their_grads = ap.tree_from_torch(net, torch.autograd.grad(loss, weights))
  else:
    means = ap.torch_weights(net, meta_params.mean)
    log_stds = ap.torch_weights(net, meta_params.log_std)
    noise = ReplayNoise(
      net, meta_params.mean, task_keys, setting.inner_steps, setting.mc_samples, setting.mc_samples
    )
    loss, nan_tasks = ap.meta_loss(
      lambda task: ap.vampire_task_loss(config, means, log_stds, task, noise), torch_tasks
    )
    assert noise.used == len(noise.arrays)  # every draw of ours, no other
    raw = torch.autograd.grad(loss, means + log_stds)
    their_grads = vj.Gaussian(
      ap.tree_from_torch(net, raw[: len(means)]), ap.tree_from_torch(net, raw[len(means) :])
    )
  assert nan_tasks == 0
  ours_loss = float(metrics["loss"])
  loss_error = abs(loss.item() - ours_loss) / abs(ours_loss)
  grad_error = _worst_error(grads, their_grads)
  print(
    f"\n{setting.image if setting.kind == 'classification' else 'MLP'} {algorithm}"
    f" second_order_steps={second_order_steps} split={split_grads}: loss ours {ours_loss:.6f}"
    f" PyTorch {loss.item():.6f} (relative error {loss_error:.1e}); gradient norm ours"
    f" {float(optax.global_norm(grads)):.4f}, largest error {grad_error:.1e} of its largest entry"
  )
  assert loss_error < RTOL
  assert grad_error < RTOL


def test_layout_conversions_are_inverse_and_put_the_head_in_nchw_order():
  net = ap.network(OMNIGLOT)
  channels, height, width = net.head_input
  assert (channels, height, width) == (8, 2, 2)  # 28 -> 14 -> 7 -> 4 -> 2
  rng = np.random.default_rng(0)
  for name, shape in zip(net.names, net.shapes):
    theirs = rng.normal(size=shape).astype(np.float32)
    ours = ap.from_torch_layout(net, name, theirs)
    np.testing.assert_array_equal(ap.to_torch_layout(net, name, ours), theirs)
  # Our head row (h, w, c) is PyTorch's column (c, h, w).
  ours = np.arange(height * width * channels * 3).reshape(height * width * channels, 3)
  theirs = ap.to_torch_layout(net, "head/kernel", ours)
  h, w, c = 1, 0, 5
  np.testing.assert_array_equal(
    theirs[:, (c * height + h) * width + w], ours[(h * width + w) * channels + c]
  )
  # A conv kernel: ours [kh, kw, in, out], PyTorch's [out, in, kh, kw].
  kernel = rng.normal(size=(3, 3, 1, 8))
  assert ap.to_torch_layout(net, "conv0/kernel", kernel)[5, 0, 2, 1] == kernel[2, 1, 0, 5]


def test_same_padding_is_xlas():
  from vampire_jax._src.core import convolution

  for size in (28, 14, 7, 4, 84, 21, 5):
    for stride in (1, 2):
      expected = convolution.same_padding(size, size, (3, 3), stride)[0]
      assert ap.same_padding(size, stride) == tuple(expected)


def test_network_outputs_equal_ours():
  for setting in (OMNIGLOT, MINI_IMAGENET, REGRESSION):
    apply_fn, params, _ = suite.network(setting)
    tasks = suite.random_tasks(setting, jax.random.key(2), 1)
    ours = np.asarray(apply_fn(params, tasks.query_x[0]))
    net = ap.network(setting)
    x = _torch_tasks(tasks)[0].query_x
    theirs = net.apply(ap.torch_weights(net, params), x).detach().numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5 * np.abs(ours).max())


def test_maml_second_order_equals_ours():
  _compare(OMNIGLOT, "maml", None)


def test_maml_truncated_equals_ours():
  _compare(MINI_IMAGENET, "maml", 1)


@pytest.mark.parametrize("split_grads", [True, False])
def test_vampire_authors_truncation_equals_ours(split_grads):
  _compare(OMNIGLOT, "vampire", 1, split_grads)


def test_vampire_full_second_order_equals_ours():
  _compare(MINI_IMAGENET, "vampire", None)


def test_vampire_regression_equals_ours():
  _compare(REGRESSION, "vampire", 1)


def test_episode_probabilities_equal_our_evaluator():
  setting = OMNIGLOT
  learner, meta_params, tasks, task_keys = _ours(setting, "vampire", None)
  evaluate = jax.jit(vj.make_classification_evaluator(learner, task_batching="map"))
  ours = evaluate(meta_params, tasks, task_keys)
  net = ap.network(setting)
  config = ap.Config(
    net,
    ap.likelihood(setting),
    setting.inner_steps,
    setting.inner_lr,
    num_mc_train=setting.mc_samples,
    num_mc_query=setting.mc_samples,
  )
  noise = ReplayNoise(
    net, meta_params.mean, task_keys, setting.inner_steps, setting.mc_samples, setting.mc_samples
  )
  means = ap.torch_weights(net, meta_params.mean)
  log_stds = ap.torch_weights(net, meta_params.log_std)
  accuracies, probs = ap.episode(config, means, log_stds, _torch_tasks(tasks), noise)
  assert noise.used == len(noise.arrays)
  np.testing.assert_allclose(probs.detach().numpy(), np.asarray(ours.probabilities), atol=1e-5)
  np.testing.assert_allclose(accuracies.numpy(), np.asarray(ours.accuracy))


def test_rows_use_the_settings_we_time():
  assert side_by_side.ROWS == tuple(ap.ROWS)
  options = ap.options_from_args(ap.build_parser().parse_args([]))
  assert options["second_order_steps"] == 1 and options["maml_second_order_steps"] is None
  for row, (name, algorithm) in ap.ROWS.items():
    setting = ap.row_setting(row, options, num_tasks=32)
    config = ap.row_config(row, setting, options)
    expected = suite.SETTINGS[name]
    assert setting.tasks == (32 if algorithm == "episode" else expected.tasks)
    assert config.num_mc_train == config.num_mc_query == setting.mc_samples
    assert setting.mc_samples == {"maml": 1, "episode": 10}.get(algorithm, expected.mc_samples)
    apply_fn, _, nll = suite.network(setting)
    if setting.kind == "regression":
      assert ap.NOISE_STD == nll.noise_std
    ours = suite.make_learner(
      setting,
      "maml" if algorithm == "maml" else "vampire",
      apply_fn,
      nll,
      unroll_steps=False,
      remat=False,
    ).settings
    assert (config.inner_lr, config.num_inner_steps) == (
      ours.inner_lr,
      ours.num_inner_steps,
    )
    if algorithm != "maml":
      assert config.kl_weight == ours.kl_weight


@pytest.mark.parametrize("separately", [True, False])
def test_meta_optimizer_is_torch_adam_with_the_authors_weight_decay(separately):
  # vampire.py's optimiser: torch.optim.Adam with weight_decay 1e-3 on the log-stds'
  # parameter group, after clip_grad_norm_ of the means and of the log-stds (each at 10),
  # against `vj.meta_optimizer(clip_separately=True, log_std_weight_decay=...)`; and the
  # joint clip against one clip_grad_norm_ over both.
  rng = np.random.default_rng(0)
  mean = {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
  log_std = {k: rng.uniform(-4, -3, size=v.shape).astype(np.float32) for k, v in mean.items()}
  gradients = [
    (
      {k: 40 * rng.normal(size=v.shape).astype(np.float32) for k, v in mean.items()},
      {k: 15 * rng.normal(size=v.shape).astype(np.float32) for k, v in mean.items()},
    )
    for _ in range(5)
  ]
  decay = 0.3  # large, so that an error in where it is added shows
  t_mean = {k: torch.tensor(v, requires_grad=True) for k, v in mean.items()}
  t_log_std = {k: torch.tensor(v, requires_grad=True) for k, v in log_std.items()}
  adam = torch.optim.Adam(
    [
      {"params": list(t_mean.values()), "weight_decay": 0},
      {"params": list(t_log_std.values()), "weight_decay": decay},
    ],
    lr=1e-2,
  )
  for g_mean, g_log_std in gradients:
    for group, grads in ((t_mean, g_mean), (t_log_std, g_log_std)):
      for k, tensor in group.items():
        tensor.grad = torch.tensor(grads[k])
    if separately:
      torch.nn.utils.clip_grad_norm_(list(t_mean.values()), max_norm=10)
      torch.nn.utils.clip_grad_norm_(list(t_log_std.values()), max_norm=10)
    else:
      torch.nn.utils.clip_grad_norm_(list(t_mean.values()) + list(t_log_std.values()), 10)
    adam.step()
  optimizer = vj.meta_optimizer(
    1e-2,
    tasks_per_step=10,
    decay_rate=1.0,
    clip_norm=10.0,
    clip_separately=separately,
    log_std_weight_decay=decay,
  )
  params = vj.Gaussian(mean, log_std)
  state = optimizer.init(params)
  for g_mean, g_log_std in gradients:
    updates, state = optimizer.update(vj.Gaussian(g_mean, g_log_std), state, params)
    params = optax.apply_updates(params, updates)
  for ours, theirs in ((params.mean, t_mean), (params.log_std, t_log_std)):
    for k in ours:
      np.testing.assert_allclose(ours[k], theirs[k].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_page_out_drops_a_read_only_files_resident_pages_as_ours_does(tmp_path):
  """`--page-out`'s page-out (the authors' process given what our release does): a file of
  this test's own, mapped read-only and read through, leaves the resident memory, and
  reads back the same (tests/core/test_host_memory.py checks ours alike)."""
  check_page_out_drops_a_files_pages(tmp_path, ap.page_out_file_pages)
