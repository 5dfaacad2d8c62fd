"""The authors' VAMPIRE and MAML meta-steps in PyTorch, to time beside ours (issue 22).

    /work/torchenv/bin/python benchmarks/authors_pytorch.py --rows omniglot_vampire,omniglot_maml --repeats 3 --json out.json
    /work/torchenv/bin/python benchmarks/authors_pytorch.py --rows all --repeats 3 --json torch.json
    /work/torchenv/bin/python benchmarks/authors_pytorch.py --rows omniglot_vampire --tasks 2 --repeats 1   # smoke
    /work/torchenv/bin/python benchmarks/authors_pytorch.py --rows episode_vampire_omniglot --episode-tasks 1 --episode-mc-samples 2

Needs torch and numpy only (it reads the settings from `benchmarks.suite`, whose
module level imports the standard library only: the process holds no JAX while it
steps; a row's `processor` is `vampire_jax.backend.processor_record`, read after the
row's memory was measured, None where the library is not installed).
`python -m benchmarks.side_by_side` runs it beside our benchmarks, one process at a
time; `tests/benchmark_scripts/test_authors_pytorch.py` checks, where torch is installed, that it
computes our meta-loss and meta-gradient.

What it follows: `vampire.py` of cnguyen10/few_shot_meta_learning (the code
of the paper), function by function:
  - The meta-batch as `MLBaseClass.train` (their code's HEAD) runs it: the T
    tasks in a Python loop, each task's query loss divided by T, checked for
    NaN (`.item()`) and back-propagated at once (`loss_v.backward()`), the
    gradients accumulating in `.grad`, so that one task's graph is freed
    before the next is built; then the step. `--meta-backward summed` is
    `vampire.py`'s `meta_train` (2019): the T losses summed into one
    meta-loss, divided by T and back-propagated once, holding T graphs at
    once (the same gradient: `tests/benchmark_scripts/test_authors_loop.py`). Either way the
    gradient norms of the means and of the log-stds are clipped at 10
    separately (`vampire.py`'s; `MLBaseClass.train` clips nowhere), then Adam,
    lr 1e-3.
  - `adapt_to_task`: inner step 1 draws L_t weights from theta and takes the
    NLL's gradient w.r.t. theta's means and log-stds with
    `create_graph=True` (no KL term: at q = theta it and its gradient are
    zero); steps 2..S draw from q and take the NLL's gradient w.r.t. q
    without `create_graph` (a constant: their truncation), plus the KL's
    gradient in closed form (differentiable), weighted by beta.
  - `predict`: L_v draws on the query set; the loss is the mean NLL over draws.
  - `sample_nn_weight`: w = mean + eps * exp(log_std), eps from `randn_like`,
    weight by weight, draw by draw (a Python loop over the L draws).
  - Test episodes (`validate_classification`): the same `adapt_to_task` (so
    step 1 still builds the graph of its gradient, the prior requiring
    gradients), then L_v draws, softmax averaged, accuracy; task by task.
The authors take the NLL's gradient w.r.t. the means and w.r.t. the log-stds
in two `autograd.grad` calls, each a backward pass through the network:
`--inner-grad split` (the default) does as they do, `joint` takes both in one
call (the same numbers, one backward pass per inner step).

MAML: second order in every inner step (`create_graph=True`), one weight
tree, the same meta-batch loop, clipping (all weights together) and Adam.
The authors' `maml.py` of the same era truncates as VAMPIRE does
(`--maml-second-order-steps 1`); their later `maml.py` (with `higher`) is
first order by default.

What is ours, not theirs, so that both sides compute the same thing:
  - The networks of `benchmarks.suite` (`vj.Conv4`, `vj.MLP`): Omniglot
    Conv4-64 with stride-2 convolutions and no pooling, 28x28x1;
    mini-ImageNet Conv4-32 with stride-1 convolutions and 2x2 max-pooling,
    84x84x3; batch norm on the batch's statistics with a scale and an offset
    (which VAMPIRE gives distributions, like every weight), eps 1e-5 (their
    ConvNet: no scale or offset, eps 0); 'SAME' padding as XLA pads it (an
    odd total padding puts the extra row and column after, so a stride-2
    layer is padded with `F.pad`; `conv4`'s default, "symmetric", pads as the
    authors' `CommonModels.CNN` and our `Conv4(padding="symmetric")`); the
    regression MLP 1-100-100-100-1.
  - Regression's likelihood: our Gaussian NLL with sigma 0.3 (theirs: MSE).
  - The settings of `benchmarks.suite.SETTINGS` (T, L, S, inner lr, 5-way
    1-shot, 15 queries per class; regression 5 support and 10 query points)
    and its KL weight 0.1.
  - Random inputs of the right shapes, made once before timing (no data
    loading); weight noise is drawn inside the step, as theirs is.

Weights are lists of tensors in `Network.names` order, named by our
parameter paths (`conv0/kernel`, `norm0/scale`, `head/kernel`,
`Dense_0/kernel`), in PyTorch's layout: `to_torch_layout` /
`from_torch_layout` convert one array from and to ours (HWIO <-> OIHW
kernels; a dense kernel transposed; the head's rows reordered from our NHWC
flattening to PyTorch's NCHW one).

Each row reports the first step apart and the mean and each of --repeats
timed steps after it (s/step; s/call for episodes), the process's peak
resident memory and its peak during the timed steps (`stepping_peak_mb`, as
`benchmarks.suite` measures ours). Each row, and each task count of an episode
row, runs in a fresh process (unless --same-process), so that peak is its own.
"""

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

