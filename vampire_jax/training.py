"""The training loop as a plain function: meta-train, validate, checkpoint, test.

    results = vj.train_and_evaluate(problem, config, workdir)

A `Problem` says what to learn: the network (a flax module), the task
sampler and the data it draws from, and the likelihood. A `RunConfig` says
how. `train_and_evaluate` checks the config, records the run in `workdir`
(so `vj.load_run(workdir)` can rebuild it without the data), resumes from
the last checkpoint, trains with one jitted call per `steps_per_call` steps
(tasks sampled inside), validates every `eval_every` steps keeping the best
meta-parameters, tests them, and writes `results.json`.

The path of a meta-step's data: `problem.splits['train']` (device arrays,
put there once) -> the jitted train step, which draws `tasks_per_step` task
keys from (seed, step), samples the tasks from the split inside the same
program, adapts to each task (`learner.adapt`, vmapped, or in `lax.map`
on a CPU), averages the query losses' gradients and applies Adam.
Nothing but the state and a few scalars crosses between host and device.

What a run leaves in `workdir`: `run.json` (the config, network and data it
was trained with), `config.json`, `checkpoints/`, `best/`, `metrics.jsonl`
(and TensorBoard files), `results.json`, `test_per_task.npz`. Ctrl-C or
SIGTERM saves a checkpoint before the run stops; running again resumes.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vampire_jax import algorithms, batching, calibration, config as config_lib, configs
from vampire_jax import diagnostics, evaluation, losses, meta_step, models, sharding
from vampire_jax import predictive_uncertainty
from vampire_jax.checkpoint import RunCheckpoints
from vampire_jax.errors import ConfigError
from vampire_jax.learners import MetaLearner
from vampire_jax.reporting import MetricWriter, Progress, format_duration
from vampire_jax.tasks import Task

PyTree = Any
RUN_RECORD = "run.json"
RUN_RECORD_FORMAT = 1


class Problem(NamedTuple):
  """What an experiment trains on.

  Attributes:
    model: the network, a flax module (recorded in the run folder, so it must
      be importable and its fields JSON values).
    input_shape: one example's shape, e.g. `(28, 28, 1)`.
    splits: `{'train', 'val', 'test'}` -> the data the sampler draws from
      (device arrays; for generated tasks, anything that tells splits apart).
    sample_tasks: `sample_tasks(split_data, task_keys [n]) -> Task` with a
      leading `[n]` axis, task i from key i alone; jittable.
    kind: 'classification' or 'regression'.
    noise_std: the regression likelihood's noise (regression only).
    query_truth: optional `query_truth(split_data, task_keys) -> [n, query, 1]`,
      the noiseless targets of the sampled tasks (regression calibration).
    data_info: what the data is and where it came from (recorded).
    sample_open_set_tasks: optional, classification: `sample_open_set_tasks(
      split_data, task_keys) -> Task`, the sampler's task i with extra queries
      of classes outside its support set, labelled -1
      (`data.open_set_tasks_from_keys`). With it the test adds open-set
      episodes (`results['test']['open_set']`); None: no open-set test.
  """
  model: nn.Module
  input_shape: tuple[int, ...]
  splits: dict
  sample_tasks: Callable[[PyTree, jax.Array], Task]
  kind: str = "classification"
  noise_std: Optional[float] = None
  query_truth: Optional[Callable[[PyTree, jax.Array], jax.Array]] = None
  data_info: dict = {}
  sample_open_set_tasks: Optional[Callable[[PyTree, jax.Array], Task]] = None


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def network(model: nn.Module, compute_dtype: str = "float32") -> losses.ApplyFn:
  """`apply_fn(params, x)` of `model`, in bfloat16 mixed precision if asked."""
  apply_fn = models.pure_apply(model)
  if compute_dtype == "float32":
    return apply_fn
  return models.mixed_precision(apply_fn, COMPUTE_DTYPES[compute_dtype])


def likelihood(kind: str, noise_std: Optional[float]) -> losses.Likelihood:
  """Categorical for classification, Gaussian with `noise_std` for regression."""
  if kind == "classification":
    return losses.categorical_nll
  if kind == "regression":
    return losses.gaussian_nll(noise_std)
  raise ValueError(f"kind must be 'classification' or 'regression', got {kind!r}")


def unroll_inner_steps(config) -> bool:
  """Unroll the inner loop: the config's choice; by default no (a scan compiles faster)."""
  return bool(config.unroll_inner_steps)


