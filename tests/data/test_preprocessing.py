import io
import zipfile

import numpy as np
import pytest
from PIL import Image

import vampire_jax as vj
from tests.conftest import OMNIGLOT_DIR, needs_omniglot
from tests.helpers import DATA_DIR, needs_data


def _reference_image(zip_name, member):
  """One drawing decoded and resized independently of the loader."""
  with zipfile.ZipFile(DATA_DIR / zip_name) as archive:
    image = Image.open(io.BytesIO(archive.read(member)))
    gray = np.asarray(image.convert("L"))
  small = Image.fromarray(gray).resize((28, 28), Image.Resampling.LANCZOS)
  return gray, 255 - np.asarray(small)


@needs_data
def test_pixels_are_inverted_and_resized(arrays):
  images = arrays.images
  assert images.min() == 0 and images.max() == 255
  # Strokes bright on black: most pixels are 0, the border is nearly empty.
  assert np.mean(images == 0) > 0.6
  assert np.mean(images[:, :, 0, :]) < 5 and np.mean(images[:, :, :, 0]) < 5
  # Ink is conserved by the resize (within 10%): ink in the 105x105 PNGs.
  gray, expected = _reference_image(
    "images_background.zip", "images_background/Alphabet_of_the_Magi/character01/0709_01.png"
  )
  np.testing.assert_array_equal(images[0, 0], expected)
  ink_105 = np.mean(gray == 0)
  assert abs(np.mean(images[0, 0]) / 255 - ink_105) < 0.1 * ink_105
  # Last drawing of the last character, the evaluation set's drawer 20.
  _, expected = _reference_image(
    "images_evaluation.zip", "images_evaluation/ULOG/character26/1623_20.png"
  )
  np.testing.assert_array_equal(images[-1, -1], expected)
  # Drawings of one character differ from each other.
  assert len({d.tobytes() for d in images[0]}) == 20


@needs_omniglot
def test_preprocess_omniglot_is_what_training_saw(omniglot_cache):
  member = "images_background/Alphabet_of_the_Magi/character01/0709_01.png"
  with zipfile.ZipFile(OMNIGLOT_DIR / "images_background.zip") as archive:
    png = Image.open(io.BytesIO(archive.read(member)))
    drawing = np.asarray(png.convert("L"))  # uint8, strokes dark
  out = vj.data.preprocess_omniglot(drawing[None])
  assert out.shape == (1, 28, 28, 1) and out.dtype == np.float32
  cached = vj.data.load_omniglot(
    cache_dir=omniglot_cache, source="cache", print_fn=lambda message: None
  )
  # Character 0, drawing 0 of the cache (drawer 01), scaled as the task sampler scales it.
  np.testing.assert_array_equal(out[0, ..., 0], vj.data.to_unit_range(cached.images[0, 0]))
  with pytest.raises(ValueError, match="105, 105"):
    vj.data.preprocess_omniglot(np.zeros((2, 28, 28), np.uint8))
