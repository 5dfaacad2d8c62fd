"""One `train_and_evaluate` (issue 43): an experiment is the library's loop given the function
that builds its problem, and each check of the config and the folder runs once, before the
data is loaded."""

import pytest

from conftest import tiny_regression_config
from experiments import regression
import vampire_jax as vj
from vampire_jax._src.core.errors import ConfigError, InputError
from vampire_jax.runs import loop

QUIET = dict(progress=False, print_fn=lambda message: None)


def _count_calls(monkeypatch, module, name, calls):
  real = getattr(module, name)

  def counted(*args, **kwargs):
    calls[name] = calls.get(name, 0) + 1
    return real(*args, **kwargs)

  monkeypatch.setattr(module, name, counted)


def test_a_run_checks_its_config_once_and_its_folder_before_the_data(tmp_path, monkeypatch):
  calls = {}
  _count_calls(monkeypatch, loop.algorithms, "check_config", calls)
  _count_calls(monkeypatch, loop.run_folder, "check_resumable", calls)
  _count_calls(monkeypatch, loop.run_folder, "check_not_in_use", calls)
  _count_calls(monkeypatch, regression, "make_problem", calls)
  config = tiny_regression_config(num_meta_steps=2)
  results = regression.run_experiment(config, tmp_path / "run", **QUIET)
  assert results["meta_steps"] == 2
  # check_resumable: once before the data, once under the folder's lock (prepare_workdir).
  assert calls == {
    "check_config": 1,
    "check_not_in_use": 1,
    "check_resumable": 2,
    "make_problem": 1,
  }


def test_a_refused_run_loads_no_data(tmp_path, monkeypatch):
  config = tiny_regression_config(num_meta_steps=2)
  regression.run_experiment(config, tmp_path, **QUIET)
  calls = {}
  _count_calls(monkeypatch, regression, "make_problem", calls)
  other = config.replace(hidden_sizes=(4, 4))
  with pytest.raises(ConfigError, match="holds a run with another config"):
    regression.run_experiment(other, tmp_path, **QUIET)
  impossible = config.replace(tasks_per_step=0)
  with pytest.raises(ConfigError):
    regression.run_experiment(impossible, tmp_path / "new", **QUIET)
  assert calls == {}
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
  "problem, message",
  [
    ({"model": None}, "problem is a dict; pass a vj.Problem or a function that returns one"),
    (lambda: {"model": None}, "the problem's function returned a dict, not a vj.Problem"),
  ],
)
def test_a_problem_that_is_not_one_is_refused_in_one_line(tmp_path, problem, message):
  config = tiny_regression_config(num_meta_steps=2)
  with pytest.raises(InputError, match=message):
    vj.train_and_evaluate(problem, config, tmp_path / "run", **QUIET)
  assert not (tmp_path / "run").exists()  # refused before the folder is made
