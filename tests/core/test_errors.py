import jax
import jax.numpy as jnp
import pytest

import vampire_jax as vj
from vampire_jax._src.core.errors import InputError


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert "ArrayImpl" not in message, message
  return message


@pytest.fixture(scope="module")
def classifier():
  """A 3-way VAMPIRE classifier on 2-D blobs: 4 tasks of 6 queries, and its per-task results."""
  model = vj.MLP((8,), 3)
  learner = vj.vampire(vj.pure_apply(model), vj.categorical_nll, num_mc_query=4)
  meta_params = learner.init(vj.init_params(model, jax.random.key(15), (1, 2)), jax.random.key(16))
  blobs = jax.random.normal(jax.random.key(14), (4, 6, 2))
  labels = jnp.tile(jnp.arange(3), (4, 2))  # [4, 6]
  tasks = vj.Task(blobs + labels[..., None], labels, blobs + 2 * labels[..., None], labels)
  keys = jax.random.split(jax.random.key(17), 4)
  per_task = vj.make_classification_evaluator(learner)(meta_params, tasks, keys)
  return learner, meta_params, tasks, keys, per_task


def _first(tasks):
  return jax.tree.map(lambda field: field[0], tasks)


def _classifier_predictive(classifier):
  learner, meta_params, tasks, keys, per_task = classifier
  task = _first(tasks)
  dist = vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, keys[0])
  return dist, task, per_task


@pytest.mark.parametrize(
  "call, names",
  [
    (lambda d, a: vj.gaussian_from_distrax({"w": a}), "tree must be a tree of distrax.Normal"),
    (lambda d, a: vj.to_distrax(a), "vj.to_distrax: dist must be a vj.Gaussian"),
    (lambda d, a: vj.predictive_interval(a), "vj.predictive_interval: distribution must be"),
    (lambda d, a: vj.uncertainty(d), "vj.uncertainty: draws must be per-draw class"),
    (lambda d, a: vj.regression_uncertainty(d, 0.3), "vj.regression_uncertainty: draws must"),
  ],
)
def test_refusals_name_what_they_got_not_arrayimpl(classifier, call, names):
  """Each refusal names the argument and what it got as a dtype and shape (float32[2]) or as
  a distribution, never `ArrayImpl`."""
  dist, _, _ = _classifier_predictive(classifier)
  with pytest.raises(InputError, match=names) as raised:
    call(dist, jnp.zeros(2))
  message = _one_line(raised)
  assert "float32[2]" in message or "a distribution (vampire_jax PredictiveCategorical" in message
