"""A trained run, loaded from its folder without its data set.

    import vampire_jax as vj
    run = vj.load_run("runs/omniglot_5way1shot_vampire_original_seed0")
    run.config                                            # the config dataclass it trained with
    probs = run.predict(support_x, support_y, query_x, key)   # [num_query, ways]
    draws = run.predict_draws(support_x, support_y, query_x, key)  # [num_mc_test, num_query, ways]
    u = vj.uncertainty(draws)      # total, aleatoric, epistemic uncertainty per query

The run folder's `run.json` names the network (class and fields), the input shape, the
likelihood and the config; the meta-parameters come from `best/` (the best validation) or
else the latest checkpoint. Nothing here reads the data set or imports TensorFlow.
"""

import functools
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core import host_memory, models
from vampire_jax._src.core.errors import InputError, MissingDataError
from vampire_jax._src.core.learners import MetaLearner, adapt_to_task
from vampire_jax._src.metrics import learner_recalibration, predictive
from vampire_jax._src.metrics import recalibration as recalibration_maps
from vampire_jax.runs import compile_note, kinds, programs, recalibration
from vampire_jax.runs import run_folder
from vampire_jax.runs.run_folder import RunCheckpoints
from vampire_jax.runs.run_from_record import (
  config_from_record as config_from_record,  # the old module path of 0.2.0 reads it here
)
from vampire_jax.runs.run_from_record import (
  network_from_record,
  template_state,
  test_learner,
  tested_step,
  x64_context,
)

PyTree = Any


def _in_run_precision(method):
  """`method` run under the run's own `JAX_ENABLE_X64` (`Run._precision`)."""

  @functools.wraps(method)
  def in_precision(self, *args, **kwargs):
    with self._precision():
      return method(self, *args, **kwargs)

  return in_precision


