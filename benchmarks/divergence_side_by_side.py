"""Where Vampire2 and SImPa diverge: ours beside the authors' own classes (issue 59, item 4).

    PY=/path/to/python-with-torch-and-higher   # jax and this repository importable too
    $PY -m benchmarks.divergence_side_by_side --algorithm vampire2 --seed 2 --steps 1100 \\
        --side ours --side theirs --authors-repo AUTHORS
    $PY -m benchmarks.divergence_side_by_side --algorithm simpa --seed 0 --steps 100 \\
        --kl-samples 16 --side ours --side theirs --authors-repo AUTHORS

`AUTHORS` is a checkout of cnguyen10/few_shot_meta_learning (its HEAD, `d797d9d`, has
`Vampire2.py`, `Simpa.py`, `MLBaseClass.py`), or its git directory (its HEAD is then
exported to a temporary folder); `--authors-repo` or `$VAMPIRE_AUTHORS_REPO`. Their code is
run from there, never copied here. It needs torch and `higher`; torchvision and tensorboard,
which their modules import for ResNets and logging only, are stood in for by empty modules.

Both sides start from the same initial weights (the run's own, `programs.run_keys(seed)`,
converted to PyTorch's layout) and train on the same tasks (meta-step s's tasks drawn from
the run's keys, as `experiments.compare --benchmark regression --preset cpu
--algorithms A --seed S` draws them), with the `cpu` preset's settings: MLP 1-100-100-100-1,
our Gaussian NLL at sigma 0.3 as their `loss_function`, T = 10 tasks of 5 support and 10
query points, S = 5 inner steps at 1e-3, L = 8 draws, first order (their default).

Sides:
  ours            the registry's run, one jitted meta-step at a time (`programs.build_train_step`,
                  the experiment's devices): clipping at 10 and gamma x 0.99 per 10 000 tasks.
  ours-plain-adam the same with their optimiser: no clipping, no decay.
  theirs          their class's own `train()` (`MLBaseClass.train`; `Simpa.train` for SImPa:
                  clipping at 10 there), their `adaptation`, `validation_loss` and Adam; only
                  `load_model` is ours (their network class `FcNet` at 100-100-100 holding our
                  initial weights), and the episodes come from the iterator of our tasks.
Vampire2 `--noise ours` (the default) replays our weight draws into their
`NormalVariationalNet.forward` (`torch.randn_like`), in the order their loops take them, so
that the first steps equal ours to float rounding (checked: step 1's loss); `--noise torch`
leaves their draws to torch. SImPa's sides draw their own noise (`Simpa.py`'s latent and
prior draws). Theirs are seeded by `torch.manual_seed(--seed)` since 2026-11-28; runs before
that drew unseeded. `--kl-samples` sets the draws of each KL estimate on both sides (their
hard-coded `num_samples = 512` is replaced in the source as it is loaded).

Each side prints one line per `--every` steps (the step's mean task loss) and its end: the
first step whose loss is not finite (theirs: the step where `train()` raised "Loss is NaN"
or "Adaptation loss is NaN"), or that it finished finite. Before the sides it prints the
processor they run on, `processor: ...`; `--json` writes it (`processor`:
`vampire_jax.backend.processor_record()`) beside every step's loss.
SImPa's theirs logs a loss only where `Simpa.train` made a meta-update, which it skips when a
step's last task is dropped for a NaN PHI loss: its end line counts those updates as its
steps, and the harness prints, per step, the kept tasks' query losses, the tasks dropped and
the updates so far (`benchmarks.simpa_step_tasks` looks into one step of ours task by task).
"""

import argparse
import functools
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run by path: the repository root makes `benchmarks` importable
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vampire_jax import backend  # noqa: E402

backend.default_to_all_cpu_cores()  # as the experiments: one XLA:CPU device per core

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments import regression  # noqa: E402
import vampire_jax as vj  # noqa: E402
from vampire_jax.runs import algorithms, loop, programs  # noqa: E402

AUTHORS_HEAD = "d797d9d"  # the commit whose Vampire2.py and Simpa.py these runs use
SIDES = ("ours", "ours-plain-adam", "theirs")


# -- Our run -----------------------------------------------------------------------------


