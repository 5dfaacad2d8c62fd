"""experiments.omniglot end to end: the quick run learns, resume loses nothing, bad requests fail."""

import dataclasses
import json
import os
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments import omniglot, runner
from vampire_jax.data import load_omniglot

DATA_DIR = Path(os.environ.get("OMNIGLOT_DIR") or Path(__file__).resolve().parents[2] / "shared/data/omniglot")
pytestmark = pytest.mark.skipif(not (DATA_DIR / "images_background.zip").exists(),
                                reason=f"Omniglot zips not found in {DATA_DIR} (set OMNIGLOT_DIR)")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  """A 28x28 cache built once from the zips, so experiments load it in milliseconds."""
  cache = tmp_path_factory.mktemp("omniglot_cache")
  load_omniglot(DATA_DIR, cache_dir=cache, source="zip")
  return cache


def test_quick_maml_run_learns(cache_dir, tmp_path):
  config = dataclasses.replace(
      omniglot.get_config("quick", "maml"), num_meta_steps=150,
      num_test_tasks=100, eval_every=150, checkpoint_every=150, cache_dir=str(cache_dir))
  results = runner.train_and_evaluate(omniglot.make_problem(config, tmp_path), config, tmp_path,
                                      progress=False)
  # Chance is 20 %; 150 meta-steps of 8 tasks reach about 60-65 % here.
  assert results["test"]["accuracy"] > 0.45, results["test"]
  assert 0.0 <= results["test"]["ece"] <= 1.0
  for name in ("results.json", "reliability.png", "training_curves.png", "split.json", "metrics.jsonl"):
    assert (tmp_path / name).stat().st_size > 0, name
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["config"]["algorithm"] == "maml" and saved["git_commit"]


def _tiny_config(cache_dir, num_meta_steps):
  return dataclasses.replace(
      omniglot.get_config("quick", "vampire"), num_filters=8, chunk_size=1, num_inner_steps=1,
      tasks_per_step=2, num_meta_steps=num_meta_steps, num_val_tasks=4, num_test_tasks=4,
      eval_batch_tasks=2, eval_every=3, checkpoint_every=3, log_every=3, num_mc_test=2,
      cache_dir=str(cache_dir))


def _final_state(workdir):
  manager = ocp.CheckpointManager((Path(workdir) / "checkpoints").absolute())
  return manager.restore(manager.latest_step(), args=ocp.args.StandardRestore())


def test_interrupted_run_resumes_to_the_same_result(cache_dir, tmp_path):
  straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
  problem = omniglot.make_problem(_tiny_config(cache_dir, 6))
  full = runner.train_and_evaluate(problem, _tiny_config(cache_dir, 6), straight, progress=False)
  runner.train_and_evaluate(problem, _tiny_config(cache_dir, 3), interrupted, progress=False)
  resumed = runner.train_and_evaluate(problem, _tiny_config(cache_dir, 6), interrupted, progress=False)
  assert resumed["resumed_from_step"] == 3
  a, b = _final_state(straight), _final_state(interrupted)
  assert int(b["step"]) == 6
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(resumed["test"]["accuracy"], full["test"]["accuracy"], atol=1e-6)


def test_impossible_requests_get_clear_errors(cache_dir):
  with pytest.raises(ValueError, match="shots"):
    omniglot.make_problem(dataclasses.replace(omniglot.get_config("quick"), shots=10,
                                              cache_dir=str(cache_dir)))
  with pytest.raises(ValueError, match="-way task needs"):
    omniglot.make_problem(dataclasses.replace(omniglot.get_config("quick"), ways=5000,
                                              cache_dir=str(cache_dir)))


def test_cli_presets_and_overrides(tmp_path):
  config, workdir, progress = omniglot.parse_args(
      ["--preset", "20way5shot", "--algorithm", "maml", "--split", "random", "--workdir", str(tmp_path)])
  assert (config.ways, config.shots, config.tasks_per_step, config.kl_weight) == (20, 5, 16, 0.0)
  assert config.split == "random" and workdir == tmp_path and progress
  config, _, _ = omniglot.parse_args(["--kl-weight", "0.05", "--log-std-init", "-5", "-4",
                                      "--meta-grad-clip-norm", "0", "--first-order"])
  assert config.kl_weight == 0.05 and config.log_std_init == (-5.0, -4.0)
  assert config.meta_grad_clip_norm is None and config.first_order
  vampire = omniglot.get_config("5way1shot", "vampire")
  assert (vampire.inner_lr, vampire.kl_weight, vampire.num_mc_test) == (0.01, 0.1, 10)
  with pytest.raises(SystemExit):
    omniglot.parse_args(["--algorithm", "bogus"])
