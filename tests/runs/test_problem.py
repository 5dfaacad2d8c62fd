"""What the entry points refuse: the optimizer's task count through a wrapper, a donated
step, the device helpers, `vj.train_and_evaluate`'s problem and config,
`vj.check_inner_loop`'s causes, the caches' folders (old import paths are in
`tests/project/test_deprecations.py`).

A refusal is one line that names the function, the argument and the fix; `vj.init_meta_state`
leaves the caller's params usable under a donated step; the caches follow `XDG_CACHE_HOME`.
"""

import jax
import numpy as np
import pytest
from flax import nnx

import vampire_jax as vj
from experiments import regression
from tests.helpers import _classification_problem, _regression_problem_and_config
from vampire_jax._src.core.errors import InputError
from vampire_jax.runs import problem as problem_lib


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


def test_splits_draw_different_tasks_and_the_truth_matches_the_queries():
  config = regression.get_config("quick", "maml")
  problem = regression.make_problem(config)
  key = jax.random.key(0)
  train = problem_lib.draw_tasks(problem, "train", key, 3)
  test = problem_lib.draw_tasks(problem, "test", key, 3)
  assert not np.allclose(train.support_x, test.support_x)
  # The noiseless truth of the sampled tasks: the targets are it plus N(0, 0.3^2) noise.
  keys = jax.random.split(jax.random.key(1), 2000)
  tasks = problem.sample_tasks(problem.splits["val"], keys)
  truth = problem.query_truth(problem.splits["val"], keys)
  residual = np.asarray(tasks.query_y - truth)
  assert abs(residual.mean()) < 0.01 and abs(residual.std() - config.noise_std) < 0.01


def test_the_class_vj_problem_itself_is_refused(tmp_path):
  """The class vj.Problem given as the problem is refused in one line, before any folder."""
  _, config = _regression_problem_and_config()
  _refused(
    vj.Problem, config, tmp_path, r"train_and_evaluate: problem is the class Problem itself; "
  )


@pytest.mark.parametrize("missing", ["val", "test"])
def test_splits_without_val_or_test_are_refused_before_the_folder_is_made(tmp_path, missing):
  """Splits without 'val' (or 'test') are refused naming the three splits, before the folder."""
  problem, config = _regression_problem_and_config()
  splits = {name: data for name, data in problem.splits.items() if name != missing}
  _refused(
    problem._replace(splits=splits),
    config,
    tmp_path,
    r"train_and_evaluate: problem.splits must be a dict with 'train' .*, 'val' .* and 'test'",
  )


def test_a_function_problem_is_checked_before_the_folder_too(tmp_path):
  """A problem given as a function is checked, and refused, before the folder is made."""
  problem, config = _regression_problem_and_config()
  splits = {name: data for name, data in problem.splits.items() if name != "val"}
  _refused(lambda: problem._replace(splits=splits), config, tmp_path, "problem.splits must be")


@pytest.mark.parametrize(
  "input_shape, message",
  [
    (
      (3,),
      r"problem.input_shape is \(3,\), but the training tasks' examples are \(1,\) .*"
      r"set input_shape=\(1,\)",
    ),
    ("1", "problem.input_shape must be a tuple of positive integers, got str '1'"),
    ((0,), r"problem.input_shape must be a tuple of positive integers, got tuple \(0,\)"),
  ],
)
def test_a_wrong_input_shape_is_refused_naming_the_shape_of_the_tasks(
  tmp_path, input_shape, message
):
  """input_shape (3,) for tasks of (1,) examples is refused naming both shapes and the fix;
  '1' and (0,) are refused as not a tuple of positive integers; all before the folder."""
  problem, config = _regression_problem_and_config()
  _refused(problem._replace(input_shape=input_shape), config, tmp_path, message)


def test_a_regression_model_of_more_outputs_than_targets_is_refused(tmp_path):
  """A model of 2 outputs for 1 target is refused naming both shapes and the output count to
  give, before the folder is made."""
  problem, config = _regression_problem_and_config()
  _refused(
    problem._replace(model=vj.MLP((8,), 2)),
    config,
    tmp_path,
    r"problem.model gives outputs float32\[5, 2\] for the training tasks' targets "
    r"float32\[5, 1\] \(support_y\): give the model 1 output",
  )


def test_a_sampler_that_fails_or_returns_no_task_is_refused_before_the_folder(tmp_path):
  """A sampler that raises is refused naming the call and its error; one that returns a
  tuple, saying tasks must be a vampire_jax.Task; both before the folder is made."""
  problem, config = _regression_problem_and_config()
  _refused(
    problem._replace(sample_tasks=lambda task_keys: problem.sample_tasks(None, task_keys)),
    config,
    tmp_path,
    r"train_and_evaluate: problem.sample_tasks\(problem.splits\['train'\], task_keys\) failed "
    r"\(TypeError: ",
  )
  _refused(
    problem._replace(sample_tasks=lambda data, keys: tuple(problem.sample_tasks(data, keys))),
    config,
    tmp_path,
    r"train_and_evaluate: problem.sample_tasks\(.*\): tasks must be a vampire_jax.Task",
  )


def test_a_classifier_of_fewer_outputs_than_ways_is_refused_naming_the_outputs(tmp_path):
  """A classifier of 3 outputs on 5-way tasks (labels 3 and 4 have no output) is refused
  before the folder, naming the outputs, the ways and the fix, with no advice on inner_lr."""
  _, config = _regression_problem_and_config()
  message = _refused(
    _classification_problem(num_outputs=3),
    config,
    tmp_path,
    r"train_and_evaluate: problem.model has 3 outputs, but the training tasks' labels go up "
    r"to 4 \(5 ways\): give the model 5 outputs",
  )
  assert "inner_lr" not in message


@pytest.mark.parametrize(
  "noise_std, got",
  [
    ("0.3", "a number, not a string, got '0.3'"),
    (None, "a number, got NoneType"),
    (-0.3, "a finite number > 0, got -0.3"),
  ],
)
def test_a_regression_noise_std_that_is_not_a_positive_number_is_refused(tmp_path, noise_std, got):
  """problem.noise_std '0.3', None and -0.3 are refused before the folder, naming the field
  (the likelihood's noise), what it must be and the value given."""
  problem, config = _regression_problem_and_config()
  _refused(
    problem._replace(noise_std=noise_std),
    config,
    tmp_path,
    rf"train_and_evaluate: problem.noise_std \(the likelihood's noise\) must be {got}",
  )


def test_a_problem_of_an_nnx_network_is_refused_saying_the_loop_takes_linen(tmp_path):
  config = regression.get_config("quick", "maml")
  problem = regression.make_problem(config)._replace(model=nnx.Linear(1, 1, rngs=nnx.Rngs(0)))
  with pytest.raises(vj.InputError) as error:
    vj.train_and_evaluate(problem, config, tmp_path / "run", progress=False)
  message = str(error.value)
  assert "problem.model" in message and "flax.linen module" in message
  assert "vj.from_nnx" in message and "vj.make_train_step" in message
  assert not (tmp_path / "run").exists()
  assert "linen" in vj.Problem.__doc__.split("input_shape:")[0]
