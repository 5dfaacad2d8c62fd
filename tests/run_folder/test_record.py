import importlib.util
import json
import os
import pickle
import subprocess
import sys
import warnings
from typing import Callable

import flax.linen as nn
import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from tests.conftest import REPO
from tests.helpers import QUERY_X, SUPPORT_X
from tests.run_folder.conftest import SUPPORT_Y
from tests.run_folder.conftest import copy_trained as _copy_trained
from tests.run_folder.conftest import load_with_warnings as _load
from tests.run_folder.conftest import predict as _predict
from tests.run_folder.conftest import train_regression as _train
from vampire_jax.runs import run_folder

QUIET = dict(progress=False, print_fn=lambda message: None)


def _one_line(error: pytest.ExceptionInfo) -> str:
  text = str(error.value)
  assert len(text.splitlines()) == 1, text
  return text


class ActivationNet(nn.Module):
  """A network with a field run.json cannot record (a function)."""

  activation: Callable = nn.relu

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(self.activation(nn.Dense(4)(x)))


SCRIPT = """
import sys

import flax.linen as nn
import jax
import numpy as np

import vampire_jax as vj


class Net(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.tanh(nn.Dense(self.width)(x)))


if __name__ == "__main__":
  sys.path.insert(0, {tests!r})
  from tests.conftest import tiny_regression_config
  from experiments import regression

  workdir = sys.argv[1]
  config = tiny_regression_config(num_meta_steps=2)
  problem = regression.make_problem(config)._replace(model=Net(8))
  vj.train_and_evaluate(problem, config, workdir, progress=False, print_fn=lambda m: None)
  run = vj.load_run(workdir)  # Net is found here: this script defines it
  x = np.linspace(-4.0, 4.0, 5, dtype=np.float32)[:, None]
  q = np.linspace(-5.0, 5.0, 7, dtype=np.float32)[:, None]
  np.save(sys.argv[2], np.asarray(run.predict(x, np.sin(x), q, jax.random.key(3))))
"""


def test_a_model_class_defined_inside_a_function_is_refused_before_any_folder_is_made(
  trained, tmp_path
):
  """A network class defined inside a function (it has no import path to load it by) is
  refused in one line naming the class and the fix, before the folder is made."""

  class LocalNet(vj.MLP):
    pass

  workdir = tmp_path / "run"
  with pytest.raises(vj.InputError) as error:
    _train(trained[1], workdir, model=LocalNet((8,), 1))
  text = _one_line(error)
  assert text.startswith("train_and_evaluate: problem.model cannot be recorded to load again")
  assert "LocalNet is defined inside a function" in text and "top level of a module" in text
  assert not workdir.exists()


def test_a_model_field_that_is_not_a_json_value_is_refused_before_any_folder_is_made(
  trained, tmp_path
):
  """A network field that is not a JSON value (relu, a custom_jvp) is refused in one line
  naming the field, before the folder is made (orbax writes the record as JSON)."""
  workdir = tmp_path / "run"
  with pytest.raises(vj.InputError) as error:
    _train(trained[1], workdir, model=ActivationNet())
  text = _one_line(error)
  assert "its field activation is relu (a custom_jvp)" in text and "run.json cannot record" in text
  assert not workdir.exists()


def test_a_script_class_is_warned_of_once():
  """A class of `__main__` (it loads only from a script defining it) is warned of once,
  naming `vj.load_run(workdir, model=ScriptNet)`."""

  class ScriptNet(vj.MLP):
    pass

  ScriptNet.__module__, ScriptNet.__qualname__ = "__main__", "ScriptNet"
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run_folder.check_model_recordable(ScriptNet((8,), 1))
    run_folder.check_model_recordable(ScriptNet((8,), 1))
  said = [str(w.message) for w in caught]
  assert len(said) == 1 and said[0].startswith(
    "train_and_evaluate: problem.model's class ScriptNet is defined in the script being run"
  )
  assert "vj.load_run(workdir, model=ScriptNet)" in said[0]


