"""What the entry points refuse: the optimizer's task count through a wrapper, a donated
step, the device helpers, `vj.train_and_evaluate`'s problem and config,
`vj.check_inner_loop`'s causes, the caches' folders (old import paths are in
`test_old_import_paths.py`).

A refusal is one line that names the function, the argument and the fix; `vj.init_meta_state`
leaves the caller's params usable under a donated step; the caches follow `XDG_CACHE_HOME`.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vampire_jax as vj
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.host_chunked import (
  make_host_chunked_meta_step,
  make_host_chunked_train_step,
)
from vampire_jax.data import sine_line


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


SMALL_MLP = vj.MLP((8,), 1)


def _regression_learner(**settings):
  params = vj.init_params(SMALL_MLP, jax.random.key(0), (1, 1))
  learner = vj.vampire(
    vj.pure_apply(SMALL_MLP), vj.gaussian_nll(0.3), **{"num_inner_steps": 1, **settings}
  )
  return learner, params


def _sample(data, task_keys):
  del data
  return sine_line.tasks_from_keys(task_keys)


# -- Issue 49, item 5: the optimizer's task count through a wrapper --------------------------


def _train_one_step(optimizer, tasks_per_step):
  learner, params = _regression_learner()
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  step = jax.jit(vj.make_train_step(learner, optimizer, _sample, tasks_per_step=tasks_per_step))
  return step(state, None, jax.random.key(2))


def test_a_wrapped_meta_optimizer_of_another_task_count_is_refused_by_make_train_step():
  """make_train_step of 8 tasks refuses optax.chain(vj.meta_optimizer(tasks_per_step=4)),
  whose schedule counts 4 (its decay would come twice as late), naming the count to give; the
  agreeing count trains as the bare optimizer does, to the bit."""
  wrapped = optax.chain(vj.meta_optimizer(1e-3, tasks_per_step=4, decay_every_tasks=8))
  with pytest.raises(InputError) as raised:
    _train_one_step(wrapped, 8)
  assert _one_line(raised).startswith(
    "make_train_step: tasks_per_step=8, but the optimizer's vj.meta_optimizer (bare or inside "
    "a wrapper such as optax.chain) counts 4 tasks per step"
  )
  assert "vj.meta_optimizer(..., tasks_per_step=8)" in str(raised.value)
  # The count that agrees trains as the bare optimizer does, to the bit.
  bare = vj.meta_optimizer(1e-3, tasks_per_step=4, decay_every_tasks=8)
  (wrapped_state, wrapped_metrics), (bare_state, bare_metrics) = (
    _train_one_step(o, 4) for o in (wrapped, bare)
  )
  assert float(wrapped_metrics["loss"][0]) == float(bare_metrics["loss"][0])
  for a, b in zip(
    jax.tree_util.tree_leaves(wrapped_state.meta_params),
    jax.tree_util.tree_leaves(bare_state.meta_params),
  ):
    np.testing.assert_array_equal(a, b)


def test_a_meta_optimizer_under_masked_or_after_another_transformation_is_refused_too():
  """The count is read through any wrapper: optax.chain after clipping, and optax.masked."""
  inner = vj.meta_optimizer(1e-3, tasks_per_step=2)
  for wrapped in (
    optax.chain(optax.clip(1.0), inner),
    optax.masked(inner, lambda tree: jax.tree_util.tree_map(lambda _: True, tree)),
  ):
    with pytest.raises(InputError, match="tasks_per_step=4, but .* counts 2 tasks per step"):
      _train_one_step(wrapped, 4)


def test_make_train_step_without_a_count_says_a_wrapper_hides_it():
  """Without tasks_per_step, a vj.meta_optimizer inside optax.chain is refused saying that
  the wrapper hides its count, not that the optimizer is not vj.meta_optimizer's."""
  learner, _ = _regression_learner()
  wrapped = optax.chain(vj.meta_optimizer(1e-3, tasks_per_step=4))
  with pytest.raises(InputError) as raised:
    vj.make_train_step(learner, wrapped, _sample)
  assert "a wrapper such as optax.chain hides its T" in _one_line(raised)


