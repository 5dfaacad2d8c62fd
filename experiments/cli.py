"""The experiments' command line: a flag per config field, with its help and the preset's default.

    config, args = cli.parse(argv, description, OmniglotConfig, PRESETS, get_config)

`--preset` and `--algorithm` are read first; every other flag's default
(shown by `--help`) is then the chosen preset's value for that algorithm.
`apply_overrides(config, {"num_meta_steps": 300})` does the same from a
notebook. `main_entry(main)` runs a command: it quiets TensorFlow, turns on
the persistent compilation cache, and turns a user error into one line and
exit code 2 (a traceback is kept for real bugs).
"""

import argparse
import dataclasses
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import vampire_jax as vj
from vampire_jax import backend
from vampire_jax import ConfigError, UserError
from vampire_jax.runs import interrupts
from vampire_jax.runs.config_records import OLD_NAMES

ZOO = Path(__file__).resolve().parents[1] / "zoo"  # the clone's trained runs, by cell name

# `--help`'s groups, in order, and the config fields each shows (the fields of the config,
# its parts and every algorithm's spec, by name). A new field goes in one of them
# (tests/experiment_scripts/test_cli.py checks that every field has one).
GROUPS = {
  "run": (
    "num_meta_steps",
    "tasks_per_step",
    "meta_lr",
    "meta_lr_decay",
    "meta_grad_clip_norm",
    "meta_grad_clip_separately",
    "log_std_weight_decay",
    "checkpoint_every",
    "log_every",
    "seed",
    "debug_nans",
  ),
  "algorithm": (
    "num_inner_steps",
    "inner_lr",
    "kl_weight",
    "num_mc_train",
    "num_mc_query",
    "first_order",
    "second_order_steps",
    "backtracking",
    "log_std_init",
    "kernel_init_gain",
    "local_reparameterization",
    "num_particles",
    "meta_objective",
    "num_leader_steps",
    "inference_data",
    "step_size_init",
    "hyper_prior_weight",
    "mean_prior_std",
    "precision_prior",
    "phi_lr",
    "phi_inner_lr",
    "epsilon",
    "num_kl_samples",
    "outer_kl_weight",
    "distance",
  ),
  "task": (
    "ways",
    "num_classes",
    "train_num_classes",
    "shots",
    "query",
    "test_query",
    "num_support",
    "num_query",
    "noise_std",
    "likelihood_std",
    "data_noise_std",
    "class_sampling",
    "num_filters",
    "hidden_sizes",
    "batch_norm_affine",
    "batch_norm_epsilon",
    "conv_padding",
  ),
  "data": (
    "dataset",
    "crop",
    "l2_normalize",
    "split",
    "split_seed",
    "num_val_alphabets",
    "num_val_characters",
    "image_size",
    "data_dir",
    "data_source",
    "source",
    "cache_dir",
    "existing_only",
  ),
  "speed": (
    "task_batching",
    "chunk_size",
    "eval_task_batching",
    "eval_chunk_size",
    "eval_batch_tasks",
    "steps_per_call",
    "unroll_inner_steps",
    "sample_batching",
    "conv_impl",
    "cpu_fusion_emitters",
    "shard_tasks",
    "remat",
    "compute_dtype",
  ),
  "evaluation": (
    "num_mc_test",
    "num_val_tasks",
    "num_test_tasks",
    "eval_every",
    "num_bins",
    "test_parameters",
    "num_plot_tasks",
    "test_query_grid",
    "num_open_set_classes",
  ),
}
_GROUP_TITLES = {
  "run": "run: the folder, the schedule, the meta-optimiser",
  "algorithm": "algorithm: adaptation and the algorithm's own options",
  "task": "task: the tasks and the network",
  "data": "data: where the data set is read from, and its split",
  "speed": "speed: none of these changes a result beyond float rounding",
  "evaluation": "evaluation: validation, test and calibration",
}
_GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}

# The flags of the algorithms' options whose field names are too short to stand alone on a
# command line: the algorithm's name before them (`--simpa-epsilon` sets Simpa's `epsilon`).
FLAG_NAMES = {field: old for old, field in OLD_NAMES.items()}


def flag(name: str) -> str:
  """The command line's flag of a config field: `tasks_per_step` -> `--tasks-per-step`."""
  return "--" + FLAG_NAMES.get(name, name).replace("_", "-")


