"""Meta-learners as NamedTuples of pure functions, the meta-step and evaluation.

A `MetaLearner` says how to turn meta-parameters into task parameters
(`adapt`) and task parameters into predictions (`predict`). `vampire` and
`maml` build one; `make_meta_step` and the evaluators work with any.
Wrap what they return in `jax.jit` at the call site.
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from vampire_jax import adaptation, batching, losses, sharding
from vampire_jax.gaussian import Gaussian, gaussian_from_params
from vampire_jax.tasks import Task

PyTree = Any


class MetaLearner(NamedTuple):
  """A gradient-based meta-learning algorithm.

  Attributes:
    init: `init(params, key) -> meta_params` from a network's initial weights.
    adapt: `adapt(meta_params, support_x, support_y, key) -> task_params`.
    predict: `predict(task_params, x, key) -> outputs [num_samples, batch, ...]`.
    nll: `nll(outputs_one_sample, y) -> scalar`, the likelihood trained on.
    meta_loss: optional `meta_loss(meta_params, task, key) -> (loss, query_outputs)`,
      one task's meta-training loss, for algorithms whose meta-objective is not
      "adapt on support, NLL on query" (e.g. PLATIPUS, ABML). `None` means
      `query_loss`'s default.
  """
  init: Callable[[PyTree, jax.Array], PyTree]
  adapt: Callable[[PyTree, jax.Array, jax.Array, jax.Array], PyTree]
  predict: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  nll: losses.Likelihood
  meta_loss: Optional[Callable[[PyTree, Task, jax.Array], tuple[jax.Array, jax.Array]]] = None


def vampire(apply_fn: adaptation.ApplyFn, nll: losses.Likelihood, *,
            num_inner_steps: int = 5, inner_lr: float = 0.1,
            kl_weight: float = 0.1, num_mc_train: int = 1,
            num_mc_query: int = 1, first_order: bool = False,
            log_std_init: tuple[float, float] = (-4.0, -3.0),
            sample_batching: batching.Batching = "vmap",
            unroll_steps: bool = False, remat: bool = False) -> MetaLearner:
  """VAMPIRE (Nguyen et al. 2020, Alg. 1): Gaussian prior, VI inner loop.

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs, e.g. `losses.categorical_nll`.
    num_inner_steps: S.
    inner_lr: alpha.
    kl_weight: beta, the KL weight in the VFE.
    num_mc_train: L_t, weight draws per inner step.
    num_mc_query: L_v, weight draws on the query set (and for prediction).
    first_order: stop gradients through the inner updates.
    log_std_init: range of the uniform initial prior log-stds.
    sample_batching: how Monte-Carlo forward passes are batched.
    unroll_steps: unroll the inner loop.
    remat: recompute each inner step in the backward pass instead of storing
      its activations (`jax.checkpoint`): less memory, more compute.
  """
  loss_fn = losses.loss_from_apply(apply_fn, nll)

  def init(params, key):
    return gaussian_from_params(params, key, log_std_init)

  def adapt(prior, support_x, support_y, key):
    return adaptation.adapt(
        prior, support_x, support_y, key, loss_fn=loss_fn,
        num_steps=num_inner_steps, inner_lr=inner_lr,
        num_mc_samples=num_mc_train, kl_weight=kl_weight,
        first_order=first_order, sample_batching=sample_batching,
        unroll_steps=unroll_steps, remat=remat)

  def predict(posterior, x, key):
    return adaptation.predict(posterior, x, key, apply_fn=apply_fn,
                              num_mc_samples=num_mc_query,
                              sample_batching=sample_batching)

  return MetaLearner(init, adapt, predict, nll)


def maml(apply_fn: adaptation.ApplyFn, nll: losses.Likelihood, *,
         num_inner_steps: int = 5, inner_lr: float = 0.1,
         first_order: bool = False, unroll_steps: bool = False,
         remat: bool = False) -> MetaLearner:
  """MAML (Finn et al. 2017): the point-estimate special case; `remat` as in `vampire`."""
  loss_fn = losses.loss_from_apply(apply_fn, nll)

  def init(params, key):
    del key
    return params

  def adapt(params, support_x, support_y, key):
    del key
    return adaptation.maml_adapt(
        params, support_x, support_y, loss_fn=loss_fn,
        num_steps=num_inner_steps, inner_lr=inner_lr,
        first_order=first_order, unroll_steps=unroll_steps, remat=remat)

  def predict(params, x, key):
    del key
    return apply_fn(params, x)[None]

  return MetaLearner(init, adapt, predict, nll)


def query_loss(learner: MetaLearner, meta_params: PyTree, task: Task,
               key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One task's meta-training loss: adapt on support, mean NLL on query.

  Args:
    learner: the algorithm.
    meta_params: its meta-parameters.
    task: one task (no leading task axis).
    key: PRNG key.

  Returns:
    `(loss, outputs)`: the query NLL averaged over weight draws (Alg. 1,
    line 9) and the query outputs `[num_samples, num_query, ...]`; or, if the
    learner defines its own `meta_loss`, what that returns.
  """
  if learner.meta_loss is not None:
    return learner.meta_loss(meta_params, task, key)
  adapt_key, query_key = jax.random.split(key)
  task_params = learner.adapt(meta_params, task.support_x, task.support_y, adapt_key)
  outputs = learner.predict(task_params, task.query_x, query_key)
  loss = jnp.mean(jax.vmap(learner.nll, in_axes=(0, None))(outputs, task.query_y))
  return loss, outputs


