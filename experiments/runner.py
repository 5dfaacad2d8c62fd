"""The training loop every experiment shares: meta-train, validate, test.

An experiment describes its data and network as a `Problem` and its
settings as a `RunConfig`; `train_and_evaluate(problem, config, workdir)`
does the rest and returns the results it also writes to
`workdir/results.json`. The same call runs from the command line, a test and
a notebook.

What a run leaves in `workdir`:
  checkpoints/   orbax checkpoints of the full meta-state (resumed from)
  best/          the meta-parameters with the best validation score
  events.*       TensorBoard scalars (tensorboardX); metrics.jsonl, the same as JSON lines
  results.json   config, test metrics, git commit, wall time, device
  *.png          reliability diagram, training curves
"""

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh

import vampire_jax as vj
from vampire_jax import calibration

PyTree = Any


class Problem(NamedTuple):
  """What an experiment trains on.

  Attributes:
    apply_fn: the network, `apply_fn(params, x)`.
    init_params: `init_params(key) -> params`, the network's initial weights.
    nll: likelihood on outputs, e.g. `vj.categorical_nll`.
    sample_tasks: `sample_tasks(split, key, num_tasks) -> Task` for split in
      {'train', 'val', 'test'}; jittable with `split` and `num_tasks` static.
    kind: 'classification' or 'regression'.
    noise_std: the regression likelihood's noise (regression only).
  """
  apply_fn: Callable
  init_params: Callable[[jax.Array], PyTree]
  nll: vj.losses.Likelihood
  sample_tasks: Callable[[str, jax.Array, int], vj.Task]
  kind: str = "classification"
  noise_std: Optional[float] = None


@dataclasses.dataclass
class RunConfig:
  """Settings shared by every experiment; defaults are the paper's Omniglot 5-way ones."""
  algorithm: str = "vampire"          # 'vampire' or 'maml'
  tasks_per_step: int = 32            # T
  num_meta_steps: int = 15_000
  num_inner_steps: int = 5            # S
  inner_lr: float = 0.1               # alpha
  kl_weight: float = 0.1              # beta
  num_mc_train: int = 1               # L_t during meta-training
  num_mc_query: int = 1               # L_v during meta-training
  num_mc_test: int = 10               # L_t = L_v at test time
  first_order: bool = False
  num_particles: int = 8              # BMAML's M (the paper's comparison used 8)
  unroll_inner_steps: Optional[bool] = None  # None: unroll on CPU (faster steps, longer compile)
  meta_lr: float = 1e-3               # gamma, x0.99 every 10 000 tasks
  meta_lr_decay: float = 0.99
  meta_grad_clip_norm: Optional[float] = 10.0   # as in the authors' code
  log_std_init: tuple[float, float] = (-4.0, -3.0)
  task_batching: str = "auto"         # 'auto', 'host_chunked' or a vj.BATCHING_STRATEGIES name
  chunk_size: int = 0                 # 0: the backend's default
  eval_task_batching: str = "auto"
  eval_chunk_size: int = 0
  num_val_tasks: int = 200
  num_test_tasks: int = 1000
  eval_batch_tasks: int = 20          # tasks per evaluation call
  eval_every: int = 500
  checkpoint_every: int = 500
  log_every: int = 50
  num_bins: int = 15                  # calibration bins
  seed: int = 0
  shard_tasks: str = "auto"           # 'auto' (on with >1 device), 'on', 'off': tasks over a device mesh
  remat: bool = False                 # recompute inner steps in the backward pass: less memory
  compute_dtype: str = "float32"      # 'float32', or 'bfloat16' for the network's matmuls/convs


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def network(problem: Problem, config: RunConfig) -> Callable:
  """The problem's `apply_fn`, in bfloat16 mixed precision if `compute_dtype` says so."""
  if config.compute_dtype not in COMPUTE_DTYPES:
    raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, "
                     f"got {config.compute_dtype!r}")
  if config.compute_dtype == "float32":
    return problem.apply_fn
  return vj.mixed_precision(problem.apply_fn, COMPUTE_DTYPES[config.compute_dtype])


def _unroll_inner_steps(config: RunConfig) -> bool:
  if config.unroll_inner_steps is None:
    return jax.default_backend() == "cpu"
  return bool(config.unroll_inner_steps)


