"""The authors' SImPa meta-step in PyTorch, re-expressed from `Simpa.py`, to check ours against.

    PYTHONPATH=$PWD:/work/torch_only python benchmarks/authors_pytorch_simpa.py   # one timed step

Needs torch and numpy only (and `benchmarks.authors_pytorch` for our networks in
PyTorch's layout). `tests/benchmark_scripts/test_authors_pytorch_simpa.py` checks, where torch is
installed, that one meta-step's loss and gradients (of the generator and of the PHI
network, before clipping and Adam) equal `vj.baselines.simpa`'s.

What it follows: `Simpa.py` of cnguyen10/few_shot_meta_learning (HEAD d797d9d),
function by function, on flat parameter vectors in the base network's order:
  - `FunctionalGenerator.forward_vector`: z -> linear, ReLU, linear, ReLU, linear,
    tanh; `forward` cuts the vector into the base network's tensors.
  - `estimate_KL_lower_bound`: mean T(G(z)) over 512 z ~ U[0, 1)^128, minus logsumexp
    of T over 512 draws of N(0, 1), minus log 512; T is the PHI network (linear, batch
    norm with eps 0 and no affine on the batch's statistics, ReLU; three times; linear).
  - `train_phi`: one ascent step on the PHI network, its gradient a constant.
  - `adaptation`: per inner step the L draws' loss, each divided by L, whose gradient
    (with `create_graph` unless first order) is divided by L again and accumulated;
    then `train_phi`; then the bound sqrt((KL + ln(n) / eps) / (2 (n - 1))) and its
    gradient (a constant), added unless NaN; then the step.
  - `train`: per task, `loss_phi = -KL` backward'd (divided by the minibatch M) unless
    NaN (then the task is skipped); the query loss over the L draws, its `.data`
    clamped at 1; the bound of the query set (0 if NaN); `(loss + bound) / M`
    backward'd; after the M tasks, the generator's hyper-prior term
    sqrt((KL_hp + M ln(M) / eps) / (2 (M - 1))) backward'd, `KL_divergence_standard_normal`
    taking the first half of the generator's tensors as means and the second half as
    log-stds.
What is ours, not theirs: the networks of `benchmarks.authors_pytorch` (our MLP and
Conv4 in PyTorch's layout) and the likelihood of the learner under test; the noise is
a `Noise` object, so that a test replays our draws in the order their loops take them.
"""

import math
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

try:
  import torch
  import torch.nn.functional as F
except ModuleNotFoundError as missing:  # run as a command without PyTorch: one line, status 2
  if __name__ != "__main__":
    raise
  sys.stderr.write(
    f"authors_pytorch_simpa: error: it runs the authors' algorithm in PyTorch and needs {missing.name}, not "
    f"installed in this Python ({sys.executable}): pip install torch, or run it with a Python "
    "that has it (benchmarks.side_by_side's --torch-python)\n"
  )
  raise SystemExit(2) from None

if __package__ in (None, ""):  # run by path: the repository root makes `benchmarks` importable
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import authors_pytorch as ap  # noqa: E402

LATENT_DIM = 128


class Noise(NamedTuple):
  """Where the draws come from: `latent(shape)` ~ U[0, 1), `prior(shape)` ~ N(0, 1)."""

  latent: Callable[[tuple], torch.Tensor] = lambda shape: torch.rand(shape)
  prior: Callable[[tuple], torch.Tensor] = lambda shape: torch.randn(shape)


class Config(NamedTuple):
  net: ap.Network
  nll: Callable
  num_inner_steps: int
  inner_lr: float
  num_models: int  # L, the authors' `num_models` (training draws = query draws)
  minibatch: int  # M
  first_order: bool = True
  phi_inner_lr: float = 5e-4
  epsilon: float = 0.1
  num_samples: int = 512


def num_base_weights(net: ap.Network) -> int:
  return sum(math.prod(shape) for shape in net.shapes)