class Run:
  """A trained meta-learner: its config, network and meta-parameters.

  A `Run` pickles (and copies) whole: its record and meta-parameters, not
  its folder, so `pickle.loads` gives the same predictions without the
  folder (a network class passed to `load_run` as `model=` is pickled by
  name, as pickle does any class).

  Precision: a `Run` predicts as its run computed, whatever this process's
  `JAX_ENABLE_X64`: a run trained in float32 (the default) predicts in
  float32 under `JAX_ENABLE_X64=1` too, the same numbers bit for bit, and
  one trained with it on predicts in 64 bits (its record's `x64`).

  Attributes:
    workdir: the run folder.
    config: the config dataclass it was trained with.
    model: the flax module.
    kind: 'classification' or 'regression'.
    input_shape: one example's shape.
    noise_std: the regression predictive's noise (None for classification): the
      likelihood's, times sqrt(s) on a run recalibrated by a variance scale s.
    meta_params: the meta-parameters (the best validated, else the latest).
    learner: the test-time learner (`num_mc_test` draws); on a recalibrated run, one
      whose `predict` applies the map (`vj.recalibrate`).
    calibration: the recalibration map the run applies (`vj.recalibrate`: its method,
      value and the tasks it was fitted on), or None: the raw predictive.
    step: the meta-step whose meta-parameters these are (None: not known).
    tested_step: the step `results.json` says the run's test scored (None:
      no results, e.g. a run still training); when it is not `step` (that
      checkpoint was deleted or is damaged), `load_run` says so in a warning.
  """

  def __init__(
    self,
    workdir: Path,
    record: dict,
    config,
    meta_params: PyTree,
    learner: MetaLearner,
    *,
    model: Optional[nn.Module] = None,
    step: Optional[int] = None,
    tested_step: Optional[int] = None,
    calibration: Optional[recalibration_maps.Calibration] = None,
    uncalibrated: Optional["Run"] = None,
  ):
    self.workdir = workdir
    self.record = record
    self.config = config
    self.model = models.module_from_spec(record["model"]) if model is None else model
    self.kind = record["kind"]
    self.input_shape = tuple(record["input_shape"])
    self.noise_std = recalibration_maps.calibrated_noise_std(calibration, record["noise_std"])
    self.meta_params = meta_params
    self.learner = learner_recalibration.calibrated_learner(
      learner, calibration, record["noise_std"]
    )
    self.step = step
    self.tested_step = tested_step
    self.calibration = calibration
    # The raw run (itself, if not recalibrated): one, so that its programs compile once.
    parts = (workdir, record, config, meta_params, learner)
    raw = self if calibration is None else uncalibrated
    self._uncalibrated = raw or Run(*parts, model=self.model, step=step, tested_step=tested_step)
    predict_outputs = jax.jit(self._predict_outputs_one, static_argnums=5)
    self._predict_outputs = host_memory.releasing_after_compiles(predict_outputs)  # memory back

  def __reduce__(self):
    """Pickled as its record, meta-parameters (host arrays) and steps, not its folder."""
    given = type(self.model)
    recorded = self.record["model"]["class"]
    override = None if models.module_spec(self.model)["class"] == recorded else given
    if override is not None and "<locals>" in given.__qualname__:
      raise InputError(
        f"pickle: this Run's network class {given.__qualname__} is defined inside a function, "
        "so pickle cannot name it; define it at the top level of a module, or pickle "
        "run.record and jax.device_get(run.meta_params) instead"
      )
    parts = (
      str(self.workdir),
      self.record,
      jax.device_get(self.meta_params),
      override,
      self.step,
      self.tested_step,
      None if self.calibration is None else tuple(self.calibration),
      type(self.config.algorithm),
    )
    return _unpickled_run, parts

  def _with_calibration(self, calibration: Optional[recalibration_maps.Calibration]) -> "Run":
    """This run with `calibration` applied in place of its own (None: its one raw run)."""
    if calibration is None:
      return self._uncalibrated
    raw = self._uncalibrated
    parts = (raw.workdir, raw.record, raw.config, raw.meta_params, raw.learner)
    kwargs = dict(model=raw.model, step=raw.step, tested_step=raw.tested_step)
    return Run(*parts, **kwargs, calibration=calibration, uncalibrated=raw)

  @functools.cached_property
  def _evaluator(self):
    """The run's jitted evaluator (`programs.build_evaluator`), of its learner and noise."""
    return programs.build_evaluator(self.kind, self.noise_std, self.config, self.learner)

  def save(self, workdir: Optional[str | os.PathLike] = None) -> Path:
    """Writes the run's calibration (`vj.recalibrate`) as `recalibration.json`, atomically.

    In `workdir` (default: the run's folder); returns the path. `vj.load_run(workdir,
    recalibrated=True)` applies it again, and refuses it for another run or step (the
    file names the run's id and step). Raises InputError on a run without a calibration,
    RunFolderError where `workdir` holds another run or is a zoo's cell whose manifest
    records another map (`recalibration.write_calibration`), StorageError where the folder
    cannot be written.
    """
    if self.calibration is None:
      raise InputError(
        "Run.save: this run has no calibration to save; fit one first: "
        "vj.recalibrate(run, validation_tasks, key).save()"
      )
    folder = self.workdir if workdir is None else Path(workdir)
    return recalibration.write_calibration(folder, self.calibration, self.record, self.step)

  def _precision(self):
    """A context in which JAX computes as the run did: `JAX_ENABLE_X64` as recorded."""
    return x64_context(run_folder.recorded_x64(self.record))

  def _predict_outputs_one(self, meta_params, support_x, support_y, query_x, key, transductive):
    """The network's outputs on the queries, `[num_mc_test, num_query, ...]`, one per draw."""
    # The key split as the evaluators split a task's key: the same draws as the test's.
    task_params, predict_key = adapt_to_task(self.learner, meta_params, support_x, support_y, key)
    if transductive:  # the queries are one batch: batch norm normalises them together
      return self.learner.predict(task_params, query_x, predict_key)

    def one_query(x):  # a batch of one, with the same weight draws for every query
      return self.learner.predict(task_params, x[None], predict_key)[:, 0]

    return jax.vmap(one_query, out_axes=1)(query_x)

  def _check_inputs(self, support_x, support_y, query_x, where: str = "Run.predict") -> None:
    """Host-side checks of `predict`'s arguments: shapes, dtypes, finite values, labels."""
    wanted = f"[n, {', '.join(map(str, self.input_shape))}]"
    for name, x in (("support_x", support_x), ("query_x", query_x)):
      if tuple(np.shape(x)[1:]) != self.input_shape or np.shape(x)[0] < 1:
        raise checks.fail(
          where, name, f"{wanted} with n >= 1, preprocessed as in training", checks.describe(x)
        )
      checks.floating(where, name, x, checks.IMAGE_HINT)
    num_support = checks.examples(where, ("support_x", "support_y"), support_x, support_y)
    kinds.get(self.kind).check_support_y(where, support_y, num_support, self.num_outputs)
    checks.check_finite(where, {"support_x": support_x, "support_y": support_y, "query_x": query_x})

  @functools.cached_property
  def num_outputs(self) -> int:
    """The network's output size (the number of ways, for a classifier); traced once.

    An embedding without a head (ProtoNet) has as many outputs as features: its
    classes are the config's ways.
    """
    if self.config.algorithm.embedding:
      return int(self.config.ways)
    x = jnp.zeros((1,) + self.input_shape)
    shape = jax.eval_shape(lambda: self.model.apply(self.model.init(jax.random.key(0), x), x))
    return int(shape.shape[-1])

  @_in_run_precision
  def predict(
    self,
    support_x,
    support_y,
    query_x,
    key: jax.Array,
    *,
    transductive: bool = True,
    num_samples: Optional[int] = None,
  ) -> jax.Array:
    """Adapts to the support set with the run's test settings and predicts the queries.

    The inputs are copied to the host and checked there (shapes, dtypes, finite
    values, bfloat16 included, labels covering the run's classes), so lists
    and arrays sharded over devices are taken as their values.

    Args:
      support_x: `[num_support, *input_shape]`, preprocessed as in training
        (e.g. `vj.data.preprocess_omniglot`).
      support_y: `[num_support]` integer labels (classification) or
        `[num_support, 1]` targets (regression).
      query_x: `[num_query, *input_shape]`.
      key: PRNG key of the adaptation and prediction draws.
      transductive: True (the default, the paper's protocol and the one that
        gave the run's test scores): the queries are one batch, and a network
        with batch norm (Conv4) normalises them with their joint statistics,
        so a query's prediction depends on the queries passed with it.
        False: each query is predicted alone (a batch of one, the same weight
        draws for every query), so its prediction is the same whatever else
        is passed. A network without batch norm (`vj.MLP`) gives the same
        answer both ways, unless it draws outputs per example
        (the spec's `local_reparameterization`).
      num_samples: regression only: how many samples of the predictive to
        draw (default: one per weight draw: the run's `num_mc_test`, BMAML's
        particles, MAML's one). Sample i is weight draw i mod D (of the D
        draws) plus its own Gaussian noise of the run's `noise_std`, so a
        point estimate (MAML) gives as many samples as asked.

    Returns:
      Classification: `[num_query, ways]`, the softmax averaged over the
      run's `num_mc_test` weight draws (rows sum to 1). Regression:
      `[num_samples, num_query, 1]`, samples of the predictive distribution,
      the likelihood's noise included (`predict_function_draws` gives the
      noise-free outputs of each weight draw).
    """
    if self.kind != "regression":
      if num_samples is not None:
        raise checks.fail(
          "Run.predict",
          "num_samples",
          "None for a classifier (it returns probabilities)",
          repr(num_samples),
        )
      draws = self._draws(support_x, support_y, query_x, key, "Run.predict", transductive)
      return kinds.get(self.kind).predictive(draws)
    return self._predictive_samples(
      support_x, support_y, query_x, key, "Run.predict", transductive, num_samples
    )

  @_in_run_precision
  def predict_draws(
    self, support_x, support_y, query_x, key: jax.Array, *, transductive: bool = True
  ) -> jax.Array:
    """The prediction of each weight draw: what `predict` averages (same key, same draws).

    Arguments as `predict`. `vj.uncertainty(draws)` splits a classifier's
    uncertainty into its aleatoric and epistemic parts.

    Returns:
      Classification: `[num_mc_test, num_query, ways]`, the softmax of each
      weight draw (a point estimate such as MAML has one draw; BMAML one per
      particle); `predict` returns their mean. Regression:
      `[draws, num_query, 1]`, one sample of the predictive per weight draw,
      the likelihood's noise included: `predict` with its default
      `num_samples`.
    """
    if self.kind == "regression":
      return self._predictive_samples(
        support_x, support_y, query_x, key, "Run.predict_draws", transductive, None
      )
    return self._draws(support_x, support_y, query_x, key, "Run.predict_draws", transductive)

  @_in_run_precision
  def predictive(self, support_x, support_y, query_x, key: jax.Array, *, transductive: bool = True):
    """The predictive distribution over the query targets, a distrax distribution.

    Arguments as `predict`; the same key gives the same weight draws as
    `predict`, `predict_draws` and `predict_function_draws`, and as the
    evaluators' split of a task's key.

    Returns:
      Classification: a `distrax.Categorical` of batch `[num_query]`, the mean
      over the `num_mc_test` draws of their softmax (`probs` is `predict`'s
      result; `entropy()` is `vj.uncertainty(...).total`); its `log_prob`
      takes `[num_query]` integer labels. Regression: a
      `distrax.MixtureSameFamily` of batch `[num_query]` and event `[1]`,
      equal weights over the draws, each `Normal(f_l(x), noise_std)`:
      `log_prob(query_y)` (`[num_query, 1]`, and no other shape) is the log
      of the predictive the test's NLL scores, samples include the noise,
      and `variance()` is the draws' spread plus noise_std^2 (`vj.predictive_interval` gives its central
      intervals). On a run recalibrated by a quantile map R (`method="quantile"`),
      that (variance-scaled) mixture under R: a `RecalibratedPredictive`, whose
      `cdf`, `log_prob`, `quantile`, samples, `mean`, `variance` and intervals
      are those of the CDF R(F(y)). See `vj.predictive_distribution`.
    """
    outputs = self._outputs(support_x, support_y, query_x, key, "Run.predictive", transductive)
    return predictive.predictive_distribution(outputs, self.learner.nll)

  @_in_run_precision
  def predict_function_draws(
    self, support_x, support_y, query_x, key: jax.Array, *, transductive: bool = True
  ) -> jax.Array:
    """The network's noise-free outputs under each weight draw, `[num_mc_test, num_query, ...]`.

    Arguments as `predict`; the same key gives the same weight draws. For a
    regression run these are draws of the mean function (without the
    likelihood's noise: their spread is the epistemic part only); for a
    classifier, each draw's logits.
    """
    return self._outputs(
      support_x, support_y, query_x, key, "Run.predict_function_draws", transductive
    )

  def _predictive_samples(
    self, support_x, support_y, query_x, key, where, transductive, num_samples
  ) -> jax.Array:
    """Regression: weight draw i mod D plus N(0, noise_std^2), for i < num_samples."""
    if num_samples is not None:
      checks.step_count(where, "num_samples", num_samples, 1)
    functions = self._outputs(support_x, support_y, query_x, key, where, transductive)
    if num_samples is None:
      num_samples = functions.shape[0]
    # The noise's own key: the weight draws stay those of the evaluator's split of `key`.
    noise_key = jax.random.fold_in(key, 1)
    if getattr(self.learner.nll, "quantile_map", None) is not None:
      # Under a quantile map the predictive is no mixture to draw a component of: its
      # samples are its quantiles at uniform levels (inverse-CDF sampling).
      distribution = predictive.predictive_distribution(functions, self.learner.nll)
      return distribution.sample(seed=noise_key, sample_shape=num_samples)
    which = jnp.arange(num_samples) % functions.shape[0]
    noise = jax.random.normal(noise_key, (num_samples,) + functions.shape[1:], functions.dtype)
    return functions[which] + self.noise_std * noise

  def _draws(self, support_x, support_y, query_x, key, where: str, transductive) -> jax.Array:
    outputs = self._outputs(support_x, support_y, query_x, key, where, transductive)
    return kinds.get(self.kind).draws(outputs)

  def _outputs(self, support_x, support_y, query_x, key, where: str, transductive) -> jax.Array:
    # Host copies: lists become arrays, and arrays sharded over devices (or on
    # another device than the meta-parameters) are gathered; the checks see values.
    if not isinstance(transductive, bool):
      raise checks.fail(where, "transductive", "True or False", repr(transductive))
    if not checks.concrete((support_x, support_y, query_x, key)):
      raise InputError(
        f"{where} runs on concrete arrays (it checks them on the host), not under "
        "jax.jit, vmap or grad; for a traceable prediction use run.learner.adapt and "
        "run.learner.predict with run.meta_params, or the evaluators"
      )
    support_x, support_y, query_x = (np.asarray(a) for a in (support_x, support_y, query_x))
    checks.prng_key(where, "key", key)
    self._check_inputs(support_x, support_y, query_x, where)
    arrays = (jnp.asarray(support_x), jnp.asarray(support_y), jnp.asarray(query_x))
    # The first call compiles (a minute for a Conv4 on a CPU): past a few seconds, one note.
    return compile_note.noting_a_slow_first_call(
      self._predict_outputs, self.meta_params, *arrays, key, transductive
    )


