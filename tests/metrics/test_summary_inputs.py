import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.metrics import summary_inputs


def test_regression_summary_splits_the_predictive_variance():
  # Two tasks, 3 draws, 2 queries: variances across draws by hand.
  predictions = np.array(
    [[[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 4.0]]]
  )[..., None]
  targets = np.zeros((2, 2, 1))
  per_task = {  # the evaluator's scores of these predictions, which summarise checks
    **summary_inputs.regression_scores(predictions, targets, 0.3),
    "predictions": predictions,
    "targets": targets,
  }
  metrics = vj.summarise("regression", per_task, noise_std=0.3).metrics
  epistemic = np.mean([8 / 3, 0.0, 0.0, 2.0])  # np.var of (0,2,4), (1,1,1), (1,1,1), (1,1,4)
  assert metrics["epistemic_variance"] == pytest.approx(epistemic)
  assert metrics["aleatoric_variance"] == pytest.approx(0.09)
  assert metrics["predictive_variance"] == pytest.approx(epistemic + 0.09)
  assert metrics["epistemic_fraction"] == pytest.approx(epistemic / (epistemic + 0.09))