def make_learner(problem: Problem, config: RunConfig, num_mc_train: int,
                 num_mc_query: int) -> vj.MetaLearner:
  """The configured algorithm with the given Monte-Carlo sample counts."""
  apply_fn = network(problem, config)
  if config.algorithm == "vampire":
    return vj.vampire(apply_fn, problem.nll, num_inner_steps=config.num_inner_steps,
                      inner_lr=config.inner_lr, kl_weight=config.kl_weight,
                      num_mc_train=num_mc_train, num_mc_query=num_mc_query,
                      first_order=config.first_order, log_std_init=tuple(config.log_std_init),
                      unroll_steps=_unroll_inner_steps(config), remat=config.remat)
  if config.algorithm in ("maml", "fomaml"):
    return vj.maml(apply_fn, problem.nll, num_inner_steps=config.num_inner_steps,
                   inner_lr=config.inner_lr,
                   first_order=config.first_order or config.algorithm == "fomaml",
                   unroll_steps=_unroll_inner_steps(config), remat=config.remat)
  common = dict(num_inner_steps=config.num_inner_steps, inner_lr=config.inner_lr,
                first_order=config.first_order, unroll_steps=_unroll_inner_steps(config))
  if config.algorithm in ("platipus", "abml"):
    factory = vj.baselines.LEARNERS[config.algorithm]
    return factory(apply_fn, problem.nll, kl_weight=config.kl_weight, num_mc_train=num_mc_train,
                   num_mc_query=num_mc_query, log_std_init=tuple(config.log_std_init), **common)
  if config.algorithm == "bmaml":  # the particles are the meta-parameters: M is fixed
    return vj.baselines.bmaml(apply_fn, problem.nll, num_particles=config.num_particles, **common)
  raise ValueError(f"unknown algorithm {config.algorithm!r}; expected one of "
                   "vampire, maml, fomaml, platipus, bmaml, abml")


def make_task_mesh(config: RunConfig, num_tasks: int) -> Optional[Mesh]:
  """The device mesh that `num_tasks` tasks are split over, or None for one device.

  'off': None. 'on': every device (of every host); `num_tasks` must divide
  evenly. 'auto': like 'on' when more than one device is visible; with one
  process it takes the largest number of devices that divides `num_tasks`.
  """
  if config.shard_tasks not in ("auto", "on", "off"):
    raise ValueError(f"shard_tasks must be 'auto', 'on' or 'off', got {config.shard_tasks!r}")
  devices = jax.devices()
  if config.shard_tasks == "off" or (config.shard_tasks == "auto" and len(devices) == 1):
    return None
  if config.shard_tasks == "auto" and jax.process_count() == 1:
    count = max(n for n in range(1, len(devices) + 1) if num_tasks % n == 0)
    if count < len(devices):
      print(f"note: {num_tasks} tasks are split over {count} of the {len(devices)} devices"
            " (the most that divide them evenly)")
    devices = devices[:count]
  mesh = vj.task_mesh(devices)
  vj.sharding.check_divisible(num_tasks, mesh)
  return mesh


def _mesh_size(mesh: Optional[Mesh]) -> int:
  return 1 if mesh is None else mesh.size


def _batching(strategy: str, chunk_size: int, num_tasks: int,
              sharded: bool = False) -> tuple[str, int]:
  default_strategy, default_chunk = vj.default_task_batching()
  if strategy == "auto":
    if sharded:  # one jitted step over the mesh; each device vmaps its own tasks
      strategy = "vmap"
    else:
      strategy = "host_chunked" if jax.default_backend() == "cpu" else default_strategy
  chunk_size = chunk_size or default_chunk
  chunk_size = max(1, min(chunk_size, num_tasks))
  while num_tasks % chunk_size:
    chunk_size -= 1
  return strategy, chunk_size


def build_meta_step(learner, optimizer, config: RunConfig, metrics_fn,
                    mesh: Optional[Mesh] = None):
  """The meta-step, jitted, with the configured (or backend-default) batching.

  With a `mesh` the tasks are split over its devices; the batching strategy
  then says how each device handles its own tasks.
  """
  num_local_tasks = config.tasks_per_step // _mesh_size(mesh)
  strategy, chunk = _batching(config.task_batching, config.chunk_size, num_local_tasks,
                              sharded=mesh is not None)
  if strategy == "host_chunked":
    if mesh is not None:
      raise ValueError("task_batching='host_chunked' runs tasks from Python on one device; "
                       "with tasks sharded over devices use an in-jit strategy (e.g. 'vmap') "
                       "or --shard-tasks off")
    return vj.make_host_chunked_meta_step(learner, optimizer, chunk_size=chunk,
                                          metrics_fn=metrics_fn)
  return jax.jit(vj.make_meta_step(learner, optimizer, task_batching=strategy,
                                   chunk_size=chunk, metrics_fn=metrics_fn, mesh=mesh))


