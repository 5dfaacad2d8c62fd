"""ProtoNet (Snell, Swersky & Zemel 2017, "Prototypical Networks for Few-shot Learning").

A network f embeds each example. Class k's prototype is the mean embedding of
its support examples, and a query's logits are minus its distance to each:

  c_k = mean_{i: y_i = k} f(x_i),    logit_k(x) = -d(f(x), c_k),

scored by the softmax cross-entropy of the query labels. There is no inner
loop and no weight draw: the learner is deterministic, its meta-parameters are
the embedding's weights, and the meta-optimiser trains them on the query loss.

d is the squared Euclidean distance (Snell et al., `distance=
"squared_euclidean"`), or the Euclidean distance itself (`distance=
"euclidean"`), which the VAMPIRE authors' `ProtoNet.py` takes
(`_utils.euclidean_distance`, a `torch.norm`).

The embedding is a classifier without its head: `vj.Conv4(num_classes=None)`
(the flattened features of the four blocks, as the authors' `CNN(dim_output=
None)`), `vj.MLP(hidden_sizes, None)` on features. Support and query sets
are embedded apart, one batch each, so a network with batch norm normalises
each with its own statistics, as the authors' code does (two forward passes).

Snell et al. trained with more classes per episode than they tested (30-way
episodes for 1-shot, 20-way for 5-shot): `train_num_classes` sets the classes
of the training episodes, whose meta-loss then builds that many prototypes;
`adapt` and `predict` (evaluation, `Run.predict`) build `num_classes`.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import adaptation, losses
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.learners import InnerLoopSettings, MetaLearner, query_nll
from vampire_jax._src.core.tasks import Task

PyTree = Any

DISTANCES = ("squared_euclidean", "euclidean")


class Prototypes(NamedTuple):
  """A task's parameters: the embedding's weights and the class prototypes.

  Attributes:
    params: the embedding network's weights (the meta-parameters).
    prototypes: `[num_classes, features]`, class k's mean support embedding.
  """

  params: PyTree
  prototypes: jax.Array


def class_prototypes(embeddings: jax.Array, labels: jax.Array, num_classes: int) -> jax.Array:
  """`[num_classes, features]`: each class's mean embedding.

  Args:
    embeddings: `[examples, features]`.
    labels: `[examples]` integers in `[0, num_classes)`, every class present.
    num_classes: K, a Python integer (it sets the shape).

  Returns:
    Row k is the mean of the embeddings labelled k. Where the labels are
    concrete, a label outside `[0, K)` or a class without an example is
    refused (`InputError`); under `jit` every row is then NaN, so that every
    score of the task is NaN (not only the absent class's distance, which an
    argmax or a distance's `where` would hide).

  Examples:
    >>> embeddings = jnp.array([[0.0, 2.0], [2.0, 4.0], [5.0, 5.0]])
    >>> vj.baselines.class_prototypes(embeddings, jnp.array([0, 0, 1]), 2)
    Array([[1., 3.],
           [5., 5.]], dtype=float32)
  """
  _check_labels("class_prototypes", labels, num_classes)
  # Sums by segment, not a one-hot matrix product: exact float32 sums on any backend.
  sums = jax.ops.segment_sum(embeddings, labels, num_segments=num_classes)
  counts = jax.ops.segment_sum(jnp.ones_like(labels, embeddings.dtype), labels, num_classes)
  # Traced labels: a task with a class absent, or a label that segment_sum drops, has no
  # prototypes to score against (NaN everywhere, not a NaN row that a later step hides).
  complete = jnp.all(counts > 0) & jnp.all((labels >= 0) & (labels < num_classes))
  return jnp.where(complete, sums / jnp.maximum(counts, 1)[:, None], jnp.nan)


def prototype_logits(
  embeddings: jax.Array, prototypes: jax.Array, distance: str = "squared_euclidean"
) -> jax.Array:
  """`[examples, num_classes]`: minus each embedding's distance to each prototype.

  Squared Euclidean: sum_j (f_j - c_kj)^2, as a sum of squared differences (not
  f.f - 2 f.c + c.c, which cancels in float32 when f is near c).
  Euclidean: its square root, with the gradient 0 where the distance is 0 (as
  `torch.norm`'s), not the square root's infinite one. A NaN distance stays NaN.
  """
  squared = jnp.sum(jnp.square(embeddings[:, None, :] - prototypes[None, :, :]), axis=-1)
  if distance == "squared_euclidean":
    return -squared
  positive = squared > 0  # False for NaN: 0 * squared keeps the NaN (and is 0 at 0)
  return -jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0 * squared)


def _check_labels(where: str, labels, num_classes: int) -> None:
  """Integer labels `[examples]`; where concrete, each class of `[0, K)` present and none else."""
  if jnp.ndim(labels) != 1 or not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
    raise checks.fail(where, "support_y", "[examples] integer labels", checks.describe(labels))
  checks.labels_in_range(where, "support_y", labels, num_classes)
  if checks.concrete(labels):
    missing = sorted(set(range(num_classes)) - set(np.asarray(labels).tolist()))
    if missing:
      raise checks.fail(
        where,
        "support_y",
        f"labels with an example of every class 0..{num_classes - 1} (a prototype is a mean)",
        f"none of classes {missing[:5]}",
      )


def protonet(
  embed_fn: losses.ApplyFn,
  *,
  num_classes: int,
  train_num_classes: Optional[int] = None,
  distance: str = "squared_euclidean",
) -> MetaLearner:
  """ProtoNet as a `MetaLearner`: prototypes of the support set, no inner loop.

  Args:
    embed_fn: the embedding, `embed_fn(params, x) -> [examples, features]`
      (e.g. `vj.pure_apply(vj.Conv4(num_classes=None))`).
    num_classes: K, the classes of a task that `adapt` and `predict` see
      (evaluation, `Run.predict`): its labels are `0..K-1`.
    train_num_classes: the classes of a training episode, whose meta-loss
      builds that many prototypes (None: `num_classes`; Snell et al.: 30 for
      1-shot, 20 for 5-shot).
    distance: 'squared_euclidean' (Snell et al.) or 'euclidean' (the
      authors' ProtoNet.py).

  Returns:
    A `MetaLearner` whose meta-parameters are the embedding's weights,
    `adapt` gives `Prototypes`, `predict` the logits `[1, examples, K]` (one
    "draw": it is deterministic, and ignores its key), `nll` is
    `vj.categorical_nll`.

  Raises:
    InputError: a count that is not an integer >= 2 (one class: every query's
      probability is 1, whatever the embedding), or an unknown distance.

  Examples:
    >>> model = vj.MLP((8,), None)  # an embedding: no output layer
    >>> learner = vj.baselines.protonet(vj.pure_apply(model), num_classes=3)
    >>> params = learner.init(vj.init_params(model, jax.random.key(0), (1, 4)), jax.random.key(1))
    >>> support_x = jax.random.normal(jax.random.key(2), (6, 4))
    >>> support_y = jnp.array([0, 1, 2, 0, 1, 2])
    >>> task_params = learner.adapt(params, support_x, support_y, jax.random.key(3))
    >>> task_params.prototypes.shape  # [classes, features]
    (3, 8)
    >>> learner.predict(task_params, support_x, jax.random.key(4)).shape  # [1, examples, classes]
    (1, 6, 3)
  """
  train_classes = num_classes if train_num_classes is None else train_num_classes
  for name, count in (("num_classes", num_classes), ("train_num_classes", train_classes)):
    checks.step_count("protonet", name, count, 1)
    if count == 1:  # a softmax over one prototype: accuracy 1, NLL 0, ECE 0 on any task
      raise checks.fail(
        "protonet",
        name,
        "at least 2 (with one class every query's probability is 1 whatever the embedding)",
        "1",
      )
  if distance not in DISTANCES:
    raise checks.fail("protonet", "distance", f"one of {', '.join(DISTANCES)}", repr(distance))
  nll = losses.categorical_nll

  def prototypes_of(classes: int):
    def adapt(params, support_x, support_y, key):
      del key  # deterministic
      checks.array("protonet.adapt", "support_x", support_x)
      checks.examples("protonet.adapt", ("support_x", "support_y"), support_x, support_y)
      _check_labels("protonet.adapt", support_y, classes)
      checks.network_fits("protonet.adapt", ("params", "support_x"), embed_fn, params, support_x)
      embeddings = embed_fn(params, support_x)
      return Prototypes(params, class_prototypes(embeddings, support_y, classes))

    return adapt

  def predict(task_params: Prototypes, x, key):
    del key
    adaptation.check_inputs("protonet.predict", x)
    checks.network_fits(
      "protonet.predict", ("task_params.params", "x"), embed_fn, task_params.params, x
    )
    embeddings = embed_fn(task_params.params, x)
    return prototype_logits(embeddings, task_params.prototypes, distance)[None]

  def support_loss(params, x, y):
    """The support set's loss against its own prototypes (what `vj.check_inner_loop` reads)."""
    outputs = predict(prototypes_of(num_classes)(params, x, y, None), x, None)
    return nll(outputs[0], y)

  def init(params, key):
    del key
    checks.float_leaves("protonet.init", "params", params)
    return params

  def train_loss(params, task: Task, key):
    # A training episode of `train_classes` ways: its own prototypes, `query_loss`'s NLL.
    task_params = prototypes_of(train_classes)(params, task.support_x, task.support_y, key)
    outputs = predict(task_params, task.query_x, key)
    return query_nll(nll, outputs, task.query_y), outputs

  return MetaLearner(
    init,
    prototypes_of(num_classes),
    predict,
    nll,
    meta_loss=None if train_classes == num_classes else train_loss,
    settings=InnerLoopSettings(support_loss, 0.0, 0.0, 0),
  )