try:
  import torch
  import torch.nn.functional as F
except ModuleNotFoundError as missing:  # run as a command without PyTorch: one line, status 2
  if __name__ != "__main__":
    raise
  sys.stderr.write(
    f"authors_pytorch: error: it runs the authors' algorithm in PyTorch and needs {missing.name}, not "
    f"installed in this Python ({sys.executable}): pip install torch, or run it with a Python "
    "that has it (benchmarks.side_by_side's --torch-python)\n"
  )
  raise SystemExit(2) from None

if __package__ in (None, ""):  # run by path: the repository root makes `benchmarks` importable
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import suite  # noqa: E402  (its module level imports the standard library only)

# As benchmarks.suite builds our learners and networks (checked by tests/benchmark_scripts/test_authors_pytorch.py).
KL_WEIGHT = 0.1  # beta, `suite.make_learner`
NOISE_STD = 0.3  # the regression likelihood's sigma, `suite.network`
BATCH_NORM_EPS = 1e-5  # `models.BatchStatNorm`
META_LR = 1e-3  # Adam, as `benchmarks.meta_step` and the authors
CLIP_NORM = 10.0  # the authors' `clip_grad_norm_(..., max_norm=10)`
LOG_STD_INIT = (-4.0, -3.0)  # the authors' `torch.rand(...) - 4`

# Row name -> (setting in suite.SETTINGS, algorithm); "episode": VAMPIRE test episodes.
ROWS = {
  "omniglot_vampire": ("omniglot_5w1s", "vampire"),
  "omniglot_maml": ("omniglot_5w1s", "maml"),
  "mini_imagenet_vampire": ("mini_imagenet_5w1s", "vampire"),
  "regression_vampire": ("regression", "vampire"),
  "episode_vampire_omniglot": ("omniglot_5w1s", "episode"),
  "episode_vampire_mini_imagenet": ("mini_imagenet_5w1s", "episode"),
}

Weights = list  # list[torch.Tensor], in `Network.names` order


class Network(NamedTuple):
  """A network as a pure function of its weights, as the authors' `net.forward(x, w)`.

  Attributes:
    names: our parameter paths, e.g. "conv0/kernel", in the order of the weights.
    shapes: each weight's shape in PyTorch's layout.
    apply: `apply(weights, x) -> outputs`; x `[batch, C, H, W]` or `[batch, 1]`.
    head_input: `(C, H, W)` of the features the Conv4 head flattens; None for an MLP.
  """

  names: tuple
  shapes: tuple
  apply: Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor]
  head_input: Optional[tuple] = None