def conv_impl(config) -> str:
  """The config's convolution, 'auto' resolved (`models.auto_conv_impl`)."""
  if config.conv_impl != "auto":
    return config.conv_impl
  strategy, _ = choose_batching(config.task_batching, config.chunk_size, config.tasks_per_step)
  mapped_draws = (algorithms.sample_batching(config) == "map"
                  and max(config.num_mc_train, config.num_mc_query) > 1)
  return models.auto_conv_impl(task_batching=strategy,
                               inner_steps_unrolled=unroll_inner_steps(config),
                               draws_mapped=mapped_draws)


def make_learner(model: nn.Module, kind: str, noise_std: Optional[float], config, *,
                 num_mc_train: int, num_mc_query: int) -> MetaLearner:
  """The configured algorithm on `model`, with the given Monte-Carlo sample counts."""
  return algorithms.learner_from_config(
      config, network(model, config.compute_dtype), likelihood(kind, noise_std),
      num_mc_train=num_mc_train, num_mc_query=num_mc_query,
      unroll_steps=unroll_inner_steps(config))


def check_config(config) -> None:
  """Raises ConfigError for an impossible setting (the config's `validate`)."""
  algorithms.get(config.algorithm)
  if hasattr(config, "validate"):
    config.validate()
  else:
    config_lib.validate(config)


# -- Devices and batching ------------------------------------------------------


def task_mesh_for(config, num_tasks: int) -> Optional[Mesh]:
  """The device mesh `num_tasks` tasks are split over, or None for one device.

  'off': None. 'on': every device (of every host); `num_tasks` must divide
  evenly. 'auto': like 'on' when more than one device is visible; with one
  process it takes the largest number of devices that divides `num_tasks`.
  """
  devices = jax.devices()
  if config.shard_tasks == "off" or (config.shard_tasks == "auto" and len(devices) == 1):
    return None
  if config.shard_tasks == "auto" and jax.process_count() == 1:
    count = max(n for n in range(1, len(devices) + 1) if num_tasks % n == 0)
    devices = devices[:count]
  mesh = sharding.task_mesh(devices)
  sharding.check_divisible(num_tasks, mesh)
  return mesh


def _mesh_size(mesh: Optional[Mesh]) -> int:
  return 1 if mesh is None else mesh.size


def choose_batching(strategy: str, chunk_size: int, num_tasks: int,
                    sharded: bool = False) -> tuple[str, int]:
  """`(strategy, chunk)`: 'auto' resolved for the backend, the chunk fitted to `num_tasks`."""
  default_strategy, default_chunk = batching.default_task_batching()
  if strategy == "auto":
    strategy = "vmap" if sharded else default_strategy
  chunk_size = max(1, min(chunk_size or default_chunk, num_tasks))
  while num_tasks % chunk_size:
    chunk_size -= 1
  return strategy, chunk_size


def steps_per_call(config, first_step: int) -> int:
  """Meta-steps per jitted call: the config's (default 1), made to divide every boundary.

  Logging, validation and checkpoints happen between calls, so the count
  divides their intervals, the run's length and the step it resumes from.
  """
  requested = config.steps_per_call or 1
  return math.gcd(requested, config.log_every, config.eval_every, config.checkpoint_every,
                  config.num_meta_steps, first_step or requested)


