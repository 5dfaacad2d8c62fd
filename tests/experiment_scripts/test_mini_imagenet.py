import json
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from experiments import calibration_protocol, cli, mini_imagenet
from tests.helpers import needs_mini_imagenet_sample, PER_CLASS, SAMPLE_DIR
from vampire_jax import data

pytestmark = needs_mini_imagenet_sample


ENV_ROWS = {  # MINI_IMAGENET_DIR -> the one line
  "missing": (lambda tmp: tmp / "nowhere", "does not exist"),
  "a file": (lambda tmp: tmp / "file.txt", "is a file, not a folder"),
}


def test_cli_presets():
  config, workdir, args = mini_imagenet.parse_args(["--preset", "5way5shot", "--algorithm", "maml"])
  assert (config.shots, config.schedule.tasks_per_step, config.algorithm.inner_lr) == (5, 2, 0.01)
  assert "kl_weight" not in config.flat()  # MAML has no KL term
  assert args.calibration_tasks == 0 and not args.calibration_only
  config = mini_imagenet.get_config("5way1shot", "vampire")
  assert (
    config.num_filters,
    config.query,
    config.algorithm.num_inner_steps,
    config.algorithm.kl_weight,
  ) == (
    32,
    15,
    5,
    0.1,
  )
  assert (
    config.algorithm.num_mc_train,
    config.algorithm.num_mc_query,
    config.algorithm.num_mc_test,
  ) == (10, 10, 10)
  assert config.evaluation.num_test_tasks == 600 and config.image_size == 84
  _, _, args = mini_imagenet.parse_args(["--calibration-tasks", "all", "--calibration-only"])
  assert args.calibration_tasks == -1 and args.calibration_only


@pytest.mark.slow  # a mini-ImageNet run and the calibration protocol's command
def test_tiny_run_and_calibration_protocol(mini_imagenet_sample, mini_imagenet_cache, tmp_path):
  config = mini_imagenet.get_config("quick", "maml").replace(
    data_dir=str(SAMPLE_DIR),
    cache_dir=str(mini_imagenet_cache),
    image_size=16,
    num_filters=8,
    num_inner_steps=1,
    tasks_per_step=2,
    chunk_size=1,
    num_meta_steps=4,
    eval_every=4,
    checkpoint_every=4,
    log_every=2,
    num_val_tasks=1,
    num_test_tasks=3,
    eval_batch_tasks=1,
    first_order=True,
  )
  splits = mini_imagenet.load_splits(config)
  assert splits["train"].images.shape == (64, PER_CLASS, 16, 16, 3)
  test_images = jax.device_put(splits["test"].images)
  mini_imagenet.run_experiment(config, tmp_path, progress=False, splits=splits)
  losses = [
    json.loads(line)["train/loss"]
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    if "train/loss" in line
  ]
  assert len(losses) == 2 and np.all(np.isfinite(losses))
  saved = json.loads((tmp_path / "results.json").read_text())
  per_test_task = np.load(tmp_path / "test_per_task.npz")
  assert saved["test"]["num_tasks"] == 3
  np.testing.assert_allclose(saved["test"]["accuracy"], per_test_task["accuracy"].mean())
  assert saved["config"]["image_size"] == 16 and saved["config"]["existing_only"]
  split_record = json.loads((tmp_path / "split.json").read_text())
  assert split_record["test"]["wnids"] == mini_imagenet_sample["test"].wnids.tolist()

  # --calibration-only --calibration-tasks 5: the saved best checkpoint on 5 of the
  # 15 504 combinations (the whole protocol is 15 504 such tasks).
  args = SimpleNamespace(calibration_only=True, calibration_tasks=5, calibration_seed=1)
  calibration_protocol.run_protocol(tmp_path, args, test_images)
  calibration = json.loads((tmp_path / "calibration.json").read_text())
  assert calibration["num_tasks"] == 5 and calibration["num_combinations"] == 15504
  assert not calibration["all_combinations"]
  assert calibration["config"]["algorithm"]["name"] == "maml"
  assert calibration["num_mc_test"] is None  # MAML draws nothing at test
  per_task = np.load(tmp_path / "calibration_per_task.npz")
  np.testing.assert_array_equal(per_task["combination_ids"], data.combination_ids(20, 5, 5, seed=1))
  assert np.isclose(calibration["accuracy"], per_task["accuracy"].mean())
  assert (tmp_path / "calibration_reliability.png").stat().st_size > 0


@pytest.mark.parametrize("row", list(ENV_ROWS))
def test_a_bad_mini_imagenet_dir_is_one_line_and_exit_2(row, tmp_path, monkeypatch, capsys):
  """A missing MINI_IMAGENET_DIR, or a file, is one error line without a traceback, exit 2."""
  make, needle = ENV_ROWS[row]
  (tmp_path / "file.txt").write_text("")
  monkeypatch.setenv("MINI_IMAGENET_DIR", str(make(tmp_path)))
  argv = ["--preset", "quick", "--workdir", str(tmp_path / "run"), "--no-compilation-cache"]
  argv += ["--cache-dir", str(tmp_path / "cache")]
  assert cli.main_entry(mini_imagenet.main, argv) == 2
  err = capsys.readouterr().err
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and needle in errors[0] and "Traceback" not in err, err
