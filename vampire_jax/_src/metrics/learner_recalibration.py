"""A recalibration map fitted on a learner's predictive of held-out tasks, and the learner
that applies it.

    calibration = vj.fit_recalibration(learner, state.meta_params, val_tasks, key)
    recalibrated = vj.recalibrated_learner(learner, calibration)
    dist = vj.predictive(recalibrated, state.meta_params, support_x, support_y, query_x, key)
    lower, upper = vj.predictive_interval(dist)     # the recalibrated 90 % interval

Both routes fit their maps here: `vj.fit_recalibration` (a learner and meta-parameters of
your own, from `vj.make_train_step`) and `vj.recalibrate` (a run folder's `vj.Run`). Each
checks the tasks (`check_tasks`), scores them with its evaluator, task i with key i of the
key's split (`evaluate_tasks`), and fits the map on the scores (`fit_per_task`): the same
tasks, key and evaluator give the same map either way. The maps and their maths are in
`recalibration`.
"""

from typing import Any, Callable, Optional

import jax
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core import losses
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.learners import MetaLearner, check_meta_params_kind
from vampire_jax._src.core.tasks import Task, check_task_batch
from vampire_jax._src.metrics import evaluation
from vampire_jax._src.metrics import recalibration as maps

PyTree = Any

# -- The learner that applies a map -------------------------------------------------------


def calibrated_learner(
  learner: MetaLearner, calibration: Optional[maps.Calibration], noise_std: Optional[float]
) -> MetaLearner:
  """`learner` whose `predict` returns recalibrated outputs and whose `nll` has the scaled noise.

  Its `adapt` (a closure over the trained likelihood) is the learner's own: recalibration
  changes the predictive, not the adaptation. A test-time learner: its meta-loss would
  train on the recalibrated outputs. Its `predict` carries the map (`predict.calibration`),
  so that a recalibrated learner is not fitted again.
  """
  if calibration is None:
    return learner
  predict = learner.predict

  def recalibrated_predict(task_params, x, key):
    return maps.calibrate_outputs(calibration, predict(task_params, x, key))

  recalibrated_predict.calibration = calibration
  nll = learner.nll
  if calibration.method in (maps.VARIANCE_SCALE, maps.QUANTILE):
    nll = losses.gaussian_nll(maps.calibrated_noise_std(calibration, noise_std))
  if calibration.method == maps.QUANTILE:
    # The map of the predictive's CDF: `vj.predictive_distribution` and the regression
    # evaluator read it from the likelihood (each draw's likelihood is still Gaussian).
    nll.quantile_map = calibration.quantile_map
  return learner._replace(predict=recalibrated_predict, nll=nll)


def recalibrated_learner(
  learner: MetaLearner, calibration: Optional[maps.Calibration]
) -> MetaLearner:
  """`learner` whose predictive is recalibrated by `calibration` (`vj.fit_recalibration`).

  Its `predict` returns the network's outputs under each weight draw as the map makes
  them (a regressor's draws stretched about their mean by sqrt(s); a classifier's moved
  to the tempered mean softmax(log p / T)), and its `nll` is the likelihood of the
  recalibrated predictive (a regressor's noise sqrt(s) sigma, a quantile map's R with
  it), so everything built from it gives the recalibrated predictive: `vj.predictive`
  and `vj.predictive_interval` (under a quantile map R its ends are
  F_s^-1(R^-1((1 -+ level) / 2))), and the evaluators (`vj.make_regression_evaluator`
  with `noise_std=recalibrated.nll.noise_std`). Its `adapt` is the learner's own: the
  map changes the predictive, not the adaptation. Use it to predict, not to train.

  Args:
    learner: the learner the map was fitted for (of `vj.categorical_nll` or
      `vj.gaussian_nll`), not recalibrated.
    calibration: from `vj.fit_recalibration` (or a run's `Run.calibration`); None gives
      `learner` back.

  Returns:
    A `vj.MetaLearner`; `learner` is unchanged.

  Raises:
    InputError: `learner` is not a `vj.MetaLearner`, or is already recalibrated;
      `calibration` is not a map of `learner`'s kind (a temperature for a classifier, a
      variance scale or a quantile map for a regressor).

  Examples:
    >>> from vampire_jax.metrics import Calibration
    >>> model = vj.MLP((8,), 1)
    >>> learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_mc_query=4)
    >>> doubled = vj.recalibrated_learner(learner, Calibration("variance_scale", 4.0, 2, 1.0, 0.5))
    >>> doubled.nll.noise_std   # sqrt(4) times the noise; the draws' spread doubles too
    0.6
  """
  where = "vj.recalibrated_learner"
  kind, noise_std = learner_kind(where, learner)
  if calibration is None:
    return learner
  if not isinstance(calibration, maps.Calibration):
    raise checks.fail(
      where,
      "calibration",
      "a map fitted by vj.fit_recalibration (a vj.metrics.Calibration) or None",
      checks.describe(calibration),
    )
  if calibration.method not in maps.METHODS[kind]:
    choices = " or ".join(maps.METHODS[kind]).replace("_", " ")
    raise InputError(
      f"{where}: calibration is a {calibration.method.replace('_', ' ')}, not a map of a "
      f"{kind} learner's predictive ({choices}); fit one for this learner with "
      "vj.fit_recalibration"
    )
  return calibrated_learner(learner, calibration, noise_std)


