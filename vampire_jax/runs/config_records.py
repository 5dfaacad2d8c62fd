"""A run's config as `run.json` records it, and back; and the one reader of the old format.

The record (`run.json`'s "config", and `config.json`) holds the config by value:

    {"algorithm": {"name": "maml", "spec": "vampire_jax.runs.specs.Maml",
                   "inner_lr": 0.1, ...},
     "schedule": {...}, "evaluation": {...}, "speed": {...},
     "seed": 0, "kernel_init_gain": 1.414..., <the experiment's data fields>}

A record written before the algorithm specs (`"algorithm": "maml"`, a string, with every
algorithm's options beside the shared fields in one flat dict) is read by `from_old_format`
alone: its fields go to their parts, the algorithm's to its spec under the spec's names, and
the fields the algorithm never read (recorded at neutral values) are left behind. Such a run
loads, predicts and resumes as it trained: the learner is built from the same values.
"""

import dataclasses
import importlib
from typing import Any, Optional

from vampire_jax._src.core.errors import RunFolderError
from vampire_jax.runs import specs
from vampire_jax.runs.run_config import PART_CLASSES, PARTS

# Every part's fields.
PART_FIELDS = frozenset(name for cls in PART_CLASSES.values() for name in cls.field_names())


def spec_path(spec) -> str:
  cls = type(spec)
  return f"{cls.__module__}.{cls.__qualname__}"


def to_record(config) -> dict:
  """The config as a JSON-ready dict (tuples stay tuples; `json` writes them as lists)."""
  record = {}
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    if f.name == "algorithm":
      record["algorithm"] = {"name": value.name, "spec": spec_path(value), **value.settings()}
    elif f.name in PARTS:
      record[f.name] = dataclasses.asdict(value)
    else:
      record[f.name] = value
  return record


def is_old_format(recorded: dict) -> bool:
  """Whether a recorded config is of the flat format written before the algorithm specs."""
  return not isinstance(recorded.get("algorithm"), dict)


def flat(recorded: dict) -> dict[str, Any]:
  """`RunConfig.flat()` of a recorded config, read without importing its classes (a record of
  the old format is converted first)."""
  if is_old_format(recorded):
    recorded = _new_format_of_old(recorded)
  values = {}
  for name, value in recorded.items():
    if name == "algorithm":
      values["algorithm"] = value["name"]
      values.update({k: v for k, v in value.items() if k not in ("name", "spec")})
    elif name in PARTS and isinstance(value, dict):
      values.update(value)
    else:
      values[name] = value
  return values


def from_record(recorded: dict, config_cls, *, algorithm: Optional[type] = None):
  """The config of class `config_cls` that `recorded` holds (either format).

  Args:
    recorded: `run.json`'s "config".
    config_cls: the run's config class (`RunConfig` or an experiment's).
    algorithm: the spec class, for a spec whose recorded import path does not import here
      (defined in `__main__`, say).

  Raises:
    RunFolderError: the spec's class cannot be imported and none was given.
  """
  if is_old_format(recorded):
    recorded = _new_format_of_old(recorded)
  spec_record = dict(recorded["algorithm"])
  name, path = spec_record.pop("name"), spec_record.pop("spec")
  spec_cls = algorithm or _spec_class(name, path)
  spec_names = set(spec_cls.field_names())
  spec = spec_cls(**{k: tuples(v) for k, v in spec_record.items() if k in spec_names})
  names = set(config_cls.field_names())
  values = {"algorithm": spec}
  for key, value in recorded.items():
    if key == "algorithm" or key not in names:
      continue
    if key in PARTS:
      part_cls = PART_CLASSES[key]
      known = set(part_cls.field_names())
      values[key] = part_cls(**{k: tuples(v) for k, v in value.items() if k in known})
    else:
      values[key] = tuples(value)
  return config_cls(**values)


