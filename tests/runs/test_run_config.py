"""`vj.RunConfig`: a config made of parts (the algorithm's spec, the schedule, the
evaluation, the speed), fields set by name, refusals that name the field."""

import jax
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import _regression_problem_and_config
from vampire_jax._src.core.errors import ConfigError, InputError
from vampire_jax.runs import run_config
from vampire_jax.runs import run_config as config_lib


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


QUIET = dict(progress=False, print_fn=lambda message: None)


def _refused(problem, config, tmp_path, match):
  """train_and_evaluate's refusal, in one line, with no folder made."""
  workdir = tmp_path / "run"
  with pytest.raises(InputError, match=match) as raised:
    vj.train_and_evaluate(problem, config, workdir, **QUIET)
  assert not workdir.exists()  # refused before the folder is made
  return _one_line(raised)


def test_no_field_of_the_run_config_belongs_to_one_algorithm():
  per_algorithm = {name for cls in vj.specs.SPECS.values() for name in cls.field_names()}
  fields = set(vj.RunConfig.field_names())
  for part in (vj.Schedule, vj.Evaluation, vj.Speed):
    fields |= set(part.field_names())
  assert not fields & per_algorithm, fields & per_algorithm


def test_replace_sets_a_field_of_any_part_by_its_name():
  config = vj.RunConfig().replace(num_meta_steps=300, eval_every=10, remat=True, inner_lr=0.1)
  assert config.schedule.num_meta_steps == 300
  assert config.evaluation.eval_every == 10
  assert config.speed.remat is True
  assert config.algorithm.inner_lr == 0.1
  assert vj.RunConfig().schedule.num_meta_steps == 15_000  # a copy: the default untouched
  flat = config.flat()
  assert (flat["algorithm"], flat["num_meta_steps"], flat["inner_lr"]) == ("vampire", 300, 0.1)


def test_a_registered_name_is_its_spec():
  maml = vj.RunConfig(algorithm="maml")
  assert maml.algorithm == vj.specs.Maml()
  # replace(algorithm=name) converts the config's spec: the settings the two share carry over.
  converted = vj.RunConfig(algorithm=vj.specs.Vampire(inner_lr=0.2)).replace(algorithm="maml")
  assert converted.algorithm == vj.specs.Maml(inner_lr=0.2)


@pytest.mark.parametrize(
  "make, names",
  [
    (lambda: vj.RunConfig(kl_weight=1.0), ["kl_weight", "Vampire", "vj.specs"]),
    (
      lambda: vj.RunConfig(algorithm="maml").replace(kl_weight=1.0),
      ["kl_weight", "maml", "Vampire"],
    ),
    (lambda: vj.RunConfig().replace(num_particles=8), ["num_particles", "Bmaml"]),
    (lambda: vj.RunConfig(tasks_per_step=8), ["tasks_per_step", "schedule", "replace"]),
    (lambda: vj.RunConfig().replace(no_such_field=1), ["no_such_field"]),
    (lambda: vj.Schedule(eval_every=5), ["eval_every", "Schedule"]),
    (lambda: vj.RunConfig(algorithm="reptile"), ["reptile", "vampire", "simpa"]),
    (lambda: vj.RunConfig(algorithm=3), ["algorithm", "vj.AlgorithmSpec"]),
  ],
)
def test_a_field_in_the_wrong_place_is_refused_naming_it_and_where_it_belongs(make, names):
  with pytest.raises(vj.ConfigError) as raised:
    make()
  message = str(raised.value)
  assert all(name in message for name in names), message
  assert len(message.splitlines()) == 1 and "--" not in message