def load_run(
  workdir: str | os.PathLike,
  *,
  model: Optional[type | ModuleType] = None,
  recalibrated: bool = False,
  algorithm: Optional[type] = None,
) -> Run:
  """Loads a run folder written by `train_and_evaluate` (any experiment).

  Args:
    workdir: the run folder.
    model: the network's class, for a run whose recorded class cannot be
      imported here: one defined in the script that trained it (`__main__`:
      training warns of it), or in a module since moved. A `flax.linen.Module`
      subclass, or a Python module that defines the class under its recorded
      name. It is built with the recorded fields; a class whose parameters
      are not the checkpoint's is refused. Default: the class `run.json`
      names, imported.
    algorithm: the algorithm's spec class, for a run of a spec of your own whose recorded
      class cannot be imported here (defined in the script that trained it, `__main__`).
      Default: the class `run.json` names, imported.
    recalibrated: False (the default): the raw predictive, `Run.calibration` None.
      True: the map of the folder's `recalibration.json` applied (`vj.recalibrate`,
      `Run.save`; the training loop writes one after its test).

  Returns:
    A `Run`: `.config`, `.predict(support_x, support_y, query_x, key)`, ...;
    `.step` is the step whose meta-parameters it holds.

  The record comes from `run.json`, else (lost or damaged) from the newest
  checkpoint; the meta-parameters are the ones the run tested
  (`config.evaluation.test_parameters`): the final ones from the newest checkpoint, or
  the best from `best/`, else (none, or damaged: a warning says so) the
  newest checkpoint that restores. A step folder without its `default/`
  item (a copy cut short) is skipped with a warning. When the step loaded is
  not the one `results.json` says was tested (its checkpoint was deleted or
  is damaged), a warning names both (`Run.step`, `Run.tested_step`).

  Raises:
    MissingDataError: the folder has no run record (`run.json` nor a
      checkpoint); a comparison's folder names the runs it holds.
    RunFolderError: a file of a zoo cell is missing or changed (not the
      sha256 that the zoo's `manifest.json` beside the folder records), no
      checkpoint restores, `best/` or a checkpoint belongs to another run
      (`run_folder`, "A run reads only what it wrote"), the network's class cannot be imported (pass `model=`), or
      the network built has other parameters than the checkpoint's (its
      code changed since training, or `model=` is another network).
    RunFolderError: with `recalibrated=True`, a folder without `recalibration.json`
      (the message says how to make one), or one fitted for another run or step.
    InputError: `model` is not a network class, nor a module defining the
      recorded one, or does not take the recorded fields; `recalibrated` not a bool.

  Examples:
    A cell of the model zoo (a run folder in a clone's `zoo/`: MAML on sine/line
    regression); any run folder loads alike.

    >>> import numpy as np
    >>> run = vj.load_run("zoo/regression_cpu_maml")
    >>> run.kind, run.config.algorithm.name, run.step
    ('regression', 'maml', 3000)
    >>> x = np.linspace(-4.0, 4.0, 5, dtype=np.float32)[:, None]   # 5 support points
    >>> samples = run.predict(x, np.sin(x), x, jax.random.key(0))  # adapted, then predicted
    >>> samples.shape                             # [draws (MAML: 1), queries, 1], noise included
    (1, 5, 1)
  """
  if not isinstance(recalibrated, bool):
    raise checks.fail("load_run", "recalibrated", "True or False", repr(recalibrated))
  workdir = Path(workdir)
  run_folder.check_recorded_files(workdir)  # a zoo cell: every file as its manifest says
  record = run_folder.read_run_record(workdir, print_fn=_warn)
  if record is None:
    inside = sorted(
      str(sub) for sub in (workdir.iterdir() if workdir.is_dir() else []) if _holds_a_run(sub)
    )
    if inside:
      raise MissingDataError(
        f"{workdir} is not a run folder but holds {len(inside)} runs (a comparison): "
        f"{', '.join(inside)}; load one of them"
      )
    raise MissingDataError(
      f"{workdir} has no {run_folder.RUN_RECORD}: not a run folder written "
      "by vampire_jax.train_and_evaluate (or written before runs were "
      "recorded)"
    )
  network = network_from_record(record["model"], model, workdir)
  saved_calibration = recalibration.read_calibration(workdir, record) if recalibrated else None
  with x64_context(run_folder.recorded_x64(record)):
    config = config_from_record(record, algorithm=algorithm)
    learner = test_learner(network, record, config)
    template = template_state(
      network, tuple(record["input_shape"]), record["kind"], record["noise_std"], config
    )
    checkpoints = RunCheckpoints(workdir, create=False, print_fn=_warn)
    try:
      meta_params, step, source = checkpoints.restore_meta_params(
        template, config.evaluation.test_parameters
      )
    finally:
      checkpoints.close()
  tested = tested_step(workdir, _warn)
  if tested is not None and tested != step:
    _warn(
      f"load_run: {workdir} gives the meta-parameters of step {step} (from {source}), not "
      f"those of step {tested}, which {run_folder.RESULTS_FILE} says the test scored: "
      f"that step's checkpoint is missing or damaged (Run.step says which step is loaded)"
    )
  calibration = None
  if recalibrated:
    calibration, fitted_step = saved_calibration
    recalibration.check_fitted_step(workdir, fitted_step, step)
  kwargs = dict(model=network, step=step, tested_step=tested, calibration=calibration)
  return Run(workdir, record, config, meta_params, learner, **kwargs)


def _unpickled_run(
  workdir: str,
  record: dict,
  meta_params,
  model,
  step,
  tested_step,
  calibration=None,
  algorithm=None,
) -> Run:
  """A pickled `Run` again (`Run.__reduce__`): rebuilt from its record, no folder read."""
  if calibration is not None:
    calibration = recalibration_maps.Calibration(*calibration)
  network = models.module_from_spec(record["model"], model)
  with x64_context(run_folder.recorded_x64(record)):
    config = config_from_record(record, algorithm=algorithm)
    learner = test_learner(network, record, config)
    meta_params = jax.tree_util.tree_map(jnp.asarray, meta_params)
  kwargs = dict(model=network, step=step, tested_step=tested_step, calibration=calibration)
  return Run(Path(workdir), record, config, meta_params, learner, **kwargs)


def _holds_a_run(folder: Path) -> bool:
  return folder.is_dir() and (
    (folder / run_folder.RUN_RECORD).is_file()
    or run_folder.latest_checkpoint_step(folder) is not None
  )


def _warn(message: str) -> None:
  warnings.warn(message, stacklevel=3)