def check_task_batch(tasks: Task) -> int:
  """Raises ValueError unless every field shares a leading task axis; returns it."""
  sizes = {name: jnp.shape(value)[0] if jnp.ndim(value) else None
           for name, value in tasks._asdict().items()}
  if len(set(sizes.values())) != 1 or None in sizes.values():
    raise ValueError(f"all Task fields need the same leading [tasks] axis; got {sizes}")
  shapes = {k: jnp.shape(v) for k, v in tasks._asdict().items()}
  if shapes["support_x"][1] != shapes["support_y"][1] or shapes["query_x"][1] != shapes["query_y"][1]:
    raise ValueError(f"x and y must have the same number of examples per task; got {shapes}")
  return sizes["support_x"]


# -- Meta-training ----------------------------------------------------------


class MetaState(NamedTuple):
  """Everything a meta-training run carries between steps."""
  step: jax.Array          # [] int32, meta-updates done
  meta_params: PyTree      # Gaussian (VAMPIRE) or a weight tree (MAML)
  opt_state: optax.OptState


def meta_lr_schedule(learning_rate: float = 1e-3, *, tasks_per_step: int,
                     decay_rate: float = 0.99, decay_every_tasks: int = 10_000) -> optax.Schedule:
  """The paper's meta learning rate: x `decay_rate` after every `decay_every_tasks` tasks."""
  if tasks_per_step < 1:
    raise ValueError(f"tasks_per_step must be >= 1, got {tasks_per_step}")
  return optax.exponential_decay(
      learning_rate, transition_steps=decay_every_tasks / tasks_per_step,
      decay_rate=decay_rate, staircase=True)


def meta_optimizer(learning_rate: float = 1e-3, *, tasks_per_step: int,
                   decay_rate: float = 0.99, decay_every_tasks: int = 10_000,
                   clip_norm: Optional[float] = None) -> optax.GradientTransformation:
  """Adam with the paper's schedule: lr x `decay_rate` every `decay_every_tasks` tasks.

  Args:
    learning_rate: gamma.
    tasks_per_step: T, tasks per meta-update (sets the decay's step count).
    decay_rate: multiplicative decay.
    decay_every_tasks: tasks between decays.
    clip_norm: if set, clip the meta-gradient's global norm first (the
      authors' code clips at 10).
  """
  adam = optax.adam(meta_lr_schedule(learning_rate, tasks_per_step=tasks_per_step,
                                     decay_rate=decay_rate, decay_every_tasks=decay_every_tasks))
  if clip_norm is None:
    return adam
  return optax.chain(optax.clip_by_global_norm(clip_norm), adam)


def init_meta_state(learner: MetaLearner, optimizer: optax.GradientTransformation,
                    params: PyTree, key: jax.Array) -> MetaState:
  """Meta-parameters from initial network weights, and a fresh optimiser state."""
  meta_params = learner.init(params, key)
  return MetaState(jnp.zeros((), jnp.int32), meta_params, optimizer.init(meta_params))


MetricsFn = Callable[[jax.Array, jax.Array], dict]


def classification_metrics(outputs: jax.Array, labels: jax.Array) -> dict:
  """Accuracy of the sample-averaged softmax; outputs `[samples, batch, classes]`."""
  probs = jnp.mean(jax.nn.softmax(outputs, axis=-1), axis=0)
  return {"accuracy": jnp.mean(jnp.argmax(probs, axis=-1) == labels)}


