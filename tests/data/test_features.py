"""LEO embeddings: the loader on files in LEO's exact pickle layout, ragged episodes, the experiment.

The files are generated: per class a random mean direction plus noise, so the
classes are separable and a short meta-training run must beat chance.
"""

import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from experiments import calibration_protocol, tiered_imagenet
from vampire_jax import data
from vampire_jax.data import features

SPLIT_SIZES = (("train", 12), ("val", 6), ("test", 7))


def _write_leo(root, dataset="tieredImageNet", noise=1.5, seed=0, bytes_keys=False):
  """`<root>/<dataset>/center/{split}_embeddings.pkl` as LEO ships them; returns the contents.

  Classes have 20 to 30 rows (ragged, like tiered-ImageNet), rows are shuffled
  so a class's rows are not contiguous, and labels are class ids in the file
  (unrelated to the sorted-wnid order the loader uses).
  """
  rng = np.random.default_rng(seed)
  folder = Path(root) / dataset / "center"
  folder.mkdir(parents=True, exist_ok=True)
  contents, next_wnid = {}, 9_000_000
  for split, num_classes in SPLIT_SIZES:
    keys, embeddings, labels = [], [], []
    for label in range(num_classes):
      wnid = f"n{next_wnid:08d}"
      next_wnid -= 1_234  # Decreasing: file order is not wnid order.
      mean = rng.normal(size=features.EMBEDDING_SIZE)
      for i in range(int(rng.integers(20, 31))):
        keys.append(f"{1000 + len(keys)}-{wnid}-{wnid}_{i}.JPEG")
        embeddings.append(mean + noise * rng.normal(size=features.EMBEDDING_SIZE))
        labels.append(label)
    order = rng.permutation(len(keys))
    keys = np.array(keys)[order]
    content = {
      "embeddings": np.array(embeddings, np.float32)[order],
      "labels": np.array(labels, np.int64)[order],
      "keys": np.char.encode(keys, "latin1") if bytes_keys else keys,
    }
    with open(folder / f"{split}_embeddings.pkl", "wb") as f:
      pickle.dump(content, f, protocol=2)
    contents[split] = content
  return contents


@pytest.fixture(scope="module")
def leo_root(tmp_path_factory):
  root = tmp_path_factory.mktemp("leo")
  return root, _write_leo(root)


def test_loader_groups_rows_by_the_class_in_the_key(leo_root):
  root, contents = leo_root
  splits = data.load_leo_embeddings(root, "tiered")
  for split, num_classes in SPLIT_SIZES:
    content, loaded = contents[split], splits[split]
    wnid_of_row = np.array([k.split("-")[1] for k in content["keys"]])
    assert loaded.wnids.tolist() == sorted(set(wnid_of_row.tolist()))
    assert loaded.features.shape == (num_classes, loaded.counts.max(), 640)
    for c, wnid in enumerate(loaded.wnids):
      rows = content["embeddings"][wnid_of_row == wnid]  # file order
      expected = rows / np.linalg.norm(rows, axis=1, keepdims=True)
      assert loaded.counts[c] == len(rows)
      np.testing.assert_allclose(loaded.features[c, : len(rows)], expected, rtol=1e-6, atol=1e-7)
      assert not np.any(loaded.features[c, len(rows) :])  # zero padding
      # The file's label of this class is one and the same for all its rows.
      assert len(set(content["labels"][wnid_of_row == wnid].tolist())) == 1
  raw = data.load_leo_embeddings(root / "tieredImageNet", "tiered", l2_normalize=False)
  wnid = raw["val"].wnids[2]
  first = np.flatnonzero([k.split("-")[1] == wnid for k in contents["val"]["keys"]])[0]
  np.testing.assert_array_equal(raw["val"].features[2, 0], contents["val"]["embeddings"][first])
  all_wnids = np.concatenate([s.wnids for s in splits.values()])
  assert len(set(all_wnids.tolist())) == len(all_wnids) == 25  # class-disjoint splits


def test_loader_accepts_python2_bytes_keys_and_rejects_bad_files(tmp_path):
  contents = _write_leo(tmp_path / "a", dataset="miniImageNet", bytes_keys=True)
  splits = data.load_leo_embeddings(tmp_path / "a" / "miniImageNet" / "center", "mini")
  assert splits["test"].counts.sum() == len(contents["test"]["keys"])

  with pytest.raises(FileNotFoundError, match="center/{train,val,test}_embeddings.pkl"):
    data.load_leo_embeddings(tmp_path / "a", "tiered")  # only miniImageNet there
  assert features.class_of_key("12-n01234567-n01234567_5.JPEG") == "n01234567"
  with pytest.raises(ValueError, match="not"):
    features.class_of_key("12-n01234567-n07654321_5.JPEG")

  content = dict(contents["train"])
  content["labels"] = np.zeros_like(content["labels"])  # every class the same label
  with pytest.raises(ValueError, match="one to one"):
    features.group_by_class(content)
  with open(tmp_path / "a" / "miniImageNet" / "center" / "val_embeddings.pkl", "wb") as f:
    pickle.dump(contents["train"], f)  # val repeats train's classes
  with pytest.raises(ValueError, match="both the train and the val"):
    data.load_leo_embeddings(tmp_path / "a", "mini")