def step_keys(key: jax.Array, step: jax.Array, num_tasks: int) -> tuple[jax.Array, jax.Array]:
  """`(task_keys, adapt_keys)` of meta-step `step` (0 before step 1), each `[num_tasks]`: the
  keys `vj.make_train_step` draws and adapts that step's tasks with, from the run's `key`."""
  task_key, adapt_key = jax.random.split(jax.random.fold_in(key, step))
  return jax.random.split(task_key, num_tasks), jax.random.split(adapt_key, num_tasks)


def run_config(algorithm: str, seed: int, kl_samples: int, plain_adam: bool = False):
  """The `cpu` regression preset for `algorithm` and `seed` (their optimiser if `plain_adam`)."""
  config = regression.get_config("cpu", algorithm).replace(seed=seed)
  if algorithm == "simpa":
    config = config.replace(num_kl_samples=kl_samples)
  if plain_adam:
    config = config.replace(meta_grad_clip_norm=None, meta_lr_decay=1.0)
  return config


def initial_state(config):
  """`(problem, learner, optimizer, state, mesh)` as the run builds them before step 1."""
  problem = regression.make_problem(config)
  learner = loop.learner_for(problem, config)
  optimizer = algorithms.make_optimizer(config)
  mesh = backend.task_mesh_for(config, config.schedule.tasks_per_step)
  init_key = programs.run_keys(config.seed).init
  state = loop._initial_state(problem, config, learner, optimizer, init_key, mesh)
  return problem, learner, optimizer, state, mesh


def run_ours(config, steps: int, every: int, label: str, stop_at: int = 0):
  """Our meta-steps 1..`steps` (or to the first non-finite loss), one jitted call each.

  Returns the summary, and the state after step `stop_at` (then only that many steps run).
  """
  problem, learner, optimizer, state, mesh = initial_state(config)
  train_step = programs.build_train_step(problem, config, learner, optimizer, mesh, 1)
  train_key = programs.run_keys(config.seed).train
  losses, start = [], time.perf_counter()
  for step in range(1, (stop_at or steps) + 1):
    state, metrics = train_step(state, train_key)
    loss = float(np.asarray(metrics["loss"]).reshape(-1)[0])
    losses.append(loss)
    if step % every == 0 or not math.isfinite(loss):
      print(f"{label} step {step}: loss {loss:.6g}", flush=True)
    if not math.isfinite(loss):
      break
  summary = _summary(label, losses, time.perf_counter() - start)
  return summary, (jax.device_get(state) if stop_at else None)


