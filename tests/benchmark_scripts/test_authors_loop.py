"""The PyTorch port's meta-batch loop (`benchmarks/authors_pytorch.py`): one backward per task,
the gradients accumulated as the authors' `MLBaseClass.train` accumulates them, gives the
gradient of the summed meta-loss (`vampire.py`'s `meta_train`) to float64 round-off.

Skipped where torch is not installed. In float64, on tiny networks (a Conv4 of 2 filters on
8x8 images, an MLP of 4 units), MAML second order and VAMPIRE with the authors' truncation,
the weight noise drawn from one seeded generator in the order both loops consume it.
"""

import numpy as np
import pytest


torch = pytest.importorskip("torch")
from benchmarks import authors_pytorch as ap  # noqa: E402  (needs torch)

TASKS = 3
# float64 round-off of a sum of three tasks' gradients, each through three inner steps.
RTOL = 1e-12


def _tasks(kind: str, generator) -> list:
  def rand(*shape):
    return torch.rand(*shape, generator=generator, dtype=torch.float64)

  if kind == "regression":
    return [
      ap.Task(rand(5, 1) * 10 - 5, rand(5, 1), rand(4, 1) * 10 - 5, rand(4, 1))
      for _ in range(TASKS)
    ]
  labels = torch.arange(3)
  return [
    ap.Task(rand(3, 1, 8, 8), labels, rand(6, 1, 8, 8), labels.repeat_interleave(2))
    for _ in range(TASKS)
  ]


def _setting(kind: str, algorithm: str, seed: int = 0):
  """`(config, groups, task_loss(task, noise), tasks)` in float64, from `seed` alone."""
  generator = torch.Generator().manual_seed(seed)
  if kind == "regression":
    net, nll = ap.mlp((4,), 1, 1), ap.gaussian_nll
  else:
    net, nll = ap.conv4(3, (8, 8, 1), 2, max_pool=False, padding="same"), ap.categorical_nll
  config = ap.Config(net, nll, 3, 0.05, num_mc_train=2, num_mc_query=2, second_order_steps=1)
  means = [
    (0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)).requires_grad_()
    for shape in net.shapes
  ]
  if algorithm == "maml":
    config = ap.Config(net, nll, 3, 0.05, second_order_steps=None)
    groups = [means]

    def task_loss(task, noise):
      return ap.maml_task_loss(config, means, task)

  else:
    log_stds = [
      (-3.5 + 0.1 * torch.rand(shape, generator=generator, dtype=torch.float64)).requires_grad_()
      for shape in net.shapes
    ]
    groups = [means, log_stds]

    def task_loss(task, noise):
      return ap.vampire_task_loss(config, means, log_stds, task, noise)

  return config, groups, task_loss, _tasks(kind, generator)


def _noise(seed: int):
  """eps like a weight, from a generator of its own: both loops draw it in the same order."""
  generator = torch.Generator().manual_seed(seed)
  return lambda like: torch.randn(like.shape, generator=generator, dtype=like.dtype)


def _largest_error(ours, theirs) -> float:
  scale = max(float(t.abs().max()) for t in theirs)
  return max(float((a - b).abs().max()) for a, b in zip(ours, theirs)) / scale


@pytest.mark.parametrize(
  "kind, algorithm",
  [("classification", "maml"), ("classification", "vampire"), ("regression", "vampire")],
)
def test_one_backward_per_task_gives_the_summed_meta_gradient(kind, algorithm):
  _, groups, task_loss, tasks = _setting(kind, algorithm)
  weights = [w for group in groups for w in group]
  noise = _noise(1)
  summed, summed_nan = ap.meta_loss(lambda task: task_loss(task, noise), tasks)
  expected = torch.autograd.grad(summed, weights)

  noise = _noise(1)
  loss, nan_tasks = ap.accumulate_meta_gradient(lambda task: task_loss(task, noise), tasks)
  accumulated = [w.grad for w in weights]

  assert summed_nan == nan_tasks == 0
  assert all(g is not None for g in accumulated)
  assert abs(loss - summed.item()) <= RTOL * abs(summed.item())
  assert _largest_error(accumulated, expected) < RTOL
  assert max(float(g.abs().max()) for g in expected) > 1e-3  # a gradient, not zeros


def test_the_two_meta_steps_make_the_same_update():
  """`make_meta_step`'s two loops, through clipping and Adam, leave the same weights."""
  after = {}
  for backward in ap.META_BACKWARDS:
    _, groups, task_loss, tasks = _setting("classification", "vampire", seed=2)
    noise = _noise(3)
    step = ap.make_meta_step(lambda task: task_loss(task, noise), groups, backward)
    losses = [step(tasks) for _ in range(2)]
    after[backward] = ([w.detach().clone() for group in groups for w in group], losses)
  (per_task, per_task_losses), (summed, summed_losses) = after["per-task"], after["summed"]
  assert _largest_error(per_task, summed) < RTOL
  for (a, nan_a), (b, nan_b) in zip(per_task_losses, summed_losses):
    assert nan_a == nan_b == 0 and np.isclose(a, b, rtol=RTOL, atol=0)


def test_the_rows_take_the_per_task_loop_by_default():
  options = ap.options_from_args(ap.build_parser().parse_args([]))
  assert options["meta_backward"] == "per-task"
  summed = ap.options_from_args(ap.build_parser().parse_args(["--meta-backward", "summed"]))
  assert summed["meta_backward"] == "summed"
  with pytest.raises(ValueError, match="meta_backward"):
    ap.make_meta_step(lambda task: None, [[]], "joint")
