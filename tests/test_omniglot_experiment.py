"""experiments.omniglot end to end: the quick run learns, an interrupted run resumes
bit-identically (after a kill or a SIGTERM), and a finished run loads back."""

import json
import os
import signal
from pathlib import Path

import jax
import numpy as np
from vampire_jax.runs import run_folder
import pytest

import vampire_jax as vj
from conftest import needs_omniglot, tiny_omniglot_config
from experiments import omniglot

pytestmark = needs_omniglot


@pytest.mark.slow  # a run that must learn: minutes
def test_quick_maml_run_learns(omniglot_cache, tmp_path):
  config = omniglot.get_config("quick", "maml").replace(
    num_meta_steps=150,
    num_test_tasks=100,
    eval_every=150,
    checkpoint_every=150,
    cache_dir=str(omniglot_cache),
  )
  results = omniglot.run_experiment(config, tmp_path, progress=False)
  # Chance is 20 %; 150 meta-steps of 8 tasks on Conv4-16 reach about 55-60 % here.
  assert results["test"]["accuracy"] > 0.45, results["test"]
  for name in (
    "results.json",
    "reliability.png",
    "risk_coverage.png",
    "training_curves.png",
    "split.json",
    "metrics.jsonl",
    "run.json",
  ):
    assert (tmp_path / name).stat().st_size > 0, name
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["config"]["algorithm"]["name"] == "maml" and saved["git_commit"]
  # The data's source is on record.
  assert saved["data"]["source"] == "zip" and saved["data"]["split"] == "original"
  # Selective prediction: the most confident half is more accurate than all.
  assert saved["test"]["accuracy_at_50_coverage"] > saved["test"]["accuracy"]


def _final_state(workdir):
  return run_folder.read_checkpoint(Path(workdir) / "checkpoints")


def _assert_same_state(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_interrupted_run_resumes_to_the_same_result(omniglot_cache, tiny_omniglot_run, tmp_path):
  straight, full = tiny_omniglot_run[0], tiny_omniglot_run[2]
  quiet = dict(progress=False, print_fn=lambda message: None)
  # Stopped after 3 steps (as a kill -9 after the step-3 checkpoint leaves it), then resumed.
  omniglot.run_experiment(tiny_omniglot_config(omniglot_cache, 3), tmp_path, **quiet)
  resumed = omniglot.run_experiment(tiny_omniglot_config(omniglot_cache, 6), tmp_path, **quiet)
  assert resumed["resumed_from_step"] == 3
  assert int(_final_state(tmp_path)["step"]) == 6
  _assert_same_state(_final_state(straight), _final_state(tmp_path))
  assert resumed["test"]["accuracy"] == full["test"]["accuracy"]


def test_sigterm_saves_a_checkpoint_and_the_rerun_finishes_the_same(
  omniglot_cache, tiny_omniglot_run, tmp_path
):
  config = tiny_omniglot_config(omniglot_cache, log_every=1, checkpoint_every=6)

  def terminate_at_step_2(message):  # the loop prints a line per logged step
    if message.startswith("step 2/"):
      os.kill(os.getpid(), signal.SIGTERM)

  with pytest.raises(vj.TrainingInterrupted) as stop:
    omniglot.run_experiment(config, tmp_path, print_fn=terminate_at_step_2)
  assert stop.value.step == 2 and stop.value.signum == signal.SIGTERM
  assert "run the same command again to resume" in str(stop.value)
  assert int(_final_state(tmp_path)["step"]) == 2  # saved, though checkpoint_every is 6
  assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored
  resumed = omniglot.run_experiment(config, tmp_path, progress=False)
  assert resumed["resumed_from_step"] == 2
  _assert_same_state(_final_state(tiny_omniglot_run[0]), _final_state(tmp_path))


def test_cli_presets_and_overrides(tmp_path):
  config, workdir, args = omniglot.parse_args(
    [
      "--preset",
      "20way5shot",
      "--algorithm",
      "maml",
      "--split",
      "random",
      "--workdir",
      str(tmp_path),
    ]
  )
  assert (config.ways, config.shots, config.schedule.tasks_per_step) == (20, 5, 16)
  assert "kl_weight" not in config.flat()  # MAML has no KL term
  assert config.split == "random" and workdir == tmp_path and not args.no_progress
  config, _, _ = omniglot.parse_args(
    [
      "--kl-weight",
      "0.05",
      "--log-std-init",
      "-5",
      "-4",
      "--meta-grad-clip-norm",
      "0",
      "--first-order",
      "--class-sampling",
      "class",
      "--no-batch-norm-affine",
    ]
  )
  assert config.algorithm.kl_weight == 0.05 and config.algorithm.log_std_init == (-5.0, -4.0)
  assert config.schedule.meta_grad_clip_norm is None and config.algorithm.first_order
  assert config.class_sampling == "class" and not config.batch_norm_affine
  vampire = omniglot.get_config("5way1shot", "vampire")
  spec = vampire.algorithm
  assert (spec.inner_lr, spec.kl_weight, spec.num_mc_test) == (0.01, 0.1, 10)
  assert vampire.class_sampling == "character" and vampire.batch_norm_affine
  with pytest.raises(SystemExit):
    omniglot.parse_args(["--algorithm", "bogus"])


def test_authors_batch_norm_has_no_scale_or_offset():
  with_affine = vj.init_params(vj.Conv4(5, num_filters=4), jax.random.key(0), (1, 28, 28, 1))
  without = vj.init_params(
    vj.Conv4(5, num_filters=4, batch_norm_affine=False), jax.random.key(0), (1, 28, 28, 1)
  )
  assert set(with_affine["norm0"]) == {"scale", "offset"} and "norm0" not in without
  size = lambda tree: sum(x.size for x in jax.tree_util.tree_leaves(tree))  # noqa: E731
  assert size(with_affine) - size(without) == 4 * 2 * 4  # 4 blocks x (scale, offset) x 4 filters
