"""A run's backend choices (`vampire_jax.runs.recorded_choices`): `run.json` names what each
'auto' setting ran as and the processor that decided it, and a resumed run keeps them when
the backend would now decide otherwise, computing what the run computes uninterrupted."""

import json

import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from experiments.presets import omniglot_config
from tests.conftest import tiny_regression_config
from vampire_jax import backend
from vampire_jax._src.core import backend_defaults
from vampire_jax.runs import recorded_choices

QUIET = dict(progress=False)


def _other_decision(monkeypatch):
  """This backend's 'auto' made another choice, as another processor or a later version
  of the defaults would make it: tasks and draws batched the other way, XLA:CPU's other
  fusion emitters."""
  here = backend_defaults.for_backend()
  other = here._replace(
    task_batching="vmap" if here.task_batching != "vmap" else "map",
    sample_batching="vmap" if here.sample_batching != "vmap" else "remat_map",
    older_emitters_up_to=0 if here.older_emitters_up_to else 10**9,
  )
  monkeypatch.setattr(backend_defaults, "for_backend", lambda backend=None: other)
  return other


def _train(config, folder, lines=None):
  return vj.train_and_evaluate(
    lambda: regression.make_problem(config),
    config,
    folder,
    print_fn=(lambda line: None) if lines is None else lines.append,
    **QUIET,
  )


def _metric_rows(folder) -> list[dict]:
  rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
  # The rates are timings, not numbers of the run.
  return [{k: v for k, v in row.items() if not k.endswith("_per_s")} for row in rows]


def test_a_resumed_run_keeps_the_choices_it_recorded(tmp_path, monkeypatch):
  # Draws left to the backend too ('auto'), so both settings this test changes are choices.
  config = tiny_regression_config("vampire", num_meta_steps=4, sample_batching="auto")
  uninterrupted = _train(config, tmp_path / "uninterrupted")

  first = _train(config.replace(num_meta_steps=2), tmp_path / "resumed")
  record = json.loads((tmp_path / "resumed" / "run.json").read_text())
  here = backend_defaults.decide_run_choices(
    config.speed,
    train_tasks=2,
    eval_tasks=2,
    input_size=1,  # a regression's x
  )
  assert record["backend_choices"]["choices"] == here  # the names and what each ran as
  assert set(here) == {
    "task_batching",
    "chunk_size",
    "eval_task_batching",
    "eval_chunk_size",
    "sample_batching",
    "cpu_fusion_emitters",
  }
  assert "auto" not in here.values() and 0 not in here.values()
  decided_on = record["backend_choices"]["decided_on"]
  assert decided_on == json.loads(json.dumps(backend.processor_record()))
  assert first[recorded_choices.RECORD_KEY] == record["backend_choices"]
  assert record["config"]["speed"]["task_batching"] == "auto"  # the config as given

  other = _other_decision(monkeypatch)
  assert backend.task_batching("auto", 0, 2)[0] == other.task_batching != here["task_batching"]
  assert backend.sample_batching("auto") == other.sample_batching != here["sample_batching"]
  assert backend.fusion_emitters("auto", 1) != here["cpu_fusion_emitters"]
  lines = []
  resumed = _train(config, tmp_path / "resumed", lines)

  assert resumed["resumed_from_step"] == 2
  after = json.loads((tmp_path / "resumed" / "run.json").read_text())
  assert after["backend_choices"] == record["backend_choices"]  # kept, and where decided
  assert resumed[recorded_choices.RECORD_KEY] == record["backend_choices"]
  said = [line for line in lines if "backend choices recorded on" in line]
  assert len(said) == 1 and f"task_batching {here['task_batching']}" in said[0], lines
  assert f"(here: {other.task_batching})" in said[0]
  # The numbers of the uninterrupted run, bit for bit: every logged row, the test.
  assert _metric_rows(tmp_path / "resumed") == _metric_rows(tmp_path / "uninterrupted")
  assert resumed["test"] == uninterrupted["test"]
  for name in ("mse", "nll"):
    np.testing.assert_array_equal(
      np.load(tmp_path / "resumed" / "test_per_task.npz")[name],
      np.load(tmp_path / "uninterrupted" / "test_per_task.npz")[name],
    )


