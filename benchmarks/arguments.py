"""The benchmarks' checks of their command lines, before any work.

Each refuses in one line, as argparse does (the usage, then `PROG: error: MESSAGE`, exit
status 2), naming the flag, the value and what it takes: a count out of range, a name a
benchmark does not know, an optional dependency that is not installed. The standard library
only, so that a refusal costs no import of JAX.
"""

import argparse
import importlib.util
import sys
from typing import Callable, Sequence


def count(lowest: int, meaning: str = "") -> Callable[[str], int]:
  """An argparse `type`: an integer >= `lowest` (`meaning`: what a value means, e.g. 0)."""

  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      value = None
    if value is None or value < lowest:
      raise argparse.ArgumentTypeError(f"must be an integer >= {lowest}{meaning}, got {text!r}")
    return value

  return parse


def counts(lowest: int) -> Callable[[str], list[int]]:
  """An argparse `type`: a comma list of integers, each >= `lowest`."""

  def parse(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
      values = [int(item) for item in items]
    except ValueError:
      values = []
    if not values or min(values) < lowest:
      raise argparse.ArgumentTypeError(
        f"must be a comma list of integers >= {lowest}, got {text!r}"
      )
    return values

  return parse


def names(parser: argparse.ArgumentParser, flag: str, text: str, known: Sequence[str]) -> list[str]:
  """The comma list `text` of `flag`, each one of `known`; `parser.error` otherwise."""
  chosen = [name.strip() for name in text.split(",") if name.strip()]
  unknown = [name for name in chosen if name not in known]
  if unknown or not chosen:
    given = ", ".join(repr(name) for name in unknown) if unknown else f"{text!r} (no names)"
    parser.error(f"{flag}: unknown {given}; choose from {', '.join(known)}")
  return chosen


def missing_modules(*modules: str) -> list[str]:
  """Those of `modules` (top-level names) that this Python cannot import."""
  return [name for name in modules if importlib.util.find_spec(name) is None]


def needs_modules(parser: argparse.ArgumentParser, what: str, *modules: str) -> None:
  """Refuses (`parser.error`) when any of `modules`, which `what` needs, is not installed."""
  missing = missing_modules(*modules)
  if missing:
    parser.error(
      f"{what} needs {' and '.join(missing)}, not installed in this Python ({sys.executable}): "
      f"pip install {' '.join(missing)}, or run it with a Python that has "
      f"{'them' if len(missing) > 1 else 'it'}"
    )
