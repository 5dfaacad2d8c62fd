"""A run's backend choices: made once, recorded in `run.json`, kept when the run resumes.

    choices = recorded_choices.choose(problem, config, mesh, saved_record)
    problem, config = recorded_choices.apply(problem, config, choices)
    record[recorded_choices.RECORD_KEY] = choices.to_record()

A config's speed settings may say 'auto' (and a chunk 0): the backend's choice
(`backend_defaults.decide_run_choices`; on a CPU tasks and draws in `lax.map`, the
loop-safe convolution). The choices change a run's numbers in their last bits, so a run
makes them once, when its folder is first recorded, and `run.json` keeps them under
`backend_choices`, with the processor they were made on (`backend.processor_record`):

    "backend_choices": {"choices": {"task_batching": "map", "chunk_size": 1,
                                    "eval_task_batching": "map", "eval_chunk_size": 1,
                                    "sample_batching": "remat_map",
                                    "cpu_fusion_emitters": "off", "conv_impl": "loop_safe"},
                        "decided_on": {"cpu": "AMD EPYC", "family": 25, "model": 17, ...}}

A resumed run whose config still says 'auto' for a setting takes the recorded value, not
the backend's choice of today: resumed on another processor, or after the defaults
changed, it computes what it would have computed uninterrupted. A setting the resumed
config names (not 'auto') is taken as named, and the record then holds it. `conv_impl` is
the network's convolution (`problem.model.conv_impl`, which an experiment builds from its
config's 'auto'): where the config says 'auto', the recorded one is put back in the network.
A choice added after a run was recorded (`backend_defaults.RECORDED_BEFORE`: XLA:CPU's
fusion emitters) resumes as the run ran before it existed.
A run recorded before the choices were (no `backend_choices`) decides them when it resumes,
as it did before, and records them from then on; its network's convolution, which its record
names (`model`), it keeps: its checkpoints carry that record, and a network of another
convolution would not be the one they hold.
"""

import math
from typing import NamedTuple, Optional

from vampire_jax._src.core import backend_defaults, machine
from vampire_jax.runs import programs
from vampire_jax.runs.problem import Problem

RECORD_KEY = "backend_choices"
CONV_IMPL = "conv_impl"  # an experiment config's field, and the network's


class RunChoices(NamedTuple):
  """The concrete settings a run runs with, and where the 'auto' ones were decided.

  Attributes:
    choices: `{field: value}`: every field of `backend_defaults.RUN_CHOICES`, and
      `conv_impl` where the network has one.
    decided_on: the `backend.processor_record` of the machine that decided them.
    kept: the fields whose value a resumed run took from its record.
    here: `{field: value}` of the kept fields whose record differs from what the backend
      decides here (another processor, or other defaults): the choices kept that matter.
  """

  choices: dict
  decided_on: dict
  kept: tuple = ()
  here: dict = {}

  def to_record(self) -> dict:
    """What `run.json` holds under `RECORD_KEY`."""
    return {"choices": dict(self.choices), "decided_on": dict(self.decided_on)}


def recorded(record: Optional[dict]) -> Optional[dict]:
  """The `backend_choices` of a run record (`run.json`), or None (a new folder, or a run
  recorded before they were)."""
  entry = record.get(RECORD_KEY) if isinstance(record, dict) else None
  if isinstance(entry, dict) and isinstance(entry.get("choices"), dict):
    return entry
  return None


def _recorded_model_conv(record: Optional[dict]) -> Optional[str]:
  """The convolution a run record's network was recorded with (`model.fields.conv_impl`), or
  None: how a run recorded before `backend_choices` names the one it trained with."""
  model = record.get("model") if isinstance(record, dict) else None
  fields = model.get("fields") if isinstance(model, dict) else None
  conv = fields.get(CONV_IMPL) if isinstance(fields, dict) else None
  return conv if isinstance(conv, str) and conv != "auto" else None


def _auto(config, field: str) -> bool:
  """Whether `config` leaves `field` to the backend ('auto', or a chunk of 0)."""
  if field == CONV_IMPL:
    return getattr(config, CONV_IMPL, None) == "auto"
  return getattr(config.speed, field) == backend_defaults.RUN_CHOICES[field]


def choose(problem: Problem, config, mesh, saved_record: Optional[dict]) -> RunChoices:
  """The choices of a run of `config` on `problem`: where the config says 'auto', the value
  `saved_record` (the folder's `run.json`) holds, else the backend's decision here.

  Args:
    problem: the run's problem (its network's `conv_impl`, where it has one).
    config: the run's config, as given.
    mesh: the devices its tasks are split over (`backend_defaults.task_mesh_for`), or None.
    saved_record: the run record of a resumed run, None for a new one.
  """
  devices = programs.mesh_size(mesh)
  decided = backend_defaults.decide_run_choices(
    config.speed,
    train_tasks=config.schedule.tasks_per_step // devices,
    eval_tasks=programs.eval_batch_size(config, mesh) // devices,
    input_size=math.prod(problem.input_shape),
  )
  model_conv = getattr(problem.model, CONV_IMPL, None)
  if isinstance(model_conv, str):
    decided[CONV_IMPL] = model_conv
  saved = recorded(saved_record)
  earlier = dict(saved["choices"]) if saved else {}
  if saved_record is not None:  # a choice its record predates: what the run ran with then
    earlier = {**backend_defaults.RECORDED_BEFORE, **earlier}
  trained_conv = _recorded_model_conv(saved_record) if saved is None else None
  if trained_conv is not None and CONV_IMPL in decided:
    earlier[CONV_IMPL] = trained_conv  # a run recorded before the choices: its network's
  choices, kept = {}, []
  for field, value in decided.items():
    if _auto(config, field) and field in earlier:
      choices[field] = earlier[field]
      kept.append(field)
    else:
      choices[field] = value
  auto = [field for field in choices if _auto(config, field)]
  all_kept = saved is not None and all(field in kept for field in auto)
  decided_on = saved["decided_on"] if all_kept else machine.processor_record()
  here = {field: decided[field] for field in kept if decided[field] != choices[field]}
  return RunChoices(choices, decided_on, tuple(kept), here)


def describe_kept(choices: RunChoices) -> Optional[str]:
  """One line on the recorded choices a resumed run keeps against this backend's decision,
  or None where they agree."""
  if not choices.here:
    return None
  kept = ", ".join(
    f"{name} {choices.choices[name]} (here: {value})" for name, value in choices.here.items()
  )
  where = choices.decided_on.get("description", "another machine")
  return f"resuming with the backend choices recorded on {where}: {kept}"


def apply(problem: Problem, config, choices: RunChoices) -> tuple[Problem, object]:
  """`(problem, config)` that run with `choices`: each 'auto' field of the config set to its
  choice, and the network's convolution to the chosen one where the config leaves it 'auto'."""
  speed_fields = [f for f in backend_defaults.RUN_CHOICES if f in choices.choices]
  changes = {f: choices.choices[f] for f in speed_fields if _auto(config, f)}
  if CONV_IMPL in choices.choices and _auto(config, CONV_IMPL):
    conv = choices.choices[CONV_IMPL]
    changes[CONV_IMPL] = conv
    if getattr(problem.model, CONV_IMPL, conv) != conv:
      problem = problem._replace(model=problem.model.clone(**{CONV_IMPL: conv}))
  return problem, config.replace(**changes) if changes else config