# -- Simpa.py's functions ------------------------------------------------------------------


def generator_vector(z: torch.Tensor, w) -> torch.Tensor:
  """`FunctionalGenerator.forward_vector`: `[draws, P]`."""
  h = F.relu(F.linear(z, w[0], w[1]))
  h = F.relu(F.linear(h, w[2], w[3]))
  return torch.tanh(F.linear(h, w[4], w[5]))


def base_weights(net: ap.Network, vector: torch.Tensor) -> list:
  """`vector_to_parameters`: one generated vector as the base network's tensors."""
  weights, pointer = [], 0
  for shape in net.shapes:
    size = math.prod(shape)
    weights.append(vector[pointer : pointer + size].view(shape))
    pointer += size
  return weights


def batch_norm_eps0(x: torch.Tensor) -> torch.Tensor:
  """`BatchNorm1d(eps=0, momentum=1, affine=False, track_running_stats=False)` in training.

  Written out: torch 2.13's `F.batch_norm` refuses eps 0 in training ("eps must be
  positive"), which the torch of `Simpa.py` computed as (x - mean) / sqrt(biased var).
  """
  mean = x.mean(dim=0)
  return (x - mean) / torch.sqrt(torch.square(x - mean).mean(dim=0))


def phi_forward(x: torch.Tensor, phi) -> torch.Tensor:
  """The PHI network: three [linear, BatchNorm1d(eps=0, affine=False), ReLU], then linear."""
  for layer in range(3):
    x = F.relu(batch_norm_eps0(F.linear(x, phi[2 * layer], phi[2 * layer + 1])))
  return F.linear(x, phi[6], phi[7])


def estimate_kl_lower_bound(config: Config, generator, phi, noise: Noise) -> torch.Tensor:
  n = config.num_samples
  kl = torch.mean(phi_forward(generator_vector(noise.latent((n, LATENT_DIM)), generator), phi))
  prior_draws = noise.prior((n, num_base_weights(config.net)))
  kl = kl - torch.logsumexp(phi_forward(prior_draws, phi), dim=(0, 1))
  return kl - np.log(n)


def train_phi(config: Config, generator, phi, noise: Noise) -> list:
  kl = estimate_kl_lower_bound(config, generator, phi, noise)
  grads = torch.autograd.grad(kl, phi, retain_graph=True)
  return [p + config.phi_inner_lr * g for p, g in zip(phi, grads)]


def bound(config: Config, kl: torch.Tensor, num_targets: int) -> torch.Tensor:
  return torch.sqrt((kl + np.log(num_targets) / config.epsilon) / (2 * (num_targets - 1)))


def adaptation(config: Config, generator, phi, x, y, noise: Noise):
  generator, phi = list(generator), list(phi)
  for _ in range(config.num_inner_steps):
    grads_accum = [0] * len(generator)
    for _ in range(config.num_models):
      weights = base_weights(
        config.net, generator_vector(noise.latent((1, LATENT_DIM)), generator)[0]
      )
      loss = config.nll(config.net.apply(weights, x), y) / config.num_models
      grads = torch.autograd.grad(
        loss, generator, create_graph=not config.first_order, retain_graph=True
      )
      grads_accum = [a + g / config.num_models for a, g in zip(grads_accum, grads)]
    phi = [p + 0.0 for p in train_phi(config, generator, phi, noise)]
    kl_loss = bound(config, estimate_kl_lower_bound(config, generator, phi, noise), y.numel())
    if not (torch.isnan(kl_loss) or kl_loss.item() < 0):
      kl_grads = torch.autograd.grad(kl_loss, generator, retain_graph=True)
      grads_accum = [a + g for a, g in zip(grads_accum, kl_grads)]
    generator = [w - config.inner_lr * a + 0 for w, a in zip(generator, grads_accum)]
  return generator, phi