def build_train_step(problem: Problem, config, learner: MetaLearner, optimizer,
                     mesh: Optional[Mesh], num_steps: int) -> Callable:
  """`train_step(state, key) -> (state, metrics [num_steps])`, compiled on first call."""
  metrics_fn = meta_step.classification_metrics if problem.kind == "classification" else None
  num_local_tasks = config.tasks_per_step // _mesh_size(mesh)
  strategy, chunk = choose_batching(config.task_batching, config.chunk_size, num_local_tasks,
                                    sharded=mesh is not None)
  data = problem.splits["train"]
  if config.debug_nans:  # one checked program (vj.debug_nonfinite) names the first NaN
    strategy = "map" if strategy == "host_chunked" else strategy
    step = diagnostics.debug_nonfinite(meta_step.make_train_step(
        learner, optimizer, problem.sample_tasks, tasks_per_step=config.tasks_per_step,
        steps_per_call=num_steps, task_batching=strategy, chunk_size=chunk,
        metrics_fn=metrics_fn, mesh=mesh))
    return lambda state, key: step(state, data, key)
  if strategy == "host_chunked":
    if mesh is not None:
      raise ConfigError("--task-batching host_chunked runs tasks from Python on one device; "
                        "with tasks sharded over devices use vmap, or --shard-tasks off")
    step = meta_step.make_host_chunked_train_step(
        learner, optimizer, problem.sample_tasks, tasks_per_step=config.tasks_per_step,
        chunk_size=chunk, metrics_fn=metrics_fn)
    return lambda state, key: step(state, data, key)
  step = jax.jit(meta_step.make_train_step(
      learner, optimizer, problem.sample_tasks, tasks_per_step=config.tasks_per_step,
      steps_per_call=num_steps, task_batching=strategy, chunk_size=chunk,
      metrics_fn=metrics_fn, mesh=mesh), donate_argnums=0)
  return lambda state, key: step(state, data, key)