def _meta_step_on(optimizer, num_tasks):
  learner, params = _regression_learner()
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(3), num_tasks))
  return jax.jit(vj.make_meta_step(learner, optimizer))(state, tasks, jax.random.key(4))


@pytest.mark.parametrize("wrap", [False, True], ids=["bare", "chained"])
def test_make_meta_step_refuses_a_task_batch_of_another_count_than_the_schedule(wrap):
  """make_meta_step refuses 8 tasks for a schedule counting 4, bare or wrapped; 4 tasks step."""
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=4)
  optimizer = optax.chain(optimizer) if wrap else optimizer
  with pytest.raises(InputError) as raised:
    _meta_step_on(optimizer, 8)
  assert _one_line(raised).startswith(
    "make_meta_step: the step was given 8 tasks (tasks' leading axis), but the optimizer's "
    "vj.meta_optimizer"
  )
  state, metrics = _meta_step_on(optimizer, 4)
  assert int(state.step) == 1 and bool(metrics["finite"])


def test_the_host_chunked_steps_refuse_another_count_too():
  """The host-chunked (CPU) train and meta steps refuse a schedule of another count too."""
  learner, params = _regression_learner()
  optimizer = optax.chain(vj.meta_optimizer(1e-3, tasks_per_step=2))
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  train_step = make_host_chunked_train_step(
    learner, optimizer, _sample, tasks_per_step=4, chunk_size=2
  )
  with pytest.raises(InputError, match="make_host_chunked_train_step: tasks_per_step=4, but"):
    train_step(state, None, jax.random.key(2))
  meta_step = make_host_chunked_meta_step(learner, optimizer, chunk_size=2)
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(3), 4))
  with pytest.raises(InputError, match="make_host_chunked_meta_step: the step was given 4 tasks"):
    meta_step(state, tasks, jax.random.key(4))
  two = jax.tree_util.tree_map(lambda x: x[:2], tasks)
  assert int(meta_step(state, two, jax.random.key(4))[0].step) == 1


# -- Issue 50, item 2: a donated step never deletes the caller's params ---------------------


@pytest.mark.parametrize("algorithm", ["vampire", "maml"])
def test_a_donated_train_step_leaves_the_params_given_to_init_meta_state_usable(algorithm):
  """A step jitted with donate_argnums=0, as make_train_step's docstring recommends, leaves
  the params given to vj.init_meta_state undeleted and unchanged (the state holds a copy:
  state.meta_params.mean for VAMPIRE, state.meta_params for MAML)."""
  params = vj.init_params(SMALL_MLP, jax.random.key(0), (1, 1))
  make = vj.vampire if algorithm == "vampire" else vj.maml
  learner = make(vj.pure_apply(SMALL_MLP), vj.gaussian_nll(0.3), num_inner_steps=1)
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  # Copies: a numpy view of a buffer (np.asarray on a CPU) would keep it from being donated.
  before = jax.tree_util.tree_map(lambda leaf: np.array(leaf, copy=True), params)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  step = jax.jit(vj.make_train_step(learner, optimizer, _sample), donate_argnums=0)
  state, _ = step(state, None, jax.random.key(2))
  assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(params))
  for leaf, saved in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(before)):
    np.testing.assert_array_equal(np.asarray(leaf + 0), saved)  # usable, and unchanged
  # The state starts from the same values as before the copy.
  fresh = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  central = getattr(fresh.meta_params, "mean", fresh.meta_params)
  for leaf, saved in zip(jax.tree_util.tree_leaves(central), jax.tree_util.tree_leaves(before)):
    np.testing.assert_array_equal(np.asarray(leaf), saved)


# -- Issue 49, item 15: the device helpers ---------------------------------------------------