def _spec_class(name: str, path: str) -> type:
  module_name, _, class_name = path.rpartition(".")
  try:
    cls = getattr(importlib.import_module(module_name), class_name)
  except (ImportError, AttributeError, ValueError) as error:
    if name in specs.SPECS and module_name.startswith("vampire_jax."):
      return specs.SPECS[name]  # a library spec that moved
    where = (
      "it was defined in the script that trained the run (__main__)"
      if module_name == "__main__"
      else f"{type(error).__name__}: {error}"
    )
    raise RunFolderError(
      f"the run's algorithm spec {path} cannot be imported here ({where}); pass the class: "
      f"vj.load_run(workdir, algorithm={class_name})"
    ) from None
  return cls


def tuples(value):
  """Lists as tuples (JSON has no tuples; the configs' sequences are tuples)."""
  if isinstance(value, list):
    return tuple(tuples(v) for v in value)
  return value


# -- The old format: one flat dict of every algorithm's options ---------------------------

# Old names of the specs' fields (the flat config prefixed an algorithm's own options).
OLD_NAMES = {
  "inner_backtracking": "backtracking",
  "bmaml_meta_objective": "meta_objective",
  "bmaml_leader_steps": "num_leader_steps",
  "platipus_inference_data": "inference_data",
  "abml_hyper_prior_weight": "hyper_prior_weight",
  "simpa_phi_lr": "phi_lr",
  "simpa_phi_inner_lr": "phi_inner_lr",
  "simpa_epsilon": "epsilon",
  "simpa_kl_samples": "num_kl_samples",
  "protonet_distance": "distance",
  "train_ways": "train_num_classes",
}

# The flat config's defaults of the algorithms' fields: what a record that predates a field
# ran with (the current specs' defaults are their factories', some of them others).
OLD_DEFAULTS = {
  "num_inner_steps": 5,
  "inner_lr": 0.01,
  "kl_weight": 0.02,
  "num_mc_train": 1,
  "num_mc_query": 1,
  "num_mc_test": 10,
  "first_order": False,
  "second_order_steps": None,
  "backtracking": False,
  "log_std_init": (-4.0, -3.0),
  "local_reparameterization": False,
  "num_particles": 8,
  "meta_objective": "bfa",
  "num_leader_steps": 1,
  "inference_data": "support_and_query",
  "hyper_prior_weight": 1e-4,
  "phi_lr": 1e-4,
  "phi_inner_lr": 5e-4,
  "epsilon": 0.1,
  "num_kl_samples": 512,
  "outer_kl_weight": None,
  "num_classes": None,
  "train_num_classes": None,
  "distance": "squared_euclidean",
  "log_std_weight_decay": 0.0,
  "meta_grad_clip_separately": False,
}


def _new_format_of_old(old: dict) -> dict:
  """The new format of a flat record: shared fields to their parts, the algorithm's to its
  spec (renamed), the rest (the options the algorithm never read) left behind."""
  name = old.get("algorithm", "vampire")
  spec_cls = specs.get(name)
  spec_fields = {}
  for field_name in spec_cls.field_names():
    old_name = next((o for o, n in OLD_NAMES.items() if n == field_name), field_name)
    if old_name in old:
      spec_fields[field_name] = old[old_name]
    elif field_name in old:  # a flat record by today's names (`RunConfig.flat()`)
      spec_fields[field_name] = old[field_name]
    elif field_name in OLD_DEFAULTS:
      spec_fields[field_name] = OLD_DEFAULTS[field_name]
  new = {
    "algorithm": {"name": name, "spec": f"{specs.__name__}.{spec_cls.__name__}", **spec_fields}
  }
  parts = {part: {} for part in PARTS}
  for key, value in old.items():
    if key == "algorithm":
      continue
    where = next((p for p, cls in PART_CLASSES.items() if key in cls.field_names()), None)
    if where:
      parts[where][key] = value
    elif key not in OLD_DEFAULTS and key not in OLD_NAMES:
      new[key] = value  # the config's own fields and the experiment's
  new.update({part: values for part, values in parts.items() if values})
  return new


def flat_or_as_is(recorded):
  """`flat(recorded)` where it reads, else `recorded` as it is (a damaged or foreign record,
  for a reader that says what is wrong with it itself)."""
  try:
    return flat(recorded)
  except Exception:  # a record of an unknown algorithm, a part that is not an object...
    return recorded