def learner_kind(where: str, learner: MetaLearner) -> tuple[str, Optional[float]]:
  """`(kind, noise_std)` of a raw learner, from its likelihood; InputError for any other."""
  if not isinstance(learner, MetaLearner):
    raise checks.fail(
      where,
      "learner",
      "a vj.MetaLearner (vj.vampire, vj.maml, vj.baselines...)",
      checks.describe(learner),
    )
  if getattr(learner.predict, "calibration", None) is not None:
    raise InputError(
      f"{where}: learner is already recalibrated (its predict applies a map); pass the "
      "learner it was made from (a run's: vj.load_run without recalibrated=True)"
    )
  if learner.nll is losses.categorical_nll:
    return "classification", None
  noise_std = getattr(learner.nll, "noise_std", None)
  if noise_std is None or getattr(learner.nll, "quantile_map", None) is not None:
    name = getattr(learner.nll, "__name__", type(learner.nll).__name__)
    if getattr(learner.nll, "quantile_map", None) is not None:
      name = "a recalibrated likelihood"
    elif hasattr(learner.nll, "distribution"):
      name = "a vj.distribution_nll"
    else:
      name = f"{name!r}"
    raise InputError(
      f"{where}: learner.nll must be vj.categorical_nll or a vj.gaussian_nll(noise_std) "
      f"(the maps temper a categorical predictive or scale a Gaussian mixture), got {name}; "
      "build the learner with one of them"
    )
  return "regression", float(noise_std)


# -- Fitting a map on tasks ---------------------------------------------------------------


