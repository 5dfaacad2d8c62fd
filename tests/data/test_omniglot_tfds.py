import importlib.util

import numpy as np
import pytest

from tests.helpers import DATA_DIR, needs_data, needs_small_zips
from vampire_jax._src.core.errors import DataError
from vampire_jax.data import (
  load_omniglot,
  omniglot_tfds,
)


def _per_character_multisets(images):
  """[C, 20, 28, 28] -> each character's drawings in a canonical order."""
  flat = images.reshape(images.shape[0], images.shape[1], -1)
  return np.stack([np.stack(sorted(c, key=bytes)) for c in flat])


def test_a_failed_tfds_build_leaves_no_files(tmp_path, monkeypatch):
  pytest.importorskip("tensorflow")

  def failing(tfds, folder, tfds_dir):
    (tfds_dir / "downloads").mkdir(parents=True)
    (tfds_dir / "downloads" / "partial.zip").write_bytes(b"x" * 1000)
    raise OSError("the download broke off")

  monkeypatch.setattr(omniglot_tfds, "_prepare_tfds", failing)
  monkeypatch.delenv("OMNIGLOT_DIR", raising=False)
  with pytest.raises(DataError, match="the download broke off"):
    load_omniglot(cache_dir=tmp_path / "cache", source="tfds")
  assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_tfds_without_tensorflow_says_what_to_install(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a)
  )
  monkeypatch.delenv("OMNIGLOT_DIR", raising=False)
  with pytest.raises(FileNotFoundError, match=r'pip install -e "\.\[data\]"'):
    load_omniglot(cache_dir=tmp_path / "cache", source="auto")


@needs_data
@needs_small_zips
def test_tfds_checksums_are_replaced_then_restored():
  tfds = pytest.importorskip("tensorflow_datasets")
  builder_cls = tfds.builder_cls("omniglot")
  url = "https://github.com/brendenlake/omniglot/raw/master/python/"
  registered = dict(builder_cls.url_infos)
  assert registered[url + "images_background.zip"].checksum.startswith("ad41ab")
  with omniglot_tfds._local_checksums(tfds, DATA_DIR):
    # The digests of the rebuilt zips, from the data folder's README.
    local = builder_cls.url_infos
    assert local[url + "images_background.zip"].checksum.startswith("512b4a")
    assert local[url + "images_evaluation.zip"].checksum.startswith("98893e")
    assert (
      local[url + "images_background_small1.zip"]
      == registered[url + "images_background_small1.zip"]
    )
  assert dict(builder_cls.url_infos) == registered


@pytest.mark.slow
@needs_data
@needs_small_zips
def test_tfds_offline_full_build_matches_zip_reader(arrays, tmp_path):
  # The stock builder needs all 50 alphabets, so no smaller TFDS build works.
  tfds = pytest.importorskip("tensorflow_datasets")
  registered = dict(tfds.builder_cls("omniglot").url_infos)
  from_tfds = load_omniglot(DATA_DIR, cache_dir=tmp_path, source="tfds")
  assert dict(tfds.builder_cls("omniglot").url_infos) == registered
  np.testing.assert_array_equal(from_tfds.alphabet, arrays.alphabet)
  np.testing.assert_array_equal(from_tfds.is_background, arrays.is_background)
  np.testing.assert_array_equal(
    _per_character_multisets(from_tfds.images), _per_character_multisets(arrays.images)
  )
  assert (tmp_path / "omniglot28.npz").is_file()