def _summary(label: str, losses: list, seconds: float, raised: str = "", first: int = 1) -> dict:
  """What a side did: each step's loss from step `first` on, and where it stopped being finite."""
  finite = [loss for loss in losses if math.isfinite(loss)]
  first_bad = next((first + i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)
  if raised and first_bad is None:
    first_bad = first + len(losses)  # their train() raised inside the step after the last logged
  peak = (
    first + int(np.argmax([x if math.isfinite(x) else -np.inf for x in losses])) if finite else None
  )
  summary = {
    "side": label,
    "first_step": first,
    "steps_run": len(losses),
    "first_non_finite_step": first_bad,
    "raised": raised,
    "largest_finite_loss": max(finite) if finite else None,
    "at_step": peak,
    "last_finite_loss": finite[-1] if finite else None,
    "seconds": round(seconds, 1),
    "losses": losses,
  }
  last = first + len(losses) - 1
  end = f"not finite at step {first_bad}" if first_bad else f"finite to step {last}"
  largest = f"{summary['largest_finite_loss']:.4g} at step {peak}" if finite else "none"
  print(
    f"{label}: steps {first}..{last}, {end}{' (' + raised + ')' if raised else ''}; "
    f"largest finite loss {largest}; {seconds:.0f} s",
    flush=True,
  )
  return summary


# -- Their code, from the authors' repository --------------------------------------------


def authors_folder(path: str) -> Path:
  """A folder holding their modules: `path` itself, or its git HEAD exported to a temp folder."""
  folder = Path(path)
  if (folder / "Vampire2.py").exists():
    return folder
  exported = Path(tempfile.mkdtemp(prefix="authors_head_"))
  archive = subprocess.run(
    ["git", f"--git-dir={folder}", "archive", AUTHORS_HEAD], check=True, capture_output=True
  ).stdout
  subprocess.run(["tar", "-x", "-C", str(exported)], input=archive, check=True)
  return exported


LOSS_TAGS = ("Train_Loss", "Loss/train")  # MLBaseClass.train's and Simpa.train's


class _Scalars:
  """A stand-in for tensorboard's SummaryWriter that keeps (and echoes) what train() logs."""

  logged: list = []
  echo = (100, 0.0, "theirs", 0)  # (every, constant taken off, label, steps before)

  def __init__(self, *args, **kwargs):
    pass

  def add_scalar(self, tag, scalar_value, global_step):
    _Scalars.logged.append((tag, int(global_step), float(scalar_value)))
    every, constant, label, before = _Scalars.echo
    value, step = float(scalar_value) - constant, before + int(global_step)
    if tag in LOSS_TAGS and (step % every == 0 or not math.isfinite(value)):
      print(f"{label} step {step}: loss {value:.6g}", flush=True)

  def close(self):
    pass


def import_authors(folder: Path, kl_samples: int) -> types.SimpleNamespace:
  """Their `Vampire2`, `Simpa`, `CommonModels` and `_utils` modules, imported from `folder`."""
  vision = types.ModuleType("torchvision")  # used by their ResNets only
  vision.models = types.ModuleType("torchvision.models")
  vision.models.resnet18 = None
  board = types.ModuleType("torch.utils.tensorboard")
  board.SummaryWriter = _Scalars
  sys.modules.update(
    {"torchvision": vision, "torchvision.models": vision.models, "torch.utils.tensorboard": board}
  )
  sys.path.insert(0, str(folder))
  import CommonModels
  import Vampire2
  import _utils

  source = (folder / "Simpa.py").read_text()
  if source.count("num_samples = 512") != 1:
    raise SystemExit(f"{folder}/Simpa.py: no single 'num_samples = 512' to set to {kl_samples}")
  simpa = types.ModuleType("Simpa")
  simpa.__file__ = str(folder / "Simpa.py")
  exec(
    compile(
      source.replace("num_samples = 512", f"num_samples = {kl_samples}"), simpa.__file__, "exec"
    ),
    simpa.__dict__,
  )
  return types.SimpleNamespace(
    CommonModels=CommonModels, Vampire2=Vampire2, Simpa=simpa, utils=_utils
  )


def _torch():
  import torch

  torch.set_num_threads(1)  # small tensors: threads only wait on each other (17 s a step with 2)

  from benchmarks import authors_pytorch as ap
  from benchmarks import authors_pytorch_simpa as sp

  return torch, ap, sp


def _their_config(config, algorithm: str, logdir: str, steps: int) -> dict:
  """Their `main.py` config dict for our settings (one epoch of `steps` meta-steps)."""
  torch, ap, _ = _torch()
  return {
    "ml_algorithm": algorithm,
    "first_order": config.algorithm.first_order,
    "KL_weight": config.algorithm.kl_weight,
    "num_ways": 1,
    "k_shot": config.num_support,
    "num_inner_updates": config.algorithm.num_inner_steps,
    "inner_lr": config.algorithm.inner_lr,
    "meta_lr": config.schedule.meta_lr,
    "minibatch": config.schedule.tasks_per_step,
    "minibatch_print": config.schedule.tasks_per_step,  # log every meta-step (main.py: lcm(T, 1000))
    "num_episodes_per_epoch": steps * config.schedule.tasks_per_step,
    "num_epochs": 1,
    "resume_epoch": 0,
    "num_models": config.algorithm.num_mc_train,
    "train_flag": True,
    "network_architecture": "FcNet",
    "batchnorm": False,
    "strided": True,
    "logdir": logdir,
    "device": torch.device("cpu"),
    "num_episodes": 0,
    # ours, not their MSELoss: the preset's likelihood (main.py takes `loss_function` as given)
    "loss_function": lambda input, target: ap.gaussian_nll(input, target),
    "train_val_split_function": lambda eps_data, k_shot: eps_data,
  }


class Episodes:
  """Their `train_dataloader`: meta-step s's tasks from our run's keys, one dict per task."""

  def __init__(self, problem, config, steps: int, on_step=None, start: int = 0):
    self.sample = jax.jit(problem.sample_tasks)
    self.data = problem.splits["train"]
    self.key = programs.run_keys(config.seed).train
    self.tasks_per_step, self.steps, self.on_step = config.schedule.tasks_per_step, steps, on_step
    self.start, self.yielded = start, 0

  def __iter__(self):
    torch, _, _ = _torch()
    for step in range(self.start, self.start + self.steps):  # state.step: 0 before step 1
      task_keys, adapt_keys = step_keys(self.key, jnp.int32(step), self.tasks_per_step)
      tasks = jax.device_get(self.sample(self.data, task_keys))
      if self.on_step is not None:
        self.on_step(step, adapt_keys)
      for t in range(self.tasks_per_step):
        as_torch = lambda a: torch.tensor(np.ascontiguousarray(a[t], np.float32))  # noqa: E731
        self.yielded += 1
        yield {
          "x_t": as_torch(tasks.support_x),
          "y_t": as_torch(tasks.support_y),
          "x_v": as_torch(tasks.query_x),
          "y_v": as_torch(tasks.query_y),
        }


class ReplayedNormals:
  """Our weight draws of a meta-step, in the order their Vampire2 loops take them.

  Per task, as `adaptation.adapt` and `learners.query_loss` split its key: each inner
  step's L draws, then the query's L draws; per draw, the tensors in their order (means
  first). `torch.randn_like` is pointed here while their train() runs.
  """

  def __init__(self, net, mean_tree, num_steps: int, num_draws: int):
    self.net, self.mean_tree, self.num_steps, self.num_draws = net, mean_tree, num_steps, num_draws
    self.queue, self.used = [], 0

  def load(self, step: int, adapt_keys) -> None:
    _, ap, _ = _torch()
    if self.used != len(self.queue):
      raise RuntimeError(f"step {step}: {len(self.queue) - self.used} replayed draws unused")
    eps = jax.device_get(self._draws(adapt_keys))  # leaves [tasks, S + 1, L, *shape]
    self.queue, self.used = [], 0
    for task in range(len(adapt_keys)):
      for keys in range(self.num_steps + 1):
        for draw in range(self.num_draws):
          for name in self.net.names:
            module, leaf = name.split("/")
            array = ap.to_torch_layout(self.net, name, eps[module][leaf][task, keys, draw])
            self.queue.append(np.ascontiguousarray(array, np.float32))

  @functools.cached_property
  def _draws(self):
    zeros = jax.tree.map(jnp.zeros_like, self.mean_tree)
    standard = vj.Gaussian(zeros, zeros)  # N(0, I): `vj.sample`'s draws of it are its noise

    def per_task(key):  # each inner step's key, then the query's
      adapt_key, query_key = jax.random.split(key)
      keys = jnp.concatenate([jax.random.split(adapt_key, self.num_steps), query_key[None]])
      draw = lambda k: vj.sample(standard, k, self.num_draws)  # noqa: E731
      return jax.vmap(draw)(keys)

    return jax.jit(jax.vmap(per_task))

  def __call__(self, like, **kwargs):
    torch, _, _ = _torch()
    array = self.queue[self.used]
    if array.shape != tuple(like.shape):
      raise RuntimeError(f"replayed draw {self.used}: {array.shape}, theirs {tuple(like.shape)}")
    self.used += 1
    return torch.from_numpy(array)


def _their_network(authors, net_sizes):
  """Their `FcNet` (`CommonModels`) at our widths, its lazy first layer built."""
  torch, _, _ = _torch()
  base_net = authors.CommonModels.FcNet(dim_output=1, num_hidden_units=tuple(net_sizes))
  base_net.forward(torch.zeros(1, 1))
  return base_net


def _adam_state(opt_state):
  """The `optax.ScaleByAdamState` inside our meta-optimiser's state."""
  import optax

  found = [
    leaf
    for leaf in jax.tree_util.tree_leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
    )
    if isinstance(leaf, optax.ScaleByAdamState)
  ]
  (adam,) = found
  return adam


