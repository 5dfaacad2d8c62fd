"""Run folders at their edges: a partial newest checkpoint, a network class that no other
process can import, a run resumed under another `JAX_ENABLE_X64`, a loaded step that is not
the tested one, and a pickled `Run`.

Each case is right, or refused in one line that names the argument and the fix. One tiny
regression run (4 meta-steps, checkpoints at 2 and 4) is trained once and copied per test.
"""

import copy
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

import flax.linen as nn
import jax
import numpy as np
import pytest

import vampire_jax as vj
from conftest import REPO, tiny_regression_config
from experiments import regression
from vampire_jax.runs import run_folder

QUIET = dict(progress=False, print_fn=lambda message: None)
SUPPORT_X = np.linspace(-4.0, 4.0, 5, dtype=np.float32)[:, None]
SUPPORT_Y = np.sin(SUPPORT_X)
QUERY_X = np.linspace(-5.0, 5.0, 7, dtype=np.float32)[:, None]


def _train(config, workdir: Path, model=None) -> dict:
  problem = regression.make_problem(config)
  if model is not None:
    problem = problem._replace(model=model)
  return vj.train_and_evaluate(problem, config, workdir, **QUIET)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """`(workdir, config, results)`: 4 steps, checkpoints 2 and 4, `best/` and results.json."""
  workdir = tmp_path_factory.mktemp("edges") / "run"
  config = tiny_regression_config(num_meta_steps=4)
  return workdir, config, _train(config, workdir)


def _copy(trained, tmp_path: Path, *, best: bool = True) -> Path:
  """A copy of the trained run; without `best/`, `load_run` reads `checkpoints/`."""
  workdir = tmp_path / "run"
  shutil.copytree(trained[0], workdir)
  if not best:
    shutil.rmtree(workdir / "best")
  return workdir


