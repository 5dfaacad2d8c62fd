"""vampire_jax: Bayesian few-shot meta-learning (VAMPIRE) in JAX.

Pure functions over parameter pytrees. A distribution over weights is a
`Gaussian(mean, log_std)` of two trees; `adapt` fits a task posterior by a
few gradient steps on the variational free energy.

Layers, from the leaves up (each imports only those below it):
  errors, checks, gaussian, losses, tasks, backend_defaults
  batching, convolution, models, sharding, config, calibration
  adapters                        from_nnx / from_equinox: (params, apply_fn) of NNX, Equinox
  adaptation                      adapt / maml_adapt / predict
  learners, baselines             MetaLearner factories: vampire, maml, platipus, bmaml, abml
  diagnostics                     check_inner_loop, debug_nonfinite
  predictive_uncertainty          vj.uncertainty, auroc, open-set summaries
  meta_step, evaluation           the meta-step and evaluator builders
  kinds                           one ProblemKind per kind: likelihood, metrics, summary, score
  algorithms                      the registry: a RunConfig -> its MetaLearner; make_learner
  run_folder                      records, lock, checkpoints, logs, results
  interrupts                      every stop and fault: signals, exit codes, background noise
  checkpoint, reporting
  training                        train_and_evaluate(problem, config, workdir)
  runs                            load_run(workdir) -> Run (uses run_folder, not training)
  configs                         each experiment's config dataclass (what run folders name)
  data                            Omniglot, mini-ImageNet, LEO features, sine/line; task sampler
"""

from vampire_jax import (
  adaptation,
  adapters,
  algorithms,
  backend_defaults,
  baselines,
  batching,
  calibration,
  checkpoint,
  checks,
  config,
  configs,
  convolution,
  data,
  diagnostics,
  errors,
  evaluation,
  gaussian,
  interrupts,
  kinds,
  learners,
  losses,
  meta_step,
  models,
  predictive_uncertainty,
  problem,
  programs,
  reporting,
  run_folder,
  runs,
  sharding,
  tasks,
  training,
)
from vampire_jax.adapters import from_equinox, from_nnx
from vampire_jax.adaptation import adapt, expected_nll, maml_adapt, predict, variational_free_energy
from vampire_jax.batching import (
  BATCHING_STRATEGIES,
  MAPPED_STRATEGIES,
  batched_map,
  default_task_batching,
)
from vampire_jax.calibration import (
  QuantileCalibration,
  ReliabilityBins,
  RiskCoverage,
  classification_calibration,
  mean_confidence_interval,
  mixture_cdf,
  mixture_quantile,
  paper_quantile_calibration,
  regression_quantile_calibration,
  risk_coverage,
)
from vampire_jax.checkpoint import RunCheckpoints
from vampire_jax.config import RunConfig
from vampire_jax.diagnostics import InnerLoopReport, check_inner_loop, debug_nonfinite
from vampire_jax.errors import (
  ConfigError,
  DataError,
  DivergenceError,
  InputError,
  MissingDataError,
  RunFolderError,
  StorageError,
  UserError,
)
from vampire_jax.evaluation import (
  ClassificationEval,
  OpenSetEval,
  RegressionEval,
  evaluate_split,
  make_classification_evaluator,
  make_open_set_evaluator,
  make_regression_evaluator,
  make_split_evaluator,
)
from vampire_jax.kinds import ProblemKind, summarise
from vampire_jax.gaussian import (
  Gaussian,
  check_gaussian,
  gaussian_from_distrax,
  gaussian_from_params,
  kl_divergence,
  kl_step_factor,
  point_mass,
  sample,
  to_distrax,
)
from vampire_jax.learners import InnerLoopSettings, MetaLearner, maml, query_loss, vampire
from vampire_jax.losses import categorical_nll, distribution_nll, gaussian_nll, loss_from_apply
from vampire_jax.meta_step import (
  MetaOptimizer,
  MetaState,
  apply_meta_gradient,
  classification_metrics,
  init_meta_state,
  make_host_chunked_meta_step,
  make_host_chunked_train_step,
  make_meta_gradient,
  make_meta_step,
  make_train_step,
  meta_lr_schedule,
  meta_optimizer,
  log_std_mask,
)
from vampire_jax.models import (
  MLP,
  Conv4,
  conv4_mini_imagenet,
  conv4_omniglot,
  init_params,
  local_reparameterization,
  mixed_precision,
  pure_apply,
)
from vampire_jax.predictive import predictive, predictive_distribution, predictive_interval
from vampire_jax.runs import Run, load_run
from vampire_jax.sharding import replicate, shard_tasks, task_mesh, use_all_cpu_cores
from vampire_jax.tasks import Task
from vampire_jax.interrupts import TrainingInterrupted
from vampire_jax.problem import Problem
from vampire_jax.training import train_and_evaluate
from vampire_jax.predictive_uncertainty import (
  Uncertainty,
  auroc,
  entropy,
  open_set_summary,
  regression_uncertainty,
  roc_curve,
  uncertainty,
)

