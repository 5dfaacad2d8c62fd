"""Old import paths, kept for one release: each warns once (a `FutureWarning`), then works.

Issue 43 moved the implementation under `vampire_jax._src/` (core, metrics, runs) and
kept about 90 names at the top level. `vampire_jax.<old module>` and the names that left
the top level stay importable through these tables until `REMOVED_IN`. Run records of
earlier versions name classes by their old paths (`vampire_jax.models.MLP`,
`vampire_jax.configs.OmniglotConfig`); `current_path` maps those silently, for good: a
run folder stays readable whatever the release. This module imports nothing of the
library, so every layer may use it.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

REMOVED_IN = "0.4.0"

# vampire_jax.<old module> -> where it lives now. (`vampire_jax.predictive` is the function;
# its module's old path is served by a stand-in, `SHADOWED_MODULES`.)
MOVED_MODULES = {
  "adaptation": "vampire_jax._src.core.adaptation",
  "adapters": "vampire_jax._src.core.framework_adapters",
  "algorithms": "vampire_jax.runs.algorithms",
  "backend_defaults": "vampire_jax._src.core.backend_defaults",
  "batching": "vampire_jax._src.core.batching",
  "calibration": "vampire_jax._src.metrics.calibration",
  "checkpoint": "vampire_jax.runs.run_folder",
  "checks": "vampire_jax._src.core.input_checks",
  "config": "vampire_jax.runs.run_config",
  "configs": "vampire_jax.runs.experiment_configs",
  "convolution": "vampire_jax._src.core.convolution",
  "diagnostics": "vampire_jax._src.core.diagnostics",
  "errors": "vampire_jax._src.core.errors",
  "evaluation": "vampire_jax._src.metrics.evaluation",
  "gaussian": "vampire_jax._src.core.gaussian",
  "interrupts": "vampire_jax.runs.interrupts",
  "kinds": "vampire_jax.runs.kinds",
  "learners": "vampire_jax._src.core.learners",
  "losses": "vampire_jax._src.core.losses",
  "meta_step": "vampire_jax._src.core.meta_step",
  "models": "vampire_jax._src.core.models",
  "predictive_uncertainty": "vampire_jax._src.metrics.predictive_uncertainty",
  "problem": "vampire_jax.runs.problem",
  "programs": "vampire_jax.runs.programs",
  "reporting": "vampire_jax.runs.reporting",
  "run_folder": "vampire_jax.runs.run_folder",
  "sharding": "vampire_jax._src.core.sharding",
  "tasks": "vampire_jax._src.core.tasks",
  "training": "vampire_jax.runs.loop",
}

# vampire_jax.<name> that left the top level -> the module that holds it.
MOVED_NAMES = {
  "BATCHING_STRATEGIES": "vampire_jax._src.core.batching",
  "MAPPED_STRATEGIES": "vampire_jax._src.core.batching",
  "batched_map": "vampire_jax._src.core.batching",
  "default_task_batching": "vampire_jax._src.core.batching",
  "check_gaussian": "vampire_jax._src.core.gaussian",
  "apply_meta_gradient": "vampire_jax._src.core.meta_step",
  "log_std_mask": "vampire_jax._src.core.meta_optimizer",
  "make_host_chunked_meta_step": "vampire_jax._src.core.host_chunked",
  "make_host_chunked_train_step": "vampire_jax._src.core.host_chunked",
  "mixture_cdf": "vampire_jax._src.metrics.quantile_calibration",
  "mixture_quantile": "vampire_jax._src.metrics.quantile_calibration",
  "evaluate_split": "vampire_jax._src.metrics.evaluation",
  "make_split_evaluator": "vampire_jax._src.metrics.evaluation",
  "RunCheckpoints": "vampire_jax.runs.run_folder",
}

# Names that left a module an old path still reaches: module -> {name: the module that holds
# it now}. The module serves them through `__getattr__ = deprecations.module_getattr(__name__)`.
MOVED_OUT_OF_MODULES = {
  "vampire_jax._src.core.meta_step": {
    "make_host_chunked_meta_step": "vampire_jax._src.core.host_chunked",
    "make_host_chunked_train_step": "vampire_jax._src.core.host_chunked",
  },
  "vampire_jax._src.metrics.calibration": {
    "PAPER_QUANTILE_LEVELS": "vampire_jax._src.metrics.quantile_calibration",
    "normal_cdf": "vampire_jax._src.metrics.normal_cdf",
  },
  "vampire_jax.data.mini_imagenet": {"mini_imagenet_builder_class": "vampire_jax.data"},
}

# Old module paths whose name the top level now gives to a function: `vampire_jax.predictive`
# is `vj.predictive`, and was also its module's path. An import of a module path sets the
# parent's attribute, which would shadow the function, so `install` puts a stand-in for the
# module in `sys.modules`: `from vampire_jax.predictive import predictive_interval` works
# (with a warning) and `vj.predictive` stays the function.
SHADOWED_MODULES = {"predictive": "vampire_jax._src.metrics.predictive"}

_warned: set[str] = set()


def current_path(dotted: str) -> str:
  """Where a dotted name that an earlier version recorded lives now, e.g.
  `vampire_jax.models.MLP` -> `vampire_jax._src.core.models.MLP`. Silent; any other
  name is returned as it is."""
  package, _, rest = dotted.partition(".")
  module, _, tail = rest.partition(".")
  if package != "vampire_jax" or module not in MOVED_MODULES:
    return dotted
  return MOVED_MODULES[module] + (f".{tail}" if tail else "")


def warn_once(old: str, new: str, stacklevel: int = 3) -> None:
  """One FutureWarning per old path and process (shown by Python's default filters)."""
  if old in _warned:
    return
  _warned.add(old)
  warnings.warn(
    f"{old} is deprecated: use {new} (the old path works until vampire_jax {REMOVED_IN})",
    FutureWarning,
    stacklevel=stacklevel,
  )


def moved_attribute(name: str):
  """`vampire_jax.<name>` for a moved module or name (module `__getattr__`)."""
  if name in MOVED_MODULES:
    warn_once(f"vampire_jax.{name}", _public_home(name), stacklevel=4)
    return importlib.import_module(MOVED_MODULES[name])
  if name in MOVED_NAMES:
    warn_once(f"vampire_jax.{name}", f"{MOVED_NAMES[name]}.{name}", stacklevel=4)
    return getattr(importlib.import_module(MOVED_NAMES[name]), name)
  raise AttributeError(f"module 'vampire_jax' has no attribute {name!r}")


def _old_path(module_name: str) -> str:
  """How users named a module: `vampire_jax._src.core.meta_step` -> `vampire_jax.meta_step`."""
  for old, new in MOVED_MODULES.items():
    if new == module_name:
      return f"vampire_jax.{old}"
  return module_name


def module_getattr(module_name: str):
  """The `__getattr__` of a module whose names in `MOVED_OUT_OF_MODULES` moved away:
  each warns once and is served from its new module; any other name is an AttributeError."""
  moved = MOVED_OUT_OF_MODULES[module_name]

  def __getattr__(name: str):
    if name not in moved:
      raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    warn_once(f"{_old_path(module_name)}.{name}", f"{moved[name]}.{name}", stacklevel=3)
    return getattr(importlib.import_module(moved[name]), name)

  return __getattr__


class _ShadowedModule(types.ModuleType):
  """A stand-in for the old module path `vampire_jax.<name>` (`SHADOWED_MODULES`): each
  public name of the module it stands for, with a warning naming the top-level name."""

  def __init__(self, old: str, home: str):
    super().__init__(f"vampire_jax.{old}")
    self.__spec__ = importlib.machinery.ModuleSpec(self.__name__, None)
    self._home = home

  def __getattr__(self, name: str):
    module = None if name.startswith("_") else importlib.import_module(self._home)
    if module is None or not hasattr(module, name):
      raise AttributeError(
        f"module {self.__name__!r} (an old path of {self._home}) has no attribute {name!r}"
      )
    public = importlib.import_module("vampire_jax")
    top = getattr(public, "__all__", ())
    new = f"vampire_jax.{name}" if name in top else f"{self._home}.{name}"
    warn_once(f"{self.__name__}.{name}", new, stacklevel=3)
    return getattr(module, name)


def _public_home(old_module: str) -> str:
  return f"the names `vampire_jax` exports (implementation: {MOVED_MODULES[old_module]})"


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """`import vampire_jax.<old>` and `from vampire_jax.<old> import x`: the module now."""

  def __init__(self):
    self._real_specs = {}

  def find_spec(self, fullname, path=None, target=None):
    package, _, name = fullname.partition(".")
    if package != "vampire_jax" or name not in MOVED_MODULES:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    name = spec.name.partition(".")[2]
    warn_once(spec.name, _public_home(name), stacklevel=3)
    module = importlib.import_module(MOVED_MODULES[name])
    self._real_specs[spec.name] = module.__spec__
    return module

  def exec_module(self, module):
    # The import system set the alias's spec on the real module; give it back its own.
    module.__spec__ = self._real_specs.pop(module.__spec__.name)


def install() -> None:
  if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
  for old, home in SHADOWED_MODULES.items():
    sys.modules.setdefault(f"vampire_jax.{old}", _ShadowedModule(old, home))