def validation_loss(config: Config, generator, x, y, noise: Noise) -> torch.Tensor:
  total = 0
  for _ in range(config.num_models):
    weights = base_weights(
      config.net, generator_vector(noise.latent((1, LATENT_DIM)), generator)[0]
    )
    total = total + config.nll(config.net.apply(weights, x), y)
  return total / config.num_models


def kl_standard_normal(p) -> torch.Tensor:
  """`Simpa.KL_divergence_standard_normal`: first half of `p` means, second half log-stds."""
  kl, n = 0, len(p) // 2
  for i in range(n):
    kl = kl + torch.sum(torch.square(p[i])) + torch.sum(torch.exp(2 * p[n + i]))
    kl = kl - n - 2 * torch.sum(p[n + i])
  return kl / 2


def meta_step_gradients(config: Config, generator, phi, tasks, noise: Noise):
  """One meta-batch of `Simpa.train`, before clipping and Adam.

  Args:
    generator, phi: leaf tensors (requires_grad), the hyper-net's and the PHI net's.
    tasks: `authors_pytorch.Task`s, `config.minibatch` of them.

  Returns:
    `(loss, skipped)`: the sum of every backward'd term and the tasks skipped; the
    gradients are in `.grad` of `generator` and `phi`, accumulated as theirs are.
  """
  total, skipped = 0.0, 0
  for task in tasks:
    adapted, adapted_phi = adaptation(config, generator, phi, task.support_x, task.support_y, noise)
    loss_phi = -estimate_kl_lower_bound(config, adapted, adapted_phi, noise)
    if torch.isnan(loss_phi):
      skipped += 1
      continue
    loss_phi = loss_phi / config.minibatch
    loss_phi.backward(retain_graph=True)
    total += loss_phi.item()
    loss = validation_loss(config, adapted, task.query_x, task.query_y, noise)
    if torch.isnan(loss):
      raise ValueError("Loss is NaN.")
    with torch.no_grad():
      loss.data = torch.clamp(input=loss.data, max=1)
    kl_loss = bound(
      config, estimate_kl_lower_bound(config, adapted, adapted_phi, noise), task.query_y.numel()
    )
    if torch.isnan(kl_loss) or kl_loss < 0:
      kl_loss = 0.0
    loss = (loss + kl_loss) / config.minibatch
    loss.backward()
    total += loss.item()
  m = config.minibatch
  hyper = torch.sqrt(
    (kl_standard_normal(generator) + m * np.log(m) / config.epsilon) / (2 * (m - 1))
  )
  hyper.backward()
  return total + hyper.item(), skipped


# -- Our trees <-> their flat vectors -------------------------------------------------------


def stacked_to_torch(net: ap.Network, tree: dict) -> np.ndarray:
  """`[N, P]`, PyTorch's flat order, from our tree whose every leaf is `[N, *our shape]`."""
  columns = []
  for name in net.names:
    module, leaf = name.split("/")
    stacked = np.asarray(tree[module][leaf])
    columns.append(np.stack([ap.to_torch_layout(net, name, row).reshape(-1) for row in stacked]))
  return np.concatenate(columns, axis=1).astype(np.float32)


def stacked_from_torch(net: ap.Network, array: np.ndarray) -> dict:
  """The inverse of `stacked_to_torch`: our tree, every leaf `[N, *our shape]`."""
  tree, pointer = {}, 0
  for name, shape in zip(net.names, net.shapes):
    size = math.prod(shape)
    rows = [
      ap.from_torch_layout(net, name, row[pointer : pointer + size].reshape(shape))
      for row in np.asarray(array)
    ]
    module, leaf = name.split("/")
    tree.setdefault(module, {})[leaf] = np.stack(rows)
    pointer += size
  return tree


def _map(tree, fn):
  return {m: {k: fn(v) for k, v in leaves.items()} for m, leaves in tree.items()}