def eval_batch_size(config, mesh: Optional[Mesh] = None) -> int:
  """`eval_batch_tasks`, rounded up to a multiple of the mesh's devices."""
  size = _mesh_size(mesh)
  return -(-config.eval_batch_tasks // size) * size


def build_evaluator(kind: str, noise_std: Optional[float], config, learner: MetaLearner,
                    mesh: Optional[Mesh] = None) -> Callable:
  """The jitted per-task evaluator of a `kind` problem, for batches of `eval_batch_size` tasks."""
  num_local_tasks = eval_batch_size(config, mesh) // _mesh_size(mesh)
  strategy, chunk = choose_batching(config.eval_task_batching, config.eval_chunk_size,
                                    num_local_tasks, sharded=mesh is not None)
  if strategy == "host_chunked":  # evaluation has no gradient to accumulate
    strategy = "chunked_unroll" if chunk < num_local_tasks else "unroll"
  if kind == "classification":
    evaluate = evaluation.make_classification_evaluator(
        learner, task_batching=strategy, chunk_size=chunk, mesh=mesh)
  else:
    evaluate = evaluation.make_regression_evaluator(
        learner, noise_std, task_batching=strategy, chunk_size=chunk, mesh=mesh)
  return jax.jit(evaluate)


def split_evaluator(problem: Problem, evaluate: Callable, split: str,
                    mesh: Optional[Mesh] = None) -> Callable:
  """`evaluate_indices(meta_params, key, indices)` on `split` (see `evaluation`)."""
  return evaluation.make_split_evaluator(evaluate, problem.sample_tasks, problem.splits[split],
                                         query_truth=problem.query_truth, mesh=mesh)


def open_set_evaluator(problem: Problem, config, learner: MetaLearner,
                       mesh: Optional[Mesh] = None) -> Optional[Callable]:
  """`evaluate_indices` of the test split's open-set episodes, or None if there are none.

  Episode i is test task i (same sample key, same adaptation and draws) with
  the extra queries of `problem.sample_open_set_tasks`.
  """
  if problem.kind != "classification" or problem.sample_open_set_tasks is None:
    return None
  num_local_tasks = eval_batch_size(config, mesh) // _mesh_size(mesh)
  strategy, chunk = choose_batching(config.eval_task_batching, config.eval_chunk_size,
                                    num_local_tasks, sharded=mesh is not None)
  if strategy == "host_chunked":
    strategy = "chunked_unroll" if chunk < num_local_tasks else "unroll"
  evaluate = jax.jit(evaluation.make_open_set_evaluator(learner, task_batching=strategy,
                                                        chunk_size=chunk, mesh=mesh))
  return evaluation.make_split_evaluator(evaluate, problem.sample_open_set_tasks,
                                         problem.splits["test"], mesh=mesh)


def draw_tasks(problem: Problem, split: str, key: jax.Array, num_tasks: int) -> Task:
  """`num_tasks` tasks of `split` (e.g. to look at them), keys split from `key`."""
  return jax.jit(problem.sample_tasks)(problem.splits[split], jax.random.split(key, num_tasks))


# -- The run folder -------------------------------------------------------------


def _config_class_name(config) -> str:
  cls = type(config)
  return f"{cls.__module__}.{cls.__qualname__}"


def run_record(problem: Problem, config) -> dict:
  """What `run.json` holds: enough to rebuild the trained model without the data."""
  return {"format": RUN_RECORD_FORMAT, "config_class": _config_class_name(config),
          "config": dataclasses.asdict(config), "model": models.module_spec(problem.model),
          "input_shape": list(problem.input_shape), "kind": problem.kind,
          "noise_std": problem.noise_std, "data": problem.data_info}


def read_run_record(workdir: str | os.PathLike) -> Optional[dict]:
  """The `run.json` of a run folder, or None if it has none."""
  path = Path(workdir) / RUN_RECORD
  return json.loads(path.read_text()) if path.exists() else None


def check_resumable(workdir: str | os.PathLike, config) -> None:
  """Raises ConfigError if `workdir` holds a run of another config.

  Schedule, evaluation and speed settings may change on a resume (e.g. a
  longer `num_meta_steps`); the message names any other field that differs.
  """
  saved = read_run_record(workdir)
  if saved is None:
    return
  differences = config_lib.config_differences(saved["config"], config)
  # Runs recorded before the experiments' configs moved into the library name
  # experiments.configs.<Class>, the same class as vampire_jax.configs.<Class>.
  if configs.recorded_class_name(saved["config_class"]) != _config_class_name(config):
    differences["config class"] = (saved["config_class"], _config_class_name(config))
  if differences:
    listed = "; ".join(f"{name}: {old!r} -> {new!r}" for name, (old, new) in differences.items())
    raise ConfigError(f"{workdir} holds a run with another config ({listed}). Use another "
                      "--workdir, or the same settings to resume it.")


def prepare_workdir(workdir: Path, problem: Problem, config, *, is_main: bool) -> None:
  """Creates the run folder and records the run, or checks that a resumed run matches.

  Raises:
    ConfigError: the folder holds a run of another config (`check_resumable`).
  """
  check_resumable(workdir, config)
  if not is_main:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  record = run_record(problem, config)
  (workdir / RUN_RECORD).write_text(json.dumps(record, indent=2, default=_jsonable))
  (workdir / "config.json").write_text(json.dumps(record["config"], indent=2, default=_jsonable))


def _jsonable(value):
  if isinstance(value, (np.floating, np.integer)):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  return str(value)


# -- Interruption -----------------------------------------------------------------


class TrainingInterrupted(Exception):
  """Training stopped on SIGINT or SIGTERM, after saving a checkpoint."""

  def __init__(self, step: int, signum: int, workdir: Path):
    self.step, self.signum, self.workdir = step, signum, workdir
    name = signal.Signals(signum).name
    super().__init__(f"{name}: stopped at step {step}, checkpoint saved in {workdir}; run the "
                     "same command again to resume")


@contextlib.contextmanager
def _interrupt_requests():
  """Yields a list that holds the signal number once SIGINT or SIGTERM arrives.

  A second signal stops at once (the default handlers are back by then).
  Outside the main thread (no handlers can be set) signals act as usual.
  """
  received: list[int] = []

  def handler(signum, frame):
    del frame
    received.append(signum)
    for sig, old in previous.items():
      signal.signal(sig, old)

  previous = {}
  try:
    for sig in (signal.SIGINT, signal.SIGTERM):
      previous[sig] = signal.signal(sig, handler)
  except ValueError:  # not the main thread
    previous.clear()
  try:
    yield received
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


# -- The loop ------------------------------------------------------------------------


class Session(NamedTuple):
  """Everything the loop needs, built once."""
  problem: Problem
  config: Any
  workdir: Path
  is_main: bool
  mesh: Optional[Mesh]
  train_step: Callable
  steps_per_call: int
  evaluate_val: Callable    # evaluate_indices(meta_params, key, indices) on the validation split
  evaluate_test: Callable
  train_key: jax.Array
  val_key: jax.Array
  test_key: jax.Array
  checkpoints: RunCheckpoints
  writer: MetricWriter
  progress: Progress
  print_fn: Callable[[str], None]
  evaluate_open_set: Optional[Callable] = None  # the test's open-set episodes, if any


def _initial_state(problem: Problem, config, learner: MetaLearner, optimizer, key, mesh):
  params_key, prior_key = jax.random.split(key)
  params = models.init_params(problem.model, params_key, (1,) + tuple(problem.input_shape))
  state = jax.jit(functools.partial(meta_step.init_meta_state, learner, optimizer))(
      params, prior_key)
  return state if mesh is None else sharding.replicate(state, mesh)


def _check_inner_loop(problem: Problem, config, learner: MetaLearner, state, key,
                      print_fn) -> None:
  """One inner loop on a real training task before the meta-step compiles (`check_inner_loop`).

  Raises:
    ConfigError: the support loss goes non-finite at initialisation, with the
      knob to turn and a value that works.
  """
  task = jax.tree_util.tree_map(lambda x: x[0], draw_tasks(problem, "train", key, 1))
  report = diagnostics.check_inner_loop(learner, state.meta_params, task, key)
  if report.ok:
    return
  message = (f"{config.algorithm}'s inner loop at initialisation, on a training task: "
             f"{report.advice} (--inner-lr, --kl-weight; see vj.check_inner_loop)")
  if not math.isfinite(report.loss_after):
    raise ConfigError(message)
  print_fn(f"warning: {message}")


def _mean_metrics(window: list[dict]) -> dict:
  stacked = {name: np.concatenate([np.asarray(m[name]) for m in window]) for name in window[0]}
  return {f"train/{name}": float(np.mean(values)) for name, values in stacked.items()}


class LoopState(NamedTuple):
  """What the loop carries between calls besides the meta-state."""
  window: list         # metrics of the calls since the last log
  validated: bool      # a validation has run (and compiled the evaluator)
  compiled: bool       # the train step has run once (and compiled)


def _validate(session: Session, state, step: int, first: bool) -> float:
  """Scores the validation split; keeps the meta-parameters if they are the best."""
  config = session.config
  if first:
    session.progress.message(f"validating on {config.num_val_tasks} tasks (the first "
                             "evaluation compiles the evaluator)...")
  per_task = evaluation.evaluate_split(
      session.evaluate_val, state.meta_params, session.val_key, config.num_val_tasks,
      eval_batch_size(config, session.mesh))
  name = _score_name(session.problem.kind)
  score = float(np.mean(per_task[name]))
  session.writer.write(step, {f"val/{name}": score, "val/nll": float(np.mean(per_task["nll"]))})
  best = session.checkpoints.best_record()
  improved = best is None or (score > best["score"] if name == "accuracy" else score < best["score"])
  if improved:
    best = {"step": step, "score": score, "metric": name}
    session.checkpoints.save_best(state.meta_params, best, write_files=session.is_main)
  session.progress.message(f"step {step}: validation {name} {score:.4f}"
                           + (" (best so far)" if improved else
                              f" (best {best['score']:.4f} at step {best['step']})"))
  return score


def _score_name(kind: str) -> str:
  return "accuracy" if kind == "classification" else "mse"


def _after_call(session: Session, state, step: int, loop: LoopState,
                train_seconds: float) -> LoopState:
  """Logging, validation and checkpointing due at `step`."""
  config = session.config
  done = step == config.num_meta_steps
  window, validated, _ = loop
  if step % config.log_every == 0 or done:
    means = _mean_metrics(window)
    if not np.isfinite(means["train/loss"]):
      raise FloatingPointError(f"meta-training diverged at step {step}: {means}; see "
                               "vj.kl_step_factor and BUILD_NOTES.md for stable settings")
    rate = session.progress.rate()
    if rate is not None:
      means.update({"train/steps_per_s": rate, "train/tasks_per_s": rate * config.tasks_per_step})
    session.writer.write(step, means)
    session.progress.log(step, {k.split("/")[1]: v for k, v in means.items()
                                if k not in ("train/steps_per_s", "train/tasks_per_s")})
    window = []
  start = time.perf_counter()
  if step % config.eval_every == 0 or done:
    _validate(session, state, step, first=not validated)
    validated = True
  if step % config.checkpoint_every == 0 or done:
    session.checkpoints.save(step, state, train_seconds, write_files=session.is_main)
  session.progress.exclude(time.perf_counter() - start)
  return loop._replace(window=window, validated=validated)


def _train(session: Session, state, earlier_seconds: float):
  """Runs meta-steps from `state.step` to `config.num_meta_steps`; returns the final state."""
  config, progress = session.config, session.progress
  start, loop = time.perf_counter(), LoopState([], False, False)
  with _interrupt_requests() as received:
    step = int(state.step)
    train_seconds = earlier_seconds
    while step < config.num_meta_steps:
      compiling = not loop.compiled
      if compiling:
        progress.message("compiling the meta-step (later calls reuse it)...")
      state, metrics = session.train_step(state, session.train_key)
      step += session.steps_per_call
      loop = loop._replace(window=loop.window + [jax.device_get(metrics)], compiled=True)
      if compiling:
        progress.message(f"compiled and ran the first call in "
                         f"{format_duration(time.perf_counter() - start)}")
        progress.start_timing(step)
      progress.advance(step)
      # The training time up to this step, as checkpointed: a resumed run reports the same.
      train_seconds = earlier_seconds + time.perf_counter() - start
      loop = _after_call(session, state, step, loop, train_seconds)
      if received:
        session.checkpoints.save(step, state, earlier_seconds + time.perf_counter() - start,
                                 write_files=session.is_main)
        session.checkpoints.wait()
        raise TrainingInterrupted(step, received[0], session.workdir)
  session.checkpoints.wait()
  return state, train_seconds


def _test(session: Session, meta_params) -> tuple[evaluation.Summary, dict]:
  config = session.config
  session.progress.message(f"testing on {config.num_test_tasks} tasks...")
  per_task = evaluation.evaluate_split(
      session.evaluate_test, meta_params, session.test_key, config.num_test_tasks,
      eval_batch_size(config, session.mesh))
  summary = evaluation.summarise(session.problem.kind, per_task, num_bins=config.num_bins,
                                 noise_std=session.problem.noise_std)
  if session.evaluate_open_set is not None:
    session.progress.message(f"open-set episodes: the {config.num_test_tasks} test tasks with "
                             "queries of unknown classes...")
    open_set = evaluation.evaluate_split(
        session.evaluate_open_set, meta_params, session.test_key, config.num_test_tasks,
        eval_batch_size(config, session.mesh))
    summary.metrics["open_set"] = predictive_uncertainty.open_set_summary(open_set)
    per_task.update({f"open_set_{name}": values for name, values in open_set.items()})
  return summary, per_task


def _setup(problem: Problem, config, workdir: Path, progress: bool,
           print_fn: Callable[[str], None]) -> tuple[Session, Any, float]:
  """Builds the session and the state to start from (fresh, or the latest checkpoint)."""
  is_main = jax.process_index() == 0
  mesh = task_mesh_for(config, config.tasks_per_step)
  init_key, train_key, val_key, test_key = jax.random.split(jax.random.key(config.seed), 4)
  train_learner = make_learner(problem.model, problem.kind, problem.noise_std, config,
                               num_mc_train=config.num_mc_train, num_mc_query=config.num_mc_query)
  test_learner = make_learner(problem.model, problem.kind, problem.noise_std, config,
                              num_mc_train=config.num_mc_test, num_mc_query=config.num_mc_test)
  optimizer = meta_step.meta_optimizer(
      config.meta_lr, tasks_per_step=config.tasks_per_step, decay_rate=config.meta_lr_decay,
      clip_norm=config.meta_grad_clip_norm)
  state = _initial_state(problem, config, train_learner, optimizer, init_key, mesh)
  _check_inner_loop(problem, config, train_learner, state, jax.random.fold_in(init_key, 1),
                    print_fn)
  checkpoints = RunCheckpoints(workdir)
  earlier_seconds = 0.0
  if checkpoints.latest_step() is not None:
    state = checkpoints.restore_latest(state)
    earlier_seconds = checkpoints.train_seconds(int(state.step))
    print_fn(f"resuming from step {int(state.step)} in {workdir}")
  num_steps = steps_per_call(config, int(state.step))
  evaluate = build_evaluator(problem.kind, problem.noise_std, config, test_learner, mesh)
  session = Session(
      problem, config, workdir, is_main, mesh,
      build_train_step(problem, config, train_learner, optimizer, mesh, num_steps), num_steps,
      split_evaluator(problem, evaluate, "val", mesh), split_evaluator(problem, evaluate, "test", mesh),
      train_key, val_key, test_key,
      checkpoints, MetricWriter(workdir, enabled=is_main),
      Progress(config.num_meta_steps, int(state.step), enabled=progress and is_main,
               print_fn=print_fn), print_fn,
      open_set_evaluator(problem, config, test_learner, mesh))
  return session, state, earlier_seconds


def train_and_evaluate(problem: Problem, config, workdir: str | os.PathLike, *,
                       progress: bool = True,
                       print_fn: Callable[[str], None] = print) -> dict:
  """Meta-trains (resuming if `workdir` holds a checkpoint), validates, tests; writes results.

  Args:
    problem: the network, data and likelihood.
    config: a `RunConfig` (or subclass).
    workdir: the run folder; created once the config is checked.
    progress: show progress (a bar on a terminal, else a line per log).
    print_fn: where messages go.

  Returns:
    The dictionary written to `workdir/results.json`: the config, test
    metrics, calibration records, best validation, timings, device.

  Raises:
    ConfigError: an impossible setting, or a run of another config in `workdir`.
    TrainingInterrupted: SIGINT/SIGTERM; a checkpoint was saved first.
    FloatingPointError: the training loss became non-finite.
  """
  start = time.time()
  check_config(config)
  workdir = Path(workdir)
  is_main = jax.process_index() == 0
  prepare_workdir(workdir, problem, config, is_main=is_main)
  session, state, earlier_seconds = _setup(problem, config, workdir, progress, print_fn)
  first_step = int(state.step)
  try:
    state, train_seconds = _train(session, state, earlier_seconds)
    session.progress.close()
    meta_params = session.checkpoints.restore_best(state.meta_params)
    test_start = time.time()
    summary, per_task = _test(session, state.meta_params if meta_params is None else meta_params)
  finally:
    session.progress.close()
    session.writer.close()
    session.checkpoints.close()
  results = {
      "config": dataclasses.asdict(config),
      "test": summary.metrics,
      "calibration": {name: calibration.to_record(curve)
                      for name, curve in summary.calibration.items()},
      "best_validation": session.checkpoints.best_record(),
      "meta_steps": config.num_meta_steps, "resumed_from_step": first_step,
      "wall_time_s": {"total": time.time() - start, "train": train_seconds,
                      "test": time.time() - test_start},
      "data": problem.data_info, "git_commit": _git_commit(), "device": device_description(),
      "task_mesh_devices": _mesh_size(session.mesh), "jax_version": jax.__version__,
  }
  if is_main:
    write_results(workdir, results)
    np.savez_compressed(workdir / "test_per_task.npz",
                        **{k: v for k, v in per_task.items() if k != "predictions"})
  return results


def write_results(workdir: str | os.PathLike, results: dict) -> None:
  """Writes `results` to `workdir/results.json` (on the first process only)."""
  if jax.process_index() == 0:
    (Path(workdir) / "results.json").write_text(json.dumps(results, indent=2, default=_jsonable))


def _git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def device_description() -> str:
  """`platform: kind xN`, e.g. `gpu: NVIDIA H100 80GB HBM3 x1`."""
  device = jax.devices()[0]
  return f"{device.platform}: {getattr(device, 'device_kind', '')} x{jax.device_count()}"


def test_summary_line(test: dict) -> str:
  """One line of a run's test metrics."""
  if "accuracy" in test:
    open_set = test.get("open_set", {}).get("auroc")
    open_set_part = ("" if not open_set else "  open-set AUROC (max prob / MI) " + " / ".join(
        "–" if open_set[k] is None else f"{open_set[k]:.3f}"
        for k in ("max_prob", "mutual_information")))
    return (f"test accuracy {100 * test['accuracy']:.2f} +- {100 * test['accuracy_ci95']:.2f} %"
            f"  NLL {test['nll']:.4f}  ECE {test['ece']:.4f}  MCE {test['mce']:.4f}"
            f"  AURC {test['aurc']:.4f}{open_set_part}  ({test['num_tasks']} tasks)")
  calibration_part = (f"  ECE {test['ece']:.4f}  MCE {test['mce']:.4f}" if "ece" in test else "")
  return (f"test MSE {test['mse']:.3f} +- {test['mse_ci95']:.3f}  NLL {test['nll']:.3f}"
          f"{calibration_part}  ({test['num_tasks']} tasks)")


def enable_compilation_cache(cache_dir: str | os.PathLike) -> Path:
  """Turns on JAX's persistent compilation cache in `cache_dir`.

  A second run of the same program loads its compiled steps instead of
  compiling them (keyed by the program and the compiler, so nothing stale
  is reused). Call it before anything is compiled.
  """
  folder = Path(cache_dir)
  folder.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  return folder
