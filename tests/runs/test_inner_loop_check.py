import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from tests.conftest import tiny_regression_config
from tests.helpers import _tiny_regression_config


def test_training_refuses_an_inner_loop_that_diverges_at_initialisation(tmp_path):
  config = _tiny_regression_config(inner_lr=50.0)
  with pytest.raises(vj.ConfigError, match=r"maml's inner loop at initialisation.*use inner_lr"):
    regression.run_experiment(config, tmp_path, progress=False, print_fn=lambda m: None)
  # Nothing was trained, so no record is left to refuse the advised settings in this folder.
  assert not (tmp_path / "run.json").exists()
  fixed = config.replace(inner_lr=1e-4)
  results = regression.run_experiment(fixed, tmp_path, progress=False, print_fn=lambda m: None)
  assert results["meta_steps"] == 2 and np.isfinite(results["test"]["mse"])


@pytest.mark.parametrize(
  "algorithm, guarded", [("maml", False), ("maml", True), ("platipus", False)]
)
def test_divergence_points_to_the_inner_loop_guard_where_it_exists(tmp_path, algorithm, guarded):
  # The meta-step overflows at once: the run stops with the divergence, and names the
  # spec's backtracking only for an algorithm that has it (PLATIPUS has none), and only
  # while it is off.
  changes = dict(meta_lr=1e30, num_meta_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  if "backtracking" in vj.specs.get(algorithm).field_names():
    changes["backtracking"] = guarded
  config = tiny_regression_config(algorithm, **changes)
  with pytest.raises(FloatingPointError, match="meta-training diverged at step") as raised:
    regression.run_experiment(config, tmp_path, progress=False, print_fn=lambda m: None)
  named = f"the {algorithm} spec's backtracking=True" in str(raised.value)
  assert named == (algorithm == "maml" and not guarded), str(raised.value)