def run_theirs_vampire2(config, steps: int, every: int, folder: Path, noise: str, state=None):
  """Their `Vampire2` class's `train()` on our tasks, from our initial weights or `state`.

  `state`: our `MetaState` after some steps (ours with their optimiser): its meta-parameters
  and Adam moments become theirs, and their train() runs the steps after it.
  """
  torch, ap, _ = _torch()
  torch.manual_seed(config.seed)  # `--noise torch`: the same draws on every run of a seed
  authors = import_authors(folder, kl_samples=512)
  problem, _, _, initial, _ = initial_state(config)
  state = jax.device_get(initial if state is None else state)
  meta_params, from_step = state.meta_params, int(state.step)
  net = ap.mlp(tuple(config.hidden_sizes), 1, 1)
  logdir = tempfile.mkdtemp(prefix="authors_vampire2_")

  class OurStart(authors.Vampire2.Vampire2):
    """Their Vampire2 whose `load_model` builds their FcNet 100-100-100 with our weights."""

    def load_model(self, resume_epoch, eps_dataloader, **kwargs):
      base_net = _their_network(authors, config.hidden_sizes)
      hyper_net = authors.Vampire2.NormalVariationalNet(base_net=base_net)
      pairs = [(hyper_net.mean, meta_params.mean), (hyper_net.log_std, meta_params.log_std)]
      with torch.no_grad():
        for theirs, ours in pairs:
          for tensor, value in zip(theirs, ap.torch_weights(net, ours), strict=True):
            tensor.copy_(value)
      f_base_net = authors.utils.torch_module_to_functional(torch_net=base_net)
      optimizer = torch.optim.Adam(params=hyper_net.parameters(), lr=self.config["meta_lr"])
      if from_step:  # our Adam's moments and count, as torch.optim.Adam keeps them
        adam = _adam_state(state.opt_state)
        moments = [
          (m, v)
          for part in ("mean", "log_std")
          for m, v in zip(
            ap.torch_weights(net, getattr(adam.mu, part)),
            ap.torch_weights(net, getattr(adam.nu, part)),
          )
        ]
        for param, (m, v) in zip(hyper_net.parameters(), moments, strict=True):
          optimizer.state[param] = {
            "step": torch.tensor(float(adam.count)),
            "exp_avg": m.detach().clone(),
            "exp_avg_sq": v.detach().clone(),
          }
      x = torch.linspace(-5, 5, 7)[:, None]  # the same network: our means give our outputs
      ours = problem.model.apply({"params": meta_params.mean}, np.asarray(x))
      theirs = f_base_net.forward(x, params=list(hyper_net.mean)).detach().numpy()
      np.testing.assert_allclose(theirs, np.asarray(ours), rtol=1e-5, atol=1e-6)
      return {"hyper_net": hyper_net, "f_base_net": f_base_net, "optimizer": optimizer}

  replay = ReplayedNormals(
    net, meta_params.mean, config.algorithm.num_inner_steps, config.algorithm.num_mc_train
  )
  load = replay.load if noise == "ours" else None
  episodes = Episodes(problem, config, steps - from_step, load, start=from_step)
  if noise == "ours":
    torch.randn_like = replay
  their = OurStart(_their_config(config, "vampire2", logdir, steps - from_step))
  # Their loss carries KL_weight * (number of weights - n^2) / 2 more than ours (their KL's
  # constant, `authors_pytorch_head.authors_kl_constant`): taken off, so the losses compare.
  constant = (
    config.algorithm.kl_weight * (sum(math.prod(s) for s in net.shapes) - len(net.shapes) ** 2) / 2
  )
  label = f"theirs ({noise} noise)"
  return _train_theirs(their, episodes, config, every, constant, label, from_step)


