"""Command-line flags shared by every experiment: one flag per config field.

`add_config_flags(parser, config_cls)` adds `--field-name` for each field of
a `RunConfig` dataclass (subclass); `apply_overrides(config, args)` returns
the config with the flags that were given. So `--kl-weight 0.05` or
`--tasks-per-step 4` work the same in every experiment.
"""

import argparse
import dataclasses
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

# Fields whose flags take a fixed set of values.
CHOICES = {
    "algorithm": ["vampire", "maml", "fomaml", "platipus", "bmaml", "abml"],
    "split": ["original", "random"],
}

# Algorithms with a KL-weighted Gaussian over the weights; the others have no KL term.
VARIATIONAL = ("vampire", "platipus", "abml")


def set_algorithm(config, algorithm: str) -> bool:
  """Sets `config.algorithm`, with KL weight 0 for MAML, FOMAML and BMAML.

  Returns whether the algorithm has a KL term. Raises ValueError for an
  unknown algorithm.
  """
  if algorithm not in CHOICES["algorithm"]:
    raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {CHOICES['algorithm']}")
  config.algorithm = algorithm
  if algorithm not in VARIATIONAL:
    config.kl_weight = 0.0
  return algorithm in VARIATIONAL


def add_config_flags(parser: argparse.ArgumentParser, config_cls,
                     choices: Optional[dict[str, Sequence[str]]] = None) -> None:
  """Adds `--field-name` (default None: keep the preset's value) per field."""
  choices = {**CHOICES, **(choices or {})}
  for field in dataclasses.fields(config_cls):
    flag = "--" + field.name.replace("_", "-")
    default = field.default
    if isinstance(default, tuple):
      parser.add_argument(flag, type=type(default[0]), nargs=len(default), default=None)
    elif field.type in (bool, "bool") or "bool" in str(field.type):
      parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
    elif default is None:  # Optional[str] paths, or Optional[float] (0 disables)
      kind = float if "float" in str(field.type) else str
      parser.add_argument(flag, type=kind, default=None,
                          help="0 disables" if kind is float else None)
    else:
      parser.add_argument(flag, type=type(default), default=None, choices=choices.get(field.name))


def apply_overrides(config, overrides: Union[argparse.Namespace, dict]):
  """`config` with the given fields replaced.

  Args:
    config: a RunConfig (subclass) instance.
    overrides: parsed flags (fields left at None are kept) or a dict such as
      `{"num_meta_steps": 300}` (from a notebook or script).

  Raises:
    ValueError: if a dict names a field the config does not have.
  """
  names = {f.name for f in dataclasses.fields(config)}
  if isinstance(overrides, dict):
    unknown = set(overrides) - names
    if unknown:
      raise ValueError(f"unknown {type(config).__name__} fields {sorted(unknown)}")
    overrides = argparse.Namespace(**overrides)
  overrides = {name: getattr(overrides, name) for name in names
               if getattr(overrides, name, None) is not None}
  if overrides.get("meta_grad_clip_norm") == 0:
    overrides["meta_grad_clip_norm"] = None
  for name, value in overrides.items():
    if isinstance(value, list):
      overrides[name] = tuple(value)
  return dataclasses.replace(config, **overrides)


def parse_experiment_args(argv, description: str, config_cls, presets: Sequence[str],
                          get_config: Callable, default_workdir: Callable, *,
                          add_flags: Optional[Callable] = None,
                          choices: Optional[dict[str, Sequence[str]]] = None):
  """The episodic experiments' command line.

  `--preset` (the first of `presets` by default), `--workdir`, `--no-progress`,
  the flags `add_flags(parser)` adds, and a flag per config field.

  Returns:
    `(config, workdir, progress, args)`: the preset's config for the chosen
    algorithm with the given flags applied, the run folder, and the parsed
    flags.
  """
  parser = argparse.ArgumentParser(description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default=presets[0], choices=list(presets))
  parser.add_argument("--workdir", type=Path, default=None,
                      help="run folder (checkpoints, logs, results); rerun to resume")
  parser.add_argument("--no-progress", action="store_true")
  if add_flags is not None:
    add_flags(parser)
  # Every config field can be overridden: --ways 20 --kl-weight 0.05 ...
  add_config_flags(parser, config_cls, choices=choices)
  args = parser.parse_args(argv)
  config = apply_overrides(get_config(args.preset, args.algorithm or "vampire"), args)
  workdir = args.workdir or default_workdir(config, args.preset)
  return config, workdir, not args.no_progress, args
