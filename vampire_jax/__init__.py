"""vampire_jax: Bayesian few-shot meta-learning (VAMPIRE) in JAX.

Pure functions over parameter pytrees. A distribution over weights is a
`Gaussian(mean, log_std)` of two trees; `adapt` fits a task posterior by a
few gradient steps on the variational free energy.

This module is the public API: the names below, and the subpackages `data`
(Omniglot, mini-ImageNet, LEO features, sine/line; the task sampler), `baselines`
(PLATIPUS, BMAML, ABML, ProtoNet, SImPa), `specs` (one spec per algorithm), `runs`
(the run harness), and the modules `backend` (how the work runs on the backend at hand:
the 'auto' choices of batching and convolution, the loop-safe convolution, CPU devices,
the compilation cache, host memory) and `metrics` (what the experiments' reports take
apart: a split's scores, calibration records, the recalibration maps). The layers, each
importing only those before it:

  _src/core/     private: the maths and how it runs: Gaussians, likelihoods, networks,
                 the inner loop, learners, the meta-step, task batching, device meshes
  _src/metrics/  private: calibration, predictive uncertainty, evaluators, the predictive
  data/, baselines/   the data sets and task samplers; the other algorithms
  runs/          the run harness: configs and specs, the loop, the run folder, `load_run`;
                 beside it `specs`, `backend` and `metrics`, which re-export from _src

Module paths of earlier versions (`vampire_jax.gaussian`, ...) and names that
left the top level warn once and still work (`_src/deprecations.py`).
"""

from vampire_jax import backend, baselines, data, metrics, runs, specs
from vampire_jax._src import deprecations as _deprecations
from vampire_jax._src.core.adaptation import (
  adapt,
  expected_nll,
  maml_adapt,
  predict,
  variational_free_energy,
)
from vampire_jax._src.core.diagnostics import (
  InnerLoopReport,
  check_inner_loop,
  debug_nonfinite,
  largest_curvature,
)
from vampire_jax._src.core.errors import (
  ConfigError,
  DataError,
  DivergenceError,
  InputError,
  MissingDataError,
  RunFolderError,
  StorageError,
  UserError,
)
from vampire_jax._src.core.framework_adapters import (
  from_equinox,
  from_nnx,
)
from vampire_jax._src.core.gaussian import (
  Gaussian,
  gaussian_from_distrax,
  gaussian_from_params,
  kl_divergence,
  kl_step_factor,
  point_mass,
  sample,
  to_distrax,
)
from vampire_jax._src.core.learners import (
  InnerLoopSettings,
  MetaLearner,
  maml,
  query_loss,
  vampire,
  vampire2,
)
from vampire_jax._src.core.losses import (
  categorical_nll,
  distribution_nll,
  gaussian_nll,
  loss_from_apply,
)
from vampire_jax._src.core.meta_optimizer import (
  MetaOptimizer,
  meta_lr_schedule,
  meta_optimizer,
)
from vampire_jax._src.core.meta_step import (
  MetaState,
  classification_metrics,
  init_meta_state,
  make_meta_gradient,
  make_meta_step,
  make_train_step,
)
from vampire_jax._src.core.models import (
  MLP,
  Conv4,
  conv4_mini_imagenet,
  conv4_omniglot,
  init_params,
  local_reparameterization,
  mixed_precision,
  pure_apply,
)
from vampire_jax._src.core.sharding import (
  initialize_multihost,
  replicate,
  shard_tasks,
  task_mesh,
  use_all_cpu_cores,
)
from vampire_jax._src.core.tasks import (
  Task,
)
from vampire_jax._src.metrics.calibration import (
  ReliabilityBins,
  RiskCoverage,
  classification_calibration,
  mean_confidence_interval,
  risk_coverage,
)
from vampire_jax._src.metrics.evaluation import (
  ClassificationEval,
  OpenSetEval,
  RegressionEval,
  make_classification_evaluator,
  make_open_set_evaluator,
  make_regression_evaluator,
)
from vampire_jax._src.metrics.learner_recalibration import (
  fit_recalibration,
  recalibrated_learner,
)
from vampire_jax._src.metrics.predictive import (
  predictive,
  predictive_distribution,
  predictive_interval,
)
from vampire_jax._src.metrics.predictive_uncertainty import (
  Uncertainty,
  auroc,
  entropy,
  open_set_summary,
  regression_uncertainty,
  roc_curve,
  uncertainty,
)
from vampire_jax._src.metrics.quantile_calibration import (
  QuantileCalibration,
  paper_quantile_calibration,
  regression_quantile_calibration,
)
from vampire_jax.runs.interrupts import (
  TrainingInterrupted,
)
from vampire_jax.runs.kinds import (
  ProblemKind,
  summarise,
  test_summary_line,
)
from vampire_jax.runs.loop import (
  train_and_evaluate,
)
from vampire_jax.runs.problem import (
  Problem,
  draw_tasks,
)
from vampire_jax.runs.recalibration import (
  recalibrate,
)
from vampire_jax.runs.run_config import (
  Evaluation,
  RunConfig,
  Schedule,
  Speed,
)
from vampire_jax.runs.specs import (
  AlgorithmSpec,
)
from vampire_jax.runs.trained_run import (
  Run,
  load_run,
)

