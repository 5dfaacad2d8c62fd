"""mini-ImageNet: loaders on the real sample (folder, TFDS, pickle), episodes, the experiment.

The sample (`../shared/data/mini_imagenet_sample`, or MINI_IMAGENET_DIR)
holds Ravi & Larochelle's full CSVs and the first 12 images of each class.
"""

import csv
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from PIL import Image

from experiments import calibration_protocol, mini_imagenet
from vampire_jax import data
from vampire_jax.data import mini_imagenet as mi

SAMPLE_DIR = Path(
  os.environ.get("MINI_IMAGENET_DIR")
  or Path(__file__).resolve().parents[2] / "shared/data/mini_imagenet_sample"
)
pytestmark = pytest.mark.skipif(
  not (SAMPLE_DIR / "split" / "test.csv").exists(),
  reason=f"mini-ImageNet sample not found in {SAMPLE_DIR}",
)
PER_CLASS = 12  # images per class in the sample


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("mini_cache")


@pytest.fixture(scope="module")
def sample(cache_dir):
  return data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=cache_dir, source="folder", existing_only=True
  )


def _csv_rows(split):
  with open(SAMPLE_DIR / "split" / f"{split}.csv") as f:
    return list(csv.reader(f))[1:]


def test_folder_loader_matches_csv_and_pil(sample):
  for split, num_classes in mi.NUM_CLASSES.items():
    images, wnids = sample[split]
    rows = _csv_rows(split)
    assert images.shape == (num_classes, PER_CLASS, 84, 84, 3) and images.dtype == np.uint8
    assert wnids.tolist() == sorted({label for _, label in rows})
    for c in (0, num_classes - 1):
      existing = [
        name
        for name, label in rows
        if label == wnids[c] and (SAMPLE_DIR / "images" / name).exists()
      ]
      for i in (0, PER_CLASS - 1):  # the i-th existing image of the class, in CSV order
        expected = np.asarray(Image.open(SAMPLE_DIR / "images" / existing[i]).convert("RGB"))
        np.testing.assert_array_equal(images[c, i], expected)
  all_wnids = np.concatenate([s.wnids for s in sample.values()])
  assert len(set(all_wnids.tolist())) == len(all_wnids) == 100  # class-disjoint


def test_missing_files_and_layouts_get_clear_errors(tmp_path, cache_dir, sample):
  del sample  # builds the cache the last check reads, whatever order the tests run in
  with pytest.raises(FileNotFoundError, match="existing_only"):
    data.load_mini_imagenet(SAMPLE_DIR, cache_dir=tmp_path, source="folder")
  with pytest.raises(FileNotFoundError, match=r"split/train.csv.*mini-imagenet-cache"):
    data.load_mini_imagenet(tmp_path, cache_dir=tmp_path)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data.load_mini_imagenet(tmp_path / "nowhere", cache_dir=tmp_path)
  with pytest.raises(FileNotFoundError, match="No mini-ImageNet cache"):
    data.load_mini_imagenet(tmp_path, cache_dir=tmp_path, source="cache")
  # The 12-per-class sample is not the full set: the full-set check says so.
  with pytest.raises(ValueError, match="expected 64 of 600"):
    mi._validate(
      data.load_mini_imagenet(SAMPLE_DIR, cache_dir=cache_dir, source="cache", existing_only=True),
      existing_only=False,
    )


def test_cache_and_tfds_give_the_same_arrays(sample, cache_dir):
  cached = data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=cache_dir, source="cache", existing_only=True
  )
  from_tfds = data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=cache_dir, source="tfds", existing_only=True
  )
  for split in mi.SPLITS:
    for loaded in (cached, from_tfds):
      np.testing.assert_array_equal(loaded[split].images, sample[split].images)
      assert loaded[split].wnids.tolist() == sample[split].wnids.tolist()


