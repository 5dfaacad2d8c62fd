"""What rebuilds a trained run from its record (`run.json`): the config dataclass, the
network (its recorded class, or one given to `load_run`), the test learner, a template of the
checkpointed state, and the precision (`JAX_ENABLE_X64`) the run computed in."""

import dataclasses
import functools
import importlib
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import flax.linen as nn
import jax

from vampire_jax._src.core import meta_step, models
from vampire_jax._src.core.errors import InputError, RunFolderError
from vampire_jax._src.core.learners import MetaLearner
from vampire_jax.runs import algorithms, config_records, run_folder, specs
from vampire_jax.runs import experiment_configs as configs
from vampire_jax.runs.run_config import RunConfig

PyTree = Any

# Every registered spec's fields: in a flat old record, none of them is the config's own.
_SPECS_FIELDS = frozenset(name for cls in specs.SPECS.values() for name in cls.field_names()) | (
  frozenset(config_records.OLD_NAMES)
)


def config_from_record(record: dict, *, algorithm: Optional[type] = None, quiet: bool = False):
  """The run's config as the dataclass it was trained with (`config_records.from_record`).

  The class is imported by the name recorded. The experiments' configs live
  in `vampire_jax.runs.experiment_configs`; run folders written before they moved there name
  `experiments.configs.<Class>`, which maps to the library's class of that
  name (`configs.recorded_class_name`), so neither imports the experiments.
  If the import fails (the code that trained the run is not installed), a
  stand-in dataclass derived from `RunConfig` with the recorded fields is
  returned, with a warning (none if `quiet`).

  Args:
    record: the run's `run.json`, as a dict.
    algorithm: the spec class, where the recorded one does not import here.
    quiet: no warning for a stand-in.

  Returns:
    An instance of the recorded config class (or of the stand-in).
  """
  recorded = record["config"]
  class_path = configs.recorded_class_name(record["config_class"])
  module_name, _, class_name = class_path.rpartition(".")
  try:
    cls = getattr(importlib.import_module(module_name), class_name)
  except (ImportError, AttributeError) as error:
    if not quiet:
      warnings.warn(
        f"cannot import the run's config class {record['config_class']} ({error}); "
        "using a stand-in dataclass with the same fields"
      )
    known = set(RunConfig.field_names())
    own = config_records.flat(recorded) if config_records.is_old_format(recorded) else recorded
    own = {name: config_records.tuples(value) for name, value in own.items()}
    extra = [
      (name, type(value), dataclasses.field(default=value))
      for name, value in own.items()
      if name not in known and name not in config_records.PART_FIELDS and name not in _SPECS_FIELDS
    ]
    cls = dataclasses.make_dataclass(class_name, extra, bases=(RunConfig,))
  return config_records.from_record(recorded, cls, algorithm=algorithm)


def x64_context(on: bool):
  """A context in which JAX computes in 64 bits if `on`, else in 32 (`jax.enable_x64`)."""
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(on)
  from jax import experimental  # JAX before 0.6: the same context under another name

  return experimental.enable_x64() if on else experimental.disable_x64()


def network_from_record(spec: dict, model, workdir: Path) -> nn.Module:
  """The run's network: its recorded class (imported, or `model`) with its recorded fields."""
  recorded = spec["class"]
  class_name = recorded.rpartition(".")[2]
  if model is None:
    try:
      return models.module_from_spec(spec)
    except (ImportError, AttributeError) as error:
      if recorded.startswith("__main__."):
        where = "it was defined in the script that trained the run (__main__)"
      else:
        where = f"{type(error).__name__}: {error}"
      raise RunFolderError(
        f"load_run: the run's network class {recorded} cannot be imported here ({where}); "
        f"pass the class: vj.load_run({str(workdir)!r}, model={class_name}), or a module "
        "that defines it"
      ) from None
  if isinstance(model, ModuleType):
    cls = getattr(model, class_name, None)
    if not isinstance(cls, type):
      raise InputError(
        f"load_run: model is the module {model.__name__}, which defines no class {class_name} "
        f"(the run's network, {recorded}); pass the module that defines it, or the class"
      )
  elif isinstance(model, type) and issubclass(model, nn.Module):
    cls = model
  elif isinstance(model, nn.Module):
    raise InputError(
      f"load_run: model is an instance of {type(model).__name__}; pass the class itself "
      f"(model={type(model).__name__}): it is built with the run's recorded fields"
    )
  else:
    raise InputError(
      f"load_run: model is {repr(model)[:80]}; pass the run's network class (a "
      f"flax.linen.Module subclass: {class_name}) or a module that defines it"
    )
  try:
    return models.module_from_spec(spec, cls)
  except TypeError as error:
    raise InputError(
      f"load_run: model={cls.__name__} does not take the run's recorded fields "
      f"{sorted(spec['fields'])} ({error}); pass the class the run was trained with ({recorded})"
    ) from None


def test_learner(network: nn.Module, record: dict, config) -> MetaLearner:
  """The learner a run tests with (its spec's `num_mc_test` draws), for the recorded likelihood."""
  return algorithms.make_learner(
    network, record["kind"], record["noise_std"], config, num_mc=config.algorithm.test_draws
  )


def template_state(model, input_shape, kind: str, noise_std: Optional[float], config):
  """A `MetaState` of the run's structure, to restore checkpoints into."""
  learner = algorithms.make_learner(model, kind, noise_std, config)
  optimizer = algorithms.make_optimizer(config)
  params = models.init_params(model, jax.random.key(0), (1,) + input_shape)
  return jax.eval_shape(
    functools.partial(meta_step.init_meta_state, learner, optimizer), params, jax.random.key(1)
  )


def tested_step(workdir: Path, print_fn: Callable[[str], None]) -> Optional[int]:
  """The step `results.json` says the test scored, or None (no results, or none readable)."""
  results = run_folder.read_json(workdir / run_folder.RESULTS_FILE, print_fn=print_fn)
  step = results.get("tested_step") if isinstance(results, dict) else None
  return step if isinstance(step, int) and not isinstance(step, bool) else None