@pytest.mark.parametrize("count", [0, -1, "2", 2.5, True])
def test_use_all_cpu_cores_refuses_a_count_that_is_not_a_positive_integer(count):
  """use_all_cpu_cores refuses 0, -1, '2', 2.5 and True in one line naming num_devices, the
  integer >= 1 it must be, and the value given."""
  with pytest.raises(InputError) as raised:
    vj.use_all_cpu_cores(count)
  assert _one_line(raised).startswith(
    f"use_all_cpu_cores: num_devices must be an integer >= 1, got {count!r}"
  )


def test_task_mesh_refuses_a_device_listed_twice_and_anything_but_devices():
  """task_mesh refuses [d, d], a single device d (naming [device]), [0] and [] in one line
  saying devices must be a list of distinct jax devices and what was given."""
  device = jax.devices()[0]
  cases = {
    "[d, d]": ([device, device], f"{device} more than once"),
    "d": (device, f"one device, {device} \\(use \\[device\\]\\)"),
    "[0]": ([0], "int 0"),
    "[]": ([], "none"),
  }
  for name, (devices, got) in cases.items():
    with pytest.raises(InputError, match="task_mesh: devices must be a list of distinct jax "):
      vj.task_mesh(devices)
    with pytest.raises(InputError, match=got) as raised:
      vj.task_mesh(devices)
    _one_line(raised)
  assert vj.task_mesh([device]).size == 1


def test_shard_tasks_refuses_one_task_without_its_task_axis():
  """shard_tasks refuses one task ([5, 1] support, [10, 1] query) whose leading axes differ,
  asking whether the task axis is missing; a batch goes through unchanged."""
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(0), 2))
  one = jax.tree_util.tree_map(lambda field: field[0], tasks)
  mesh = vj.task_mesh()
  with pytest.raises(InputError) as raised:
    vj.shard_tasks(one, mesh)
  assert _one_line(raised).startswith("shard_tasks: tasks.query_x must be 5 tasks")
  assert "one task without its leading task axis?" in str(raised.value)
  with pytest.raises(InputError, match=r"shard_tasks: tasks must be .* leading axes \[5, 10\]"):
    vj.shard_tasks(tuple(one), mesh)  # any tree: one leading count
  sharded = vj.shard_tasks(tasks, mesh)  # a batch goes through, values unchanged
  for a, b in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(tasks)):
    np.testing.assert_array_equal(a, b)


def test_a_mesh_argument_that_is_not_a_task_mesh_is_refused():
  """A device list, None or a string as the mesh is refused in one line by shard_tasks,
  replicate, make_meta_step and make_train_step, naming vj.task_mesh(devices); a mesh
  without a 'tasks' axis is refused naming its axes."""
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(0), 2))
  learner, _ = _regression_learner()
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=2)
  calls = {
    "shard_tasks": lambda: vj.shard_tasks(tasks, jax.devices()),
    "replicate": lambda: vj.replicate(tasks, None),
    "make_meta_step": lambda: vj.make_meta_step(learner, optimizer, mesh=jax.devices()),
    "make_train_step": lambda: vj.make_train_step(learner, optimizer, _sample, mesh="tasks"),
  }
  for where, call in calls.items():
    with pytest.raises(InputError) as raised:
      call()
    assert _one_line(raised).startswith(
      f"{where}: mesh must be a device mesh, vj.task_mesh(devices), got "
    )
  other_axis = jax.sharding.Mesh(np.asarray(jax.devices()), ("x",))
  with pytest.raises(InputError, match=r"an axis named 'tasks'\), got axes \('x',\)"):
    vj.shard_tasks(tasks, other_axis)


# -- Issue 49, item 13: vj.train_and_evaluate refuses before making a folder or loading data --

QUIET = dict(progress=False, print_fn=lambda message: None)