def torch_generator(net: ap.Network, generator) -> list:
  """Our `Generator` as `Simpa.py`'s six tensors [W1, b1, W2, b2, W3 (P x 512), b3]."""
  tensors = []
  for layer in generator.hidden:
    tensors += [np.asarray(layer.kernel).T, np.asarray(layer.bias)]
  tensors.append(stacked_to_torch(net, generator.output_kernel).T)
  tensors.append(
    stacked_to_torch(net, _map(generator.output_bias, lambda b: np.asarray(b)[None]))[0]
  )
  return [torch.tensor(np.ascontiguousarray(t, np.float32)).requires_grad_() for t in tensors]


def torch_phi(net: ap.Network, phi) -> list:
  """Our `PhiNetwork` as the PHI network's eight tensors [W0 (512 x P), b0, ..., W3, b3]."""
  tensors = [
    stacked_to_torch(net, _map(phi.input_kernel, lambda k: np.moveaxis(np.asarray(k), -1, 0))),
    np.asarray(phi.input_bias),
  ]
  for layer in (*phi.hidden, phi.output):
    tensors += [np.asarray(layer.kernel).T, np.asarray(layer.bias)]
  return [torch.tensor(np.ascontiguousarray(t, np.float32)).requires_grad_() for t in tensors]


def generator_from_torch(net: ap.Network, tensors) -> dict:
  """`{"hidden": [(kernel, bias), ...], "output_kernel": tree, "output_bias": tree}`, ours."""
  arrays = [t.detach().numpy() for t in tensors]
  return {
    "hidden": [(arrays[0].T, arrays[1]), (arrays[2].T, arrays[3])],
    "output_kernel": stacked_from_torch(net, arrays[4].T),
    "output_bias": _map(stacked_from_torch(net, arrays[5][None]), lambda b: b[0]),
  }


def phi_from_torch(net: ap.Network, tensors) -> dict:
  """`{"input_kernel": tree, "input_bias", "hidden": [...], "output": (kernel, bias)}`, ours."""
  arrays = [t.detach().numpy() for t in tensors]
  return {
    "input_kernel": _map(stacked_from_torch(net, arrays[0]), lambda k: np.moveaxis(k, 0, -1)),
    "input_bias": arrays[1],
    "hidden": [(arrays[2].T, arrays[3]), (arrays[4].T, arrays[5])],
    "output": (arrays[6].T, arrays[7]),
  }


# -- Initialisation (the authors' IdentityNet: Kaiming-normal kernels, zero biases) ----------


def init_networks(net: ap.Network) -> tuple[list, list]:
  """The generator's six and the PHI network's eight tensors, as `IdentityNet` initialises them."""
  sizes = num_base_weights(net)

  def layers(shapes):
    tensors = []
    for out, fan_in in shapes:
      tensors.append(torch.nn.init.kaiming_normal_(torch.empty(out, fan_in), nonlinearity="relu"))
      tensors.append(torch.zeros(out))
    return [t.requires_grad_() for t in tensors]

  generator = layers([(256, LATENT_DIM), (512, 256), (sizes, 512)])
  phi = layers([(512, sizes), (256, 512), (128, 256), (1, 128)])
  return generator, phi


def main() -> None:
  """Times one meta-step of SImPa on the regression MLP (1-100-100-100-1), T = 10, S = 5, L = 1;
  then names the processor, `processor: ...` (`benchmarks.suite.cpu_processor`)."""
  net = ap.mlp((100, 100, 100), 1, 1)
  config = Config(net, ap.gaussian_nll, 5, 0.001, 1, 10)
  generator, phi = init_networks(net)
  setting = ap.suite.SETTINGS["regression"]
  tasks = ap.random_tasks(setting, config.minibatch)
  for _ in range(2):
    start = time.perf_counter()
    meta_step_gradients(config, generator, phi, tasks, Noise())
    print(f"SImPa meta-step in PyTorch: {time.perf_counter() - start:.1f} s", flush=True)
  print(ap.suite.processor_line(ap.suite.cpu_processor(with_jaxlib=False)))


if __name__ == "__main__":
  main()
