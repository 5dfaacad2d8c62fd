"""No silent answers, third sweep (issue 40): a number means what its name says, or is refused.

Each case below was a silent answer before: a value that looked meaningful and was not.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax import config as config_lib
from vampire_jax.errors import ConfigError, InputError

# -- KL of leaves that do not match ----------------------------------------------------------


def _gaussian(shape, log_std=-1.0):
  return vj.Gaussian({"w": jnp.zeros(shape)}, {"w": jnp.full(shape, log_std)})


@pytest.mark.parametrize("q_shape, p_shape", [((8,), (1,)), ((3, 1), (1, 3))])
def test_kl_of_leaves_of_other_shapes_is_refused_not_broadcast(q_shape, p_shape):
  """Before: an [8] leaf against a [1] leaf gave 0.0; [3, 1] against [1, 3] summed 9 elements."""
  with pytest.raises(InputError, match=r"kl_divergence: the leaf \['w'\] has shapes"):
    vj.kl_divergence(_gaussian(q_shape), _gaussian(p_shape, -2.0))
  # Equal shapes still give the closed form: sum of log(s_p/s_q) + (s_q^2)/(2 s_p^2) - 1/2.
  kl = vj.kl_divergence(_gaussian((3,)), _gaussian((3,), -2.0))
  expected = 3 * (-2.0 + 1.0 + 0.5 * math.exp(2.0) - 0.5)
  np.testing.assert_allclose(float(kl), expected, rtol=1e-6)


def test_kl_of_trees_of_other_keys_is_one_line():
  """Before: a 27-line pytree diff."""
  q = _gaussian((3,))
  p = vj.Gaussian({"v": jnp.zeros(3)}, {"v": jnp.zeros(3)})
  with pytest.raises(InputError) as raised:
    vj.kl_divergence(q, p)
  assert "another tree structure" in str(raised.value)
  assert len(str(raised.value).splitlines()) == 1


# -- A range that is not a range -----------------------------------------------------------


@pytest.mark.parametrize("bad", [(-math.inf, -3.0), (-4.0, math.nan), (-3.0, -4.0)])
def test_gaussian_from_params_refuses_a_non_finite_or_reversed_range(bad):
  """Before: (-inf, -3) gave NaN log-stds without a word."""
  with pytest.raises(InputError, match="log_std_range must be finite"):
    vj.gaussian_from_params({"w": jnp.zeros(4)}, jax.random.key(0), bad)


# -- Metrics of class probabilities ----------------------------------------------------------


def test_risk_coverage_refuses_labels_outside_the_classes_and_logits():
  """Before: label 7 of 3 classes gave AURC 1.0, and logits gave AURC 0.0."""
  probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
    vj.risk_coverage(probs, np.array([0, 7]))
  with pytest.raises(ValueError, match="not logits"):
    vj.risk_coverage(np.array([[3.0, -1.0, 0.5], [0.2, 2.5, -3.0]]), np.array([0, 1]))
  # What it accepts, it scores: the confident right answer first, AURC = mean risk.
  curve = vj.risk_coverage(probs, np.array([0, 2]))
  np.testing.assert_allclose(curve.accuracy, [0.0, 0.5])  # 0.8 (wrong) is the most confident
  assert curve.aurc == pytest.approx(np.mean([1.0, 0.5]))


# -- Intervals of one task -------------------------------------------------------------------


def test_one_task_gives_no_interval_not_plus_minus_zero():
  """Before: one test task printed `24.00 +- 0.00 %`; `accuracy_ci95` was 0.0."""
  mean, half = vj.mean_confidence_interval([0.24])
  assert mean == pytest.approx(0.24) and math.isnan(half)
  mean, half = vj.mean_confidence_interval([0.2, 0.4])
  assert half == pytest.approx(1.959964 * 0.1 / math.sqrt(2), rel=1e-5)
  per_task = {
    "accuracy": np.array([0.24]),
    "nll": np.array([1.3]),
    "probabilities": np.full((1, 5, 5), 0.2),
    "targets": np.zeros((1, 5), np.int32),
  }
  summary = vj.summarise("classification", per_task)
  assert math.isnan(summary.metrics["accuracy_ci95"]) and math.isnan(summary.metrics["nll_ci95"])


# -- Seeds and one-way tasks -----------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**32, 2**63 - 1, 2**64, 1.5, True])
def test_a_seed_jax_would_cut_to_32_bits_is_refused(seed):
  """Before: --seed 4294967296 (2**32) silently repeated seed 0, and -1 repeated 2**32 - 1."""
  import dataclasses

  config = dataclasses.replace(vj.RunConfig(), seed=seed)
  with pytest.raises(ConfigError, match=r"--seed must be an integer in \[0, 2\*\*32 - 1\]"):
    config_lib.validate(config)
  config_lib.validate(dataclasses.replace(vj.RunConfig(), seed=config_lib.MAX_SEED))


def test_the_largest_seed_is_a_key_of_its_own():
  keys = {
    seed: tuple(np.asarray(jax.random.key_data(jax.random.key(seed))).tolist())
    for seed in (0, 1, config_lib.MAX_SEED)
  }
  assert len(set(keys.values())) == 3


def test_one_way_tasks_are_refused():
  """Before: `--ways 1` printed `test accuracy 100.00 +- 0.00 %  NLL 0.0000  ECE 0.0000`."""
  from vampire_jax.configs import check_episodes

  with pytest.raises(ConfigError, match="--ways 1: a task needs at least 2 classes"):
    check_episodes(1, 1, 15, 20, {"train": 100, "val": 10, "test": 50}, what="Omniglot's")
  check_episodes(2, 1, 15, 20, {"train": 100, "val": 10, "test": 50}, what="Omniglot's")


# -- An edited run.json ------------------------------------------------------------------------


@pytest.mark.parametrize(
  "field, value", [("kl_weight", 0.0), ("num_inner_steps", 0), ("inner_lr", 10.0)]
)
def test_an_edited_run_record_is_refused_not_used(tiny_omniglot_run, tmp_path, field, value):
  """Before: kl_weight 1 -> 0 or num_inner_steps 5 -> 0 in run.json changed the predictions."""
  import json
  import shutil

  from vampire_jax.errors import RunFolderError

  workdir = tmp_path / "run"
  shutil.copytree(tiny_omniglot_run[0], workdir)
  record = json.loads((workdir / "run.json").read_text())
  record["config"][field] = value
  (workdir / "run.json").write_text(json.dumps(record))
  with pytest.raises(RunFolderError) as raised:
    vj.load_run(workdir)
  message = str(raised.value)
  assert f"config.{field}" in message and "edited after training" in message
  # A setting a resumed run may change (the schedule) is no edit of what was trained.
  record["config"][field] = tiny_omniglot_run[2]["config"][field]
  record["config"]["num_meta_steps"] = 12
  (workdir / "run.json").write_text(json.dumps(record))
  assert vj.load_run(workdir).config.num_meta_steps == 12
  # Deleted, the checkpoints' own record is used.
  (workdir / "run.json").unlink()
  with pytest.warns(UserWarning, match="missing; using the run record its checkpoints carry"):
    assert vj.load_run(workdir).config == tiny_omniglot_run[1]