def _regression_problem_and_config():
  from conftest import tiny_regression_config
  from experiments import regression

  config = tiny_regression_config(num_meta_steps=2)
  return regression.make_problem(config), config


def _refused(problem, config, tmp_path, match):
  """train_and_evaluate's refusal, in one line, with no folder made."""
  workdir = tmp_path / "run"
  with pytest.raises(InputError, match=match) as raised:
    vj.train_and_evaluate(problem, config, workdir, **QUIET)
  assert not workdir.exists()  # refused before the folder is made
  return _one_line(raised)


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


def _classification_problem(num_outputs: int, ways: int = 5):
  """Random 8x8 'images' of 10 classes; a Conv4 of `num_outputs` outputs."""
  from vampire_jax.data import tasks_from_keys

  images = jax.random.randint(jax.random.key(0), (10, 4, 8, 8, 1), 0, 255).astype(jnp.uint8)

  def sample_tasks(class_images, task_keys):
    return tasks_from_keys(task_keys, class_images, ways=ways, shots=1, query=1)

  return vj.Problem(
    model=vj.Conv4(num_classes=num_outputs, num_filters=4),
    input_shape=(8, 8, 1),
    splits={"train": images, "val": images, "test": images},
    sample_tasks=sample_tasks,
    kind="classification",
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


def test_gaussian_nll_refuses_a_noise_std_given_as_a_string():
  """gaussian_nll refuses a noise_std given as a string, naming the argument and the value."""
  with pytest.raises(InputError) as raised:
    vj.gaussian_nll("0.3")
  message = _one_line(raised)
  assert message.startswith("gaussian_nll: noise_std ")  # the function and the argument
  assert "must be a number, not a string" in message and "got '0.3'" in message


# -- Issue 49, item 14: check_inner_loop names the real cause -------------------------------


def _inner_loop_case(**settings):
  learner, params = _regression_learner(**settings)
  meta_params = learner.init(params, jax.random.key(1))
  task = jax.tree_util.tree_map(
    lambda field: field[0], sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 1))
  )
  return learner, meta_params, task


@pytest.mark.parametrize(
  "field, value, name",
  [("support_y", jnp.nan, "task.support_y"), ("support_x", jnp.inf, "task.support_x")],
)
def test_check_inner_loop_names_non_finite_task_values_not_the_step_size(field, value, name):
  """NaN targets and infinite inputs are named as the task's field that must be finite,
  with the count of bad values, not blamed on inner_lr."""
  learner, meta_params, task = _inner_loop_case()
  bad = task._replace(**{field: getattr(task, field).at[0].set(value)})
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, meta_params, bad, jax.random.key(3))
  message = _one_line(raised)
  assert message.startswith(f"check_inner_loop: {name} ")  # the function and the field
  assert "must be finite" in message and "got 1 NaN or infinite values of 5" in message


def test_check_inner_loop_names_non_finite_meta_parameters():
  """NaN meta-parameters are refused naming the leaf of meta_params, not the KL factor."""
  learner, meta_params, task = _inner_loop_case()
  bad = jax.tree_util.tree_map(lambda leaf: leaf * jnp.nan, meta_params)
  with pytest.raises(InputError, match=r"check_inner_loop: meta_params\.mean\[.* free of NaN"):
    vj.check_inner_loop(learner, bad, task, jax.random.key(3))


