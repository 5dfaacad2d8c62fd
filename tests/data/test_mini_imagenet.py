"""mini-ImageNet: loaders on the real sample (folder, TFDS, pickle), episodes, the experiment.

The sample (`../shared/data/mini_imagenet_sample`, or MINI_IMAGENET_DIR)
holds Ravi & Larochelle's full CSVs and the first 12 images of each class.
"""

import csv
import pickle
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from tests.helpers import needs_mini_imagenet_sample, PER_CLASS, SAMPLE_DIR
from vampire_jax import data
from vampire_jax.data import mini_imagenet as mi

pytestmark = needs_mini_imagenet_sample


def _csv_rows(split):
  with open(SAMPLE_DIR / "split" / f"{split}.csv") as f:
    return list(csv.reader(f))[1:]


def test_folder_loader_matches_csv_and_pil(mini_imagenet_sample):
  for split, num_classes in mi.NUM_CLASSES.items():
    images, wnids = mini_imagenet_sample[split]
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
  all_wnids = np.concatenate([s.wnids for s in mini_imagenet_sample.values()])
  assert len(set(all_wnids.tolist())) == len(all_wnids) == 100  # class-disjoint


def test_missing_files_and_layouts_get_clear_errors(
  tmp_path, mini_imagenet_cache, mini_imagenet_sample
):
  del mini_imagenet_sample  # builds the cache the last check reads, whatever order the tests run in
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
      data.load_mini_imagenet(
        SAMPLE_DIR, cache_dir=mini_imagenet_cache, source="cache", existing_only=True
      ),
      existing_only=False,
    )


def test_import_does_not_load_tensorflow():
  code = (
    "import sys, vampire_jax.data.mini_imagenet, vampire_jax.data.features; "
    "print('tensorflow' in sys.modules or 'tensorflow_datasets' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_pickle_caches_and_other_sizes_are_read(mini_imagenet_sample, tmp_path):
  # The common pickles: 'image_data' [N, 84, 84, 3], 'class_dict' {wnid: indices}.
  rng = np.random.default_rng(0)
  for split in mi.SPLITS:
    images, wnids = mini_imagenet_sample[split]
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
    np.testing.assert_array_equal(loaded[split].images, mini_imagenet_sample[split].images)
    assert loaded[split].wnids.tolist() == mini_imagenet_sample[split].wnids.tolist()

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


def test_episodes_stay_in_their_split(mini_imagenet_sample):
  # Every sampled image is traced back to its (split, class, index) by its bytes.
  table = {}
  for split, (images, _) in mini_imagenet_sample.items():
    for c in range(images.shape[0]):
      for i in range(PER_CLASS):
        table[images[c, i].tobytes()] = (split, c, i)
  for split in ("train", "test"):  # val is drawn by the same code
    tasks = data.sample_tasks(
      jax.random.key(1),
      jax.device_put(mini_imagenet_sample[split].images),
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
