"""A run's backend choices (`vampire_jax.runs.recorded_choices`): `run.json` names what each
'auto' setting ran as and the processor that decided it, and a resumed run keeps them when
the backend would now decide otherwise, computing what the run computes uninterrupted."""

import json

import jax
import numpy as np

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
  of the defaults would make it: tasks and draws batched the other way."""
  here = backend_defaults.for_backend()
  other = here._replace(
    task_batching="vmap" if here.task_batching != "vmap" else "map",
    sample_batching="vmap" if here.sample_batching != "vmap" else "remat_map",
  )
  monkeypatch.setitem(backend_defaults.DEFAULTS, jax.default_backend(), other)
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
  here = backend_defaults.decide_run_choices(config.speed, train_tasks=2, eval_tasks=2)
  assert record["backend_choices"]["choices"] == here  # the names and what each ran as
  assert set(here) == {
    "task_batching",
    "chunk_size",
    "eval_task_batching",
    "eval_chunk_size",
    "sample_batching",
  }
  assert "auto" not in here.values() and 0 not in here.values()
  decided_on = record["backend_choices"]["decided_on"]
  assert decided_on == json.loads(json.dumps(backend.processor_record()))
  assert first[recorded_choices.RECORD_KEY] == record["backend_choices"]
  assert record["config"]["speed"]["task_batching"] == "auto"  # the config as given

  other = _other_decision(monkeypatch)
  assert backend.task_batching("auto", 0, 2)[0] == other.task_batching != here["task_batching"]
  assert backend.sample_batching("auto") == other.sample_batching != here["sample_batching"]
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
  for old in ({"format": 2}, {"backend_choices": "damaged"}, {"backend_choices": {}}):
    choices = recorded_choices.choose(problem, config, None, old)
    assert choices.kept == () and choices.decided_on == backend.processor_record()
    assert choices.choices == backend_defaults.decide_run_choices(
      config.speed, train_tasks=2, eval_tasks=2
    )


def test_a_record_without_choices_keeps_the_convolution_its_network_was_recorded_with():
  """A run recorded before the choices (a GPU's paper cell: 'patches') resumed where the backend
  decides another convolution: its record's network names the one its checkpoints hold."""
  config = omniglot_config("quick", "vampire")
  trained = recorded_choices.choose(_conv_problem("patches"), config, None, None)
  legacy = {"model": {"class": "Conv4", "fields": {"conv_impl": "patches"}}}
  today = _conv_problem("loop_safe")
  choices = recorded_choices.choose(today, config, None, legacy)
  assert choices.choices["conv_impl"] == "patches" and choices.kept == ("conv_impl",)
  assert choices.decided_on == backend.processor_record()  # the rest decided here, and said so
  assert {k: v for k, v in choices.choices.items() if k != "conv_impl"} == {
    k: v for k, v in trained.choices.items() if k != "conv_impl"
  }
  problem, running = recorded_choices.apply(today, config, choices)
  assert problem.model.conv_impl == "patches" and running.conv_impl == "patches"
  # Named in the config, the convolution is taken as named.
  named = config.replace(conv_impl="loop_safe")
  assert recorded_choices.choose(today, named, None, legacy).choices["conv_impl"] == "loop_safe"