# The one version: pyproject.toml reads it (setuptools' dynamic version).
__version__ = "0.2.0"

__all__ = (
  # Distributions over weights.
  "Gaussian",
  "gaussian_from_params",
  "gaussian_from_distrax",
  "to_distrax",
  "kl_divergence",
  "kl_step_factor",
  "point_mass",
  "sample",
  # Likelihoods.
  "categorical_nll",
  "distribution_nll",
  "gaussian_nll",
  "loss_from_apply",
  # Networks.
  "MLP",
  "Conv4",
  "conv4_mini_imagenet",
  "conv4_omniglot",
  "init_params",
  "local_reparameterization",
  "mixed_precision",
  "pure_apply",
  "from_equinox",
  "from_nnx",
  # Tasks.
  "Task",
  # Adaptation to a task.
  "adapt",
  "expected_nll",
  "maml_adapt",
  "predict",
  "variational_free_energy",
  # Learners.
  "InnerLoopSettings",
  "MetaLearner",
  "maml",
  "query_loss",
  "vampire",
  "vampire2",
  # Diagnostics.
  "InnerLoopReport",
  "check_inner_loop",
  "debug_nonfinite",
  "largest_curvature",
  # The meta-step.
  "MetaOptimizer",
  "MetaState",
  "classification_metrics",
  "init_meta_state",
  "make_meta_gradient",
  "make_meta_step",
  "make_train_step",
  "meta_lr_schedule",
  "meta_optimizer",
  # Several devices.
  "initialize_multihost",
  "replicate",
  "shard_tasks",
  "task_mesh",
  "use_all_cpu_cores",
  # Evaluation.
  "ClassificationEval",
  "OpenSetEval",
  "RegressionEval",
  "make_classification_evaluator",
  "make_open_set_evaluator",
  "make_regression_evaluator",
  # Calibration.
  "ReliabilityBins",
  "RiskCoverage",
  "classification_calibration",
  "mean_confidence_interval",
  "risk_coverage",
  "QuantileCalibration",
  "paper_quantile_calibration",
  "regression_quantile_calibration",
  # Uncertainty and open-set detection.
  "Uncertainty",
  "auroc",
  "entropy",
  "open_set_summary",
  "regression_uncertainty",
  "roc_curve",
  "uncertainty",
  # The predictive distribution (distrax, imported on first use).
  "predictive",
  "predictive_distribution",
  "predictive_interval",
  # Recalibration of a learner's predictive (a run's: vj.recalibrate).
  "fit_recalibration",
  "recalibrated_learner",
  # Training runs.
  "RunConfig",
  "Schedule",
  "Evaluation",
  "Speed",
  "AlgorithmSpec",
  "specs",
  "Problem",
  "draw_tasks",
  "ProblemKind",
  "summarise",
  "test_summary_line",
  "TrainingInterrupted",
  "train_and_evaluate",
  "Run",
  "load_run",
  "recalibrate",
  # Errors.
  "UserError",
  "ConfigError",
  "DataError",
  "DivergenceError",
  "InputError",
  "MissingDataError",
  "RunFolderError",
  "StorageError",
  # Subpackages.
  "data",
  "baselines",
  "runs",
  "backend",
  "metrics",
)

_deprecations.install()


def __getattr__(name: str):
  # Old module paths and names that left the top level: warn once, then work.
  return _deprecations.moved_attribute(name)