def make_meta_gradient(learner: MetaLearner, *,
                       task_batching: batching.Batching = "vmap",
                       chunk_size: int = 1,
                       metrics_fn: Optional[MetricsFn] = None,
                       mesh: Optional[Mesh] = None):
  """Builds `meta_gradient(meta_params, tasks, task_keys) -> (grads, metrics)`.

  Each task's query loss and its gradient w.r.t. the meta-parameters are
  computed per task, batched by `task_batching`, and averaged over tasks.

  Args:
    learner: the algorithm (`vampire(...)`, `maml(...)`).
    task_batching: how tasks are batched (see `vampire_jax.batching`); with
      a mesh, how each device batches its own tasks.
    chunk_size: tasks per chunk for the chunked strategies.
    metrics_fn: optional `metrics_fn(query_outputs, query_y) -> dict` of
      per-task scalars to average and report (e.g. `classification_metrics`).
    mesh: optional `sharding.task_mesh(...)`: split the tasks over its
      devices, each averages its own, then the devices average (`pmean`).
      The number of tasks must divide evenly.

  Returns:
    A pure function; `tasks` has a leading `[tasks]` axis and `task_keys`
    holds one PRNG key per task.
  """
  per_task = jax.value_and_grad(
      lambda meta_params, task, key: query_loss(learner, meta_params, task, key),
      has_aux=True)

  def one_task(meta_params, task, key):
    (loss, outputs), grads = per_task(meta_params, task, key)
    metrics = {"loss": loss}
    if metrics_fn is not None:
      metrics.update(metrics_fn(outputs, task.query_y))
    return grads, metrics

  def mean_over_tasks(meta_params, tasks: Task, task_keys: jax.Array):
    grads, metrics = batching.batched_map(
        lambda args: one_task(meta_params, *args), (tasks, task_keys),
        strategy=task_batching, chunk_size=chunk_size)
    return jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), (grads, metrics))

  def meta_gradient(meta_params, tasks: Task, task_keys: jax.Array):
    num_tasks = check_task_batch(tasks)
    if mesh is None:
      return mean_over_tasks(meta_params, tasks, task_keys)
    sharding.check_divisible(num_tasks, mesh)
    return sharding.mean_over_task_shards(mean_over_tasks, mesh)(meta_params, tasks, task_keys)

  return meta_gradient


