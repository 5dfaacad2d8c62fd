"""The paper's experiments: `python -m experiments.<name>`.

Importing this package checks the environment's device-count settings before
anything imports JAX: JAX reads them once, when it starts, and answers a bad
value with a traceback (or XLA with its whole flag list).
"""

import os
import re
import sys


def _device_count_problem() -> str:
  """What is wrong with JAX_NUM_CPU_DEVICES or XLA_FLAGS' device count ('' if nothing)."""
  value = os.environ.get("JAX_NUM_CPU_DEVICES")
  if value is not None and not re.fullmatch(r"\s*[1-9][0-9]*\s*", value):
    return (
      f"JAX_NUM_CPU_DEVICES={value!r} must be a whole number >= 1 (XLA:CPU devices); "
      "unset it for one device per core"
    )
  for flag_value in re.findall(
    r"--xla_force_host_platform_device_count(?:=(\S*))?", os.environ.get("XLA_FLAGS", "")
  ):
    if not re.fullmatch(r"[1-9][0-9]*", flag_value):
      return (
        f"XLA_FLAGS has --xla_force_host_platform_device_count={flag_value}; it must be a "
        "whole number >= 1 (XLA:CPU devices); remove it for one device per core"
      )
  return ""


if _device_count_problem():
  print(f"error: {_device_count_problem()}", file=sys.stderr)
  raise SystemExit(2)