def fit_recalibration(
  learner: MetaLearner,
  meta_params: PyTree,
  tasks: Task,
  key: jax.Array,
  *,
  method: Optional[str] = None,
  batch_tasks: Optional[int] = None,
) -> maps.Calibration:
  """The recalibration map of a learner's predictive, fitted on held-out tasks.

  The maps `vj.recalibrate` fits for a run, fitted for a learner and meta-parameters of
  your own (`vj.make_train_step`'s `state.meta_params`; the network from NNX, Equinox or
  linen). The learner adapts to each task and predicts its queries as its evaluator does
  (`vj.make_classification_evaluator`, `vj.make_regression_evaluator` with the
  likelihood's noise: the learner's own weight draws, task i with key i of `key`'s
  split), and one parameter is fitted by the NLL of the query targets:

  - classification (`vj.categorical_nll`): a temperature T of the predictive
    p = mean_l softmax(f_l): p_T = softmax(log p / T), which keeps each query's arg max;
  - regression (`vj.gaussian_nll(sigma)`), `method="variance_scale"`: a variance scale s
    of the predictive mixture mean_l N(f_l, sigma^2), about its mean m:
    mean_l N(m + sqrt(s) (f_l - m), s sigma^2);
  - regression, `method="quantile"` (Kuleshov et al. 2018): that scale, then a monotone,
    piecewise-linear map R of the scaled predictive's CDF, fitted on the tasks' PIT
    values; at least 100 query targets.

  `method` None (the default): the temperature for a classifier; for a regressor the
  quantile map where the tasks hold at least 100 query targets, else the variance scale.
  `vj.recalibrated_learner(learner, calibration)` is the learner whose predictive
  (`vj.predictive`, `vj.predictive_interval`, the evaluators) applies the map. On a run's
  learner and meta-parameters (`run.learner`, `run.meta_params`), the map is
  `vj.recalibrate(run, tasks, key)`'s: the same draws and fit, the same numbers (up to
  float32's last digits where the run's evaluator batches the tasks otherwise).

  The predictive has the learner's own weight draws (`num_mc_query` of `vj.vampire`):
  for a sharper estimate, fit and predict with a learner of more draws on the same
  meta-parameters, as a run tests with its `num_mc_test`
  (`vj.vampire(apply_fn, nll, num_mc_query=32)`).

  Args:
    learner: a `vj.MetaLearner` of `vj.categorical_nll` or `vj.gaussian_nll`.
    meta_params: its meta-parameters (`state.meta_params`).
    tasks: a `vj.Task` batch with a leading task axis that the learner never trained on
      (validation tasks); at least 2 tasks (about 100 pin the map down).
    key: PRNG key of the adaptation and prediction draws; the same key gives the same map.
    method: None, 'temperature' (classification), 'quantile' or 'variance_scale'
      (regression).
    batch_tasks: tasks per call of the evaluator (None: all at once; fewer take less
      memory). A task's draws do not depend on it, its numbers at most in float32's last
      digits.

  Returns:
    A `vj.metrics.Calibration`: `method`, `value` (T or s), `num_tasks`, the NLL of the
    tasks' queries before and after (`nll_before`, `nll_after`) and a quantile map's
    knots (`quantile_map`).

  Raises:
    InputError: `learner` not a `vj.MetaLearner` of `vj.categorical_nll` or
      `vj.gaussian_nll`, or already recalibrated; `meta_params` of another kind than
      `learner.init` makes; tasks that are not a concrete `vj.Task` batch of at least 2
      tasks of the learner's kind (float inputs; integer labels `[tasks, n]` of every
      class for a classifier, `[tasks, n, outputs]` float targets for a regressor), that
      do not fit its network, or with non-finite values; tasks whose predictive is not
      finite (naming them); a method not of the learner's kind, a quantile map of fewer
      than 100 query targets; or a predictive whose NLL has no minimum inside the range
      searched (T in [0.01, 100], s in [1e-4, 1e4]).

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((8,), 1)
    >>> learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_mc_query=4)
    >>> meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)),
    ...                            jax.random.key(1))
    >>> val_tasks = sine_line.sample_tasks(jax.random.key(2), 10)   # 100 query targets
    >>> calibration = vj.fit_recalibration(learner, meta_params, val_tasks, jax.random.key(3))
    >>> calibration.method, calibration.num_tasks, calibration.nll_after < calibration.nll_before
    ('quantile', 10, True)
  """
  where = "vj.fit_recalibration"
  kind, noise_std = learner_kind(where, learner)
  check_meta_params_kind(
    where, "meta_params", learner, meta_params, "pass the meta-parameters it trained"
  )
  checks.prng_key(where, "key", key)
  maps.check_method(where, kind, method)
  if batch_tasks is not None:
    checks.step_count(where, "batch_tasks", batch_tasks, 1)
  num_tasks, arrays = check_tasks(where, tasks, kind)
  if kind == "classification":
    evaluate = evaluation.make_classification_evaluator(learner)
  else:
    evaluate = evaluation.make_regression_evaluator(learner, noise_std)
  per_task = evaluate_tasks(
    _fitting_the_learner(where, jax.jit(evaluate)),
    meta_params,
    tasks,
    key,
    num_tasks,
    batch_tasks or num_tasks,
  )
  if kind == "classification":  # the classes are the network's outputs
    check_labels(where, arrays, kind, per_task["probabilities"].shape[-1])
  return fit_per_task(kind, per_task, noise_std, where, method)


def _fitting_the_learner(where: str, evaluate: Callable) -> Callable:
  """`evaluate`, whose errors of tasks that do not fit the network are one line naming `tasks`."""
  import flax.errors  # flax is imported by the models anyway

  def evaluate_or_refuse(meta_params, tasks, keys):
    try:
      return evaluate(meta_params, tasks, keys)
    except (TypeError, ValueError, flax.errors.FlaxError) as error:
      line = (str(error).strip().splitlines() or [type(error).__name__])[0]
      raise InputError(
        f"{where}: tasks do not fit the learner's network and likelihood ({line}); pass "
        "tasks of the inputs and targets it trained on"
      ) from error

  return evaluate_or_refuse