def _load(workdir: Path, **kwargs):
  """`vj.load_run(workdir)` and the messages of the warnings it gave."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = vj.load_run(workdir, **kwargs)
  return run, [str(w.message) for w in caught]


def _predict(run):
  return np.asarray(run.predict(SUPPORT_X, SUPPORT_Y, QUERY_X, jax.random.key(3)))


def _equal(a, b) -> bool:
  """Equal leaves; a NamedTuple (`vj.Gaussian`) compares as the dict a checkpoint saves."""
  a, b = (x._asdict() if hasattr(x, "_asdict") else x for x in (a, b))
  leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
    np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b)
  )


def _saved_params(workdir: Path, step: int):
  return run_folder.read_checkpoint(workdir / "checkpoints", step)["meta_params"]


def _one_line(error: pytest.ExceptionInfo) -> str:
  text = str(error.value)
  assert len(text.splitlines()) == 1, text
  return text


def _tree(workdir: Path) -> list[str]:
  return sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))


# -- 1. A partial checkpoint is skipped, not taken for damage of them all ------------------------


def test_an_empty_newest_checkpoint_is_skipped_and_the_newest_complete_one_loads(trained, tmp_path):
  """An empty `checkpoints/400/` is named as incomplete and skipped in one line; step 4, the
  newest complete checkpoint, loads, and the folder is left as it was."""
  workdir = _copy(trained, tmp_path, best=False)
  (workdir / "checkpoints" / "400").mkdir()
  before = _tree(workdir)
  run, said = _load(workdir)
  assert run.step == 4 and _equal(run.meta_params, _saved_params(workdir, 4))
  assert said == [
    f"{workdir / 'checkpoints' / '400'} is incomplete (no default/ folder: an empty folder, or a "
    "copy or sync cut short), not a checkpoint; skipped it, using step 4, the newest complete one"
  ]
  assert _tree(workdir) == before  # a reader moves nothing (a read-only folder loads too)


def test_a_checkpoint_missing_its_default_folder_is_skipped_for_the_one_before(trained, tmp_path):
  """`checkpoints/4/` without `default/` (a copy cut short) is named as incomplete and skipped:
  step 2 loads."""
  workdir = _copy(trained, tmp_path, best=False)
  shutil.rmtree(workdir / "checkpoints" / "4" / "default")
  run, said = _load(workdir)
  assert run.step == 2 and _equal(run.meta_params, _saved_params(workdir, 2))
  assert f"{workdir / 'checkpoints' / '4'} is incomplete" in said[0]
  assert "using step 2, the newest complete one" in said[0]
  assert all(len(line.splitlines()) == 1 for line in said)


def test_a_partial_best_is_skipped_and_the_complete_best_loads(trained, tmp_path):
  """An empty `best/400/` is named as incomplete and skipped: the intact best loads, not the
  latest checkpoint."""
  workdir = _copy(trained, tmp_path)
  best_step = trained[2]["best_validation"]["step"]
  (workdir / "best" / "400").mkdir()
  run, said = _load(workdir)
  assert not any("does not restore" in line for line in said) and run.step == best_step
  assert _equal(run.meta_params, vj.load_run(trained[0]).meta_params)
  assert len(said) == 1 and f"{workdir / 'best' / '400'} is incomplete" in said[0]


def test_an_empty_checkpoint_999_does_not_claim_a_run_trained_to_999_on_resume(trained, tmp_path):
  """Empty `checkpoints/999` and `best/999` do not count as step 999: resuming with
  --num-meta-steps 6 goes on from step 4, and both are named and moved to damaged/."""
  workdir = _copy(trained, tmp_path)
  (workdir / "checkpoints" / "999").mkdir()
  (workdir / "best" / "999").mkdir()
  longer = trained[1].replace(num_meta_steps=6)
  assert run_folder.latest_checkpoint_step(workdir) == 4
  run_folder.check_resumable(workdir, longer)  # no claim of step 999
  lines = []
  results = vj.train_and_evaluate(
    regression.make_problem(longer), longer, workdir, progress=False, print_fn=lines.append
  )
  assert results["resumed_from_step"] == 4 and results["meta_steps"] == 6
  moved = [line for line in lines if "/999 is incomplete" in line]
  assert len(moved) == 2 and all("moved it to" in line for line in moved), lines
  aside = sorted(p.name.split("_")[:2] for p in (workdir / "damaged").iterdir())
  assert aside == [["best", "999"], ["checkpoint", "999"]]
  assert results["best_validation"]["step"] in (2, 4, 6)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4", "6"]


def test_step_folders_not_named_as_orbax_names_steps_are_not_checkpoints(trained, tmp_path):
  """`checkpoints/0400`, `400.bak` and a file `500` are not steps (orbax never lists them):
  the latest step is 4, the run resumes, and load_run gives step 4 with nothing to report."""
  workdir = _copy(trained, tmp_path, best=False)
  shutil.copytree(workdir / "checkpoints" / "4", workdir / "checkpoints" / "0400")
  shutil.copytree(workdir / "checkpoints" / "4", workdir / "checkpoints" / "400.bak")
  (workdir / "checkpoints" / "500").write_text("a file, not a step")
  assert run_folder.latest_checkpoint_step(workdir) == 4
  run_folder.check_resumable(workdir, trained[1])
  run, said = _load(workdir)
  assert run.step == 4 and said == []


# -- 8. A network class no other process can import -----------------------------------------------


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


class ActivationNet(nn.Module):
  """A network with a field run.json cannot record (a function)."""

  activation: Callable = nn.relu

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(self.activation(nn.Dense(4)(x)))


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
  from conftest import tiny_regression_config
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


def test_load_run_refuses_a_model_that_is_not_a_network_class_in_one_line(trained):
  """`model=` must be a flax module class, or a module that defines the recorded class."""
  with pytest.raises(vj.InputError) as error:
    vj.load_run(trained[0], model=3)
  assert _one_line(error).startswith("load_run: model is 3; pass the run's network class")
  with pytest.raises(vj.InputError) as error:
    vj.load_run(trained[0], model=vj.MLP((8, 8), 1))
  assert _one_line(error).startswith("load_run: model is an instance of MLP; pass the class")
  with pytest.raises(vj.InputError) as error:
    vj.load_run(trained[0], model=json)
  assert _one_line(error).startswith(
    "load_run: model is the module json, which defines no class MLP"
  )


class NarrowMLP(nn.Module):
  """Takes MLP's fields but builds other parameters (a network changed since training)."""

  hidden_sizes: tuple
  num_outputs: int
  kernel_init_gain: float = 1.0

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_outputs)(nn.relu(nn.Dense(3)(x)))