def same_padding(size: int, stride: int, kernel: int = 3) -> tuple[int, int]:
  """(low, high) padding of 'SAME' as XLA pads: an odd total puts the extra one after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def conv4(
  num_classes: Optional[int],
  image: tuple,
  num_filters: int,
  max_pool: bool,
  batch_norm_affine: bool = True,
  padding: str = "symmetric",
) -> Network:
  """`vampire_jax.Conv4` (scale and offset in batch norm), on NCHW inputs.

  Four [conv 3x3 -> batch norm (batch statistics) -> ReLU (-> 2x2 max-pool)] blocks and a
  dense head. Stride 2 without pooling (Omniglot), stride 1 with pooling (mini-ImageNet).
  `padding`: "symmetric" (the default), one row and column on each side, as the authors'
  `CommonModels.CNN` (`padding=1`) and our `Conv4(padding="symmetric")`; "same", 'SAME' as
  XLA pads it, our `Conv4`'s default (an odd total puts the extra row and column after, so
  a stride-2 layer is padded with `F.pad`: 0 before, 1 after on an even size). With stride 1
  both are 1 on each side. `batch_norm_affine=False`: no scale or offset (the authors'
  `CNN(bn_affine=False)`); `num_classes=None`: no head, the flattened features out
  (ProtoNet's embedding), in NCHW order.
  """
  if padding not in ("same", "symmetric"):
    raise ValueError(f"padding must be 'same' or 'symmetric', got {padding!r}")
  height, width, channels = image
  stride = 1 if max_pool else 2
  per_block = 4 if batch_norm_affine else 2
  names, shapes, paddings = [], [], []
  for block in range(4):
    if padding == "same":
      paddings.append((same_padding(height, stride), same_padding(width, stride)))
    else:
      paddings.append(((1, 1), (1, 1)))
    names += [f"conv{block}/kernel", f"conv{block}/bias"]
    if batch_norm_affine:
      names += [f"norm{block}/scale", f"norm{block}/offset"]
    shapes += [(num_filters, channels, 3, 3)] + [(num_filters,)] * (per_block - 1)
    # Either padding gives ceil(size / stride): (size + 2 - 3) // stride + 1 for "symmetric".
    height, width, channels = -(-height // stride), -(-width // stride), num_filters
    if max_pool:  # 'VALID' 2x2: an odd last row or column is dropped
      height, width = height // 2, width // 2
  if num_classes is not None:
    names += ["head/kernel", "head/bias"]
    shapes += [(num_classes, channels * height * width), (num_classes,)]

  def apply(weights, x):
    for block, ((top, bottom), (left, right)) in enumerate(paddings):
      kernel, bias, *scale_offset = weights[per_block * block : per_block * (block + 1)]
      scale, offset = scale_offset if batch_norm_affine else (None, None)
      if top == bottom and left == right:
        x = F.conv2d(x, kernel, bias, stride=stride, padding=(top, left))
      else:
        x = F.conv2d(F.pad(x, (left, right, top, bottom)), kernel, bias, stride=stride)
      x = F.batch_norm(x, None, None, scale, offset, training=True, eps=BATCH_NORM_EPS)
      x = F.relu(x)
      if max_pool:
        x = F.max_pool2d(x, 2)
    if num_classes is None:
      return x.flatten(1)
    return F.linear(x.flatten(1), weights[-2], weights[-1])

  return Network(tuple(names), tuple(shapes), apply, (channels, height, width))


def mlp(hidden_sizes: Sequence[int], num_inputs: int, num_outputs: int) -> Network:
  """`vampire_jax.MLP`: ReLU layers, then a linear output (flax names Dense_i)."""
  sizes = [num_inputs, *hidden_sizes, num_outputs]
  names, shapes = [], []
  for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    names += [f"Dense_{layer}/kernel", f"Dense_{layer}/bias"]
    shapes += [(fan_out, fan_in), (fan_out,)]

  def apply(weights, x):
    for layer in range(len(sizes) - 1):
      x = F.linear(x, weights[2 * layer], weights[2 * layer + 1])
      if layer < len(sizes) - 2:
        x = F.relu(x)
    return x

  return Network(tuple(names), tuple(shapes), apply)


def network(setting: suite.Setting) -> Network:
  """The network `benchmarks.suite.network` builds for the setting."""
  if setting.kind == "regression":
    return mlp((100, 100, 100), 1, 1)
  return conv4(setting.ways, setting.image, setting.num_filters, setting.max_pool, padding="same")


def categorical_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
  """Mean softmax cross-entropy (the authors' `CrossEntropyLoss`, our `categorical_nll`)."""
  return F.cross_entropy(logits, labels)


def gaussian_nll(means: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
  """Our `gaussian_nll(0.3)`: mean over examples of the summed -log N(y; mean, sigma^2)."""
  log_norm = math.log(NOISE_STD) + 0.5 * math.log(2.0 * math.pi)
  residual = (means - targets) / NOISE_STD
  return torch.mean(torch.sum(0.5 * residual.square() + log_norm, dim=-1))


def likelihood(setting: suite.Setting) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
  return gaussian_nll if setting.kind == "regression" else categorical_nll


# -- Weight layout: ours (flax, NHWC) <-> PyTorch's (NCHW) ---------------------------------


def to_torch_layout(net: Network, name: str, array: np.ndarray) -> np.ndarray:
  """One of our weights (or a same-shaped noise draw or gradient) in PyTorch's layout.

  - conv kernel: ours HWIO `[3, 3, in, out]` -> OIHW `[out, in, 3, 3]`.
  - Conv4 head kernel: ours `[H*W*C, N]`, rows in NHWC flattening order
    ((h * W + w) * C + c) -> `[N, C*H*W]`, columns in NCHW order ((c * H + h) * W + w).
  - MLP kernel: ours `[in, out]` -> `[out, in]`.
  - biases, batch-norm scales and offsets: as they are.
  """
  array = np.asarray(array)
  if not name.endswith("/kernel"):
    return array
  if array.ndim == 4:
    return array.transpose(3, 2, 0, 1)
  if name == "head/kernel" and net.head_input is not None:
    channels, height, width = net.head_input
    return (
      array.reshape(height, width, channels, -1).transpose(3, 2, 0, 1).reshape(-1, array.shape[0])
    )
  return array.T


def from_torch_layout(net: Network, name: str, array: np.ndarray) -> np.ndarray:
  """The inverse of `to_torch_layout`: a PyTorch-layout weight in ours."""
  array = np.asarray(array)
  if not name.endswith("/kernel"):
    return array
  if array.ndim == 4:
    return array.transpose(2, 3, 1, 0)
  if name == "head/kernel" and net.head_input is not None:
    channels, height, width = net.head_input
    return (
      array.reshape(-1, channels, height, width).transpose(2, 3, 1, 0).reshape(array.shape[1], -1)
    )
  return array.T


def torch_weights(net: Network, tree: dict) -> Weights:
  """Leaf tensors (requiring gradients) from our nested weight dict, e.g. `{"conv0": {"kernel": ...}}`."""
  weights = []
  for name in net.names:
    module, leaf = name.split("/")
    array = to_torch_layout(net, name, np.asarray(tree[module][leaf], np.float32))
    weights.append(torch.tensor(np.ascontiguousarray(array)).requires_grad_())
  return weights


def tree_from_torch(net: Network, tensors: Sequence[torch.Tensor]) -> dict:
  """Our nested dict of numpy arrays (our layout) from tensors in `net.names` order."""
  tree = {}
  for name, tensor in zip(net.names, tensors):
    module, leaf = name.split("/")
    tree.setdefault(module, {})[leaf] = from_torch_layout(net, name, tensor.detach().numpy())
  return tree


# -- Initialisation and tasks (random, made before timing) ---------------------------------


def init_means(net: Network) -> Weights:
  """The authors' means: Xavier-normal kernels with gain sqrt(2), zero biases; ours: unit BN scales."""
  weights = []
  for name, shape in zip(net.names, net.shapes):
    if name.endswith("/kernel"):
      weight = torch.nn.init.xavier_normal_(torch.empty(shape), gain=math.sqrt(2.0))
    elif name.endswith("/scale"):
      weight = torch.ones(shape)
    else:
      weight = torch.zeros(shape)
    weights.append(weight.requires_grad_())
  return weights


def init_log_stds(net: Network) -> Weights:
  """The authors' log-stds: uniform in [-4, -3)."""
  low, high = LOG_STD_INIT
  return [(torch.rand(shape) * (high - low) + low).requires_grad_() for shape in net.shapes]


class Task(NamedTuple):
  support_x: torch.Tensor  # [ways*shots, C, H, W] or [shots, 1]
  support_y: torch.Tensor  # [ways*shots] int64 or [shots, 1]
  query_x: torch.Tensor  # [ways*query, C, H, W] or [query, 1]
  query_y: torch.Tensor  # [ways*query] int64 or [query, 1]


def random_tasks(setting: suite.Setting, num_tasks: int) -> list[Task]:
  """Tasks of the setting's shapes: uniform images and balanced labels, or sine-line-sized points."""
  tasks = []
  for _ in range(num_tasks):
    if setting.kind == "regression":
      tasks.append(
        Task(
          torch.rand(setting.shots, 1) * 10 - 5,
          torch.randn(setting.shots, 1),
          torch.rand(setting.query, 1) * 10 - 5,
          torch.randn(setting.query, 1),
        )
      )
      continue
    height, width, channels = setting.image
    labels = torch.arange(setting.ways)
    tasks.append(
      Task(
        torch.rand(setting.ways * setting.shots, channels, height, width),
        labels.repeat_interleave(setting.shots),
        torch.rand(setting.ways * setting.query, channels, height, width),
        labels.repeat_interleave(setting.query),
      )
    )
  return tasks


# -- The algorithms ------------------------------------------------------------------------

Noise = Callable[[torch.Tensor], torch.Tensor]  # eps shaped like a weight; default randn_like


@dataclasses.dataclass(frozen=True)
class Config:
  """What one task's adaptation and query loss need (one of `benchmarks.suite.SETTINGS`)."""

  net: Network
  nll: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
  num_inner_steps: int  # S
  inner_lr: float  # alpha
  kl_weight: float = KL_WEIGHT  # beta
  num_mc_train: int = 1  # L_t
  num_mc_query: int = 1  # L_v
  # Differentiate the NLL's gradient in the first K inner steps (1: the authors); None: all.
  second_order_steps: Optional[int] = 1
  split_grads: bool = True  # the authors' two autograd.grad calls per inner step


def sample_weights(mean: Weights, log_std: Weights, noise: Noise) -> Weights:
  """w = mean + eps * exp(log_std), weight by weight (the authors' `sample_nn_weight`)."""
  return [m + noise(m) * torch.exp(s) for m, s in zip(mean, log_std)]


def expected_nll(config: Config, mean, log_std, x, y, num_draws: int, noise: Noise) -> torch.Tensor:
  """The NLL averaged over `num_draws` weight draws, drawn one after another."""
  total = 0
  for _ in range(num_draws):
    total = total + config.nll(config.net.apply(sample_weights(mean, log_std, noise), x), y)
  return total / num_draws


def _differentiated(config: Config, step: int) -> bool:
  return config.second_order_steps is None or step < config.second_order_steps


def _nll_grads(config: Config, loss, mean, log_std, create_graph: bool):
  """d loss / d (mean, log_std): two backward passes as the authors, or one (`split_grads=False`)."""
  if config.split_grads:
    grad_mean = torch.autograd.grad(loss, mean, create_graph=create_graph, retain_graph=True)
    grad_log_std = torch.autograd.grad(loss, log_std, create_graph=create_graph, retain_graph=True)
    return list(grad_mean), list(grad_log_std)
  grads = torch.autograd.grad(loss, mean + log_std, create_graph=create_graph, retain_graph=True)
  return list(grads[: len(mean)]), list(grads[len(mean) :])


def vampire_adapt(config: Config, prior_mean, prior_log_std, x, y, noise: Noise = torch.randn_like):
  """The authors' `adapt_to_task`: S steps from q = prior; returns q's (mean, log_std)."""
  mean, log_std = list(prior_mean), list(prior_log_std)
  for step in range(config.num_inner_steps):
    loss = expected_nll(config, mean, log_std, x, y, config.num_mc_train, noise)
    grad_mean, grad_log_std = _nll_grads(config, loss, mean, log_std, _differentiated(config, step))
    if step > 0:  # at step 1 q = prior: the KL and its gradient are zero, and the authors skip them
      # KL(q || p) = sum[s_p - s_q + (exp(2 s_q) + (m_q - m_p)^2) / (2 exp(2 s_p)) - 1/2], so
      # d/d m_q = (m_q - m_p) exp(-2 s_p) and d/d s_q = exp(2 (s_q - s_p)) - 1.
      for i, (pm, ps) in enumerate(zip(prior_mean, prior_log_std)):
        grad_mean[i] = grad_mean[i] + config.kl_weight * (mean[i] - pm) * torch.exp(-2 * ps)
        grad_log_std[i] = grad_log_std[i] + config.kl_weight * (
          torch.exp(2 * (log_std[i] - ps)) - 1
        )
    mean = [m - config.inner_lr * g for m, g in zip(mean, grad_mean)]
    log_std = [s - config.inner_lr * g for s, g in zip(log_std, grad_log_std)]
  return mean, log_std


def vampire_predict(
  config: Config, mean, log_std, x, num_draws: int, noise: Noise = torch.randn_like
):
  """Outputs `[num_draws, batch, ...]` under draws from q (the authors' `predict`)."""
  return torch.stack(
    [config.net.apply(sample_weights(mean, log_std, noise), x) for _ in range(num_draws)]
  )


def vampire_task_loss(
  config: Config, prior_mean, prior_log_std, task: Task, noise=torch.randn_like
):
  """One task's meta-loss: adapt on the support set, the NLL on the query set averaged over L_v draws."""
  mean, log_std = vampire_adapt(
    config, prior_mean, prior_log_std, task.support_x, task.support_y, noise
  )
  outputs = vampire_predict(config, mean, log_std, task.query_x, config.num_mc_query, noise)
  loss = 0
  for draw in range(config.num_mc_query):
    loss = loss + config.nll(outputs[draw], task.query_y)
  return loss / config.num_mc_query


def maml_adapt(config: Config, params, x, y):
  """MAML's S SGD steps, `create_graph` in the first `second_order_steps` (all if None)."""
  weights = list(params)
  for step in range(config.num_inner_steps):
    loss = config.nll(config.net.apply(weights, x), y)
    grads = torch.autograd.grad(
      loss, weights, create_graph=_differentiated(config, step), retain_graph=True
    )
    weights = [w - config.inner_lr * g for w, g in zip(weights, grads)]
  return weights


def maml_task_loss(config: Config, params, task: Task) -> torch.Tensor:
  weights = maml_adapt(config, params, task.support_x, task.support_y)
  return config.nll(config.net.apply(weights, task.query_x), task.query_y)


def meta_loss(
  task_loss: Callable[[Task], torch.Tensor], tasks: Sequence[Task]
) -> tuple[torch.Tensor, int]:
  """`(mean of the tasks' losses, how many were NaN)`, task by task, summed into one graph
  (`vampire.py`'s `meta_train`): its backward holds every task's graph at once.

  The authors stop at a NaN task loss (`torch.isnan(loss).item()`, a sync per
  task); here the check runs, as theirs does, and is counted, so that a
  diverging setting still gets timed.
  """
  total, nan_tasks = 0, 0
  for task in tasks:
    loss = task_loss(task)
    nan_tasks += int(torch.isnan(loss).item())
    total = total + loss
  return total / len(tasks), nan_tasks


def accumulate_meta_gradient(
  task_loss: Callable[[Task], torch.Tensor], tasks: Sequence[Task]
) -> tuple[float, int]:
  """`(mean of the tasks' losses, how many were NaN)`, the gradient of that mean added to
  the weights' `.grad`: `MLBaseClass.train`'s loop, one backward per task.

  Each task's loss is divided by T (`loss_v / minibatch`), checked for NaN and
  back-propagated at once, so its graph is freed before the next task's is built:
  one task's graph is alive at a time, not T. Counted, not raised, as `meta_loss`.
  """
  total, nan_tasks = 0.0, 0
  for task in tasks:
    loss = task_loss(task) / len(tasks)
    nan_tasks += int(torch.isnan(loss).item())
    loss.backward()
    total += loss.item()
  return total, nan_tasks


META_BACKWARDS = ("per-task", "summed")


def make_meta_step(task_loss, groups: Sequence[Weights], meta_backward: str = "per-task"):
  """`step(tasks) -> (loss, NaN tasks)`: the meta-gradient (`meta_backward`: one backward per
  task, `accumulate_meta_gradient`, or one of the summed meta-loss, `meta_loss`), each
  group's norm clipped at 10, Adam."""
  if meta_backward not in META_BACKWARDS:
    raise ValueError(f"meta_backward must be one of {META_BACKWARDS}, got {meta_backward!r}")
  optimizer = torch.optim.Adam([{"params": group} for group in groups], lr=META_LR)

  def step(tasks):
    optimizer.zero_grad()
    if meta_backward == "per-task":
      loss, nan_tasks = accumulate_meta_gradient(task_loss, tasks)
    else:
      summed, nan_tasks = meta_loss(task_loss, tasks)
      summed.backward()
      loss = summed.item()
    for group in groups:
      torch.nn.utils.clip_grad_norm_(group, max_norm=CLIP_NORM)
    optimizer.step()
    return loss, nan_tasks

  return step


def episode(config: Config, mean, log_std, tasks: Sequence[Task], noise=torch.randn_like):
  """Test episodes as the authors' `validate_classification`: per task, adapt, then L_v draws.

  Returns:
    `(accuracies [tasks], probs [tasks, queries, ways])`, the softmax averaged over draws.
  """
  accuracies, all_probs = [], []
  for task in tasks:
    q_mean, q_log_std = vampire_adapt(config, mean, log_std, task.support_x, task.support_y, noise)
    logits = vampire_predict(config, q_mean, q_log_std, task.query_x, config.num_mc_query, noise)
    # Kept detached: a task's graph (the prior requires gradients, as theirs does) goes with it.
    probs = torch.softmax(logits, dim=-1).mean(dim=0).detach()
    accuracies.append((probs.argmax(dim=-1) == task.query_y).float().mean())
    all_probs.append(probs)
  return torch.stack(accuracies), torch.stack(all_probs)


# -- Timing -------------------------------------------------------------------------------


def page_out_file_pages() -> int:
  """This process's resident pages of its read-only file mappings dropped, as our release
  drops ours (`vampire_jax/_src/core/host_memory.py`, which this process does not import:
  it would bring JAX in); the mappings the kernel took. `madvise(MADV_PAGEOUT)`, Linux 5.4."""
  import ctypes
  import ctypes.util

  libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  taken = 0
  for line in Path("/proc/self/maps").read_text().splitlines():
    address, perms, *rest = line.split(maxsplit=5)
    path = rest[-1] if len(rest) == 4 else ""
    if path.startswith("/") and not path.startswith("/dev/") and "w" not in perms:
      start, end = (int(a, 16) for a in address.split("-"))
      taken += libc.madvise(start, end - start, 21) == 0
  return taken


def _timed(
  fn, repeats: int, page_out: bool = False
) -> tuple[float, list[float], object, "suite.MemoryPeaks"]:
  """`(first_s, [s of each of `repeats` further calls], last result, peak RSS)`.

  The peaks (MB) are the process's and the further calls' alone (`suite.measure_stepping`,
  nothing released between: PyTorch compiles nothing), as ours report them. `page_out`:
  after the first call the process's read-only file pages are dropped, as our release
  drops ours (`--page-out`: theirs, like for like with ours on that count).
  """
  out = {"each": []}

  def first():
    start = time.perf_counter()
    out["result"] = fn()
    out["first_s"] = time.perf_counter() - start
    if page_out:
      page_out_file_pages()

  def further():
    for _ in range(repeats):
      start = time.perf_counter()
      out["result"] = fn()
      out["each"].append(time.perf_counter() - start)

  memory = suite.measure_stepping(first, further, release=False)
  return out["first_s"], out["each"], out["result"], memory


def _steps_label(steps: Optional[int]) -> str:
  return "all" if steps is None else str(steps)


def row_setting(row: str, options: dict, num_tasks: Optional[int] = None) -> suite.Setting:
  """The row's `benchmarks.suite.SETTINGS` entry with the command line's T and L.

  A training row takes --tasks and --mc-samples (MAML: one draw); an episode
  row `num_tasks` tasks and --episode-mc-samples draws.
  """
  name, algorithm = ROWS[row]
  setting = suite.SETTINGS[name]
  if algorithm == "episode":
    return dataclasses.replace(setting, tasks=num_tasks, mc_samples=options["episode_mc_samples"])
  setting = dataclasses.replace(
    setting,
    tasks=options["tasks"] or setting.tasks,
    mc_samples=1 if algorithm == "maml" else options["mc_samples"] or setting.mc_samples,
  )
  return setting


def row_config(row: str, setting: suite.Setting, options: dict) -> Config:
  """The row's algorithm settings: the setting's S, alpha, L; the truncation asked for."""
  algorithm = ROWS[row][1]
  if algorithm == "episode":
    second_order_steps = 1  # the authors' adapt_to_task, as their test calls it
  elif algorithm == "maml":
    second_order_steps = options["maml_second_order_steps"]
  else:
    second_order_steps = options["second_order_steps"]
  return Config(
    network(setting),
    likelihood(setting),
    setting.inner_steps,
    setting.inner_lr,
    num_mc_train=setting.mc_samples,
    num_mc_query=setting.mc_samples,
    second_order_steps=second_order_steps,
    split_grads=options["inner_grad"] == "split",
  )


def train_row_step(row: str, options: dict):
  """`(setting, config, step, tasks)` of a training row: `step(tasks)` is its meta-step, from
  initial weights and tasks drawn after `torch.manual_seed(options["seed"])`."""
  torch.manual_seed(options["seed"])
  algorithm = ROWS[row][1]
  setting = row_setting(row, options)
  config = row_config(row, setting, options)
  net = config.net
  tasks = random_tasks(setting, setting.tasks)
  means = init_means(net)
  backward = options.get("meta_backward", "per-task")
  if algorithm == "maml":
    step = make_meta_step(lambda task: maml_task_loss(config, means, task), [means], backward)
  else:
    log_stds = init_log_stds(net)
    step = make_meta_step(
      lambda task: vampire_task_loss(config, means, log_stds, task), [means, log_stds], backward
    )
  return setting, config, step, tasks


def run_train_row(row: str, options: dict) -> dict:
  """Times one training row's meta-step (the first step apart)."""
  name, algorithm = ROWS[row]
  setting, config, step, tasks = train_row_step(row, options)
  first_s, each, (loss, nan_tasks), memory = _timed(
    lambda: step(tasks), options["repeats"], options["page_out"]
  )
  return {
    "row": row,
    "setting": name,
    "algorithm": algorithm,
    "tasks": setting.tasks,
    "mc_samples": setting.mc_samples,
    "inner_steps": setting.inner_steps,
    "second_order_steps": _steps_label(config.second_order_steps),
    "inner_grad": options["inner_grad"] if algorithm == "vampire" else "one call",
    "page_out": options["page_out"],
    "meta_backward": options.get("meta_backward", "per-task"),
    "first_s": first_s,
    "step_s": float(np.mean(each)) if each else None,
    "step_s_each": each,
    "peak_mb": memory.process,
    "stepping_peak_mb": memory.stepping,
    "loss": loss,
    "loss_finite": math.isfinite(loss) and not nan_tasks,
    **_environment(options),
  }


def run_episode_row(row: str, num_tasks: int, options: dict) -> dict:
  """Times VAMPIRE test episodes of `num_tasks` tasks (one call: all tasks, one by one)."""
  torch.manual_seed(options["seed"])
  name, _ = ROWS[row]
  setting = row_setting(row, options, num_tasks)
  config = row_config(row, setting, options)
  tasks = random_tasks(setting, num_tasks)
  means, log_stds = init_means(config.net), init_log_stds(config.net)
  first_s, each, (accuracies, _), memory = _timed(
    lambda: episode(config, means, log_stds, tasks), options["repeats"], options["page_out"]
  )
  mean_s = float(np.mean(each)) if each else None
  return {
    "row": row,
    "setting": name,
    "algorithm": "vampire",
    "tasks": num_tasks,
    "mc_samples": setting.mc_samples,
    "inner_steps": setting.inner_steps,
    "inner_grad": options["inner_grad"],
    "page_out": options["page_out"],
    "first_s": first_s,
    "episode_s": mean_s,
    "episode_s_each": each,
    "ms_per_task": None if mean_s is None else 1000 * mean_s / num_tasks,
    "peak_mb": memory.process,
    "stepping_peak_mb": memory.stepping,
    "score_finite": bool(torch.isfinite(accuracies).all()),
    **_environment(options),
  }


def _environment(options: dict) -> dict:
  """PyTorch's version and threads, and the processor the row ran on (`suite.cpu_processor`:
  `vampire_jax.backend` imported only now, after the row's memory was measured, and JAX not
  started: this process holds no JAX while it steps)."""
  processor = suite.cpu_processor(with_jaxlib=False)
  return {"torch": torch.__version__, "threads": torch.get_num_threads(), "processor": processor}


def run_unit(row: str, num_tasks: Optional[int], options: dict) -> dict:
  """One training row (`num_tasks` None) or one episode row's task count, in this process."""
  torch.set_num_threads(options["threads"])
  if ROWS[row][1] == "episode":
    return run_episode_row(row, num_tasks, options)
  return run_train_row(row, options)


def _in_fresh_process(row: str, num_tasks: Optional[int], options: dict) -> dict:
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
    return pool.submit(run_unit, row, num_tasks, options).result()


def _line(result: dict) -> str:
  if "episode_s" in result:
    seconds, unit = result["episode_s_each"], "s/call"
  else:
    seconds, unit = result["step_s_each"], "s/step"
  mean = float(np.mean(seconds)) if seconds else float("nan")
  return (
    f"  {result['row']:30s} T={result['tasks']:<3d} L={result['mc_samples']:<4d}"
    f" first {result['first_s']:7.2f} s  {mean:8.3f} {unit}"
    f" ({', '.join(f'{s:.3f}' for s in seconds)})  peak {suite.fmt(result['peak_mb'], '7.0f')} MB"
    f" (stepping {suite.fmt(result['stepping_peak_mb'], '.0f')} MB)"
  )


def _second_order(value: str) -> Optional[int]:
  return None if value == "all" else int(value)


def build_parser() -> argparse.ArgumentParser:
  from benchmarks import arguments

  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--rows", default="all", help=f"comma list of {', '.join(ROWS)}, or all")
  parser.add_argument(
    "--repeats", type=arguments.count(1), default=3, help="timed steps after the first"
  )
  parser.add_argument(
    "--tasks",
    type=arguments.count(0, " (0: the setting's)"),
    default=0,
    help="T of the training rows (0: the setting's)",
  )
  parser.add_argument(
    "--mc-samples",
    type=arguments.count(0, " (0: the setting's)"),
    default=0,
    help="L of the VAMPIRE training rows (0: the setting's)",
  )
  parser.add_argument(
    "--episode-tasks", default="1,32", help="comma list of tasks per episode call"
  )
  parser.add_argument(
    "--episode-mc-samples", type=arguments.count(1), default=10, help="L of the episodes"
  )
  parser.add_argument(
    "--second-order-steps",
    type=_second_order,
    default=1,
    help="VAMPIRE: differentiate the NLL's gradient in the first K inner steps"
    " (1: the authors' code; all: Alg. 1)",
  )
  parser.add_argument(
    "--maml-second-order-steps",
    type=_second_order,
    default=None,
    help="MAML: the same (default all: second-order MAML; 1: the authors' maml.py)",
  )
  parser.add_argument(
    "--inner-grad",
    default="split",
    choices=("split", "joint"),
    help="VAMPIRE's inner gradients: two autograd.grad calls as the authors (split) or one",
  )
  parser.add_argument(
    "--meta-backward",
    default="per-task",
    choices=META_BACKWARDS,
    help="training rows: one backward per task, the gradients accumulated (MLBaseClass.train),"
    " or one of the summed meta-loss (vampire.py's meta_train, T graphs held at once)",
  )
  parser.add_argument(
    "--page-out",
    action="store_true",
    help="after the first step, drop the process's read-only file pages (madvise PAGEOUT),"
    " as our release does: the memory while stepping like for like on that count",
  )
  parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None, help="also write the rows to this file")
  parser.add_argument(
    "--same-process", action="store_true", help="run every row here (peak memory then accumulates)"
  )
  return parser


def options_from_args(args: argparse.Namespace) -> dict:
  """What the rows read from the command line (`options_from_args(build_parser().parse_args([]))`: the defaults)."""
  return {
    "repeats": args.repeats,
    "tasks": args.tasks,
    "mc_samples": args.mc_samples,
    "episode_mc_samples": args.episode_mc_samples,
    "second_order_steps": args.second_order_steps,
    "maml_second_order_steps": args.maml_second_order_steps,
    "inner_grad": args.inner_grad,
    "meta_backward": args.meta_backward,
    "threads": args.threads,
    "seed": args.seed,
    "page_out": args.page_out,
  }


def main(argv=None) -> list[dict]:
  parser = build_parser()
  args = parser.parse_args(argv)
  rows = (
    list(ROWS) if args.rows == "all" else [r.strip() for r in args.rows.split(",") if r.strip()]
  )
  unknown = [r for r in rows if r not in ROWS]
  if unknown:
    parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
  options = options_from_args(args)
  units = []
  for row in rows:
    if ROWS[row][1] == "episode":
      units += [(row, int(n)) for n in args.episode_tasks.split(",") if n.strip()]
    else:
      units.append((row, None))
  print(
    f"PyTorch {torch.__version__}, {args.threads} threads; the authors' algorithm"
    f" (VAMPIRE second order through {_steps_label(args.second_order_steps)} step(s),"
    f" inner gradients {args.inner_grad}; MAML through"
    f" {_steps_label(args.maml_second_order_steps)}; backward {args.meta_backward});"
    f" {args.repeats} timed steps after the first",
    flush=True,
  )
  results = []
  for row, num_tasks in units:
    if args.same_process or len(units) == 1:
      results.append(run_unit(row, num_tasks, options))
    else:
      results.append(_in_fresh_process(row, num_tasks, options))
    print(_line(results[-1]), flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == "__main__":
  main()
