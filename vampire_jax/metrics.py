"""The metrics' parts the experiments build their reports from, beyond the top level's.

The top level scores tasks (`vj.make_classification_evaluator`, ...) and summarises them
(`vj.summarise`, `vj.classification_calibration`, `vj.paper_quantile_calibration`, ...).
This module holds what a report or a figure takes apart:

- a split of tasks scored in batches (`evaluate_split`), task i's keys from the
  evaluation's key alone (`index_keys`);
- calibration results (`vj.ReliabilityBins`, `vj.RiskCoverage`, `vj.QuantileCalibration`)
  as JSON records and back (`calibration_to_record`, `calibration_from_record`); the best
  risk any ordering reaches (`oracle_risk`); the quantile calibration of a whole
  predictive, noise included (`predictive_quantile_calibration`);
- the recalibration maps `vj.recalibrate` and `vj.fit_recalibration` fit (a `Calibration`: a
  temperature, a variance scale, or a quantile map over one): fitted on per-task results
  (`fit_recalibration`; the top level's fits on tasks, from a learner), described and recorded (`describe_recalibration`,
  `recalibration_to_record`), applied to per-task results (`recalibrated_per_task`,
  `calibrated_noise_std`); a regressor's PIT values and central interval
  (`predictive_pit`, `interval_coverage`, `interval_metrics`); the quantile map alone
  (`QuantileMap`, `fit_quantile_map`, `quantile_map_bins`).
"""

from vampire_jax._src.metrics.calibration import (
  from_record as calibration_from_record,
)
from vampire_jax._src.metrics.calibration import (
  oracle_risk,
)
from vampire_jax._src.metrics.calibration import (
  to_record as calibration_to_record,
)
from vampire_jax._src.metrics.evaluation import (
  evaluate_split,
  index_keys,
)
from vampire_jax._src.metrics.quantile_calibration import (
  predictive_quantile_calibration,
)
from vampire_jax._src.metrics.quantile_map import (
  QuantileMap,
)
from vampire_jax._src.metrics.quantile_map import (
  fit as fit_quantile_map,
)
from vampire_jax._src.metrics.quantile_map import (
  num_bins as quantile_map_bins,
)
from vampire_jax._src.metrics.recalibration import (
  QUANTILE,
  VARIANCE_SCALE,
  Calibration,
  calibrated_noise_std,
  interval_coverage,
  interval_metrics,
  predictive_pit,
  recalibrated_per_task,
)
from vampire_jax._src.metrics.recalibration import (
  MIN_TASKS as RECALIBRATION_MIN_TASKS,
)
from vampire_jax._src.metrics.recalibration import (
  describe as describe_recalibration,
)
from vampire_jax._src.metrics.recalibration import (
  fit as fit_recalibration,
)
from vampire_jax._src.metrics.recalibration import (
  to_record as recalibration_to_record,
)

__all__ = (
  # A split of tasks, scored in batches.
  "evaluate_split",
  "index_keys",
  # Calibration results.
  "calibration_to_record",
  "calibration_from_record",
  "oracle_risk",
  "predictive_quantile_calibration",
  # Recalibration maps.
  "Calibration",
  "RECALIBRATION_MIN_TASKS",
  "QUANTILE",
  "VARIANCE_SCALE",
  "fit_recalibration",
  "describe_recalibration",
  "recalibration_to_record",
  "recalibrated_per_task",
  "calibrated_noise_std",
  "predictive_pit",
  "interval_coverage",
  "interval_metrics",
  # The quantile map.
  "QuantileMap",
  "fit_quantile_map",
  "quantile_map_bins",
)
