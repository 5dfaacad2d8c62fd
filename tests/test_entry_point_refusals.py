"""What the entry points refuse: the optimizer's task count through a wrapper, a donated
step, the device helpers, `vj.train_and_evaluate`'s problem and config,
`vj.check_inner_loop`'s causes, the caches' folders (found by the fourth sweep, issue 49,
and a newcomer, issue 50; old import paths are in `test_old_import_paths.py`).

Issue 49: the optimizer's task count through a wrapper (item 5),
`vj.train_and_evaluate`'s problem and config (13), `vj.check_inner_loop`'s causes (14) and
the device helpers (15). Issue 50: `vj.init_meta_state` and donated steps (item 2), the
caches under `XDG_CACHE_HOME` (7). Each case was silent, or refused in a poor message,
before: its test says what happened ("Before: ..."), and a refusal is one line that names
the function, the argument and the fix.
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
  """Before: optax.chain(vj.meta_optimizer(tasks_per_step=4)) trained 8 tasks a step with a
  schedule counting 4 (its decay came twice as late), without a word."""
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
  """Before: any wrapper (optax.chain after clipping, optax.masked) lost the count."""
  inner = vj.meta_optimizer(1e-3, tasks_per_step=2)
  for wrapped in (
    optax.chain(optax.clip(1.0), inner),
    optax.masked(inner, lambda tree: jax.tree_util.tree_map(lambda _: True, tree)),
  ):
    with pytest.raises(InputError, match="tasks_per_step=4, but .* counts 2 tasks per step"):
      _train_one_step(wrapped, 4)


def test_make_train_step_without_a_count_says_a_wrapper_hides_it():
  """Before: "required with an optimizer not built by vj.meta_optimizer", said of an
  optimizer that was built by it and then wrapped."""
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
  """Before: make_meta_step given 8 tasks trained with a schedule counting 4, bare or wrapped."""
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
  """Before: the CPU steps took the optimizer's schedule of any count."""
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
  """Before: state.meta_params.mean (VAMPIRE) or state.meta_params (MAML) was the caller's
  params object, and one step jitted with donate_argnums=0, as make_train_step's docstring
  recommends, deleted it: "Array has been deleted" surfaced later, elsewhere."""
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
  """Before: 0, '2' and 2.5 were accepted without a word (returned early where the count was
  chosen already, else set, and JAX failed later: "new int config value must be ... int",
  or "Could not determine process_index" when the first computation started)."""
  with pytest.raises(InputError) as raised:
    vj.use_all_cpu_cores(count)
  assert _one_line(raised).startswith(
    f"use_all_cpu_cores: num_devices must be an integer >= 1, got {count!r}"
  )


def test_task_mesh_refuses_a_device_listed_twice_and_anything_but_devices():
  """Before: [d, d] made a mesh of 2 "devices", and an empty AssertionError came when it
  was used; a single device gave "'Device' object is not iterable"; [0] made a mesh of 0."""
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
  """Before: one task's [5, 1] support and [10, 1] query came back "sharded" as if
  5 support points were 5 tasks (and 10 queries 10 tasks)."""
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
  """Before: a device list as the mesh gave AttributeError "'list' object has no attribute
  'size'"; None to vj.replicate, a pybind "incompatible function arguments" of 5 lines."""
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
  """Before: TypeError "Problem.__new__() missing 4 required positional arguments"."""
  _, config = _regression_problem_and_config()
  _refused(
    vj.Problem, config, tmp_path, r"train_and_evaluate: problem is the class Problem itself; "
  )


@pytest.mark.parametrize("missing", ["val", "test"])
def test_splits_without_val_or_test_are_refused_before_the_folder_is_made(tmp_path, missing):
  """Before: KeyError 'val' (or 'test') after the folder and its run record were made."""
  problem, config = _regression_problem_and_config()
  splits = {name: data for name, data in problem.splits.items() if name != missing}
  _refused(
    problem._replace(splits=splits),
    config,
    tmp_path,
    r"train_and_evaluate: problem.splits must be a dict with 'train' .*, 'val' .* and 'test'",
  )


def test_a_function_problem_is_checked_before_the_folder_too(tmp_path):
  """Before: the function's problem was used unchecked, and failed after the folder."""
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
  """Before: (3,) failed in adapt ("prior and support_x do not fit together") after the
  folder was made; '1' with "Shapes must be 1D sequences of concrete values of integer
  type"."""
  problem, config = _regression_problem_and_config()
  _refused(problem._replace(input_shape=input_shape), config, tmp_path, message)


def test_a_regression_model_of_more_outputs_than_targets_is_refused(tmp_path):
  """Before: "adapt: support_y does not fit the network's outputs", after the folder."""
  problem, config = _regression_problem_and_config()
  _refused(
    problem._replace(model=vj.MLP((8,), 2)),
    config,
    tmp_path,
    r"problem.model gives outputs float32\[5, 2\] for the training tasks' targets "
    r"float32\[5, 1\] \(support_y\): give the model 1 output",
  )


