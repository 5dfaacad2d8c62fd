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
was trained with, and what the backend's 'auto' choices were: `recorded_choices`,
which a resumed run keeps), `config.json`, `checkpoints/`, `best/`, `metrics.jsonl`
(and TensorBoard files), `results.json`, `test_per_task.npz`, `recalibration.json`; `run_folder`
owns them (atomic writes, the folder's lock, checkpoints that fall back to an
older one). Ctrl-C or SIGTERM saves a checkpoint before the run stops;
running again resumes; `interrupts` owns that path and every other way a run
stops or fails.
"""

import functools
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jaxlib
import numpy as np
from jax.sharding import Mesh

from vampire_jax._src.core import backend_defaults, host_memory, meta_step, models, sharding
from vampire_jax._src.core.errors import ConfigError, DivergenceError
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax._src.metrics import calibration, evaluation, predictive_uncertainty
from vampire_jax.runs import algorithms, config_records, interrupts, kinds, programs
from vampire_jax.runs import run_config, run_folder
from vampire_jax.runs import inner_loop_check
from vampire_jax.runs import init_from as run_start
from vampire_jax.runs import problem as problem_lib
from vampire_jax.runs import recalibration, recorded_choices
from vampire_jax.runs.problem import Problem
from vampire_jax.runs.reporting import MetricWriter, Progress, format_duration
from vampire_jax.runs.run_folder import RunCheckpoints

PyTree = Any


def prepare_workdir(workdir: Path, record: dict, config, *, is_main: bool, print_fn=None) -> None:
  """Under the folder's lock, checks that a resumed run matches and records the run (`record`,
  in `run.json`): `train_and_evaluate` checked the folder before it loaded the data; this
  check is the one that no run written in between can pass.

  Raises:
    ConfigError: the folder holds a run of another config (`check_resumable`).
    RunFolderError: `record` differs from the one the folder's checkpoints carry.
    StorageError: the record cannot be written.
  """
  run_folder.check_resumable(workdir, config, print_fn=print_fn)
  run_folder.check_new_record(workdir, record)  # a record its checkpoints refuse: not written
  if is_main:
    run_folder.write_run_record(workdir, record)


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
  evaluate_val: Callable  # evaluate_indices(meta_params, key, indices) on the validation split
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
    params, prior_key
  )
  return state if mesh is None else sharding.replicate(state, mesh)


def learner_for(problem: Problem, config, num_mc: Optional[int] = None) -> MetaLearner:
  """The run's learner: training's weight draws, or `num_mc` on support and query (testing)."""
  return algorithms.make_learner(
    problem.model, problem.kind, problem.noise_std, config, num_mc=num_mc
  )


def _mean_metrics(window: list[dict]) -> dict:
  stacked = {name: np.concatenate([np.asarray(m[name]) for m in window]) for name in window[0]}
  return {f"train/{name}": float(np.mean(values)) for name, values in stacked.items()}


class LoopState(NamedTuple):
  """What the loop carries between calls besides the meta-state."""

  window: list  # metrics of the calls since the last log
  validated: bool  # a validation has run (and compiled the evaluator)
  compiled: bool  # the train step has run once (and compiled)


def _validate(session: Session, state, step: int, first: bool) -> float:
  """Scores the validation split; keeps the meta-parameters if they are the best.

  Meta-parameters under which some validation task's results are NaN or
  infinite (an adapted weight draw that overflowed, say) are never kept as
  the best: the loop says so, naming the tasks, and trains on; the test
  still refuses non-finite results.
  """
  config = session.config
  if first:
    session.progress.message(
      f"validating on {config.evaluation.num_val_tasks} tasks (the first evaluation compiles the evaluator)..."
    )
  per_task = evaluation.evaluate_split(
    session.evaluate_val,
    state.meta_params,
    session.val_key,
    config.evaluation.num_val_tasks,
    programs.eval_batch_size(config, session.mesh),
    refuse_non_finite=False,
  )
  kind = kinds.get(session.problem.kind)
  name = kind.score
  bad = evaluation.non_finite_tasks(per_task)
  if bad.size:
    if session.is_main:
      session.progress.warn(
        f"step {step}: validation: {bad.size} of {config.evaluation.num_val_tasks} tasks gave non-finite "
        f"results (tasks {bad[:10].tolist()}): these meta-parameters are not kept as the best"
      )
    return float("nan")
  score = float(np.mean(per_task[name]))
  summary = kind.summarise(per_task, config.evaluation.num_bins, session.problem.noise_std)[0]
  calibration_metrics = {  # ECE/MCE against steps: how calibration moves while training
    f"val/{metric}": float(summary[metric]) for metric in ("ece", "mce") if metric in summary
  }
  session.writer.write(
    step,
    {f"val/{name}": score, "val/nll": float(np.mean(per_task["nll"])), **calibration_metrics},
  )
  best = session.checkpoints.best_record()
  improved = kind.better(score, None if best is None else best["score"])
  if improved:
    best = {"step": step, "score": score, "metric": name}
    session.checkpoints.save_best(state.meta_params, best, write_files=session.is_main)
  session.progress.message(
    f"step {step}: validation {name} {score:.4f}"
    + (" (best so far)" if improved else f" (best {best['score']:.4f} at step {best['step']})")
  )
  return score


def _guard_hint(config) -> str:
  """Where the algorithm has the inner-loop guard and it is off, say so (a runaway task)."""
  if getattr(config.algorithm, "backtracking", True):  # on, or an algorithm without it
    return ""
  return (
    f"; where a task's inner loop ran away (a 'finite' below 1), the {config.algorithm.name} "
    "spec's backtracking=True (vj.adapt's) guards against it"
  )


def _after_call(
  session: Session, state, step: int, loop: LoopState, train_seconds: float
) -> LoopState:
  """Logging, validation and checkpointing due at `step`."""
  config = session.config
  done = step == config.schedule.num_meta_steps
  window, validated, _ = loop
  if step % config.evaluation.log_every == 0 or done:
    means = _mean_metrics(window)
    if not np.isfinite(means["train/loss"]):
      raise FloatingPointError(
        f"meta-training diverged at step {step}: {means}; see "
        "vj.kl_step_factor for stable settings" + _guard_hint(config)
      )
    rate = session.progress.rate()
    if rate is not None:
      means.update(
        {"train/steps_per_s": rate, "train/tasks_per_s": rate * config.schedule.tasks_per_step}
      )
    session.writer.write(step, means)
    session.progress.log(
      step,
      {
        k.split("/")[1]: v
        for k, v in means.items()
        if k not in ("train/steps_per_s", "train/tasks_per_s")
      },
    )
    window = []
  start = time.perf_counter()
  if step % config.evaluation.eval_every == 0 or done:
    _validate(session, state, step, first=not validated)
    validated = True
  if step % config.evaluation.checkpoint_every == 0 or done:
    session.checkpoints.save(
      step, state, train_seconds, write_files=session.is_main, log_window=window
    )
  session.progress.exclude(time.perf_counter() - start)
  return loop._replace(window=window, validated=validated)


def _train(session: Session, state, earlier_seconds: float):
  """Runs meta-steps from `state.step` to `config.schedule.num_meta_steps`; returns the final state."""
  config, progress = session.config, session.progress
  step = int(state.step)
  # A resumed run carries on the window of steps since the last logged row.
  window = session.checkpoints.log_window(step) if step else []
  start, loop = time.perf_counter(), LoopState(window, False, False)
  with interrupts.requests() as received:
    train_seconds = earlier_seconds
    while step < config.schedule.num_meta_steps:
      compiling = not loop.compiled
      if compiling:
        progress.message("compiling the meta-step (later calls reuse it)...")
      state, metrics = session.train_step(state, session.train_key)
      step += session.steps_per_call
      loop = loop._replace(window=loop.window + [jax.device_get(metrics)], compiled=True)
      if compiling:
        progress.message(
          f"compiled and ran the first call in {format_duration(time.perf_counter() - start)}"
        )
        progress.start_timing(step)
      progress.advance(step)
      # The training time up to this step, as checkpointed: a resumed run reports the same.
      train_seconds = earlier_seconds + time.perf_counter() - start
      loop = _after_call(session, state, step, loop, train_seconds)
      interrupts.stop_if_requested(
        received,
        session.checkpoints,
        step,
        state,
        earlier_seconds + time.perf_counter() - start,
        workdir=session.workdir,
        write_files=session.is_main,
        log_window=loop.window,
      )
  session.checkpoints.wait()
  return state, train_seconds


def _parameters_to_test(session: Session, state) -> tuple[Any, int]:
  """`(meta_params, step)` that `config.evaluation.test_parameters` names.

  'best': the best by validation (the final ones if no validation kept any);
  'final': the last step's, as the authors' 2019 code tested.
  """
  final = (state.meta_params, int(state.step))
  if session.config.evaluation.test_parameters == "final":
    return final
  best = session.checkpoints.restore_best(state.meta_params)
  if best is None:
    return final
  return best, int(session.checkpoints.best_record()["step"])


def _test(session: Session, meta_params, step: int) -> tuple[evaluation.Summary, dict]:
  config = session.config
  which = "best by validation" if config.evaluation.test_parameters == "best" else "final"
  session.progress.message(
    f"testing the {which} meta-parameters (step {step}) on {config.evaluation.num_test_tasks} tasks..."
  )
  per_task = evaluation.evaluate_split(
    session.evaluate_test,
    meta_params,
    session.test_key,
    config.evaluation.num_test_tasks,
    programs.eval_batch_size(config, session.mesh),
  )
  summary = kinds.summarise(
    session.problem.kind,
    per_task,
    num_bins=config.evaluation.num_bins,
    noise_std=session.problem.noise_std,
  )
  if session.evaluate_open_set is not None:
    session.progress.message(
      f"open-set episodes: the {config.evaluation.num_test_tasks} test tasks with "
      "queries of unknown classes..."
    )
    open_set = evaluation.evaluate_split(
      session.evaluate_open_set,
      meta_params,
      session.test_key,
      config.evaluation.num_test_tasks,
      programs.eval_batch_size(config, session.mesh),
    )
    summary.metrics["open_set"] = predictive_uncertainty.open_set_summary(open_set)
    per_task.update({f"open_set_{name}": values for name, values in open_set.items()})
  return summary, per_task


def _setup(
  problem: Problem,
  config,
  workdir: Path,
  progress: bool,
  print_fn: Callable[[str], None],
  record: dict,
  start: Optional[run_start.Start] = None,
) -> tuple[Session, Any, float]:
  """Builds the session and the state to start from (fresh, `start`'s, or the latest checkpoint)."""
  is_main = jax.process_index() == 0
  mesh = backend_defaults.task_mesh_for(config, config.schedule.tasks_per_step)
  init_key, train_key, val_key, test_key = programs.run_keys(config.seed)
  train_learner = learner_for(problem, config)
  test_learner = learner_for(problem, config, num_mc=config.algorithm.test_draws)
  optimizer = algorithms.make_optimizer(config)
  state = _initial_state(problem, config, train_learner, optimizer, init_key, mesh)
  if start is not None:  # a trained run's meta-parameters, a fresh optimiser state (`init_from`)
    state = run_start.initial_state(start, train_learner, optimizer, state, mesh)
  if run_folder.latest_checkpoint_step(workdir) is None:  # a resumed run passed it at its start
    try:
      inner_loop_check.check_before_training(
        problem, config, train_learner, state, inner_loop_check.check_key(init_key), print_fn
      )
    except DivergenceError:
      if is_main:  # nothing was trained: the corrected settings may use this folder
        run_folder.forget_unused_record(workdir)
      raise
  checkpoints = RunCheckpoints(workdir, record=record, print_fn=print_fn)
  earlier_seconds = 0.0
  if checkpoints.latest_step() is not None:
    state = checkpoints.restore_latest(state)  # the newest that restores
    earlier_seconds = checkpoints.train_seconds(int(state.step))
    print_fn(f"resuming from step {int(state.step)} in {workdir}")
    if int(state.step) > config.schedule.num_meta_steps:
      checkpoints.close()
      raise ConfigError(
        f"num_meta_steps {config.schedule.num_meta_steps}: {workdir} holds a run "
        f"trained to step {int(state.step)}; set num_meta_steps "
        f"{int(state.step)} (or more) to test or continue it",
        fields=("num_meta_steps",),
      )
  # The programs compiled to set up (initialisation, the inner-loop check, a tried task) run
  # once: forgotten, their memory is not held while the run steps.
  host_memory.drop_compiled_programs()
  num_steps = backend_defaults.steps_per_call(config, int(state.step))
  evaluate = programs.build_evaluator(problem.kind, problem.noise_std, config, test_learner, mesh)
  session = Session(
    problem=problem,
    config=config,
    workdir=workdir,
    is_main=is_main,
    mesh=mesh,
    train_step=programs.build_train_step(
      problem, config, train_learner, optimizer, mesh, num_steps
    ),
    steps_per_call=num_steps,
    evaluate_val=programs.split_evaluator(problem, evaluate, "val", mesh),
    evaluate_test=programs.split_evaluator(problem, evaluate, "test", mesh),
    train_key=train_key,
    val_key=val_key,
    test_key=test_key,
    checkpoints=checkpoints,
    writer=MetricWriter(workdir, enabled=is_main, resumed_from=int(state.step) or None),
    progress=Progress(
      config.schedule.num_meta_steps,
      int(state.step),
      enabled=progress and is_main,
      print_fn=print_fn,
    ),
    print_fn=print_fn,
    evaluate_open_set=programs.open_set_evaluator(problem, config, test_learner, mesh),
  )
  return session, state, earlier_seconds


def train_and_evaluate(
  problem: Problem | Callable[[], Problem],
  config,
  workdir: str | os.PathLike,
  *,
  init_from=None,
  progress: bool = True,
  print_fn: Callable[[str], None] = print,
) -> dict:
  """Meta-trains (resuming if `workdir` holds a checkpoint), validates, tests; writes results.

  Args:
    problem: the network, data and likelihood; or a function that builds it
      (loads the data), called once the config and the folder are checked.
    config: a `RunConfig` (or subclass).
    workdir: the run folder; created once the config is checked.
    init_from: a trained run (`vj.Run`, or its folder: a zoo cell) whose meta-parameters start
      a new run (`run.json` records it; a resume does not read it again): `runs.init_from`.
    progress: show progress (a bar on a terminal, else a line per log).
    print_fn: where messages go.

  Returns:
    The dictionary written to `workdir/results.json`: the config, test
    metrics, calibration records, best validation, timings, device.

  Raises:
    InputError: `problem` or `config` of the wrong type, or a problem whose first
      training task the network cannot take (`problem.check_problem`).
    ConfigError: an impossible setting, a run of another config in `workdir`,
      one already trained past `num_meta_steps`, or an `init_from` run that does not fit.
    RunFolderError: another process holds `workdir`, or none of its checkpoints restores.
    StorageError: `workdir` cannot be written (a file, read-only, a full disk).
    TrainingInterrupted: SIGINT/SIGTERM; a checkpoint was saved first.
    FloatingPointError: the training loss became non-finite.

  Examples:
    Generated sine/line tasks, each split its own stream; 20 meta-steps (the user guide
    runs this, in seconds on a CPU), then the folder loads as a `vj.Run`:

    >>> from vampire_jax.data import sine_line
    >>> def sample_split(split_id, task_keys):
    ...   keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(task_keys, split_id)
    ...   return sine_line.tasks_from_keys(keys)
    >>> problem = vj.Problem(model=vj.MLP((16, 16), 1), input_shape=(1,),
    ...     splits={"train": jnp.uint32(0), "val": jnp.uint32(1), "test": jnp.uint32(2)},
    ...     sample_tasks=sample_split, kind="regression", noise_std=0.3)
    >>> config = vj.RunConfig(
    ...     algorithm=vj.specs.Vampire(inner_lr=0.001, kl_weight=1.0),
    ...     schedule=vj.Schedule(tasks_per_step=4, num_meta_steps=20),
    ...     evaluation=vj.Evaluation(num_val_tasks=4, num_test_tasks=8, eval_batch_tasks=4,
    ...                              eval_every=20, checkpoint_every=20, log_every=10))
    >>> results = vj.train_and_evaluate(problem, config, "runs/sines")  # doctest: +SKIP
    >>> results["tested_step"], results["test"]["num_tasks"]  # doctest: +SKIP
    (20, 8)
    >>> run = vj.load_run("runs/sines")  # doctest: +SKIP

    Called again on the same folder, it resumes from the newest checkpoint; with
    `init_from="zoo/<cell>"` a new folder starts from a trained run's meta-parameters.
  """
  start = time.time()
  # Every check of the config and the folder, once, before the data is loaded or the
  # folder made: a refused run reads nothing and writes nothing.
  run_config.check_is_config("train_and_evaluate", config)
  algorithms.check_config(config)
  workdir = Path(workdir)
  is_main = jax.process_index() == 0
  if is_main:
    run_folder.check_writable(workdir)
    run_folder.check_not_in_use(workdir)
  run_folder.check_resumable(workdir, config)
  source = run_start.source(init_from, workdir, config, print_fn)  # None: resumed, or none
  # Built if a function; its splits finite and one training task tried (`check_problem`).
  problem = problem_lib.checked_problem(problem)
  run_folder.check_model_recordable(problem.model)  # a run that could never load: refused
  if source is not None:
    run_start.check_fits(source, problem, config)
    print_fn(run_start.describe(source))
  if is_main:
    run_folder.make_folder(workdir)
  with run_folder.lock(workdir, is_main=is_main, print_fn=print_fn):
    # The backend's 'auto' choices: the folder's recorded ones on a resume, else decided here;
    # the run runs with them (`running`), its record keeps them and the config as given.
    mesh = backend_defaults.task_mesh_for(config, config.schedule.tasks_per_step)
    choices = recorded_choices.choose(problem, config, mesh, run_folder.read_run_record(workdir))
    problem, running = recorded_choices.apply(problem, config, choices)
    record = run_start.with_start(run_folder.run_record(problem, config), workdir, source)
    record[recorded_choices.RECORD_KEY] = choices.to_record()
    prepare_workdir(workdir, record, config, is_main=is_main, print_fn=print_fn)
    kept = recorded_choices.describe_kept(choices)
    if kept is not None:
      print_fn(kept)
    session, state, earlier_seconds = _setup(
      problem, running, workdir, progress, print_fn, record, source
    )
    first_step = int(state.step)
    try:
      state, train_seconds = _train(session, state, earlier_seconds)
      session.progress.close()
      tested_params, tested_step = _parameters_to_test(session, state)
      test_start = time.time()
      summary, per_task = _test(session, tested_params, tested_step)
      recalibrated = recalibration.after_test(session, record, tested_params, tested_step, per_task)
      session.writer.write_test(int(state.step), config.flat(), summary.metrics)
    finally:
      session.progress.close()
      session.writer.close()
      session.checkpoints.close()
    results = {
      "config": config_records.to_record(config),
      "kind": problem.kind,
      "test": summary.metrics,
      "calibration": {
        name: calibration.to_record(curve) for name, curve in summary.calibration.items()
      },
      **recalibrated,  # `recalibration` (the map fitted on validation) and `test_recalibrated`
      "best_validation": session.checkpoints.best_record(),
      "test_parameters": config.evaluation.test_parameters,
      "tested_step": tested_step,
      "meta_steps": int(state.step),
      "resumed_from_step": first_step,
      **{k: v for k, v in record.items() if k == run_start.RECORD_KEY},  # started from a run
      "wall_time_s": {
        "total": time.time() - start,
        "train": train_seconds,
        "test": time.time() - test_start,
      },
      "data": problem.data_info,
      "git_commit": run_folder.git_commit(),
      "device": run_folder.device_description(),
      "task_mesh_devices": programs.mesh_size(session.mesh),
      "jax_version": jax.__version__,
      # XLA (in jaxlib) compiles for the CPU it runs on, and its version changes the
      # rounding: a run is repeatable to the bit only with the same jaxlib.
      "jaxlib_version": jaxlib.__version__,
      # What 'auto' ran as, and the processor that decided it (kept since the run began).
      recorded_choices.RECORD_KEY: choices.to_record(),
    }
    if is_main:
      run_folder.write_results(workdir, results)
      run_folder.save_per_task(workdir, per_task)
  return results