_flag = flag


def as_flags(error: UserError) -> UserError:
  """The library's refusal, naming its fields, said in this command line's flags."""
  message = str(error)
  for name in sorted(getattr(error, "fields", ()), key=len, reverse=True):
    # A field's name as a word: not in a possessive ("another algorithm's": prose), nor
    # inside a path ("runs/workdir/...").
    message = re.sub(rf"(?<![\w./-]){re.escape(name)}(?![\w/]|'s)", flag(name), message)
  translated = type(error)(message)
  translated.fields = ()
  return translated


def _field_type(field: dataclasses.Field):
  """The Python type behind a field's annotation (Optional[X] -> X)."""
  hint = field.type
  if isinstance(hint, str):
    hint = eval(hint, vars(typing))  # annotations are strings only in unusual modules
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is Union and len(args) == 1:
    return args[0]
  return hint


def _help(help_text: str, value) -> str:
  """The help text with the default, unless the text already says what the default means."""
  if "default:" in help_text or (value is None and "none:" in help_text.lower()):
    return help_text
  return f"{help_text} (default: {value!r})" if help_text else f"(default: {value!r})"


def _groups(parser: argparse.ArgumentParser) -> dict:
  """`--help`'s argument groups of `parser`, by name (made once)."""
  groups = getattr(parser, "_vampire_jax_groups", None)
  if groups is None:
    groups = {name: parser.add_argument_group(_GROUP_TITLES[name]) for name in GROUPS}
    parser._vampire_jax_groups = groups
  return groups


def config_fields(config) -> dict[str, tuple[dataclasses.Field, Any, str]]:
  """`{name: (field, current value, note)}` over the config's own fields, its parts' and every
  registered algorithm's options (the config's algorithm's first). The note says which
  algorithms take an option that the config's algorithm does not."""
  fields = {}
  for f in dataclasses.fields(config):
    if f.name == "algorithm":
      continue
    value = getattr(config, f.name)
    if dataclasses.is_dataclass(value):  # a part
      for g in dataclasses.fields(value):
        fields[g.name] = (g, getattr(value, g.name), "")
    else:
      fields[f.name] = (f, value, "")
  spec = config.algorithm
  for g in dataclasses.fields(spec):
    fields.setdefault(g.name, (g, getattr(spec, g.name), ""))
  for name, cls in vj.specs.SPECS.items():
    for g in dataclasses.fields(cls):
      if g.name not in fields:
        owners = [c.name for c in vj.specs.SPECS.values() if g.name in c.field_names()]
        fields[g.name] = (g, g.default, f"an option of {', '.join(owners)}")
  return fields


def add_config_flags(parser: argparse.ArgumentParser, config) -> None:
  """Adds a flag (`flag(name)`) for each field of `config`, of its parts and of every
  algorithm's spec, with its help and current value as default.

  The flags go in `--help`'s groups (`GROUPS`); a field in none of them goes in "run".
  """
  groups = _groups(parser)
  for name, (field, value, note) in config_fields(config).items():
    kind = _field_type(field)
    help_text = field.metadata.get("help", "")
    choices = field.metadata.get("choices")
    shown = f"{help_text} ({note})" if note else _help(help_text, value)
    group = groups[_GROUP_OF.get(name, "run")]
    options = dict(dest=name, default=None, help=shown.replace("%", "%%"))
    if typing.get_origin(kind) is tuple:
      item = typing.get_args(kind)[0]
      group.add_argument(
        flag(name),
        type=item,
        nargs=len(typing.get_args(kind)),
        metavar=item.__name__.upper(),
        **options,
      )
    elif kind is bool:
      group.add_argument(flag(name), action=argparse.BooleanOptionalAction, **options)
    elif kind is Any or kind is None:
      continue
    else:
      group.add_argument(
        flag(name),
        type=kind,
        choices=choices,
        metavar=None if choices else kind.__name__.upper(),
        **options,
      )