def test_a_sampler_that_fails_or_returns_no_task_is_refused_before_the_folder(tmp_path):
  """Before: the sampler's own TypeError, or "tasks must be a vampire_jax.Task" from the
  train step, after the folder was made."""
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
  """Before: the run's folder was made and training refused with "the support loss went
  non-finite (nan -> nan) ... use kl_weight 0.3 or lower inner_lr", advice that no setting
  could follow (labels 3 and 4 have no output)."""
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
  """Before: AttributeError "'dict' object has no attribute 'algorithm'"."""
  import dataclasses

  problem, config = _regression_problem_and_config()
  given = dataclasses.asdict(config) if as_given == "dict" else vj.RunConfig
  got = (
    "a dict; build one: vj.RunConfig\\(\\*\\*config\\)"
    if as_given == "dict"
    else ("the class RunConfig itself")
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
  """Before: '0.3' gave TypeError "'>' not supported between instances of 'str' and 'int'",
  after the folder was made (None and -0.3 too, in messages without the argument's name)."""
  problem, config = _regression_problem_and_config()
  _refused(
    problem._replace(noise_std=noise_std),
    config,
    tmp_path,
    rf"train_and_evaluate: problem.noise_std \(the likelihood's noise\) must be {got}",
  )


def test_gaussian_nll_refuses_a_noise_std_given_as_a_string():
  """Before: TypeError "'>' not supported between instances of 'str' and 'int'"."""
  with pytest.raises(InputError) as raised:
    vj.gaussian_nll("0.3")
  assert _one_line(raised) == "gaussian_nll: noise_std must be a number, not a string, got '0.3'"


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
  """Before: "the support loss went non-finite (nan -> nan) in the inner loop; lower
  inner_lr (e.g. tenfold)" for NaN targets and infinite inputs."""
  learner, meta_params, task = _inner_loop_case()
  bad = task._replace(**{field: getattr(task, field).at[0].set(value)})
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, meta_params, bad, jax.random.key(3))
  assert _one_line(raised) == (
    f"check_inner_loop: {name} must be finite, got 1 NaN or infinite values of 5"
  )


def test_check_inner_loop_names_non_finite_meta_parameters():
  """Before: NaN meta-parameters got advice about the KL factor ("narrowest log-std nan")."""
  learner, meta_params, task = _inner_loop_case()
  bad = jax.tree_util.tree_map(lambda leaf: leaf * jnp.nan, meta_params)
  with pytest.raises(InputError, match=r"check_inner_loop: meta_params\.mean\[.* free of NaN"):
    vj.check_inner_loop(learner, bad, task, jax.random.key(3))


@pytest.mark.parametrize("algorithm", ["vampire", "maml"])
def test_check_inner_loop_of_zero_inner_steps_says_so(algorithm):
  """Before: "the support loss did not fall (18.82 -> 18.82) in the inner loop; lower
  inner_lr (e.g. tenfold)" for a learner that takes no inner step."""
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
  """Before: MAML given a Gaussian failed deep in flax ("The first argument passed to an
  apply function should be a dictionary of collections..."); VAMPIRE given weights with
  TypeError "expected a vampire_jax.Gaussian, got dict"."""
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
  """Before: AttributeError "'tuple' object has no attribute 'support_x'"; a batch of one
  task was blamed on `adapt`, a function the caller never called."""
  learner, meta_params, task = _inner_loop_case()
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, meta_params, tuple(task), jax.random.key(3))
  assert _one_line(raised) == (
    "check_inner_loop: task must be one vj.Task(support_x, support_y, query_x, query_y), "
    "got tuple (wrap it: vj.Task(*task))"
  )
  batch = jax.tree_util.tree_map(lambda field: field[None], task)
  with pytest.raises(InputError, match=r"check_inner_loop: task.support_x float32\[1, 5, 1\]"):
    vj.check_inner_loop(learner, meta_params, batch, jax.random.key(3))
  with pytest.raises(InputError, match="check_inner_loop: key must be a PRNG key"):
    vj.check_inner_loop(learner, meta_params, task, 3)
  assert vj.check_inner_loop(learner, meta_params, vj.Task(*tuple(task)), jax.random.key(3)).ok


def test_check_inner_loop_refuses_labels_outside_the_networks_classes():
  """Before: a classifier of 3 outputs on 5-way labels got "lower inner_lr"."""
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
  """Before: both caches went to ~/.cache/vampire_jax whatever XDG_CACHE_HOME said."""
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
  """Before: load_omniglot looked for its cached arrays in ~/.cache/vampire_jax regardless."""
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
  # Before: a raw `vmap` error (one key: "rank should be at least 1"; two keys for three
  # tasks: "inconsistent sizes"), naming neither the argument nor the fix.
  learner, params = _regression_learner()
  meta_params = learner.init(params, jax.random.key(1))
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 3))
  meta_gradient = vj.make_meta_gradient(learner)
  with pytest.raises(InputError) as raised:
    meta_gradient(meta_params, tasks, keys())
  assert _one_line(raised) == (
    "meta_gradient: task_keys must be 3 PRNG keys, one per task: jax.random.split(key, 3),"
    f" got {got}"
  )
  grads, _ = meta_gradient(meta_params, tasks, jax.random.split(jax.random.key(3), 3))
  raw = jax.random.key_data(jax.random.split(jax.random.key(3), 3))  # uint32[3, 2] works too
  same = jax.tree.map(np.array_equal, grads, meta_gradient(meta_params, tasks, raw)[0])
  assert all(jax.tree.leaves(same))
