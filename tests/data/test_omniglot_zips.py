import zipfile

import numpy as np
import pytest

from tests.helpers import BIG_ZIPS, DATA_DIR, SMALL_ZIPS, needs_data, needs_small_zips
from vampire_jax._src.core.errors import DataError
from vampire_jax.data import load_omniglot, omniglot


@pytest.fixture
def small_folder(tmp_path):
  """A folder laid out like the data folder, the big zips being the small."""
  folder = tmp_path / "small"
  folder.mkdir()
  for name, target in zip(BIG_ZIPS + SMALL_ZIPS, SMALL_ZIPS + SMALL_ZIPS):
    (folder / name).symlink_to(DATA_DIR / target)
  return folder


def test_truncated_zip_is_an_error_that_names_the_file(tmp_path):
  folder = tmp_path / "data"
  folder.mkdir()
  for name in BIG_ZIPS:
    (folder / name).write_bytes(b"PK\x03\x04 truncated")
  with pytest.raises(DataError) as error:
    load_omniglot(folder, cache_dir=tmp_path / "cache")
  assert "images_background.zip" in str(error.value) and "truncated" in str(error.value)
  assert not (tmp_path / "cache" / "omniglot28.npz").exists()


@needs_data
@needs_small_zips
def test_extracted_folders_read_like_zips(small_folder, tmp_path):
  extracted = tmp_path / "extracted"
  extracted.mkdir()
  for zip_name, set_name in zip(SMALL_ZIPS, ("images_background", "images_evaluation")):
    with zipfile.ZipFile(DATA_DIR / zip_name) as archive:
      archive.extractall(tmp_path)
    # The small zips' top folders are images_background_small1 and 2.
    (tmp_path / zip_name.removesuffix(".zip")).rename(extracted / set_name)
  from_zips = omniglot._load_zips(small_folder)
  from_folders = omniglot._load_zips(extracted)
  assert from_zips.images.shape == (136 + 156, 20, 28, 28)
  for a, b in zip(from_zips, from_folders):
    np.testing.assert_array_equal(a, b)


def test_a_damaged_png_inside_the_zip_is_one_line_naming_it(tmp_path):
  """A damaged PNG inside the zip is refused in one line naming the file and its zip."""
  import io
  import zipfile

  from PIL import Image

  from vampire_jax._src.core.errors import DataError
  from vampire_jax.data import omniglot

  good = io.BytesIO()
  Image.new("L", (105, 105), 255).save(good, format="PNG")
  for set_name in ("images_background", "images_evaluation"):
    with zipfile.ZipFile(tmp_path / f"{set_name}.zip", "w") as archive:
      archive.writestr(f"{set_name}/Latin/character01/0101_01.png", good.getvalue())
      if set_name == "images_evaluation":
        archive.writestr(f"{set_name}/Latin/character01/0101_02.png", b"\x89PNG not an image")
  with pytest.raises(DataError) as raised:
    omniglot._load_zips(tmp_path)
  message = str(raised.value)
  assert "images_evaluation/Latin/character01/0101_02.png" in message
  assert f"0101_02.png in {tmp_path / 'images_evaluation.zip'} is not" in message
  assert "not a readable image" in message and len(message.splitlines()) == 1