def apply_overrides(config, overrides: Union[argparse.Namespace, dict], *, print_fn=None):
  """`config` with the given fields replaced (`RunConfig.replace`).

  Args:
    config: a RunConfig (subclass) instance.
    overrides: parsed flags (fields left at None are kept) or a dict such as
      `{"num_meta_steps": 300}` (from a notebook or script).
    print_fn: with parsed flags, where a note goes for an option of another algorithm than
      the config's, which is not applied (a comparison passes its flags to every method);
      default: standard error.

  Raises:
    ConfigError: a dict names a field the config, its parts and its algorithm do not have.
  """
  names = config_fields(config)
  if isinstance(overrides, dict):
    # An option by its flag's name too (`inner_backtracking` for `backtracking`).
    overrides = {OLD_NAMES.get(name, name): value for name, value in overrides.items()}
    unknown = sorted(set(overrides) - set(names))
    if unknown:
      raise ConfigError(
        f"unknown {type(config).__name__} fields {unknown}: no part of it, nor any "
        "algorithm's spec, has them"
      )
    values = dict(overrides)
  else:
    values = {
      name: getattr(overrides, name) for name in names if getattr(overrides, name, None) is not None
    }
  spec = config.algorithm
  for name in list(values):
    if names[name][2]:  # another algorithm's option
      (print_fn or _stderr)(
        f"note: --algorithm {spec.name} ignores {flag(name)} {values.pop(name)!r} "
        f"({names[name][2]}); not applied"
      )
  if values.get("meta_grad_clip_norm") == 0:
    values["meta_grad_clip_norm"] = None
  for name, value in values.items():
    if isinstance(value, list):
      values[name] = tuple(value)
  try:
    return config.replace(**values)
  except ConfigError as error:
    if isinstance(overrides, dict):
      raise
    raise as_flags(error) from None