def _train_theirs(their, episodes, config, every, constant, label, from_step=0) -> dict:
  """Runs their `train()`; each logged step's mean task loss, less `constant`, is kept."""
  _Scalars.logged, _Scalars.echo = [], (every, constant, label, from_step)
  start, raised = time.perf_counter(), ""
  try:
    their.train(train_dataloader=episodes, val_dataloader=None)
  except ValueError as error:  # "Loss is NaN." / "Adaptation loss is NaN"
    done = episodes.yielded - 1
    step, task = (
      from_step + done // config.schedule.tasks_per_step + 1,
      done % config.schedule.tasks_per_step + 1,
    )
    raised = f"{error} (task {task} of step {step})"
  losses = [value - constant for tag, _, value in _Scalars.logged if tag in LOSS_TAGS]
  return _summary(label, losses, time.perf_counter() - start, raised, first=from_step + 1)


def run_theirs_simpa(config, steps: int, every: int, folder: Path) -> dict:
  """Their `Simpa` class's `train()` from our initial generator and PHI network, on our tasks."""
  torch, ap, sp = _torch()
  torch.manual_seed(config.seed)  # their latent and prior draws: the same on every run of a seed
  authors = import_authors(folder, kl_samples=config.algorithm.num_kl_samples)
  problem, _, _, state, _ = initial_state(config)
  meta_params = jax.device_get(state.meta_params)
  net = ap.mlp(tuple(config.hidden_sizes), 1, 1)
  logdir = tempfile.mkdtemp(prefix="authors_simpa_")
  Simpa = authors.Simpa

  class BatchNormEps0(torch.nn.Module):
    """Their PHI network's `BatchNorm1d(eps=0., momentum=1., affine=False,
    track_running_stats=False)`, which torch 2.13 refuses in training ("eps must be
    positive"); the batch's own statistics, as the torch of `Simpa.py` computed it."""

    def forward(self, x):
      return sp.batch_norm_eps0(x)

  query_losses, skips = [], _PhiNaNCount()

  class OurStart(Simpa.Simpa):
    """Their Simpa whose `load_model` puts our generator and PHI network in their classes,
    and whose `validation_loss` (each task's query loss) is kept as it is computed."""

    def validation_loss(self, *args, **kwargs):
      loss = super().validation_loss(*args, **kwargs)
      query_losses.append(float(loss))
      return loss

    def load_model(self, resume_epoch, eps_dataloader):
      base_net = _their_network(authors, config.hidden_sizes)
      self.base_net_shapes = [p.shape for p in base_net.parameters()]
      self.base_net_num_params = sum(p.numel() for p in base_net.parameters())
      model = {"f_base_net": authors.utils.torch_module_to_functional(torch_net=base_net)}
      model["f_generator"] = Simpa.FunctionalGenerator(base_net=base_net)
      generator = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, self.base_net_num_params),
      )  # fmt: skip
      model["hyper_net"] = Simpa.IdentityNet(base_net=generator)
      phi_layers = []
      for fan_in, fan_out in ((self.base_net_num_params, 512), (512, 256), (256, 128)):
        phi_layers += [
          torch.nn.Linear(fan_in, fan_out),
          BatchNormEps0(),  # theirs: BatchNorm1d(eps=0, momentum=1, affine=False, no stats)
          torch.nn.ReLU(),
        ]
      phi_net = torch.nn.Sequential(*phi_layers, torch.nn.Linear(128, 1))
      model["f_phi_base_net"] = authors.utils.torch_module_to_functional(torch_net=phi_net)
      model["phi_hyper_net"] = Simpa.IdentityNet(base_net=phi_net)
      with torch.no_grad():
        for hyper, ours in (
          (model["hyper_net"], sp.torch_generator(net, meta_params.generator)),
          (model["phi_hyper_net"], sp.torch_phi(net, meta_params.phi)),
        ):
          for tensor, value in zip(hyper.params, ours, strict=True):
            tensor.copy_(value)
      model["optimizer"] = torch.optim.Adam(
        model["hyper_net"].parameters(), lr=self.config["meta_lr"]
      )
      model["phi_optimizer"] = torch.optim.Adam(
        model["phi_hyper_net"].parameters(), lr=self.config["phi_lr"]
      )
      return model

  marks = [0]  # len(query_losses) when each step began

  def report(step, adapt_keys):  # before meta-step step + 1's tasks: step `step` as it went
    done = query_losses[marks[-1] :]
    marks.append(len(query_losses))
    if step and step % every == 0:
      losses = f"{min(done):.4g} to {max(done):.4g}" if done else "none"
      print(
        f"theirs step {step}: query loss of its {len(done)} unskipped tasks {losses}; "
        f"tasks skipped for a NaN PHI loss so far {skips.count}; meta-updates so far "
        f"{sum(tag in LOSS_TAGS for tag, _, _ in _Scalars.logged)}",
        flush=True,
      )

  episodes = Episodes(problem, config, steps, on_step=report)
  their = OurStart(_their_config(config, "simpa", logdir, steps))
  root = logging.getLogger()
  level = root.level
  root.addHandler(skips)
  root.setLevel(logging.INFO)  # their `logging.info("Loss PHI is NaN.")`
  try:
    summary = _train_theirs(their, episodes, config, every, 0.0, "theirs (torch noise)")
  finally:
    root.removeHandler(skips)
    root.setLevel(level)
  summary.update(tasks_skipped_for_nan_phi_loss=skips.count, query_losses=query_losses)
  print(
    f"theirs: {skips.count} of {len(query_losses) + skips.count} tasks skipped for a NaN PHI "
    f"loss (their train() then `continue`s: no query loss, and no meta-update where it was a "
    f"step's last task); {summary['steps_run']} meta-updates logged",
    flush=True,
  )
  return summary