def _conv_problem(conv_impl: str) -> vj.Problem:
  return vj.Problem(
    model=vj.Conv4(num_classes=5, num_filters=4, conv_impl=conv_impl),
    input_shape=(28, 28, 1),
    splits={},
    sample_tasks=lambda data, keys: None,
  )


def test_a_new_run_decides_here_and_a_named_setting_is_taken_as_named(monkeypatch):
  config = omniglot_config("quick", "vampire")
  assert config.conv_impl == "auto" and config.speed.sample_batching == "auto"
  conv = backend.config_conv_impl(config)
  fresh = recorded_choices.choose(_conv_problem(conv), config, None, None)
  assert fresh.kept == () and fresh.here == {}
  assert fresh.choices["conv_impl"] == conv  # the network's convolution, as the experiment built it
  assert fresh.choices["sample_batching"] == backend.sample_batching("auto")
  assert fresh.decided_on == backend.processor_record()

  saved = {recorded_choices.RECORD_KEY: fresh.to_record()}
  _other_decision(monkeypatch)
  named = config.replace(task_batching="unroll")  # named on the command line: taken as named
  resumed = recorded_choices.choose(_conv_problem(conv), named, None, saved)
  assert resumed.choices["task_batching"] == "unroll"
  assert resumed.choices["sample_batching"] == fresh.choices["sample_batching"]
  assert "task_batching" not in resumed.kept and "sample_batching" in resumed.kept
  _, running = recorded_choices.apply(_conv_problem(conv), named, resumed)
  assert running.speed.task_batching == "unroll"
  assert running.speed.sample_batching == fresh.choices["sample_batching"]


def test_the_recorded_convolution_is_put_back_in_the_network():
  """An experiment builds its network's convolution from the config's 'auto' today; a resumed
  run's network gets the one it was trained with."""
  config = omniglot_config("quick", "vampire")
  saved = recorded_choices.choose(_conv_problem("xla"), config, None, None)
  assert saved.choices["conv_impl"] == "xla"
  today = _conv_problem("loop_safe")
  choices = recorded_choices.choose(today, config, None, {"backend_choices": saved.to_record()})
  assert choices.choices["conv_impl"] == "xla" and choices.here == {"conv_impl": "loop_safe"}
  problem, running = recorded_choices.apply(today, config, choices)
  assert problem.model.conv_impl == "xla" and running.conv_impl == "xla"
  assert problem.model.num_filters == 4  # the same network otherwise
  # Named in the config, the convolution is the network's as built.
  named = config.replace(conv_impl="loop_safe")
  problem, _ = recorded_choices.apply(
    today,
    named,
    recorded_choices.choose(today, named, None, {"backend_choices": saved.to_record()}),
  )
  assert problem.model.conv_impl == "loop_safe"


def test_a_record_without_choices_decides_them_as_before():
  """A run recorded before the choices were (no `backend_choices`, or a damaged entry)."""
  config = tiny_regression_config("vampire")
  problem = regression.make_problem(config)
  decided = backend_defaults.decide_run_choices(
    config.speed, train_tasks=2, eval_tasks=2, input_size=1
  )
  for old in ({"format": 2}, {"backend_choices": "damaged"}, {"backend_choices": {}}):
    choices = recorded_choices.choose(problem, config, None, old)
    assert choices.kept == ("cpu_fusion_emitters",)
    assert choices.decided_on == backend.processor_record()
    # XLA's default fusion emitters, as every run recorded then ran; the rest decided here.
    assert choices.choices == dict(decided, cpu_fusion_emitters="on")


