"""ProtoNet (Snell et al. 2017): prototypes, distances and the learner, by closed forms (issue 51).

`tests/benchmark_scripts/test_authors_pytorch_head.py` checks an episode against the authors' ProtoNet.py;
`tests/experiment_scripts/test_vampire2_protonet_runs.py` runs it through the experiments end to end.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, presets
from vampire_jax.runs import algorithms, settings


def _embedding(num_features=6):
  model = vj.MLP((num_features,), None)  # an embedding: the ReLU units, no output layer
  return model, vj.init_params(model, jax.random.key(0), (1, 4))


def _episode(key, ways=3, shots=2, query=4):
  """Gaussian blobs: class k's inputs around its own centre in the first two dimensions,
  with a nuisance noise 8 times wider in the other two (what meta-training learns to ignore)."""
  k_centres, k_support, k_query = jax.random.split(key, 3)
  centres = jnp.concatenate(
    [2.0 * jax.random.normal(k_centres, (ways, 2)), jnp.zeros((ways, 2))], 1
  )
  scale = jnp.array([0.5, 0.5, 4.0, 4.0])
  support_y = jnp.repeat(jnp.arange(ways), shots)
  query_y = jnp.repeat(jnp.arange(ways), query)
  support_x = centres[support_y] + scale * jax.random.normal(k_support, (ways * shots, 4))
  query_x = centres[query_y] + scale * jax.random.normal(k_query, (ways * query, 4))
  return vj.Task(support_x, support_y, query_x, query_y)


WAYS = 3


SUPPORT_Y = jnp.array([0, 1, 2, 0, 1, 2])


QUERY_Y = jnp.array([0, 1, 2, 2])


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _learner(distance="squared_euclidean", **counts):
  model = vj.MLP((6,), None)
  params = vj.init_params(model, jax.random.key(0), (1, 4))
  counts = {"num_classes": WAYS, **counts}
  return vj.baselines.protonet(vj.pure_apply(model), distance=distance, **counts), params


def _tasks(support_ys, query_ys=None):
  """Tasks of `WAYS` Gaussian blobs with the given support (and query) labels."""
  num = len(support_ys)
  keys = jax.random.split(jax.random.key(1), 2)
  support_x = jax.random.normal(keys[0], (num, len(SUPPORT_Y), 4))
  query_x = jax.random.normal(keys[1], (num, len(QUERY_Y), 4))
  query_ys = [QUERY_Y] * num if query_ys is None else query_ys
  return vj.Task(support_x, jnp.stack(support_ys), query_x, jnp.stack(query_ys))


def test_protonet_keeps_snells_squared_distance_and_says_the_authors_differ():
  for experiment in ("omniglot", "mini_imagenet"):
    for preset in presets.PRESETS[experiment]:
      if preset == "authors2019":
        continue  # VAMPIRE's only
      config = presets.get_config(experiment, preset, "protonet")
      assert config.algorithm.distance == "squared_euclidean"
  help_text = settings.field_help(vj.specs.Protonet)["distance"]  # --protonet-distance
  assert "Snell" in help_text and "euclidean (the VAMPIRE authors' ProtoNet.py" in help_text


def test_prototypes_are_class_means_and_logits_minus_distances():
  embeddings = jnp.array([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
  labels = jnp.array([1, 1, 0, 1])
  prototypes = vj.baselines.class_prototypes(embeddings, labels, 2)
  np.testing.assert_allclose(prototypes, [[0.0, 3.0], [1.0, 1.0 / 3.0]], rtol=1e-6)
  queries = jnp.array([[0.0, 3.0], [4.0, 3.0]])
  squared = [[0.0, 1.0 + (8.0 / 3.0) ** 2], [16.0, 9.0 + (8.0 / 3.0) ** 2]]
  np.testing.assert_allclose(vj.baselines.prototype_logits(queries, prototypes), -np.array(squared))
  np.testing.assert_allclose(
    vj.baselines.prototype_logits(queries, prototypes, "euclidean"),
    -np.sqrt(squared),
    rtol=1e-6,
  )


def test_the_euclidean_distance_has_a_finite_gradient_where_it_is_zero():
  # As torch.norm's: 0 at a distance of 0 (the square root's would be infinite, NaN here).
  def logit(query):
    return vj.baselines.prototype_logits(query[None], jnp.array([[1.0, 2.0]]), "euclidean")[0, 0]

  np.testing.assert_array_equal(jax.grad(logit)(jnp.array([1.0, 2.0])), [0.0, 0.0])
  np.testing.assert_allclose(jax.grad(logit)(jnp.array([4.0, 6.0])), [-0.6, -0.8], rtol=1e-6)


def test_squared_distance_logits_are_a_linear_classifier_of_the_embedding():
  # -|f - c_k|^2 = 2 c_k.f - |c_k|^2 - |f|^2, and |f|^2 is the same for every class: the
  # softmax is that of a linear layer with weights 2 c_k and biases -|c_k|^2 (Snell et al.).
  model, params = _embedding()
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=3)
  task = _episode(jax.random.key(1))
  task_params = learner.adapt(params, task.support_x, task.support_y, jax.random.key(2))
  logits = learner.predict(task_params, task.query_x, jax.random.key(3))[0]
  features = vj.pure_apply(model)(params, task.query_x)
  c = task_params.prototypes
  linear = features @ (2 * c.T) - jnp.sum(c**2, axis=1)
  np.testing.assert_allclose(jax.nn.softmax(logits), jax.nn.softmax(linear), atol=1e-5)


def test_the_learner_is_deterministic_and_the_query_loss_is_the_mean_cross_entropy():
  model, params = _embedding()
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=3)
  task = _episode(jax.random.key(1))
  meta = learner.init(params, jax.random.key(5))
  assert meta is params and learner.meta_loss is None
  a, outputs = vj.query_loss(learner, meta, task, jax.random.key(2))
  b, _ = vj.query_loss(learner, meta, task, jax.random.key(3))
  assert float(a) == float(b) and outputs.shape == (1, 12, 3)  # one "draw"
  log_p = jax.nn.log_softmax(outputs[0])
  expected = -jnp.mean(log_p[jnp.arange(12), task.query_y])
  np.testing.assert_allclose(float(a), float(expected), rtol=1e-6)
  report = vj.check_inner_loop(learner, meta, task, jax.random.key(4))
  assert report.ok and report.loss_before == report.loss_after  # no inner loop to check


def test_check_inner_loop_checks_a_protonet_task_as_any_other():
  """ProtoNet has no loop to check, but its arguments are checked as the others' are: a
  task given as a tuple is refused naming vj.Task(*task)."""
  model, params = _embedding()
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=3)
  task = _episode(jax.random.key(1))
  with pytest.raises(vj.InputError) as error:
    vj.check_inner_loop(learner, params, tuple(task), jax.random.key(4))
  message = str(error.value)
  assert len(message.splitlines()) == 1, message
  assert message.startswith("check_inner_loop: task ")  # the function and the argument
  assert "must be one vj.Task(support_x, support_y, query_x, query_y)" in message
  assert "got tuple" in message and "wrap it: vj.Task(*task)" in message  # the value, the fix


def test_training_episodes_of_more_ways_build_that_many_prototypes():
  model, params = _embedding()
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=2, train_num_classes=4)
  task = _episode(jax.random.key(1), ways=4)
  loss, outputs = learner.meta_loss(params, task, jax.random.key(2))
  assert outputs.shape == (1, 16, 4)
  four_way = vj.baselines.protonet(vj.pure_apply(model), num_classes=4)
  np.testing.assert_allclose(
    float(loss), float(vj.query_loss(four_way, params, task, jax.random.key(0))[0])
  )
  # adapt and predict (evaluation, Run.predict) are 2-way.
  two_way = _episode(jax.random.key(3), ways=2)
  task_params = learner.adapt(params, two_way.support_x, two_way.support_y, None)
  assert learner.predict(task_params, two_way.query_x, None).shape == (1, 8, 2)


def test_meta_training_separates_unseen_classes():
  # 150 meta-steps on Gaussian-blob episodes: query accuracy on 100 new episodes rises far
  # above the untrained embedding's (observed 0.48 -> 0.91).
  model = vj.MLP((32,), None)
  params = vj.init_params(model, jax.random.key(0), (1, 4))
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=3)
  optimizer = vj.meta_optimizer(1e-2, tasks_per_step=8)
  state = vj.init_meta_state(learner, optimizer, params, jax.random.key(1))
  step = jax.jit(vj.make_meta_step(learner, optimizer))
  episodes = jax.vmap(_episode)
  test = episodes(jax.random.split(jax.random.key(99), 100))
  evaluate = jax.jit(vj.make_classification_evaluator(learner))
  before = float(evaluate(state.meta_params, test, jax.random.key(2)).accuracy.mean())
  for i in range(150):
    state, _ = step(state, episodes(jax.random.split(jax.random.key(i + 10), 8)), jax.random.key(i))
  after = float(evaluate(state.meta_params, test, jax.random.key(2)).accuracy.mean())
  assert after > 0.85 and after > before + 0.3, (before, after)


@pytest.mark.parametrize(
  "call, says",
  [
    (
      lambda learner, p, x: learner.adapt(p, x, jnp.array([0, 0, 1, 1, 0, 1]), None),
      r"protonet.adapt: support_y must be labels with an example of every class 0..2 .*"
      r"got none of classes \[2\]",
    ),
    (
      lambda learner, p, x: learner.adapt(p, x, jnp.array([0, 1, 2, 3, 0, 1]), None),
      r"protonet.adapt: support_y must be class indices in \[0, 3\)",
    ),
    (
      lambda learner, p, x: learner.adapt(p, x, jnp.arange(6.0), None),
      r"protonet.adapt: support_y must be \[examples\] integer labels",
    ),
    (
      lambda learner, p, x: vj.baselines.protonet(learner, num_classes=0),
      r"protonet: num_classes must be an integer >= 1, got 0",
    ),
    (
      lambda learner, p, x: vj.baselines.protonet(learner, num_classes=3, distance="cosine"),
      r"protonet: distance must be one of squared_euclidean, euclidean, got 'cosine'",
    ),
  ],
)
def test_bad_input_is_refused_in_one_line(call, says):
  model, params = _embedding()
  learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (6, 4))
  with pytest.raises(vj.InputError, match=says) as raised:
    call(learner, params, x)
  assert len(str(raised.value).splitlines()) == 1


def test_networks_without_a_head_are_embeddings():
  conv = vj.Conv4(num_classes=None, num_filters=8)
  params = vj.init_params(conv, jax.random.key(0), (1, 28, 28, 1))
  assert "head" not in params
  x = jnp.zeros((3, 28, 28, 1))
  assert vj.pure_apply(conv)(params, x).shape == (3, 2 * 2 * 8)  # 28 -> 14 -> 7 -> 4 -> 2
  mlp = vj.MLP((16, 8), None)
  mlp_params = vj.init_params(mlp, jax.random.key(0), (1, 5))
  assert len(mlp_params) == 2 and vj.pure_apply(mlp)(mlp_params, jnp.ones((3, 5))).shape == (3, 8)


def test_the_registry_builds_protonet_and_refuses_what_it_does_not_take():
  """The preset's ProtoNet is its spec with the factory's defaults: no inner loop, no KL, no
  draws, so no field for them; another algorithm's option is refused naming the specs that
  take it, and the command line says it is not applied."""
  from experiments import presets

  config = presets.get_config("omniglot", "quick", "protonet")
  assert config.algorithm == vj.specs.Protonet()
  assert not {"kl_weight", "num_inner_steps", "num_mc_test"} & set(config.flat())
  assert config.algorithm.test_draws is None
  assert algorithms.network_outputs(config) is None
  assert algorithms.network_outputs(config.replace(algorithm="maml")) == 5
  algorithms.check_config(config)
  for field, value, owner in (
    ("inner_lr", 0.5, "Maml"),
    ("num_inner_steps", 5, "Maml"),
    ("kl_weight", 0.1, "Vampire"),
    ("num_mc_test", 10, "Vampire"),
    ("first_order", True, "Maml"),
    ("outer_kl_weight", 0.1, "Vampire2"),
  ):
    with pytest.raises(vj.ConfigError) as raised:
      config.replace(**{field: value})
    message = str(raised.value)
    assert f"{field} is not a setting of protonet" in message and owner in message, message
    assert len(message.splitlines()) == 1
    notes = []
    kept = cli.apply_overrides(config, argparse.Namespace(**{field: value}), print_fn=notes.append)
    assert kept == config
    flag = field.replace("_", "-")
    assert len(notes) == 1 and notes[0].startswith(f"note: --algorithm protonet ignores --{flag} ")
    assert notes[0].endswith("not applied")
  # Its own options: refused by every other algorithm.
  for field, value in (("train_num_classes", 20), ("distance", "euclidean")):
    algorithms.check_config(config.replace(**{field: value}))
    with pytest.raises(vj.ConfigError, match=rf"{field} is not a setting of vampire .*Protonet"):
      config.replace(algorithm="vampire", **{field: value})
  learner = algorithms.make_learner(
    vj.Conv4(num_classes=None, num_filters=4),
    "classification",
    None,
    config.replace(train_num_classes=20),
  )
  assert learner.meta_loss is not None  # 20-way training episodes


@pytest.mark.parametrize(
  "changes, says",
  [
    (dict(train_num_classes=1), r"train_num_classes must be an integer >= 2, got 1"),
    (
      dict(train_num_classes=1000),
      r"train_num_classes 1000: a 1000-way training episode needs 1000 .* 813",
    ),
  ],
)
def test_train_num_classes_is_checked_against_the_data(changes, says):
  from experiments import presets

  config = presets.get_config("omniglot", "quick", "protonet").replace(**changes)
  with pytest.raises(vj.ConfigError, match=says) as raised:
    algorithms.check_config(config)
  assert len(str(raised.value).splitlines()) == 1 and "--" not in str(raised.value)
  mini = presets.get_config("mini_imagenet", "quick", "protonet").replace(train_num_classes=65)
  with pytest.raises(vj.ConfigError, match=r"mini-ImageNet's train part has only 64"):
    algorithms.check_config(mini)


def test_protonet_classifies_only():
  from experiments import presets

  config = presets.get_config("regression", "quick", "protonet")
  with pytest.raises(vj.ConfigError, match=r"algorithm protonet classifies .* RegressionConfig"):
    algorithms.check_config(config)
  omniglot = presets.get_config("omniglot", "quick", "protonet")
  assert omniglot.algorithm.training_ways(omniglot.ways) == 5


@pytest.mark.parametrize("name", ["protonet", "class_prototypes"])
def test_the_docstring_examples_run(name):
  import doctest

  function = getattr(vj.baselines, name)
  globs = {"jax": jax, "jnp": jnp, "vj": vj}
  tests = [t for t in doctest.DocTestFinder(recurse=False).find(function, name, globs=globs)]
  assert tests and tests[0].examples
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
  for test in tests:
    runner.run(test)
  assert runner.failures == 0


@pytest.mark.parametrize("field", ["num_classes", "train_num_classes"])
def test_one_class_is_refused_where_the_learner_is_built(field):
  """num_classes or train_num_classes 1 (every query's probability 1: accuracy 1.0, ECE 0
  and NLL 0 on pure noise) is refused where the learner is built, naming the field."""
  counts = {"num_classes": 1, "train_num_classes": 1} if field == "num_classes" else {}
  counts = counts or {"num_classes": WAYS, "train_num_classes": 1}
  with pytest.raises(vj.InputError) as raised:
    _learner(**counts)
  message = _one_line(raised)
  assert message.startswith(f"protonet: {field} ")  # the function and the argument
  assert "must be at least 2" in message and "got 1" in message  # allowed, and the value
  assert "with one class every query's probability is 1 whatever the embedding" in message


@pytest.mark.parametrize("distance", ["squared_euclidean", "euclidean"])
def test_a_task_it_cannot_score_is_nan_in_every_score_under_jit(distance):
  """Under jit, for both distances, a task lacking class 2, a support label of 3 (which the
  class sums would drop) or a query label of -1 (which would pick the last class) is NaN in
  accuracy (not the argmax of NaN, 0.333), NLL and probabilities; the meta-step's accuracy
  too. A task it can score stays finite."""
  learner, params = _learner(distance)
  tasks = _tasks(
    [SUPPORT_Y, jnp.array([0, 1, 0, 0, 1, 1]), jnp.array([0, 1, 2, 3, 1, 2]), SUPPORT_Y],
    [QUERY_Y, QUERY_Y, QUERY_Y, jnp.array([0, 1, 2, -1])],
  )
  scores = jax.jit(vj.make_classification_evaluator(learner))(params, tasks, jax.random.key(2))
  assert np.isfinite(scores.accuracy[0]) and np.isfinite(scores.nll[0])
  assert np.isfinite(scores.probabilities[0]).all()
  for task in (1, 2, 3):  # class 2 absent; a support label of 3; a query label of -1
    assert np.isnan(scores.accuracy[task]), (task, scores.accuracy[task])
    assert np.isnan(scores.nll[task]), (task, scores.nll[task])
    assert np.isnan(scores.probabilities[task]).all(), task
  # The meta-step's own accuracy (its metrics) is NaN for such a task as well.
  logits = learner.predict(
    jax.jit(learner.adapt)(params, tasks.support_x[1], tasks.support_y[1], None),
    tasks.query_x[1],
    None,
  )
  assert np.isnan(logits).all()
  assert np.isnan(vj.classification_metrics(logits, tasks.query_y[1])["accuracy"])


@pytest.mark.parametrize("distance", ["squared_euclidean", "euclidean"])
def test_a_task_it_cannot_score_is_refused_by_name_where_the_labels_are_concrete(distance):
  learner, params = _learner(distance)
  x = jax.random.normal(jax.random.key(1), (6, 4))
  with pytest.raises(vj.InputError) as raised:
    learner.adapt(params, x, jnp.array([0, 1, 0, 0, 1, 1]), None)
  message = _one_line(raised)
  assert message.startswith("protonet.adapt: support_y ")  # the function and the argument
  assert "must be labels with an example of every class 0..2" in message
  assert "(a prototype is a mean)" in message and "got none of classes [2]" in message
  with pytest.raises(vj.InputError) as raised:
    learner.adapt(params, x, jnp.array([0, 1, 2, 3, 1, 2]), None)
  message = _one_line(raised)
  assert message.startswith("protonet.adapt: support_y ")  # the function and the argument
  assert "must be class indices in [0, 3) for 3 outputs" in message
  assert "got 1 outside it: [3]" in message


def test_the_euclidean_distance_keeps_a_nan_and_is_still_zero_at_zero():
  prototypes = jnp.array([[1.0, 2.0], [jnp.nan, 0.0]])
  logits = vj.baselines.prototype_logits(jnp.array([[1.0, 2.0]]), prototypes, "euclidean")
  assert float(logits[0, 0]) == 0.0 and np.isnan(logits[0, 1])


def test_inputs_of_another_feature_count_are_refused_by_name():
  """Inputs of another feature count are refused by protonet.adapt and protonet.predict,
  naming the argument and its shape."""
  learner, params = _learner()
  wide = jnp.ones((6, 5))  # 5 features for an embedding of 4
  with pytest.raises(vj.InputError) as raised:
    learner.adapt(params, wide, SUPPORT_Y, None)
  assert _one_line(raised).startswith(
    "protonet.adapt: params and support_x float32[6, 5] do not fit together (another "
    "network's parameters, or inputs of another shape"
  )
  task_params = learner.adapt(params, jnp.ones((6, 4)), SUPPORT_Y, None)
  with pytest.raises(vj.InputError) as raised:
    learner.predict(task_params, wide, None)
  assert _one_line(raised).startswith(
    "protonet.predict: task_params.params and x float32[6, 5] do not fit together"
  )