@pytest.mark.parametrize(
  "changes, field",
  [
    (dict(tasks_per_step=0), "tasks_per_step"),
    (dict(meta_lr=float("nan")), "meta_lr"),
    (dict(meta_lr_decay=1.5), "meta_lr_decay"),
    (dict(num_bins=0), "num_bins"),
    (dict(test_parameters="last"), "test_parameters"),
    (dict(shard_tasks="yes"), "shard_tasks"),
    (dict(remat="no"), "remat"),
    (dict(seed=-1), "seed"),
    (dict(seed=2**32), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(kl_weight=-0.1), "kl_weight"),
  ],
)
def test_an_impossible_setting_is_refused_naming_the_field(changes, field):
  with pytest.raises(vj.ConfigError) as raised:
    vj.RunConfig().replace(**changes).validate()
  message = str(raised.value)
  assert message.startswith(field) and raised.value.fields[0] == field, message
  assert "--" not in message


def test_each_part_knows_what_a_resumed_run_may_change():
  names = vj.RunConfig().resumable_names()
  assert {"num_meta_steps", "eval_every", "num_test_tasks", "task_batching", "num_mc_test"} <= names
  assert not {"tasks_per_step", "meta_lr", "seed", "inner_lr", "kl_weight"} & names
  assert "num_mc_test" not in vj.RunConfig(algorithm="maml").resumable_names()  # it has none


def test_differences_name_only_what_a_resumed_run_may_not_change():
  saved = run_config.jsonable(vj.RunConfig().replace(num_meta_steps=10).flat())
  resumed = vj.RunConfig().replace(num_meta_steps=20, eval_every=5, num_mc_test=3)
  assert run_config.config_differences(saved, resumed) == {}
  other = vj.RunConfig().replace(inner_lr=0.5, tasks_per_step=4)
  assert run_config.config_differences(saved, other) == {
    "inner_lr": (None, 0.5),
    "tasks_per_step": (32, 4),
  }
  maml = vj.RunConfig(algorithm="maml")
  assert run_config.config_differences(saved, maml)["algorithm"] == ("vampire", "maml")


def test_the_library_names_no_command_line_flag_for_a_config_it_refuses():
  with pytest.raises(vj.ConfigError) as raised:
    vj.RunConfig(algorithm="simpa").replace(tasks_per_step=1).validate()
  assert "tasks_per_step 1" in str(raised.value) and "--" not in str(raised.value)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**63 - 1, 2**64, 1.5, True])
def test_a_seed_jax_would_cut_to_32_bits_is_refused(seed):
  """A seed outside [0, 2**32 - 1] (which `jax.random.key` would cut to 32 bits, repeating a
  smaller seed: 2**32 as 0, -1 as 2**32 - 1) or not an integer is refused, naming the field,
  the range and the value; the command line says it by its flag; 2**32 - 1 is accepted."""
  from experiments import cli

  config = vj.RunConfig().replace(seed=seed)
  with pytest.raises(
    ConfigError, match=r"^seed must be an integer in \[0, 2\*\*32 - 1\]"
  ) as raised:
    config.validate()
  assert f"got {seed!r}" in str(raised.value) and raised.value.fields == ("seed",)
  assert str(cli.as_flags(raised.value)).startswith("--seed must be an integer in [0, 2**32 - 1]")
  vj.RunConfig().replace(seed=config_lib.MAX_SEED).validate()


def test_the_largest_seed_is_a_key_of_its_own():
  keys = {
    seed: tuple(np.asarray(jax.random.key_data(jax.random.key(seed))).tolist())
    for seed in (0, 1, config_lib.MAX_SEED)
  }
  assert len(set(keys.values())) == 3


@pytest.mark.parametrize("as_given", ["dict", "class"])
def test_a_config_given_as_a_dict_or_the_class_is_refused(tmp_path, as_given):
  """A dict or the class `vj.RunConfig` given as the config is refused in one line, saying
  what was given and how to build a config."""
  import dataclasses

  problem, config = _regression_problem_and_config()
  given = dataclasses.asdict(config) if as_given == "dict" else vj.RunConfig
  got = (
    r"a dict; build one: vj.RunConfig\(\).replace\(\*\*config\)"
    if as_given == "dict"
    else r"the class RunConfig itself; build one: vj.RunConfig\(...\)"
  )
  _refused(problem, given, tmp_path, rf"train_and_evaluate: config must be a vj.RunConfig .*{got}")
