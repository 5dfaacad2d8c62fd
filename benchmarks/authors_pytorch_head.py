"""The authors' Vampire2 and ProtoNet at the HEAD of their repository, in PyTorch (issue 51).

    PYTHONPATH=.:$TORCH_ONLY python -m pytest tests/benchmark_scripts/test_authors_pytorch_head.py -s

Needs torch and numpy only. `tests/benchmark_scripts/test_authors_pytorch_head.py` checks, where torch is
installed, that one meta-step's loss and meta-gradient (before the optimiser) of each
equal ours, at the same weights, tasks and weight noise.

What it follows: cnguyen10/few_shot_meta_learning at d797d9d (2022-03-07), file by
file, re-expressed as plain functions of weight lists (no `higher`, no modules):

  - `MLBaseClass.train`: each task's validation loss divided by the number of tasks
    (`minibatch`) and back-propagated, the gradients summed over the tasks: the
    meta-gradient of the mean of the tasks' losses. No clipping (Adam, lr 1e-3).
  - `Vampire2.adaptation`: `num_inner_updates` steps; each computes the KL of the
    task's q to N(0, I) once (`KL_divergence_standard_normal`), then for each of
    `num_models` draws w ~ q (`NormalVariationalNet.forward`: a `randn_like` per
    weight tensor, means first) takes the gradient of `loss(f(x; w), y) + KL_weight
    * KL` w.r.t. q's means and log-stds and adds 1 / num_models of it: the NLL's
    gradient averaged over the draws, the KL's entering once. With `--first-order`
    (their default) the gradient is taken with `retain_graph` only, a constant;
    otherwise with `create_graph`. Then q <- q - inner_lr * gradient.
  - `Vampire2.validation_loss`: `num_models` new draws from the adapted q on the
    query set, the loss averaged over them, plus `KL_weight * KL(q || N(0, I))`.
  - `Vampire2.KL_divergence_standard_normal`: sum over n (mean, log-std) tensor pairs
    of sum(m^2) + sum(exp(2 s)) - n - 2 sum(s), halved. The `- n` is inside the loop
    over the n pairs: n^2 / 2 in all, where the KL has the number of weights / 2. A
    constant: no gradient changes; the loss is ours plus KL_weight * (number of
    weights - n^2) / 2 (`authors_kl_constant`), which the test adds back.
  - `ProtoNet.adaptation` / `prediction` / `validation_loss`: the support set embedded
    (one forward pass), each class's prototype the mean of its embeddings
    (`_utils.get_cls_prototypes`, classes in `torch.unique` order); the query set
    embedded in a second pass; logits minus `_utils.euclidean_distance`, a
    `torch.norm` (the Euclidean distance, not squared); the mean cross-entropy.

What is ours, not theirs (as in `benchmarks/authors_pytorch.py`): the networks
(`authors_pytorch.conv4` and `mlp`: batch norm eps 1e-5 as theirs, here without scale
and offset and padded 1 on each side as their `CNN(bn_affine=False)`, and any filter
count; `padding="same"` pads as XLA, our `Conv4`'s default), the likelihood of regression (our Gaussian NLL, theirs `MSELoss`), the
weights (ours, converted) and the tasks (ours, NCHW).
"""

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from benchmarks import authors_pytorch as ap

Weights = list  # list[torch.Tensor], in `Network.names` order


def authors_kl_standard_normal(mean: Weights, log_std: Weights) -> torch.Tensor:
  """`Vampire2.KL_divergence_standard_normal`, the constant as theirs: n per pair, n pairs."""
  n = len(mean)
  kl = 0
  for m, s in zip(mean, log_std):
    kl = kl + torch.sum(torch.square(m)) + torch.sum(torch.exp(2 * s)) - n
    kl = kl - 2 * torch.sum(s)
  return kl / 2