def parse(
  argv: Optional[Sequence[str]],
  description: str,
  presets: Sequence[str],
  get_config: Callable,
  *,
  default_preset: Optional[str] = None,
  algorithm_flag: bool = True,
  add_flags: Optional[Callable[[argparse.ArgumentParser], None]] = None,
):
  """Parses an experiment's command line.

  Args:
    argv: the arguments (None: `sys.argv[1:]`).
    description: the `--help` text.
    presets: the experiment's presets; `get_config(preset, algorithm)` builds one.
    default_preset: the preset without `--preset` (default: the first).
    algorithm_flag: offer `--algorithm` (one method per run).
    add_flags: adds the experiment's own flags.

  Returns:
    `(config, args)`: the preset's config with the given flags applied, and
    the parsed flags (`args.workdir`, `args.no_progress`, ...). An option of
    another algorithm than the one run is said in a line and not applied
    (`apply_overrides`).
  """
  default_preset = default_preset or presets[0]
  first = argparse.ArgumentParser(add_help=False)
  first.add_argument("--preset", default=default_preset, choices=list(presets))
  if algorithm_flag:
    first.add_argument("--algorithm", default="vampire", choices=list(vj.specs.SPECS))
  known, _ = first.parse_known_args(argv)
  config = get_config(known.preset, getattr(known, "algorithm", "vampire"))

  usage = (
    "%(prog)s [-h] [--preset PRESET]"
    + (" [--algorithm ALGORITHM]" if algorithm_flag else "")
    + " [--workdir WORKDIR] [--FLAG ...]"
  )
  parser = argparse.ArgumentParser(
    description=description, usage=usage, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  groups = _groups(parser)
  groups["run"].add_argument(
    "--preset",
    default=default_preset,
    choices=list(presets),
    help=f"settings to start from (default: {default_preset}); the "
    "other flags' defaults below are this preset's",
  )
  groups["run"].add_argument(
    "--workdir",
    type=Path,
    default=None,
    help="run folder (checkpoints, logs, results); run again to resume",
  )
  groups["run"].add_argument(
    "--init-from",
    default=None,
    metavar="RUN_DIR_OR_CELL",
    help="start a new run from a trained run's meta-parameters: its folder, or a cell of "
    "zoo/ by name (step 0 of this run's schedule, a fresh optimiser state; run.json records "
    "it; a comparison's folder gives each method its own)",
  )
  groups["run"].add_argument("--no-progress", action="store_true", help="print no progress")
  groups["run"].add_argument(
    "--no-compilation-cache",
    action="store_true",
    help="compile afresh instead of reusing compiled steps from the cache",
  )
  if algorithm_flag:
    groups["algorithm"].add_argument(
      "--algorithm",
      default="vampire",
      choices=list(vj.specs.SPECS),
      help="meta-learning algorithm (default: vampire)",
    )
  if add_flags is not None:
    add_flags(parser)
  add_config_flags(parser, config)
  args = parser.parse_args(argv)
  args.init_from = init_from_folder(args.init_from)
  config = apply_overrides(config, args)
  return config, args


def count_at_least(minimum: int, why: str, of: str = ""):
  """An argparse type: an integer of at least `minimum`, refused in one line saying `why`.

  e.g. `count_at_least(2, "SImPa's KL estimate needs two draws")` refuses "1" with "a count
  of at least 2 (SImPa's KL estimate needs two draws), not '1'"; `of` names what is counted
  (" of test tasks").
  """

  def parse(text: str) -> int:
    try:
      count = int(text)
    except ValueError:
      count = minimum - 1
    if count < minimum:
      raise argparse.ArgumentTypeError(f"a count{of} of at least {minimum} ({why}), not {text!r}")
    return count

  return parse


def init_from_folder(text: Optional[str]) -> Optional[Path]:
  """`--init-from`: a run folder (or a comparison's), else a cell of `zoo/` by name (None: none).

  Raises:
    ConfigError: neither, naming the zoo's cells.
  """
  if text is None:
    return None
  if Path(text).is_dir():
    return Path(text)
  if Path(text).name == text and (ZOO / text).is_dir():
    return ZOO / text
  cells = sorted(p.name for p in ZOO.iterdir() if p.is_dir()) if ZOO.is_dir() else []
  raise ConfigError(
    f"--init-from {text}: no such run folder, nor a cell of {ZOO}"
    + (f" (its cells: {', '.join(cells)})" if cells else "")
  )


def _stderr(message: str) -> None:
  print(message, file=sys.stderr)


def compilation_cache_dir() -> Path:
  """`xla/` in the data cache's folder (`vj.data.default_cache_dir()`): `$VAMPIRE_JAX_CACHE/xla`,
  else `$XDG_CACHE_HOME/vampire_jax/xla`, else `~/.cache/vampire_jax/xla`."""
  from vampire_jax.data import default_cache_dir

  return default_cache_dir() / "xla"


def enable_compilation_cache_or_say_why_not() -> None:
  """The compilation cache on, or, where its folder cannot be written, one line and off.

  The cache only saves compile time: a read-only or impossible folder is no
  reason to refuse a run.
  """
  import os

  folder = compilation_cache_dir()
  try:
    backend.enable_compilation_cache(folder)
    writable = os.access(folder, os.W_OK | os.X_OK)
    reason = "not writable"
  except OSError as error:
    writable, reason = False, error.strerror or type(error).__name__
  if not writable:
    import jax

    jax.config.update("jax_compilation_cache_dir", None)
    print(
      f"note: compiling without the compilation cache ({folder}: {reason}); set "
      "VAMPIRE_JAX_CACHE to a writable folder, or pass --no-compilation-cache",
      file=sys.stderr,
    )


def main_entry(
  main: Callable[[Optional[Sequence[str]]], object], argv: Optional[Sequence[str]] = None
) -> int:
  """Runs `main(argv)` as a command; returns the exit code.

  XLA gets one CPU device per core (`vj.use_all_cpu_cores`; a device count
  set in `JAX_NUM_CPU_DEVICES` or `XLA_FLAGS` wins). TensorFlow and absl stay
  quiet; the compilation cache is on unless `--no-compilation-cache`. How a
  stop or a fault ends is `vampire_jax.runs.interrupts.run_command`'s: a
  `UserError` (bad flag, missing or corrupt data, a resumed run of another
  config, a run folder in use, full or read-only) prints `error: ...` and
  returns 2, as does any other error of the file system (a full disk while
  drawing a figure); a stopped run (Ctrl-C,
  SIGTERM, in any phase) says how to resume in one line and returns 128 +
  the signal's number; divergence prints its message and returns 1.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core (JAX_NUM_CPU_DEVICES=1: one)

  def run() -> None:
    if "--no-compilation-cache" not in argv:
      enable_compilation_cache_or_say_why_not()
    try:
      main(argv)
    except UserError as error:  # the library names fields: say them as flags
      if not getattr(error, "fields", ()):
        raise
      raise as_flags(error) from None

  return interrupts.run_command(run)
