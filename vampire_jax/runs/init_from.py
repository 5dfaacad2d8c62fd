"""A new run that starts from a trained run's meta-parameters: `train_and_evaluate(init_from=)`.

    results = vj.train_and_evaluate(problem, config, "runs/mine", init_from="zoo/<cell>")

The source is a `vj.Run` or its folder (a zoo cell, any run folder); its meta-parameters
are the ones it tested (`vj.load_run`). The new run starts from them at step 0 of its own
schedule, with a fresh optimiser state, in a folder of its own, whose `run.json` records
where it started (`init_from`: the folder, the zoo cell, the step, and sha256 checksums of
the checkpoint's files and of the meta-parameters). The source is only read.

Why a fresh optimiser state: a fine-tune is a new run with a schedule of its own (its
`meta_lr`, decay and clipping), as flax's and big_vision's `init from` load parameters
only. The authors' code has no such start: its `--resume-epoch` continues the same run,
optimiser included, which is what resuming a run folder does here.

What is refused, in one line, before the data is loaded or the folder made: a source of
another algorithm; then, with the problem built, another kind, another network class, or
meta-parameters of other shapes (the network's fields that differ are named). Resuming the
new run later continues it: `init_from` is read only when the folder holds no checkpoint.
"""

import hashlib
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src import deprecations
from vampire_jax._src.core import meta_step, models, sharding
from vampire_jax._src.core.errors import ConfigError, InputError
from vampire_jax.runs import algorithms, run_folder
from vampire_jax.runs.run_folder import checksums
from vampire_jax.runs.trained_run import Run, load_run

PyTree = Any
RECORD_KEY = "init_from"  # run.json's field: where the run started


class Start(NamedTuple):
  """The run a new run starts from, and what its `run.json` records of it."""

  run: Run
  record: dict


def _checkpoint_of(run: Run) -> Optional[str]:
  """The folder of `run`'s meta-parameters in its run folder (`best/<n>` or
  `checkpoints/<n>`), or None (its folder is gone: a pickled `Run`)."""
  if run.step is None:
    return None
  order = (
    ("best", "checkpoints") if run.config.evaluation.test_parameters == "best" else ("checkpoints",)
  )
  for folder in order:
    if (Path(run.workdir) / folder / str(run.step)).is_dir():
      return f"{folder}/{run.step}"
  return None


def files_sha256(workdir: Path, checkpoint: str) -> str:
  """sha256 of the lines `<path> <sha256 of the file>` of every file under `checkpoint`,
  sorted, paths relative to the run folder: a zoo manifest's `files` entries give it too."""
  lines = []
  for path in sorted(p for p in (workdir / checkpoint).rglob("*") if p.is_file()):
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    lines.append(f"{path.relative_to(workdir).as_posix()} {digest}\n")
  return hashlib.sha256("".join(lines).encode()).hexdigest()


def meta_params_sha256(meta_params: PyTree) -> str:
  """sha256 of every leaf's path, dtype, shape and bytes, in the tree's order."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(meta_params)[0]:
    array = np.asarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)} {array.dtype} {array.shape}\n".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def start_record(run: Run) -> dict:
  """What `run.json`'s `init_from` holds of `run`."""
  workdir = Path(run.workdir)
  checkpoint = _checkpoint_of(run)
  cell = workdir.resolve().name if checksums.recorded_files(workdir) is not None else None
  return {
    "folder": str(workdir.resolve()),
    "zoo_cell": cell,
    "run_id": run.record.get("run_id"),
    "algorithm": run.config.algorithm.name,
    "step": run.step,
    "tested_step": run.tested_step,
    "checkpoint": checkpoint,
    "checkpoint_sha256": None if checkpoint is None else files_sha256(workdir, checkpoint),
    "meta_params_sha256": meta_params_sha256(run.meta_params),
  }


def _check_type(init_from) -> None:
  if not isinstance(init_from, (Run, str, os.PathLike)):
    raise InputError(
      f"train_and_evaluate: init_from must be a vj.Run or a run folder's path, got "
      f"{type(init_from).__name__}"
    )


def source(init_from, workdir: Path, config, print_fn: Callable[[str], None]) -> Optional[Start]:
  """The run to start from, checked against `config`'s algorithm; None without one, or when
  `workdir` holds checkpoints (a resume: the run started from its source already).

  Raises:
    ConfigError: the source is a run of another algorithm, or `workdir` holds a run that
      did not start from a trained run (init_from starts a new run).
    MissingDataError, RunFolderError: `load_run` of the source's folder.
    InputError: `init_from` is neither a `vj.Run` nor a path.
  """
  if init_from is None:
    return None
  _check_type(init_from)
  latest = run_folder.latest_checkpoint_step(workdir)
  if latest is not None:
    started = (run_folder.read_run_record(workdir) or {}).get(RECORD_KEY)
    if not started:
      raise ConfigError(
        f"init_from: {workdir} holds a run trained from its own initialisation (checkpoint "
        f"{latest}), and init_from starts a new run: give it another workdir, or resume "
        "this one without init_from"
      )
    given = init_from.workdir if isinstance(init_from, Run) else init_from
    other = Path(given).resolve() != Path(started["folder"])
    print_fn(
      f"resuming {workdir}, which started from {started['folder']} (step {started['step']}): "
      "init_from is not applied again"
      + (f" (the one given, {given}, is another run folder: it is not read)" if other else "")
    )
    return None
  run = init_from if isinstance(init_from, Run) else load_run(init_from)
  check_algorithm(run.workdir, run.config.algorithm.name, config)
  return Start(run, start_record(run))