def authors_kl_constant(mean: Weights) -> float:
  """Their KL minus the KL of N(0, I): (number of weights - n^2) / 2, n the tensors."""
  return (sum(m.numel() for m in mean) - len(mean) ** 2) / 2


def vampire2_adapt(
  config: ap.Config, mean: Weights, log_std: Weights, x, y, noise: ap.Noise = torch.randn_like
):
  """`Vampire2.adaptation`: S steps from q = prior; returns q's (means, log-stds).

  `config.second_order_steps` 0 is their `--first-order` (every inner gradient a
  constant); None is `--no-first-order` (`create_graph` in every step).
  """
  q_mean, q_log_std = list(mean), list(log_std)
  for step in range(config.num_inner_steps):
    params = q_mean + q_log_std
    kl = authors_kl_standard_normal(q_mean, q_log_std)
    accumulated = [0] * len(params)
    for _ in range(config.num_mc_train):
      weights = ap.sample_weights(q_mean, q_log_std, noise)
      loss = config.nll(config.net.apply(weights, x), y) + config.kl_weight * kl
      grads = torch.autograd.grad(
        loss, params, create_graph=ap._differentiated(config, step), retain_graph=True
      )
      accumulated = [a + g / config.num_mc_train for a, g in zip(accumulated, grads)]
    updated = [p - config.inner_lr * g for p, g in zip(params, accumulated)]
    q_mean, q_log_std = updated[: len(mean)], updated[len(mean) :]
  return q_mean, q_log_std


def vampire2_task_loss(
  config: ap.Config, mean: Weights, log_std: Weights, task: ap.Task, noise=torch.randn_like
) -> torch.Tensor:
  """`Vampire2.validation_loss` after `adaptation`: the query loss over L_v draws + the KL."""
  q_mean, q_log_std = vampire2_adapt(config, mean, log_std, task.support_x, task.support_y, noise)
  loss = 0
  for _ in range(config.num_mc_query):
    weights = ap.sample_weights(q_mean, q_log_std, noise)
    loss = loss + config.nll(config.net.apply(weights, task.query_x), task.query_y)
  loss = loss / config.num_mc_query
  return loss + config.kl_weight * authors_kl_standard_normal(q_mean, q_log_std)


def class_prototypes(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
  """`_utils.get_cls_prototypes`: the mean embedding of each class, in `torch.unique` order."""
  classes = torch.unique(labels)
  return torch.stack([embeddings[labels == c].mean(dim=0) for c in classes])


def euclidean_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
  """`_utils.euclidean_distance`: `[N, M]`, the Frobenius norm of each difference."""
  n, m, d = a.shape[0], b.shape[0], a.shape[1]
  return torch.norm(a.unsqueeze(1).expand(n, m, d) - b.unsqueeze(0).expand(n, m, d), dim=2)


def squared_euclidean_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
  """Snell et al.'s distance (not the authors'): the squared Euclidean distance."""
  return torch.sum(torch.square(a.unsqueeze(1) - b.unsqueeze(0)), dim=2)


def protonet_logits(
  net: ap.Network,
  weights: Weights,
  task: ap.Task,
  distance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = euclidean_distance,
) -> torch.Tensor:
  """`ProtoNet.adaptation` then `prediction`: `[queries, classes]`, two forward passes."""
  prototypes = class_prototypes(net.apply(weights, task.support_x), task.support_y)
  return -distance(net.apply(weights, task.query_x), prototypes)


def protonet_task_loss(net, weights, task, distance=euclidean_distance) -> torch.Tensor:
  """`ProtoNet.validation_loss`: the query set's mean cross-entropy."""
  return F.cross_entropy(protonet_logits(net, weights, task, distance), task.query_y)


def meta_loss(task_loss: Callable[[ap.Task], torch.Tensor], tasks: Sequence[ap.Task]):
  """`MLBaseClass.train`'s meta-loss: the sum over the tasks of each loss / minibatch."""
  total = 0
  for task in tasks:
    total = total + task_loss(task) / len(tasks)
  return total