class _PhiNaNCount(logging.Handler):
  """Counts `Simpa.train`'s "Loss PHI is NaN." (it skips the task, and the step's update if
  the task was the step's last)."""

  def __init__(self):
    super().__init__()
    self.count = 0

  def emit(self, record):
    self.count += "Loss PHI is NaN" in record.getMessage()


def authors_repo_problem(path: str) -> str:
  """Why `path` cannot be --authors-repo ('' if it can): neither their code nor a git directory
  holding AUTHORS_HEAD."""
  folder = Path(path)
  if not folder.is_dir():
    return "does not exist"
  if (folder / "Vampire2.py").exists():
    return ""
  if not ((folder / "HEAD").is_file() and (folder / "objects").is_dir()):
    return (
      "holds neither their code (Vampire2.py) nor a git directory: give a checkout of "
      "cnguyen10/few_shot_meta_learning or its .git folder"
    )
  found = subprocess.run(
    ["git", f"--git-dir={folder}", "cat-file", "-e", f"{AUTHORS_HEAD}^{{commit}}"],
    capture_output=True,
  )
  return "" if found.returncode == 0 else f"is a git directory without commit {AUTHORS_HEAD}"


def main(argv=None) -> None:
  from benchmarks import arguments, suite

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--algorithm", choices=("vampire2", "simpa"), required=True)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--steps", type=arguments.count(1), required=True, help="meta-steps to run at most"
  )
  parser.add_argument("--side", action="append", choices=SIDES, help="repeatable (default: all)")
  parser.add_argument(
    "--noise", choices=("ours", "torch"), default="ours", help="Vampire2's theirs"
  )
  parser.add_argument(
    "--kl-samples", type=arguments.count(2), default=512, help="SImPa: draws per KL estimate"
  )
  parser.add_argument(
    "--every", type=arguments.count(1), default=100, help="print every this many steps"
  )
  parser.add_argument("--authors-repo", default=os.environ.get("VAMPIRE_AUTHORS_REPO"))
  parser.add_argument(
    "--theirs-from-step",
    type=arguments.count(0),
    default=0,
    help="Vampire2: start theirs from the state of ours with their optimiser after this step",
  )
  parser.add_argument("--json", help="write each side's summary and losses here")
  args = parser.parse_args(argv)
  sides = args.side or list(SIDES)
  if "theirs" in sides and not args.authors_repo:
    parser.error("--side theirs needs --authors-repo (or $VAMPIRE_AUTHORS_REPO)")
  if "theirs" in sides:  # before either side runs
    problem = authors_repo_problem(args.authors_repo)
    if problem:
      parser.error(f"--authors-repo {args.authors_repo}: {problem}")
    arguments.needs_modules(parser, "--side theirs (the authors' code)", "torch", "higher")
  print(
    f"{args.algorithm}, regression `cpu` preset, seed {args.seed}, {args.steps} steps"
    + (f", {args.kl_samples} KL draws" if args.algorithm == "simpa" else "")
    + f"; {jax.device_count()} XLA devices",
    flush=True,
  )
  processor = backend.processor_record()
  print(suite.processor_line(processor), flush=True)
  results = {}
  for side in sides:
    config = run_config(args.algorithm, args.seed, args.kl_samples, side != "ours")
    if side != "theirs":
      results[side], _ = run_ours(config, args.steps, args.every, side)
    elif args.algorithm == "vampire2":
      folder, state = authors_folder(args.authors_repo), None
      if args.theirs_from_step:
        label = "ours-plain-adam (theirs' start)"
        _, state = run_ours(config, args.steps, args.every, label, args.theirs_from_step)
      results[side] = run_theirs_vampire2(config, args.steps, args.every, folder, args.noise, state)
    else:
      results[side] = run_theirs_simpa(
        config, args.steps, args.every, authors_folder(args.authors_repo)
      )
  if args.json:
    record = {"processor": processor, "args": vars(args), "sides": results}
    Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
  main()