def test_import_does_not_load_tensorflow():
  code = (
    "import sys, vampire_jax.data.mini_imagenet, vampire_jax.data.features; "
    "print('tensorflow' in sys.modules or 'tensorflow_datasets' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_pickle_caches_and_other_sizes_are_read(sample, tmp_path):
  # The common pickles: 'image_data' [N, 84, 84, 3], 'class_dict' {wnid: indices}.
  rng = np.random.default_rng(0)
  for split in mi.SPLITS:
    images, wnids = sample[split]
    flat = images.reshape(-1, 84, 84, 3)
    order = rng.permutation(len(flat))  # rows shuffled; class_dict says where
    position = np.argsort(order)
    class_dict = {
      w: position[c * PER_CLASS : (c + 1) * PER_CLASS].tolist()
      for c, w in reversed(list(enumerate(wnids)))
    }
    with open(tmp_path / mi.PICKLE_NAME.format(split=split), "wb") as f:
      pickle.dump({"image_data": flat[order], "class_dict": class_dict}, f)
  loaded = data.load_mini_imagenet(tmp_path, cache_dir=tmp_path / "cache", existing_only=True)
  for split in mi.SPLITS:
    np.testing.assert_array_equal(loaded[split].images, sample[split].images)
    assert loaded[split].wnids.tolist() == sample[split].wnids.tolist()

  # A Ravi-layout copy at another size (and PNG) is resized with LANCZOS.
  folder = tmp_path / "big"
  (folder / "images").mkdir(parents=True)
  expected = {}
  for s, split in enumerate(mi.SPLITS):
    lines = ["filename,label"]
    for c in range(2):
      wnid = f"n0{s}{c}000000"
      for i in range(3):
        name = f"{wnid}{i:08d}.png"
        big = rng.integers(0, 256, (100, 120, 3), dtype=np.uint8)
        Image.fromarray(big).save(folder / "images" / name)
        lines.append(f"{name},{wnid}")
        expected[split, c, i] = np.asarray(
          Image.fromarray(big).resize((84, 84), Image.Resampling.LANCZOS)
        )
    (folder / f"{split}.csv").write_text("\n".join(lines) + "\n")  # CSVs beside images/
  loaded = data.load_mini_imagenet(folder, cache_dir=tmp_path / "cache", existing_only=True)
  for (split, c, i), image in expected.items():
    np.testing.assert_array_equal(loaded[split].images[c, i], image)


def test_episodes_stay_in_their_split(sample):
  # Every sampled image is traced back to its (split, class, index) by its bytes.
  table = {}
  for split, (images, _) in sample.items():
    for c in range(images.shape[0]):
      for i in range(PER_CLASS):
        table[images[c, i].tobytes()] = (split, c, i)
  for split in ("train", "test"):  # val is drawn by the same code
    tasks = data.sample_tasks(
      jax.random.key(1),
      jax.device_put(sample[split].images),
      num_tasks=4,
      ways=5,
      shots=1,
      query=5,
      rotate=False,
    )
    assert tasks.support_x.shape == (4, 5, 84, 84, 3)
    for t in range(4):
      x = np.concatenate([tasks.support_x[t], tasks.query_x[t]])
      y = np.concatenate([tasks.support_y[t], tasks.query_y[t]])
      sources = [table[np.round(np.asarray(image) * 255).astype(np.uint8).tobytes()] for image in x]
      assert {s for s, _, _ in sources} == {split}
      class_of_label = {label: c for label, (_, c, _) in zip(y.tolist(), sources)}
      assert len(class_of_label) == 5 and len(set(class_of_label.values())) == 5
      assert all(class_of_label[label] == c for label, (_, c, _) in zip(y.tolist(), sources))
      assert len(set(sources)) == len(sources)  # support and query never share an image


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
def test_tiny_run_and_calibration_protocol(sample, cache_dir, tmp_path):
  config = mini_imagenet.get_config("quick", "maml").replace(
    data_dir=str(SAMPLE_DIR),
    cache_dir=str(cache_dir),
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
  assert split_record["test"]["wnids"] == sample["test"].wnids.tolist()

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