@pytest.mark.parametrize("algorithm", ["vampire", "maml"])
def test_check_inner_loop_of_zero_inner_steps_says_so(algorithm):
  """A learner of num_inner_steps 0 is reported as taking no inner steps, without advice on
  inner_lr, and its loss is the support NLL at the meta-parameters."""
  params = vj.init_params(SMALL_MLP, jax.random.key(0), (1, 1))
  make = vj.vampire if algorithm == "vampire" else vj.maml
  learner = make(vj.pure_apply(SMALL_MLP), vj.gaussian_nll(0.3), num_inner_steps=0)
  _, _, task = _inner_loop_case()
  meta_params = learner.init(params, jax.random.key(1))
  report = vj.check_inner_loop(learner, meta_params, task, jax.random.key(3))
  assert not report.ok and report.loss_after == report.loss_before
  assert report.advice.startswith("the learner takes no inner steps (num_inner_steps 0)")
  assert "inner_lr" not in report.advice
  # The loss it reports is the support NLL at the meta-parameters, as with inner steps.
  stepping = make(vj.pure_apply(SMALL_MLP), vj.gaussian_nll(0.3), num_inner_steps=1)
  with_steps = vj.check_inner_loop(stepping, meta_params, task, jax.random.key(3))
  assert report.loss_before == pytest.approx(with_steps.loss_before, rel=1e-6)


def test_check_inner_loop_refuses_a_gaussian_for_maml_and_weights_for_vampire():
  """MAML given a vj.Gaussian, and VAMPIRE given a weight tree, are refused in one line
  naming what meta_params is and what the learner's init makes."""
  vampire, gaussian, task = _inner_loop_case()
  maml = vj.maml(vj.pure_apply(SMALL_MLP), vj.gaussian_nll(0.3), num_inner_steps=1)
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(maml, gaussian, task, jax.random.key(3))
  assert _one_line(raised).startswith(
    "check_inner_loop: meta_params is a vj.Gaussian, but this learner's init makes a weight tree"
  )
  with pytest.raises(InputError, match="meta_params is a weight tree, but .* makes a vj.Gaussian"):
    vj.check_inner_loop(vampire, gaussian.mean, task, jax.random.key(3))
  assert vj.check_inner_loop(maml, gaussian.mean, task, jax.random.key(3)).ok


def test_check_inner_loop_refuses_a_task_given_as_a_tuple_or_a_batch():
  """A task given as a tuple is refused naming vj.Task(*task); a batch of one task names
  task.support_x's shape under check_inner_loop, not `adapt`; an int key is refused."""
  learner, meta_params, task = _inner_loop_case()
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, meta_params, tuple(task), jax.random.key(3))
  message = _one_line(raised)
  assert message.startswith("check_inner_loop: task ")  # the function and the argument
  assert "must be one vj.Task(support_x, support_y, query_x, query_y)" in message
  assert "got tuple" in message and "wrap it: vj.Task(*task)" in message  # the value, the fix
  batch = jax.tree_util.tree_map(lambda field: field[None], task)
  with pytest.raises(InputError, match=r"check_inner_loop: task.support_x float32\[1, 5, 1\]"):
    vj.check_inner_loop(learner, meta_params, batch, jax.random.key(3))
  with pytest.raises(InputError, match="check_inner_loop: key must be a PRNG key"):
    vj.check_inner_loop(learner, meta_params, task, 3)
  assert vj.check_inner_loop(learner, meta_params, vj.Task(*tuple(task)), jax.random.key(3)).ok


def test_check_inner_loop_refuses_labels_outside_the_networks_classes():
  """5-way labels for a classifier of 3 outputs are refused naming the labels' range."""
  problem = _classification_problem(num_outputs=3)
  task = jax.tree_util.tree_map(
    lambda field: field[0],
    problem.sample_tasks(problem.splits["train"], jax.random.split(jax.random.key(0), 1)),
  )
  params = vj.init_params(problem.model, jax.random.key(0), (1, 8, 8, 1))
  learner = vj.maml(vj.pure_apply(problem.model), vj.categorical_nll, num_inner_steps=1)
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, params, task, jax.random.key(3))
  assert _one_line(raised).startswith(
    "check_inner_loop: task.support_y cannot be scored: categorical_nll: labels must be class "
    "indices in [0, 3) for 3 outputs"
  )


# -- Issue 50, item 7: the data cache and the XLA cache honour XDG_CACHE_HOME ----------------