# The one version: pyproject.toml reads it (setuptools' dynamic version).
__version__ = "0.2.0"

__all__ = (
  # Modules.
  "adaptation",
  "adapters",
  "algorithms",
  "backend_defaults",
  "baselines",
  "batching",
  "calibration",
  "checkpoint",
  "checks",
  "config",
  "configs",
  "convolution",
  "data",
  "diagnostics",
  "errors",
  "evaluation",
  "gaussian",
  "interrupts",
  "kinds",
  "learners",
  "losses",
  "meta_step",
  "models",
  "predictive_uncertainty",
  "problem",
  "programs",
  "reporting",
  "run_folder",
  "runs",
  "sharding",
  "tasks",
  "training",
  # Distributions over weights.
  "Gaussian",
  "check_gaussian",
  "gaussian_from_params",
  "gaussian_from_distrax",
  "to_distrax",
  "kl_divergence",
  "kl_step_factor",
  "point_mass",
  "sample",
  # Likelihoods, networks, tasks.
  "categorical_nll",
  "distribution_nll",
  "gaussian_nll",
  "loss_from_apply",
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
  "Task",
  # Adaptation and learners.
  "adapt",
  "expected_nll",
  "maml_adapt",
  "predict",
  "variational_free_energy",
  "MetaLearner",
  "InnerLoopSettings",
  "maml",
  "query_loss",
  "vampire",
  # Diagnostics.
  "InnerLoopReport",
  "check_inner_loop",
  "debug_nonfinite",
  # The meta-step.
  "MetaOptimizer",
  "MetaState",
  "apply_meta_gradient",
  "classification_metrics",
  "init_meta_state",
  "make_host_chunked_meta_step",
  "make_host_chunked_train_step",
  "make_meta_gradient",
  "make_meta_step",
  "make_train_step",
  "meta_lr_schedule",
  "meta_optimizer",
  "log_std_mask",
  "BATCHING_STRATEGIES",
  "MAPPED_STRATEGIES",
  "batched_map",
  "default_task_batching",
  # Evaluation and calibration.
  "ClassificationEval",
  "RegressionEval",
  "evaluate_split",
  "make_classification_evaluator",
  "make_regression_evaluator",
  "make_split_evaluator",
  "summarise",
  "ProblemKind",
  "QuantileCalibration",
  "ReliabilityBins",
  "RiskCoverage",
  "classification_calibration",
  "mean_confidence_interval",
  "mixture_cdf",
  "mixture_quantile",
  "paper_quantile_calibration",
  "regression_quantile_calibration",
  "risk_coverage",
  # The predictive distribution (distrax).
  "predictive",
  "predictive_distribution",
  "predictive_interval",
  # Uncertainty and open-set detection.
  "Uncertainty",
  "uncertainty",
  "regression_uncertainty",
  "entropy",
  "auroc",
  "roc_curve",
  "open_set_summary",
  "OpenSetEval",
  "make_open_set_evaluator",
  # Training runs.
  "RunConfig",
  "Problem",
  "TrainingInterrupted",
  "train_and_evaluate",
  "RunCheckpoints",
  "Run",
  "load_run",
  # Several devices.
  "replicate",
  "shard_tasks",
  "task_mesh",
  "use_all_cpu_cores",
  # Errors.
  "UserError",
  "ConfigError",
  "DataError",
  "DivergenceError",
  "InputError",
  "MissingDataError",
  "RunFolderError",
  "StorageError",
)