def test_cli_presets():
  config, workdir, args = tiered_imagenet.parse_args(
    [
      "--preset",
      "5way5shot",
      "--dataset",
      "mini",
      "--algorithm",
      "maml",
      "--calibration-tasks",
      "all",
    ]
  )
  assert (config.dataset, config.shots, config.algorithm.name) == ("mini", 5, "maml")
  assert "kl_weight" not in config.flat()  # MAML has no KL term
  assert args.calibration_tasks == -1 and "mini_features" in str(workdir) and not args.no_progress
  config = tiered_imagenet.get_config("5way1shot", "vampire")
  assert (
    config.hidden_sizes,
    config.algorithm.inner_lr,
    config.algorithm.num_inner_steps,
    config.algorithm.kl_weight,
  ) == (
    (128, 32),
    0.01,
    5,
    0.1,
  )
  assert config.evaluation.num_test_tasks == 5000
  config, _, _ = tiered_imagenet.parse_args(["--hidden-sizes", "64", "16"])
  assert config.hidden_sizes == (64, 16)


@pytest.mark.slow  # a run that must learn: minutes
def test_short_maml_run_learns_and_scores_combinations(leo_root, tmp_path):
  root, _ = leo_root
  config = tiered_imagenet.get_config("quick", "maml").replace(
    data_dir=str(root),
    num_meta_steps=60,
    eval_every=30,
    checkpoint_every=30,
    log_every=10,
    num_val_tasks=50,
    num_test_tasks=100,
  )
  splits = tiered_imagenet.load_splits(config)
  results = tiered_imagenet.run_experiment(config, tmp_path, progress=False, splits=splits)
  args = SimpleNamespace(calibration_only=False, calibration_tasks=40, calibration_seed=0)
  calibration_protocol.run_protocol(
    tmp_path, args, jax.device_put(splits["test"].features), jax.device_put(splits["test"].counts)
  )
  # Chance is 20 %; the classes are separable and 60 steps of 8 tasks reach 45-60 % here.
  assert results["test"]["accuracy"] > 0.35, results["test"]
  assert results["test"]["num_tasks"] == 100
  losses = [
    json.loads(line)["train/loss"]
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    if "train/loss" in line
  ]
  assert len(losses) == 6 and np.all(np.isfinite(losses)) and losses[-1] < losses[0]
  saved = json.loads((tmp_path / "split.json").read_text())
  assert saved["test"]["wnids"] == splits["test"].wnids.tolist()
  calibration = json.loads((tmp_path / "calibration.json").read_text())
  # 40 asked, but the 7 test classes give only C(7, 5) = 21 tasks: all of them.
  assert calibration["num_tasks"] == calibration["num_combinations"] == 21
  assert calibration["all_combinations"] and calibration["accuracy"] > 0.35
  assert calibration["num_mc_test"] is None  # MAML draws nothing at test
  assert calibration["config"]["algorithm"]["name"] == "maml"
  assert (tmp_path / "calibration_reliability.png").stat().st_size > 0


@pytest.mark.slow
def test_tiny_vampire_run(leo_root, tmp_path):
  root, _ = leo_root
  config = tiered_imagenet.get_config("quick", "vampire").replace(
    data_dir=str(root),
    num_inner_steps=1,
    tasks_per_step=2,
    num_meta_steps=4,
    eval_every=4,
    checkpoint_every=4,
    log_every=2,
    num_val_tasks=4,
    num_test_tasks=4,
    eval_batch_tasks=4,
    num_mc_test=2,
  )
  results = tiered_imagenet.run_experiment(config, tmp_path, progress=False)
  logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [m["step"] for m in logged if "train/loss" in m] == [2, 4]
  assert results["config"]["algorithm"]["name"] == "vampire"  # the spec, recorded by part
  assert results["best_validation"]["step"] == 4
  # The summary is the per-task file's, and each task's numbers follow from its predictions.
  per_task = np.load(tmp_path / "test_per_task.npz")
  test = json.loads((tmp_path / "results.json").read_text())["test"]
  probabilities, targets = per_task["probabilities"], per_task["targets"]  # [4, 5 * 15, 5], [4, 75]
  assert test["num_tasks"] == len(probabilities) == 4
  np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(per_task["accuracy"], np.mean(probabilities.argmax(-1) == targets, 1))
  target_probabilities = np.take_along_axis(probabilities, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(per_task["nll"], -np.mean(np.log(target_probabilities), 1), rtol=1e-4)
  np.testing.assert_allclose(test["accuracy"], per_task["accuracy"].mean(), rtol=1e-6)
  np.testing.assert_allclose(
    test["accuracy_ci95"], 1.959964 * per_task["accuracy"].std() / 2, rtol=1e-5
  )