def test_the_caches_honour_xdg_cache_home_unless_vampire_jax_cache_is_set(tmp_path, monkeypatch):
  """The data cache and the XLA cache go under an absolute XDG_CACHE_HOME, under
  VAMPIRE_JAX_CACHE where set, and under ~/.cache otherwise."""
  from experiments import cli
  from vampire_jax.data import default_cache_dir

  monkeypatch.delenv("VAMPIRE_JAX_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert default_cache_dir() == tmp_path / "xdg" / "vampire_jax"
  assert cli.compilation_cache_dir() == tmp_path / "xdg" / "vampire_jax" / "xla"
  before = jax.config.jax_compilation_cache_dir
  try:  # the command lines' XLA cache goes there
    cli.enable_compilation_cache_or_say_why_not()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xdg" / "vampire_jax" / "xla")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
  # Ours wins over XDG's; a relative XDG_CACHE_HOME is ignored, as the XDG spec asks.
  monkeypatch.setenv("VAMPIRE_JAX_CACHE", str(tmp_path / "ours"))
  assert default_cache_dir() == tmp_path / "ours"
  assert cli.compilation_cache_dir() == tmp_path / "ours" / "xla"
  monkeypatch.delenv("VAMPIRE_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
  assert default_cache_dir() == Path.home() / ".cache" / "vampire_jax"
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert default_cache_dir() == Path.home() / ".cache" / "vampire_jax"


def test_load_omniglot_reads_its_cache_under_xdg_cache_home(tmp_path, monkeypatch, omniglot_cache):
  """load_omniglot reads its cached arrays from XDG_CACHE_HOME's folder, not ~/.cache."""
  import shutil

  from conftest import OMNIGLOT_DIR
  from vampire_jax.data import load_omniglot
  from vampire_jax.data.omniglot import CACHE_FILENAME

  xdg_cache = tmp_path / "xdg" / "vampire_jax"
  xdg_cache.mkdir(parents=True)
  shutil.copy(omniglot_cache / CACHE_FILENAME, xdg_cache / CACHE_FILENAME)
  monkeypatch.delenv("VAMPIRE_JAX_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty ~/.cache: only XDG's holds it
  arrays = load_omniglot(OMNIGLOT_DIR, print_fn=lambda message: None)
  assert arrays.provenance["loaded"] == "cache"  # read from XDG's folder, not built again
  assert not (tmp_path / "home").exists()
  assert arrays.images.shape[1:] == (20, 28, 28)


@pytest.mark.parametrize(
  "keys, got",
  [
    (lambda: jax.random.key(3), "key<fry>[]"),  # one key for the batch
    (lambda: jax.random.split(jax.random.key(3), 2), "key<fry>[2]"),  # too few
    (lambda: jnp.zeros((3, 4), jnp.uint32), "uint32[3, 4]"),
  ],
)
def test_make_meta_gradient_wants_one_key_per_task(keys, got):
  # One key, two keys for three tasks, or raw key data of another shape are refused naming
  # task_keys, the count and jax.random.split; three keys, typed or raw, give one gradient.
  learner, params = _regression_learner()
  meta_params = learner.init(params, jax.random.key(1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 3))
  meta_gradient = vj.make_meta_gradient(learner)
  with pytest.raises(InputError) as raised:
    meta_gradient(meta_params, tasks, keys())
  message = _one_line(raised)
  assert message.startswith("meta_gradient: task_keys ")  # the function and the argument
  assert "must be 3 PRNG keys, one per task" in message and f"got {got}" in message
  assert "jax.random.split(key, 3)" in message  # the fix
  grads, _ = meta_gradient(meta_params, tasks, jax.random.split(jax.random.key(3), 3))
  raw = jax.random.key_data(jax.random.split(jax.random.key(3), 3))  # uint32[3, 2] works too
  same = jax.tree.map(np.array_equal, grads, meta_gradient(meta_params, tasks, raw)[0])
  assert all(jax.tree.leaves(same))