def describe(start: Start) -> str:
  """The line a run that starts from a trained run prints first: where it starts."""
  record = start.record
  cell = f" (zoo cell {record['zoo_cell']})" if record["zoo_cell"] else ""
  return (
    f"starting from {record['folder']}{cell}: its meta-parameters of step {record['step']}, "
    "with a fresh optimiser state"
  )


def check_algorithm(folder, algorithm: str, config) -> None:
  """Refuses, in one line, a source run (in `folder`) of another algorithm than `config`'s.

  Raises:
    ConfigError: `algorithm` is not `config.algorithm.name`.
  """
  if algorithm != config.algorithm.name:
    raise ConfigError(
      f"init_from: {folder} is a run of {algorithm}, and this run trains "
      f"{config.algorithm.name}: its meta-parameters are another algorithm's; start from a "
      f"{config.algorithm.name} run, or train algorithm {algorithm}",
      fields=("init_from", "algorithm"),
    )


def _network_differences(theirs: dict, ours: dict) -> str:
  fields = sorted(set(theirs["fields"]) | set(ours["fields"]))
  return "; ".join(
    f"{name}: {theirs['fields'].get(name)!r} there, {ours['fields'].get(name)!r} here"
    for name in fields
    if theirs["fields"].get(name) != ours["fields"].get(name)
  )


def check_fits(start: Start, problem, config) -> None:
  """Refuses, in one line, a source whose meta-parameters this problem's network cannot take.

  Raises:
    ConfigError: another kind (classification, regression), another network class, or
      meta-parameters of another structure or shapes (naming the network's fields that
      differ, and the first leaf).
  """
  run, folder = start.run, start.run.workdir
  if run.kind != problem.kind:
    raise ConfigError(
      f"init_from: {folder} is a {run.kind} run, and this problem is {problem.kind}: its "
      "meta-parameters do not fit; start from a run of this kind"
    )
  theirs = dict(run.record["model"])
  theirs["class"] = deprecations.current_path(theirs["class"])
  ours = models.module_spec(problem.model)
  if theirs["class"] != ours["class"]:
    raise ConfigError(
      f"init_from: {folder}'s network is {theirs['class']}, and this problem's is "
      f"{ours['class']}: its meta-parameters do not fit"
    )
  template = _template(problem, config)
  made = jax.tree_util.tree_flatten_with_path(template)[0]
  given = jax.tree_util.tree_flatten_with_path(run.meta_params)[0]
  differ = [
    (jax.tree_util.keystr(path), tuple(np.shape(leaf)), tuple(mine.shape))
    for (path, leaf), (path_here, mine) in zip(given, made)
    if path != path_here or tuple(np.shape(leaf)) != tuple(mine.shape)
  ]
  if len(given) != len(made) or differ:
    fields = _network_differences(run.record["model"], _jsonable(ours))
    where = (
      f"{differ[0][0]} is {list(differ[0][1])} there, {list(differ[0][2])} here"
      if differ
      else f"{len(given)} arrays there, {len(made)} here"
    )
    raise ConfigError(
      f"init_from: {folder}'s meta-parameters do not fit this network ({where}"
      + (f"; the network's {fields}" if fields else "")
      + "): build the same network, or start from a run of this one"
    )


def _jsonable(spec: dict) -> dict:
  fields = {k: list(v) if isinstance(v, tuple) else v for k, v in spec["fields"].items()}
  return dict(spec, fields=fields)


def _template(problem, config) -> PyTree:
  """The meta-parameters' shapes this problem's network and `config`'s algorithm make."""
  learner = algorithms.make_learner(
    problem.model, problem.kind, problem.noise_std, config, num_mc=1
  )
  key = jax.random.key(0)
  shape = (1,) + tuple(problem.input_shape)
  return jax.eval_shape(lambda: learner.init(models.init_params(problem.model, key, shape), key))


def initial_state(start: Start, learner, optimizer, template_state, mesh=None):
  """Step 0 with the source's meta-parameters (copies, in the template's dtypes, e.g. a float32
  run in a 64-bit process) and a fresh optimiser state; replicated over `mesh`, if any."""
  meta_params = jax.tree_util.tree_map(
    lambda given, made: jnp.asarray(given, made.dtype),
    start.run.meta_params,
    template_state.meta_params,
  )
  keep = learner._replace(init=lambda meta_params, key: meta_params)
  state = jax.jit(lambda p: meta_step.init_meta_state(keep, optimizer, p, jax.random.key(0)))(
    meta_params
  )
  return state if mesh is None else sharding.replicate(state, mesh)


def with_start(record: dict, workdir: Path, start: Optional[Start]) -> dict:
  """`record` (for `run.json`) with where the run started: the new start's, or (resuming) the
  one the folder recorded; unchanged for a run that started from its own initialisation."""
  if start is not None:
    return dict(record, **{RECORD_KEY: start.record})
  if run_folder.latest_checkpoint_step(workdir) is None:
    return record
  started = (run_folder.read_run_record(workdir) or {}).get(RECORD_KEY)
  return dict(record, **{RECORD_KEY: started}) if started else record
