import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vampire_jax as vj
from vampire_jax.data import mini_imagenet as mi
from vampire_jax.data import mini_imagenet_files


def _fake_mini_imagenet(root: Path, per_class: int = 2, csv_text=None) -> Path:
  """A tiny folder in Ravi & Larochelle's layout: 2 classes per split, `per_class` images each."""
  (root / "images").mkdir(parents=True)
  (root / "split").mkdir()
  rng = np.random.default_rng(0)
  for s, split in enumerate(("train", "val", "test")):
    rows = ["filename,label"]
    for c in range(2):
      wnid = f"n{s}{c:07d}"
      for i in range(per_class):
        name = f"{wnid}{i:08d}.png"
        Image.fromarray(rng.integers(0, 255, (84, 84, 3), dtype=np.uint8)).save(
          root / "images" / name
        )
        rows.append(f"{name},{wnid}")
    text = "\n".join(rows) + "\n"
    (root / "split" / f"{split}.csv").write_text(csv_text(text) if csv_text else text)
  return root


def _load(folder, cache, **kwargs):
  return vj.data.load_mini_imagenet(folder, cache_dir=cache, existing_only=True, **kwargs)


def _first_image() -> str:
  """The train split's first image of `_fake_mini_imagenet`."""
  return f"n{0}{0:07d}{0:08d}.png"


def _first_rows(text: str, change) -> str:
  lines = text.splitlines()
  return "\n".join(lines[:1] + change(lines[1]) + lines[2:]) + "\n"


MINI_ROWS = {  # what is done to the folder after the first load -> what the second load says
  "images/ deleted": (
    lambda folder: shutil.rmtree(folder / "images"),
    vj.MissingDataError,
    r"No images/ folder in",
  ),
  "the folder deleted": (
    lambda folder: shutil.rmtree(folder),
    vj.MissingDataError,
    r"mini-ImageNet folder .* does not exist",
  ),
}


CSV_ROWS = {  # a CSV -> (error, message); None: loads (documented)
  "one image listed 12 times": (
    lambda text: _first_rows(text, lambda row: [row] * 12),
    vj.DataError,
    rf"train.csv, line 3: {_first_image()} is listed again \(first on line 2\)",
  ),
  "a byte-order mark": (lambda text: "\ufeff" + text, None, None),
  "; separators": (
    lambda text: text.replace(",", ";"),
    vj.DataError,
    r"train.csv: fields are separated by \";\"",
  ),
  "a row without a label": (
    lambda text: _first_rows(text, lambda row: [row.split(",")[0] + ","]),
    vj.DataError,
    r"train.csv, line 2: expected \"<image>,<wnid>\"",
  ),
}


def test_a_corrupt_image_and_a_missing_one_name_the_file(tmp_path):
  from vampire_jax.data import mini_imagenet_files

  broken = tmp_path / "n01532829_00000005.jpg"
  broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
  with pytest.raises(vj.DataError, match=f"{broken} is not a readable image"):
    mini_imagenet_files._decode(broken)
  (tmp_path / "split").mkdir()
  (tmp_path / "images").mkdir()
  for split in ("train", "val", "test"):
    (tmp_path / "split" / f"{split}.csv").write_text("filename,label\nmissing.jpg,n01532829\n")
  with pytest.raises(vj.MissingDataError, match="missing.jpg"):
    mini_imagenet_files._image_rows(tmp_path, "train", existing_only=False)


def test_the_mini_imagenet_cache_is_rebuilt_when_an_image_changes(tmp_path, capsys):
  """A changed image makes the cache rebuild, saying so: the new image, not the cached one."""
  folder = _fake_mini_imagenet(tmp_path / "mini")
  first = _load(folder, tmp_path / "cache")
  assert first["train"].images[0, 0].max() > 0
  Image.fromarray(np.zeros((84, 84, 3), np.uint8)).save(folder / "images" / _first_image())
  capsys.readouterr()
  second = _load(folder, tmp_path / "cache")
  assert "rebuilding the cache" in capsys.readouterr().err
  assert second["train"].images[0, 0].max() == 0  # the new image, not the cached one
  np.testing.assert_array_equal(second["train"].images[0, 1], first["train"].images[0, 1])


@pytest.mark.parametrize("row", list(MINI_ROWS))
def test_a_mini_imagenet_cache_never_stands_in_for_a_changed_folder(row, tmp_path):
  """A cache never stands in for a folder whose images/, or itself, is deleted: refused."""
  change, error, message = MINI_ROWS[row]
  folder = _fake_mini_imagenet(tmp_path / "mini")
  _load(folder, tmp_path / "cache")
  change(folder)
  with pytest.raises(error, match=message):
    _load(folder, tmp_path / "cache")


def test_two_full_mini_imagenet_folders_get_two_caches(tmp_path):
  """The cache's name differs between two folders, and between the full and the small set."""
  one, two = tmp_path / "one", tmp_path / "two"
  assert mi._cache_name(one, False) != mi._cache_name(two, False)
  assert mi._cache_name(one, False) != mi._cache_name(one, True)


@pytest.mark.parametrize("row", list(CSV_ROWS))
def test_mini_imagenet_csvs_are_read_or_refused_naming_file_and_line(row, tmp_path):
  change, error, message = CSV_ROWS[row]
  folder = _fake_mini_imagenet(tmp_path / "mini", csv_text=change)
  if error is None:
    loaded = _load(folder, tmp_path / "cache")
    assert loaded["train"].wnids.tolist() == ["n00000000", "n00000001"]
    return
  with pytest.raises(error, match=message):
    _load(folder, tmp_path / "cache")


def test_an_unwritable_mini_imagenet_cache_fails_before_decoding(tmp_path, monkeypatch):
  """A cache folder under a file (or on a read-only mount) is refused before any image is
  decoded."""
  folder = _fake_mini_imagenet(tmp_path / "mini")
  (tmp_path / "file").write_text("")
  decoded = []
  monkeypatch.setattr(mini_imagenet_files, "_decode", lambda path: decoded.append(path))
  caches = [tmp_path / "file" / "cache"]  # under a file
  read_only = tmp_path / "read_only"  # a read-only mount, where mounting is allowed (root)
  read_only.mkdir()
  mount = ["mount", "-t", "tmpfs", "-o", "ro,size=100k", "tmpfs", str(read_only)]
  mounted = subprocess.run(mount, capture_output=True).returncode == 0
  if mounted:
    caches.append(read_only / "cache")
  try:
    for cache in caches:
      with pytest.raises(vj.StorageError, match=rf"mini-ImageNet cache folder {cache} cannot be"):
        _load(folder, cache)
  finally:
    if mounted:
      subprocess.run(["umount", str(read_only)], check=True)
  assert decoded == []
