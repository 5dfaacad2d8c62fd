"""What a config's part is made of: fields with their help and whether a resumed run may
change them (`setting`), a class that refuses an unknown name in one line (`Settings`),
and the checks of a field's value that name the field (`check_count`, ...).

The parts of `run_config` and the algorithms' `specs` are built of these.
"""

import dataclasses
import math
from typing import Any, Optional, Sequence

from vampire_jax._src.core.errors import ConfigError


def setting(
  default: Any, help: str, *, resumable: bool = False, choices: Optional[Sequence[Any]] = None
) -> Any:
  """A dataclass field with its help text.

  Args:
    default: the default value (tuples and frozen parts are immutable: no factory needed).
    help: one line, for the docs and a command line's help.
    resumable: whether a resumed run may use another value (schedule length, evaluation
      and speed settings).
    choices: the allowed values, if they are a fixed set.
  """
  return dataclasses.field(
    default=default,
    metadata={"help": help, "resumable": resumable, "choices": tuple(choices) if choices else None},
  )


class _RefusesUnknownNames(type):
  """Construction (and `dataclasses.replace`) refuses a keyword that names no field in one line,
  saying where the name belongs (`unknown_field`), rather than Python's TypeError."""

  def __call__(cls, *args, **kwargs):
    names = set(cls.field_names())
    for name in kwargs:
      if name not in names:
        raise ConfigError(cls.unknown_field(name), fields=(name,))
    return super().__call__(*args, **kwargs)


class Settings(metaclass=_RefusesUnknownNames):
  """What every part of a config shares: its fields by name, which of them a resumed run may
  change, and a one-line refusal of a field it does not have (`unknown_field`, overridden
  by `RunConfig` and the algorithm specs to say where the name belongs)."""

  @classmethod
  def field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))

  @classmethod
  def resumable_fields(cls) -> frozenset[str]:
    """The fields a resumed run may change."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("resumable"))

  @classmethod
  def unknown_field(cls, name: str) -> str:
    """Why `name` is no field of this class, in one line."""
    return f"{cls.__name__} has no field {name!r}; its fields: {', '.join(cls.field_names())}"


def part(cls):
  """A frozen dataclass: a part of a config."""
  return dataclasses.dataclass(frozen=True)(cls)


# -- Checks shared by the parts, the specs and the experiments ---------------------------


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_count(name: str, value, lowest: int) -> None:
  """ConfigError unless `value` is an integer >= `lowest` (a bool is no count)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
    raise ConfigError(f"{name} must be an integer >= {lowest}, got {value!r}", fields=(name,))


def check_rate(name: str, value, *, positive: bool) -> None:
  """ConfigError unless `value` is a finite number > 0 (`positive`) or >= 0."""
  if not is_number(value) or value < 0 or (positive and value == 0):
    need = "a finite number > 0" if positive else "a finite number >= 0"
    raise ConfigError(f"{name} must be {need}, got {value!r}", fields=(name,))


def check_bool(name: str, value) -> None:
  """ConfigError unless `value` is True or False (a string 'False' is true)."""
  if not isinstance(value, bool):
    raise ConfigError(
      f"{name} must be True or False, got {value!r} (a {type(value).__name__})", fields=(name,)
    )


def check_choices(settings) -> None:
  """ConfigError for a field with `choices` holding another value."""
  for f in dataclasses.fields(settings):
    choices = f.metadata.get("choices")
    if choices and getattr(settings, f.name) not in choices:
      raise ConfigError(
        f"{f.name} must be one of {', '.join(map(str, choices))}, "
        f"got {getattr(settings, f.name)!r}",
        fields=(f.name,),
      )


def field_help(cls) -> dict[str, str]:
  """`{field name: help text}` of a config dataclass or part."""
  return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