def eval_batch_size(config: RunConfig, mesh: Optional[Mesh] = None) -> int:
  """`eval_batch_tasks`, rounded up to a multiple of the mesh's devices."""
  size = _mesh_size(mesh)
  return -(-config.eval_batch_tasks // size) * size


def build_evaluator(problem: Problem, config: RunConfig, learner, mesh: Optional[Mesh] = None):
  """A jitted per-task evaluator for a batch of `eval_batch_size(config, mesh)` tasks."""
  num_local_tasks = eval_batch_size(config, mesh) // _mesh_size(mesh)
  strategy, chunk = _batching(config.eval_task_batching, config.eval_chunk_size,
                              num_local_tasks, sharded=mesh is not None)
  if strategy == "host_chunked":  # evaluation has no gradient to accumulate
    strategy = "chunked_unroll" if chunk < num_local_tasks else "unroll"
  if problem.kind == "classification":
    evaluate = vj.make_classification_evaluator(learner, task_batching=strategy, chunk_size=chunk,
                                                mesh=mesh)
  else:
    evaluate = vj.make_regression_evaluator(learner, problem.noise_std, task_batching=strategy,
                                            chunk_size=chunk, mesh=mesh)
  return jax.jit(evaluate)


def sample_task_batch(sample_tasks: Callable, split: str, key: jax.Array, num_tasks: int,
                      mesh: Optional[Mesh] = None) -> vj.Task:
  """`num_tasks` tasks of `split`, split over the mesh's devices if there is one.

  With several processes each samples its own `num_tasks / process_count`
  tasks (its key folded with its index) and the slices form one global batch.
  """
  if mesh is None:
    return sample_tasks(split, key, num_tasks)
  if jax.process_count() == 1:
    return vj.shard_tasks(sample_tasks(split, key, num_tasks), mesh)
  local_key = jax.random.fold_in(key, jax.process_index())
  return vj.shard_tasks(sample_tasks(split, local_key, num_tasks // jax.process_count()), mesh)


def evaluate_tasks(problem: Problem, evaluate, meta_params, split: str, num_tasks: int,
                   key: jax.Array, batch_tasks: int, progress: bool = False,
                   mesh: Optional[Mesh] = None) -> dict:
  """Evaluates on `num_tasks` tasks of `split`, `batch_tasks` at a time.

  With a `mesh`, each batch is split over its devices (`evaluate` must be
  built with the same mesh) and the results are gathered on every process.

  Returns:
    Per-task arrays (numpy), concatenated over batches: the fields of
    `ClassificationEval` or `RegressionEval`, plus the query labels/targets.
  """
  sample = jax.jit(problem.sample_tasks, static_argnums=(0, 2))
  num_batches = -(-num_tasks // batch_tasks)
  outputs = []
  iterator = range(num_batches)
  if progress:
    from tqdm import tqdm
    iterator = tqdm(iterator, desc=f"evaluate {split}", unit="batch", leave=False)
  for i in iterator:
    task_key, eval_key = jax.random.split(jax.random.fold_in(key, i))
    tasks = sample_task_batch(sample, split, task_key, batch_tasks, mesh)
    result = evaluate(meta_params, tasks, eval_key)
    outputs.append(vj.sharding.gather(dict(result._asdict(), targets=tasks.query_y)))
  merged = {k: np.concatenate([np.asarray(o[k]) for o in outputs])[:num_tasks] for k in outputs[0]}
  return merged


def summarise(problem: Problem, per_task: dict, num_bins: int) -> dict:
  """Mean +- 95% CI of the per-task scores, NLL, and calibration."""
  summary = {}
  if problem.kind == "classification":
    mean, half = calibration.mean_confidence_interval(per_task["accuracy"])
    summary.update(accuracy=mean, accuracy_ci95=half)
    bins = calibration.classification_calibration(per_task["probabilities"], per_task["targets"],
                                                  num_bins=num_bins)
    summary.update(ece=float(bins.ece), mce=float(bins.mce))
    summary["_bins"] = bins
  else:
    mean, half = calibration.mean_confidence_interval(per_task["mse"])
    summary.update(mse=mean, mse_ci95=half)
    means = np.moveaxis(per_task["predictions"][..., 0], 1, 0)  # [samples, tasks, query]
    quantiles = calibration.regression_quantile_calibration(
        means.reshape(means.shape[0], -1), per_task["targets"].reshape(-1), problem.noise_std)
    summary.update(ece=float(quantiles.ece), mce=float(quantiles.mce))
    summary["_quantiles"] = quantiles
  nll_mean, nll_half = calibration.mean_confidence_interval(per_task["nll"])
  summary.update(nll=nll_mean, nll_ci95=nll_half, num_tasks=int(len(per_task["nll"])))
  return summary


def restore_meta_params(problem: Problem, config: RunConfig,
                        workdir: str | os.PathLike) -> PyTree:
  """The meta-parameters of a run in `workdir`: the best validated ones, else the latest.

  Raises:
    FileNotFoundError: if `workdir` holds no checkpoint.
  """
  workdir = Path(workdir).absolute()
  learner = make_learner(problem, config, 1, 1)
  optimizer = vj.meta_optimizer(config.meta_lr, tasks_per_step=config.tasks_per_step,
                                clip_norm=config.meta_grad_clip_norm)
  template = vj.init_meta_state(learner, optimizer, problem.init_params(jax.random.key(0)),
                                jax.random.key(1))
  if (workdir / "best").exists():
    best = ocp.CheckpointManager(workdir / "best")
    if best.latest_step() is not None:
      return best.restore(best.latest_step(),
                          args=ocp.args.StandardRestore(template.meta_params))
  if (workdir / "checkpoints").exists():
    checkpoints = ocp.CheckpointManager(workdir / "checkpoints")
    if checkpoints.latest_step() is not None:
      state = checkpoints.restore(checkpoints.latest_step(),
                                  args=ocp.args.StandardRestore(template))
      return state.meta_params
  raise FileNotFoundError(f"no checkpoint in {workdir} (expected best/ or checkpoints/ from "
                          "train_and_evaluate)")


def accuracy_line(test: dict, results_path: Path) -> str:
  """One line for a classification run's test summary (from `summarise`)."""
  return (f"test accuracy {100 * test['accuracy']:.2f} +- {100 * test['accuracy_ci95']:.2f} %"
          f"  NLL {test['nll']:.4f}  ECE {test['ece']:.4f}  MCE {test['mce']:.4f}"
          f"  ({test['num_tasks']} tasks); results in {results_path}")


def calibration_record(summary: dict) -> dict:
  """The reliability bins or quantile curve of a summary, as JSON-ready lists.

  `calibration_from_record` turns it back into the `calibration` NamedTuple,
  so figures comparing several runs can be drawn from their results.json.
  """
  result = summary.get("_bins", summary.get("_quantiles"))
  record = {k: (np.asarray(v).tolist() if np.ndim(v) else float(v))
            for k, v in result._asdict().items()}
  return {"kind": type(result).__name__, **record}


def calibration_from_record(record: dict):
  """Inverse of `calibration_record`: a `ReliabilityBins` or `QuantileCalibration`."""
  kind = getattr(calibration, record["kind"])
  return kind(**{f: (np.asarray(record[f], dtype=float) if isinstance(record[f], list)
                     else record[f]) for f in kind._fields})


def _git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def device_description() -> str:
  device = jax.devices()[0]
  return f"{device.platform}: {getattr(device, 'device_kind', '')} x{jax.device_count()}"


def _public(summary: dict) -> dict:
  return {k: v for k, v in summary.items() if not k.startswith("_")}


class _NoLogger:
  """What processes other than the first log with: nothing."""

  def log(self, step: int, metrics: dict):
    pass

  def close(self):
    pass


class _Logger:
  """TensorBoard scalars (tensorboardX) and a metrics.jsonl beside them."""

  def __init__(self, workdir: Path):
    from tensorboardX import SummaryWriter
    self._writer = SummaryWriter(str(workdir))
    self._jsonl = open(workdir / "metrics.jsonl", "a")

  def log(self, step: int, metrics: dict):
    for name, value in metrics.items():
      self._writer.add_scalar(name, float(value), step)
    self._jsonl.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
    self._jsonl.flush()

  def close(self):
    self._writer.close()
    self._jsonl.close()


def _read_history(workdir: Path) -> tuple[list[int], dict[str, list[float]]]:
  path = workdir / "metrics.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
  rows = [r for r in rows if "train/loss" in r]
  history = {k: [r[k] for r in rows] for k in ("train/loss", "train/accuracy") if rows and k in rows[0]}
  return [r["step"] for r in rows], history


def _write_plots(problem: Problem, config: RunConfig, summary: dict, per_task: dict,
                 workdir: Path) -> dict:
  """The calibration and training-curve figures, and the per-task test scores."""
  from vampire_jax import plotting
  plots = {}
  label = config.algorithm.upper()
  if problem.kind == "classification":
    plots["reliability"] = str(plotting.plot_reliability_diagram(
        {label: summary["_bins"]}, workdir / "reliability.png",
        title=f"{label}: {summary['num_tasks']} test tasks"))
  else:
    plots["quantile_calibration"] = str(plotting.plot_quantile_calibration(
        {label: summary["_quantiles"]}, workdir / "quantile_calibration.png"))
  steps, history = _read_history(workdir)
  if steps:
    plots["training_curves"] = str(plotting.plot_training_curves(history, steps,
                                                                 workdir / "training_curves.png"))
  np.savez_compressed(workdir / "test_per_task.npz",
                      **{k: v for k, v in per_task.items() if k != "predictions"})
  return plots


def train_and_evaluate(problem: Problem, config: RunConfig, workdir: str | os.PathLike,
                       *, progress: bool = True, extra_results: Optional[dict] = None) -> dict:
  """Meta-trains, keeps the best validation checkpoint, tests it, writes results.

  Resumes from the latest checkpoint in `workdir` if there is one; the
  per-step keys are `fold_in(seed, step)`, so a resumed run draws the same
  tasks as an uninterrupted one.

  With `config.shard_tasks` on (the default with more than one device), the
  tasks of every meta-step and evaluation batch are split over a device mesh
  (`make_task_mesh`). With several processes (`jax.distributed`), only the
  first writes logs, plots and results; all of them save checkpoints.

  Returns:
    The results dictionary written to `workdir/results.json`.
  """
  start_time = time.time()
  is_main = jax.process_index() == 0
  progress = progress and is_main
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if is_main:
    (workdir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
  mesh = make_task_mesh(config, config.tasks_per_step)
  eval_batch = eval_batch_size(config, mesh)

  base_key = jax.random.key(config.seed)
  init_key, train_key, val_key, test_key = jax.random.split(base_key, 4)
  train_learner = make_learner(problem, config, config.num_mc_train, config.num_mc_query)
  test_learner = make_learner(problem, config, config.num_mc_test, config.num_mc_test)
  optimizer = vj.meta_optimizer(config.meta_lr, tasks_per_step=config.tasks_per_step,
                                decay_rate=config.meta_lr_decay,
                                clip_norm=config.meta_grad_clip_norm)
  params_key, prior_key = jax.random.split(init_key)
  state = vj.init_meta_state(train_learner, optimizer, problem.init_params(params_key), prior_key)
  if mesh is not None:
    state = vj.replicate(state, mesh)
  if config.algorithm == "vampire":
    factor = float(vj.kl_step_factor(state.meta_params, config.inner_lr, config.kl_weight))
    if factor >= 2.0:
      print(f"warning: inner_lr * kl_weight / sigma_p^2 reaches {factor:.1f} at initialisation;"
            " the KL term makes the inner loop oscillate (stable below 2). See BUILD_NOTES.md.")

  metrics_fn = vj.classification_metrics if problem.kind == "classification" else None
  meta_step = build_meta_step(train_learner, optimizer, config, metrics_fn, mesh)
  evaluate = build_evaluator(problem, config, test_learner, mesh)
  sample = jax.jit(problem.sample_tasks, static_argnums=(0, 2))

  def sample_train(key):
    return sample_task_batch(sample, "train", key, config.tasks_per_step, mesh)

  score_name = "accuracy" if problem.kind == "classification" else "mse"
  better = (lambda a, b: a > b) if problem.kind == "classification" else (lambda a, b: a < b)

  checkpoints = ocp.CheckpointManager(
      (workdir / "checkpoints").absolute(),
      options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  best = ocp.CheckpointManager((workdir / "best").absolute(),
                               options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True))
  best_path = workdir / "best_score.json"
  best_record = json.loads(best_path.read_text()) if best_path.exists() else None
  # Training seconds up to each checkpointed step, summed over resumes.
  train_time_path = workdir / "train_time.json"
  train_seconds = json.loads(train_time_path.read_text()) if train_time_path.exists() else {}
  earlier_train_time = 0.0
  if checkpoints.latest_step() is not None:
    state = checkpoints.restore(checkpoints.latest_step(), args=ocp.args.StandardRestore(state))
    print(f"resumed from step {int(state.step)} in {workdir}")
    earlier_train_time = train_seconds.get(str(int(state.step)), 0.0)

  logger = _Logger(workdir) if is_main else _NoLogger()
  first_step = int(state.step)
  iterator = range(first_step, config.num_meta_steps)
  if progress:
    from tqdm import tqdm
    iterator = tqdm(iterator, initial=first_step, total=config.num_meta_steps,
                    desc=f"meta-train {config.algorithm}", unit="step", dynamic_ncols=True)
  window, window_start = [], time.time()

  def validate(step):
    nonlocal best_record
    per_task = evaluate_tasks(problem, evaluate, state.meta_params, "val", config.num_val_tasks,
                              val_key, eval_batch, mesh=mesh)
    score = float(np.mean(per_task[score_name]))
    logger.log(step, {f"val/{score_name}": score, "val/nll": float(np.mean(per_task["nll"]))})
    if best_record is None or better(score, best_record["score"]):
      best.save(step, args=ocp.args.StandardSave(state.meta_params), force=True)
      best.wait_until_finished()
      best_record = {"step": step, "score": score, "metric": score_name}
      if is_main:
        best_path.write_text(json.dumps(best_record))
    return score

  for step in iterator:
    step_key = jax.random.fold_in(train_key, step)
    task_key, update_key = jax.random.split(step_key)
    state, metrics = meta_step(state, sample_train(task_key), update_key)
    window.append(metrics)
    done = step + 1
    if done % config.log_every == 0 or done == config.num_meta_steps:
      means = {f"train/{k}": float(np.mean([float(m[k]) for m in window])) for k in window[0]}
      if not np.isfinite(means["train/loss"]):
        raise FloatingPointError(f"meta-training diverged at step {done}: {means}")
      elapsed = time.time() - window_start
      means["train/steps_per_s"] = len(window) / elapsed
      means["train/tasks_per_s"] = len(window) * config.tasks_per_step / elapsed
      logger.log(done, means)
      if progress:
        iterator.set_postfix({k.split("/")[1]: f"{v:.3g}" for k, v in means.items()
                              if k != "train/tasks_per_s"})
      window, window_start = [], time.time()
    if done % config.eval_every == 0 or done == config.num_meta_steps:
      score = validate(done)
      if progress:
        iterator.write(f"step {done}: val {score_name} {score:.4f}"
                       f" (best {best_record['score']:.4f} at step {best_record['step']})")
    if done % config.checkpoint_every == 0 or done == config.num_meta_steps:
      checkpoints.save(done, args=ocp.args.StandardSave(state), force=True)
      if is_main:
        train_seconds[str(done)] = earlier_train_time + time.time() - start_time
        train_time_path.write_text(json.dumps(train_seconds))
  checkpoints.wait_until_finished()
  # Over every process that trained this run, so a resumed run reports its whole cost.
  train_time = earlier_train_time + time.time() - start_time

  # Test the best validated meta-parameters on unseen tasks.
  meta_params = state.meta_params
  if best.latest_step() is not None:
    meta_params = best.restore(best.latest_step(), args=ocp.args.StandardRestore(state.meta_params))
  test_start = time.time()
  per_task = evaluate_tasks(problem, evaluate, meta_params, "test", config.num_test_tasks,
                            test_key, eval_batch, progress=progress, mesh=mesh)
  summary = summarise(problem, per_task, config.num_bins)
  logger.log(config.num_meta_steps, {f"test/{k}": v for k, v in _public(summary).items()})
  logger.close()

  plots = _write_plots(problem, config, summary, per_task, workdir) if is_main else {}

  results = {
      "config": dataclasses.asdict(config),
      "test": _public(summary),
      "best_validation": best_record,
      "meta_steps": config.num_meta_steps,
      "resumed_from_step": first_step,
      "wall_time_s": {"total": time.time() - start_time, "train": train_time,
                      "test": time.time() - test_start},
      "git_commit": _git_commit(),
      "device": device_description(),
      "task_mesh_devices": _mesh_size(mesh),
      "jax_version": jax.__version__,
      "plots": plots,
      "calibration": calibration_record(summary),
      **(extra_results or {}),
  }
  if is_main:
    (workdir / "results.json").write_text(json.dumps(results, indent=2, default=float))
  return results
