"""ProtoNet refuses what it cannot score, and a task it cannot score is NaN in every score.

A ProtoNet of one class gives every query the probability 1 (accuracy 1, NLL 0, ECE 0 on
pure noise): refused at construction. A task whose support lacks a class, or holds a label
outside `0..K-1`, has no prototypes to score against: refused by name where the labels are
concrete, and NaN in every score under `jit` (the accuracy too, not the argmax of NaN), for
both distances.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj

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


def _tasks(support_ys, query_ys=None):
  """Tasks of `WAYS` Gaussian blobs with the given support (and query) labels."""
  num = len(support_ys)
  keys = jax.random.split(jax.random.key(1), 2)
  support_x = jax.random.normal(keys[0], (num, len(SUPPORT_Y), 4))
  query_x = jax.random.normal(keys[1], (num, len(QUERY_Y), 4))
  query_ys = [QUERY_Y] * num if query_ys is None else query_ys
  return vj.Task(support_x, jnp.stack(support_ys), query_x, jnp.stack(query_ys))


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