def test_a_network_with_other_parameters_is_refused_leaving_the_folder_intact(trained, tmp_path):
  """A network of other parameters is refused in one line naming the network, saying the
  folder is intact (never damaged), and the folder is left as it was."""
  workdir = _copy(trained, tmp_path)
  before = _tree(workdir)
  with pytest.raises(vj.RunFolderError) as error:
    vj.load_run(workdir, model=NarrowMLP)
  text = _one_line(error)
  assert "the network built here has other parameters than the checkpoint's" in text
  assert f"The run folder {workdir} is intact" in text and "damaged" not in text
  assert _tree(workdir) == before


# -- 9. JAX_ENABLE_X64 is recorded, and a resume under another is refused ------------------------


def test_a_float32_run_resumed_under_x64_is_refused_in_one_line(trained, tmp_path):
  """run.json records x64; a float32 run resumed with it on (other random task streams,
  another precision) is refused in one line saying how to resume it."""
  workdir = _copy(trained, tmp_path)
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
  workdir = _copy(trained, tmp_path)
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
  workdir = _copy(trained, tmp_path)
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


# -- 10. The step loaded, when it is not the tested one --------------------------------------------


def test_load_run_says_which_step_it_loads_when_results_tested_another(trained, tmp_path):
  """With checkpoint 4 deleted, load_run gives step 2's meta-parameters and says in one line
  that results.json's tested step 4 is not the one loaded."""
  workdir = _copy(trained, tmp_path, best=False)
  assert trained[2]["tested_step"] == 4
  intact, said = _load(workdir)
  assert (intact.step, intact.tested_step, said) == (4, 4, [])
  shutil.rmtree(workdir / "checkpoints" / "4")
  run, said = _load(workdir)
  assert (run.step, run.tested_step) == (2, 4)
  assert said == [
    f"load_run: {workdir} gives the meta-parameters of step 2 (from checkpoints/), not those of "
    "step 4, which results.json says the test scored: that step's checkpoint is missing or "
    "damaged (Run.step says which step is loaded)"
  ]
  assert _equal(run.meta_params, _saved_params(workdir, 2))


def test_a_results_json_naming_a_step_that_does_not_exist_is_said(trained, tmp_path):
  """A results.json of step 999 (copied from another run, say) is not the loaded step 4."""
  workdir = _copy(trained, tmp_path, best=False)
  path = workdir / "results.json"
  path.write_text(json.dumps(dict(json.loads(path.read_text()), tested_step=999)))
  run, said = _load(workdir)
  assert (run.step, run.tested_step) == (4, 999) and len(said) == 1 and "step 999" in said[0]
  path.write_text('{"tested_st')  # damaged: nothing to compare, said as damaged
  run, said = _load(workdir)
  assert (run.step, run.tested_step) == (4, None) and len(said) == 1 and "damaged" in said[0]


# -- 17. A Run pickles -------------------------------------------------------------------------


def test_a_run_pickles_and_predicts_the_same_without_its_folder(trained, tmp_path):
  """A Run pickles (and deep-copies) and predicts the same numbers without its folder."""
  workdir = _copy(trained, tmp_path)
  run = vj.load_run(workdir)
  expected = _predict(run)
  data = pickle.dumps(run)
  shutil.rmtree(workdir)  # rebuilt from what was pickled, not from the folder
  again = pickle.loads(data)
  assert again.config == run.config and again.record == run.record and again.step == run.step
  assert _equal(again.meta_params, run.meta_params)
  assert np.array_equal(_predict(again), expected)
  assert np.array_equal(_predict(copy.deepcopy(run)), expected)
