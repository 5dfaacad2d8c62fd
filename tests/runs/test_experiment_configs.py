import pytest

from experiments import cli
from vampire_jax._src.core.errors import ConfigError
from vampire_jax.runs import experiment_configs


def test_open_set_config_checks():
  from experiments import presets

  config = presets.get_config("mini_imagenet", "5way1shot")
  assert experiment_configs.open_set_classes(config) == 5  # default: as many as ways
  for value, message, as_flags in (
    (
      16,
      "num_open_set_classes 16: an open-set test episode needs ways \\+ unknown = 21",
      "--num-open-set-classes 16: an open-set test episode needs --ways + unknown = 21",
    ),
    (
      -1,
      "num_open_set_classes must be an integer >= 0, got -1",
      "--num-open-set-classes must be an integer >= 0",
    ),
  ):
    with pytest.raises(ConfigError, match=message) as refused:
      config.replace(num_open_set_classes=value).validate()
    assert as_flags in str(cli.as_flags(refused.value))  # as a command says it
  assert experiment_configs.open_set_classes(config.replace(num_open_set_classes=0)) == 0
  # A partial copy with 7 test classes: the default takes the 2 left beside the 5 ways, an
  # explicit number it cannot give fails before training.
  assert experiment_configs.open_set_classes(config, test_classes=7) == 2
  assert experiment_configs.open_set_classes(config, test_classes=5) == 0
  with pytest.raises(ConfigError, match="test split has 7"):
    experiment_configs.open_set_classes(config.replace(num_open_set_classes=3), 7)


def test_omniglot_validation_size_config():
  from experiments import presets

  assert presets.get_config("omniglot", "5way1shot").num_val_alphabets == 0  # the paper's
  assert presets.get_config("omniglot", "20way5shot").num_val_characters == 0
  assert presets.get_config("omniglot", "quick").num_val_alphabets == 5
  assert experiment_configs.omniglot_split_characters("original", 0) == {
    "train": 964,
    "val": 964,
    "test": 659,
  }
  assert experiment_configs.omniglot_split_characters("original", 5) == {
    "train": 813,
    "val": 151,
    "test": 659,
  }
  config = presets.get_config("omniglot", "quick")
  for name, value in (("num_val_alphabets", 30), ("num_val_characters", -1)):
    with pytest.raises(ConfigError, match=f"{name} must be .*got {value}") as refused:
      config.replace(**{name: value}).validate()
    assert str(cli.as_flags(refused.value)).startswith(cli.flag(name))  # as a command says it


def test_one_way_tasks_are_refused():
  """One-way tasks (every prediction right: accuracy 100 %, NLL and ECE 0, saying nothing)
  are refused, naming the field, the value and the fix; the command line says it by its
  flag; two ways are accepted."""
  from experiments import cli
  from vampire_jax.runs.experiment_configs import check_episodes

  with pytest.raises(ConfigError, match="^ways 1: a task needs at least 2 classes") as raised:
    check_episodes(1, 1, 15, 20, {"train": 100, "val": 10, "test": 50}, what="Omniglot's")
  assert "use ways 2 or more" in str(raised.value)
  assert str(cli.as_flags(raised.value)).startswith("--ways 1: a task needs at least 2 classes")
  check_episodes(2, 1, 15, 20, {"train": 100, "val": 10, "test": 50}, what="Omniglot's")
