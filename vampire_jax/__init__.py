"""vampire_jax: Bayesian few-shot meta-learning (VAMPIRE) in JAX.

Pure functions over parameter pytrees. A distribution over weights is a
`Gaussian(mean, log_std)` of two trees; `adapt` fits a task posterior by a
few gradient steps on the variational free energy.
"""

from vampire_jax.adaptation import adapt, expected_nll, maml_adapt, predict, variational_free_energy
from vampire_jax.batching import BATCHING_STRATEGIES, batched_map, default_task_batching
from vampire_jax.gaussian import (Gaussian, check_gaussian, gaussian_from_params, kl_divergence, kl_step_factor,
                                 point_mass, sample)
from vampire_jax.losses import categorical_nll, gaussian_nll, loss_from_apply
from vampire_jax.meta import (ClassificationEval, MetaLearner, MetaState, RegressionEval,
                              apply_meta_gradient, classification_metrics, init_meta_state, make_classification_evaluator,
                              make_host_chunked_meta_step, make_meta_gradient,
                              make_meta_step, make_regression_evaluator, maml, meta_lr_schedule, meta_optimizer,
                              query_loss, vampire)
from vampire_jax.models import (MLP, Conv4, conv4_mini_imagenet, conv4_omniglot, init_params, mixed_precision,
                                pure_apply)
from vampire_jax import sharding
from vampire_jax.sharding import replicate, shard_tasks, task_mesh
from vampire_jax.tasks import Task

__version__ = "0.1.0"
from vampire_jax.calibration import (QuantileCalibration, ReliabilityBins, classification_calibration,
                                     mean_confidence_interval, mixture_cdf, mixture_quantile,
                                     regression_quantile_calibration)
from vampire_jax import baselines