def test_a_record_that_predates_a_choice_resumes_as_it_ran():
  """`backend_choices` recorded before XLA:CPU's fusion emitters were a choice: the resumed
  run compiles with XLA's default emitters, whatever this processor's row says, and a new
  run with the row's."""
  config = tiny_regression_config("vampire")
  problem = regression.make_problem(config)
  fresh = recorded_choices.choose(problem, config, None, None)
  assert fresh.choices["cpu_fusion_emitters"] == backend.fusion_emitters("auto", 1)
  earlier = {k: v for k, v in fresh.choices.items() if k != "cpu_fusion_emitters"}
  saved = {"backend_choices": {"choices": earlier, "decided_on": fresh.decided_on}}
  resumed = recorded_choices.choose(problem, config, None, saved)
  assert resumed.choices == dict(earlier, cpu_fusion_emitters="on")
  assert "cpu_fusion_emitters" in resumed.kept
  _, running = recorded_choices.apply(problem, config, resumed)
  assert running.speed.cpu_fusion_emitters == "on"
  assert backend.compiler_options(running.speed.cpu_fusion_emitters) == {}
  # Named in the config, the emitters are taken as named.
  named = config.replace(cpu_fusion_emitters="off")
  assert (
    recorded_choices.choose(problem, named, None, saved).choices["cpu_fusion_emitters"] == "off"
  )


def test_a_record_without_choices_keeps_the_convolution_its_network_was_recorded_with():
  """A run recorded before the choices (a GPU's paper cell: 'patches') resumed where the backend
  decides another convolution: its record's network names the one its checkpoints hold."""
  config = omniglot_config("quick", "vampire")
  trained = recorded_choices.choose(_conv_problem("patches"), config, None, None)
  legacy = {"model": {"class": "Conv4", "fields": {"conv_impl": "patches"}}}
  today = _conv_problem("loop_safe")
  choices = recorded_choices.choose(today, config, None, legacy)
  assert choices.choices["conv_impl"] == "patches"
  assert set(choices.kept) == {"conv_impl", "cpu_fusion_emitters"}  # the emitters: XLA's then
  assert choices.decided_on == backend.processor_record()  # the rest decided here, and said so
  assert {k: v for k, v in choices.choices.items() if k != "conv_impl"} == {
    **{k: v for k, v in trained.choices.items() if k != "conv_impl"},
    "cpu_fusion_emitters": "on",  # XLA's default, as the run ran before it was a choice
  }
  problem, running = recorded_choices.apply(today, config, choices)
  assert problem.model.conv_impl == "patches" and running.conv_impl == "patches"
  # Named in the config, the convolution is taken as named.
  named = config.replace(conv_impl="loop_safe")
  assert recorded_choices.choose(today, named, None, legacy).choices["conv_impl"] == "loop_safe"


def test_the_run_programs_compile_with_the_chosen_xla_options(tmp_path, monkeypatch):
  """The emitters are a compile option of every program a run compiles (its train step and
  evaluators): an option XLA does not have fails the run's first compile, and the two
  emitters give the same run to float rounding."""
  config = tiny_regression_config("maml", num_meta_steps=2)
  runs = {
    emitters: _train(config.replace(cpu_fusion_emitters=emitters), tmp_path / emitters)
    for emitters in ("on", "off")
  }
  assert runs["on"]["backend_choices"]["choices"]["cpu_fusion_emitters"] == "on"
  assert runs["off"]["backend_choices"]["choices"]["cpu_fusion_emitters"] == "off"
  for name in ("mse", "nll"):
    np.testing.assert_allclose(
      runs["off"]["test"][name], runs["on"]["test"][name], rtol=1e-4, atol=1e-6
    )
  monkeypatch.setattr(
    backend_defaults, "compiler_options", lambda setting="auto": {"xla_cpu_no_such_option": True}
  )
  with pytest.raises(Exception, match="xla_cpu_no_such_option"):
    _train(config, tmp_path / "unknown_option")