def check_tasks(
  where: str,
  tasks: Task,
  kind: str,
  input_shape: Optional[tuple] = None,
  num_outputs: Optional[int] = None,
) -> tuple[int, Task]:
  """Host checks of `tasks` to fit a `kind` map on: `(number of tasks, numpy arrays)`.

  A concrete `vj.Task` batch of at least `maps.MIN_TASKS` tasks, float inputs (of
  `input_shape` where given, else support and query alike), integer labels `[tasks, n]`
  or float targets `[tasks, n, num_outputs]` (any width where None), finite values;
  with `num_outputs`, also `check_labels`.
  """
  num_tasks = check_task_batch(tasks, where)
  if not checks.concrete(tuple(tasks)):
    raise InputError(f"{where} runs on concrete tasks (it checks them on the host), not traced")
  arrays = Task(*(np.asarray(field) for field in tasks))
  if num_tasks < maps.MIN_TASKS:
    raise checks.fail(
      where,
      "tasks",
      f"at least {maps.MIN_TASKS} tasks (one task's queries share one adaptation: a fit on "
      "them fits that task), e.g. the validation tasks",
      f"{num_tasks} task",
    )
  if input_shape is None:
    input_shape, whose = tuple(arrays.support_x.shape[2:]), "support_x's"
  else:
    input_shape, whose = tuple(input_shape), "the run's"
  shape = ", ".join(map(str, input_shape))
  for name in ("support_x", "query_x"):
    value = getattr(arrays, name)
    if tuple(value.shape[2:]) != input_shape:
      raise checks.fail(
        where, f"tasks.{name}", f"[tasks, n, {shape}] ({whose} inputs)", checks.describe(value)
      )
    checks.floating(where, f"tasks.{name}", value, checks.IMAGE_HINT)
  width = "outputs" if num_outputs is None else num_outputs
  for name in ("support_y", "query_y"):
    value = getattr(arrays, name)
    if kind == "classification":
      good = value.ndim == 2 and np.issubdtype(value.dtype, np.integer)
      wanted = "[tasks, n] integer labels (a classifier's tasks)"
    else:
      good = value.ndim == 3 and np.issubdtype(value.dtype, np.floating)
      good = good and num_outputs in (None, value.shape[2])
      wanted = f"[tasks, n, {width}] float targets (a regressor's tasks)"
    if not good:
      raise checks.fail(where, f"tasks.{name}", wanted, checks.describe(value))
  checks.check_finite(where, {f"tasks.{k}": v for k, v in arrays._asdict().items()})
  if num_outputs is not None:
    check_labels(where, arrays, kind, num_outputs)
  return num_tasks, arrays


def check_labels(where: str, arrays: Task, kind: str, num_outputs: int) -> None:
  """A classifier's labels: queries' in `[0, num_outputs)`, each support set of every class."""
  if kind != "classification":
    return
  checks.labels_in_range(where, "tasks.query_y", arrays.query_y, num_outputs)
  for i, labels in enumerate(arrays.support_y):
    present = sorted(set(labels.tolist()))
    if present != list(range(num_outputs)):
      raise checks.fail(
        where,
        f"tasks.support_y (task {i})",
        f"labels covering every class 0..{num_outputs - 1} of the {num_outputs} outputs",
        f"labels {present}",
      )


def evaluate_tasks(
  evaluate: Callable,
  meta_params: PyTree,
  tasks: Task,
  key: jax.Array,
  num_tasks: int,
  batch_tasks: int,
) -> dict:
  """`evaluate`'s per-task results on `tasks` (numpy), with `targets`.

  In batches of `batch_tasks`; task i with key i of `key`'s split, so a task's draws do not
  depend on the batch.
  """
  keys = evaluation.per_task_keys(key, num_tasks)
  parts = []
  for start in range(0, num_tasks, batch_tasks):
    chunk = jax.tree_util.tree_map(lambda field: field[start : start + batch_tasks], tasks)
    result = evaluate(meta_params, chunk, keys[start : start + batch_tasks])
    parts.append(jax.device_get(result._asdict()))
  per_task = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
  per_task["targets"] = np.asarray(tasks.query_y)
  return per_task


def fit_per_task(
  kind: str, per_task: dict, noise_std: Optional[float], where: str, method: Optional[str]
) -> maps.Calibration:
  """The map fitted on an evaluator's per-task results; InputError naming non-finite tasks."""
  bad = evaluation.non_finite_tasks(per_task)
  if bad.size:
    raise InputError(
      f"{where}: {bad.size} of {len(per_task['targets'])} tasks gave non-finite results "
      f"(tasks {bad[:10].tolist()}); no map is fitted on them: leave those tasks out, or "
      "find where the meta-parameters diverged (vj.debug_nonfinite)"
    )
  return maps.fit(kind, per_task, noise_std, where, method)