def apply_meta_gradient(optimizer: optax.GradientTransformation, state: MetaState,
                        grads: PyTree) -> MetaState:
  """One optimiser step on the meta-parameters (Alg. 1, line 11)."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.meta_params)
  meta_params = optax.apply_updates(state.meta_params, updates)
  return MetaState(state.step + 1, meta_params, opt_state)


def make_meta_step(learner: MetaLearner, optimizer: optax.GradientTransformation, *,
                   task_batching: batching.Batching = "vmap", chunk_size: int = 1,
                   metrics_fn: Optional[MetricsFn] = None, mesh: Optional[Mesh] = None):
  """Builds `meta_step(state, tasks, key) -> (state, metrics)` (Alg. 1, lines 3-11).

  A pure function: wrap it in `jax.jit`. Arguments as in `make_meta_gradient`;
  `tasks` is a `Task` with a leading `[tasks]` axis. The metrics are the
  task-averaged query loss (and `metrics_fn`'s values) and the meta-gradient
  norm. With a `mesh` the tasks are split over its devices and the state is
  replicated; the result equals the one-device step's up to float rounding.
  """
  meta_gradient = make_meta_gradient(learner, task_batching=task_batching,
                                     chunk_size=chunk_size, metrics_fn=metrics_fn,
                                     mesh=mesh)

  def meta_step(state: MetaState, tasks: Task, key: jax.Array):
    task_keys = jax.random.split(key, check_task_batch(tasks))
    grads, metrics = meta_gradient(state.meta_params, tasks, task_keys)
    metrics["grad_norm"] = optax.global_norm(grads)
    return apply_meta_gradient(optimizer, state, grads), metrics

  return meta_step


def make_host_chunked_meta_step(learner: MetaLearner,
                                optimizer: optax.GradientTransformation, *,
                                chunk_size: int,
                                metrics_fn: Optional[MetricsFn] = None):
  """The meta-step for CPUs: jitted, unrolled chunks of tasks, looped on the host.

  XLA:CPU runs convolutions inside loops (`lax.map`, `lax.scan`) several
  times slower than at the top level, and vmapped per-task weights become
  slow grouped convolutions; unrolling every task is fastest but its compile
  time grows with the number of tasks. This step compiles one unrolled chunk
  of `chunk_size` tasks and runs the chunks from Python, so compile time is
  bounded and each task runs at unrolled speed. It gives the same result as
  `make_meta_step` with the same key.

  Do not wrap the returned function in `jax.jit`: it jits its own pieces.
  """
  chunk_gradient = jax.jit(make_meta_gradient(
      learner, task_batching="unroll", metrics_fn=metrics_fn))
  split_keys = jax.jit(jax.random.split, static_argnums=1)

  @jax.jit
  def finish(state, grads, metrics):
    metrics = dict(metrics, grad_norm=optax.global_norm(grads))
    return apply_meta_gradient(optimizer, state, grads), metrics

  def meta_step(state: MetaState, tasks: Task, key: jax.Array):
    num_tasks = check_task_batch(tasks)
    if chunk_size < 1 or num_tasks % chunk_size:
      raise ValueError(f"chunk_size={chunk_size} must be >= 1 and divide the {num_tasks} tasks")
    task_keys = split_keys(key, num_tasks)
    total = None
    for start in range(0, num_tasks, chunk_size):
      chunk = jax.tree_util.tree_map(lambda x: x[start:start + chunk_size], tasks)
      result = chunk_gradient(state.meta_params, chunk, task_keys[start:start + chunk_size])
      total = result if total is None else jax.tree_util.tree_map(jnp.add, total, result)
    num_chunks = num_tasks // chunk_size
    grads, metrics = jax.tree_util.tree_map(lambda t: t / num_chunks, total)
    return finish(state, grads, metrics)

  return meta_step


# -- Evaluation -------------------------------------------------------------


class ClassificationEval(NamedTuple):
  """Per-task results of evaluating a classifier on a batch of tasks."""
  accuracy: jax.Array       # [tasks]
  nll: jax.Array            # [tasks], mean -log p(y|x) of the predictive
  probabilities: jax.Array  # [tasks, num_query, classes], averaged over draws


class RegressionEval(NamedTuple):
  """Per-task results of evaluating a regressor on a batch of tasks."""
  mse: jax.Array            # [tasks], squared error of the predictive mean
  nll: jax.Array            # [tasks], -log of the Gaussian-mixture predictive
  predictions: jax.Array    # [tasks, num_samples, num_query, 1]


def _map_tasks(learner, meta_params, tasks, key, score, task_batching, chunk_size, mesh):
  num_tasks = check_task_batch(tasks)

  def one_task(meta_params, task, task_key):
    adapt_key, predict_key = jax.random.split(task_key)
    task_params = learner.adapt(meta_params, task.support_x, task.support_y, adapt_key)
    return score(learner.predict(task_params, task.query_x, predict_key), task.query_y)

  def map_tasks(meta_params, tasks, task_keys):
    return batching.batched_map(lambda args: one_task(meta_params, *args), (tasks, task_keys),
                                strategy=task_batching, chunk_size=chunk_size)

  task_keys = jax.random.split(key, num_tasks)
  if mesh is None:
    return map_tasks(meta_params, tasks, task_keys)
  sharding.check_divisible(num_tasks, mesh)
  return sharding.map_over_task_shards(map_tasks, mesh)(meta_params, tasks, task_keys)


def make_classification_evaluator(learner: MetaLearner, *,
                                  task_batching: batching.Batching = "vmap",
                                  chunk_size: int = 1, mesh: Optional[Mesh] = None):
  """Builds `evaluate(meta_params, tasks, key) -> ClassificationEval`.

  Prediction follows the paper's App. C: adapt with L_t draws, then average
  the softmax of L_v draws (the learner's `num_mc_*` settings). With a
  `mesh` the tasks, and the per-task results, are split over its devices.
  """
  def score(logits, labels):
    probs = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
    accuracy = jnp.mean(jnp.argmax(probs, axis=-1) == labels)
    nll = -jnp.mean(losses.mixture_log_prob_categorical(logits, labels))
    return ClassificationEval(accuracy, nll, probs)

  def evaluate(meta_params, tasks: Task, key: jax.Array) -> ClassificationEval:
    return _map_tasks(learner, meta_params, tasks, key, score, task_batching, chunk_size, mesh)

  return evaluate


def make_regression_evaluator(learner: MetaLearner, noise_std: float, *,
                              task_batching: batching.Batching = "vmap",
                              chunk_size: int = 1, mesh: Optional[Mesh] = None):
  """Builds `evaluate(meta_params, tasks, key) -> RegressionEval`; `mesh` as above."""
  def score(means, targets):
    # The point prediction is the predictive's mean, the average over draws
    # (it minimises the expected squared error); the spread enters the NLL.
    mse = jnp.mean(jnp.square(jnp.mean(means, axis=0) - targets))
    nll = -jnp.mean(losses.mixture_log_prob_gaussian(means, targets, noise_std))
    return RegressionEval(mse, nll, means)

  def evaluate(meta_params, tasks: Task, key: jax.Array) -> RegressionEval:
    return _map_tasks(learner, meta_params, tasks, key, score, task_batching, chunk_size, mesh)

  return evaluate