def test_a_run_of_a_script_class_loads_in_another_process_given_the_class(tmp_path):
  """A run of a script's class: one warning at training, a one-line refusal of load_run
  elsewhere naming `model=`, and `load_run(workdir, model=Net)` (or the module) gives the
  script's predictions bit for bit."""
  script = tmp_path / "train_script.py"
  script.write_text(SCRIPT.format(tests=str(REPO / "tests")))
  workdir, expected = tmp_path / "run", tmp_path / "predicted.npy"
  done = subprocess.run(
    [sys.executable, str(script), str(workdir), str(expected)],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  warned = [line for line in done.stderr.splitlines() if "is defined in the script" in line]
  assert len(warned) == 1 and "model=Net" in warned[0], done.stderr[-3000:]
  assert json.loads((workdir / "run.json").read_text())["model"]["class"] == "__main__.Net"

  with pytest.raises(vj.RunFolderError) as error:
    vj.load_run(workdir)
  text = _one_line(error)
  assert text.startswith("load_run: the run's network class __main__.Net cannot be imported")
  assert f"vj.load_run({str(workdir)!r}, model=Net)" in text

  spec = importlib.util.spec_from_file_location("train_script", script)
  module = importlib.util.module_from_spec(spec)
  sys.modules["train_script"] = module  # as an import would: pickle names the class by it
  try:
    spec.loader.exec_module(module)
    for given in (module.Net, module):
      run, said = _load(workdir, model=given)
      assert type(run.model) is module.Net and run.model.width == 8 and said == []
      assert np.array_equal(_predict(run), np.load(expected))
    again = pickle.loads(pickle.dumps(run))  # the class given is pickled by its name
    assert np.array_equal(_predict(again), np.load(expected))
  finally:
    del sys.modules["train_script"]


def test_a_float32_run_resumed_under_x64_is_refused_in_one_line(trained, tmp_path):
  """run.json records x64; a float32 run resumed with it on (other random task streams,
  another precision) is refused in one line saying how to resume it."""
  workdir = _copy_trained(trained, tmp_path)
  assert json.loads((workdir / "run.json").read_text())["x64"] is False
  longer = trained[1].replace(num_meta_steps=6)
  with jax.enable_x64(True), pytest.raises(vj.ConfigError) as error:
    _train(longer, workdir)
  text = _one_line(error)
  assert text.startswith(
    f"{workdir} holds a run trained with JAX_ENABLE_X64 off, and this process has it on: "
    "resumed, it would go on with other random task streams and precision. "
  )
  assert text.endswith("Resume it with JAX_ENABLE_X64=0 (or unset), or use another workdir")
  assert run_folder.latest_checkpoint_step(workdir) == 4  # nothing trained


def test_a_record_without_x64_is_a_float32_run(trained, tmp_path):
  """Run folders written before x64 was recorded resume silently without it
  (test_old_run_folders) and are refused under it, as float32 runs."""
  workdir = _copy_trained(trained, tmp_path)
  path = workdir / "run.json"
  path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "x64"}))
  run_folder.check_resumable(workdir, trained[1])
  with jax.enable_x64(True), pytest.raises(vj.ConfigError, match="JAX_ENABLE_X64 off"):
    run_folder.check_resumable(workdir, trained[1])


def test_a_run_trained_under_x64_records_it_and_resumes_only_under_it(trained, tmp_path):
  """The other way round: a record of x64 on refuses a process without it."""
  with jax.enable_x64(True):
    record = run_folder.run_record(regression.make_problem(trained[1]), trained[1])
  assert record["x64"] is True
  run_folder.write_run_record(tmp_path, record)
  with pytest.raises(vj.ConfigError) as error:
    run_folder.check_resumable(tmp_path, trained[1])
  assert "trained with JAX_ENABLE_X64 on" in _one_line(error) and "JAX_ENABLE_X64=1" in str(
    error.value
  )
  with jax.enable_x64(True):
    run_folder.check_resumable(tmp_path, trained[1])


def test_an_edited_x64_in_run_json_is_refused_as_an_edit(trained, tmp_path):
  """run.json's x64 is checked against the record its checkpoints carry, as the config is."""
  workdir = _copy_trained(trained, tmp_path)
  path = workdir / "run.json"
  path.write_text(json.dumps(dict(json.loads(path.read_text()), x64=True)))
  with pytest.raises(vj.RunFolderError, match="x64: False in the checkpoints, True in run.json"):
    vj.load_run(workdir)


def test_a_float32_run_predicts_the_same_numbers_under_x64(trained):
  """Under JAX_ENABLE_X64 a float32 Run computes as it trained: float32, the same numbers bit
  for bit (float64 would take other random draws); a run recorded with x64 gives float64."""
  run = vj.load_run(trained[0])
  expected = _predict(run)
  inputs = [a.astype(np.float64) for a in (SUPPORT_X, SUPPORT_Y, QUERY_X)]
  with jax.enable_x64(True):
    assert np.asarray(run.predict(*inputs, jax.random.key(3))).dtype == np.float32
    got = _predict(run)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      also = _predict(vj.load_run(trained[0]))
  assert np.array_equal(got, expected) and np.array_equal(also, expected)
  # A run recorded with x64 on computes in 64 bits in a process without it.
  as_x64 = pickle.loads(pickle.dumps(run))
  as_x64.record = dict(run.record, x64=True)
  assert np.asarray(as_x64.predict(*inputs, jax.random.key(3))).dtype == np.float64


def test_a_resume_whose_record_its_checkpoints_refuse_leaves_run_json_as_it_was(trained, tmp_path):
  """A run resumed with another network than its checkpoints hold is refused before its
  `run.json` is written: written, the folder would no longer load ("edited after training"),
  and a kept paper cell copied back after the failed call would carry it."""
  workdir = _copy_trained(trained, tmp_path)
  before = (workdir / "run.json").read_bytes()
  other = regression.make_problem(trained[1]).model.clone(hidden_sizes=(8, 4))
  with pytest.raises(vj.RunFolderError) as error:
    _train(trained[1].replace(num_meta_steps=6), workdir, model=other)
  assert "this run's record differs from the one its checkpoints carry (model:" in str(error.value)
  assert str(error.value).endswith("run.json is left as it was")
  assert (workdir / "run.json").read_bytes() == before
  assert _load(workdir)[0].step == 4  # the folder still loads
