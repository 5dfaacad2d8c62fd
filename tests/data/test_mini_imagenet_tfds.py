import numpy as np
import pytest

from tests.helpers import SAMPLE_DIR
from vampire_jax import data
from vampire_jax.data import mini_imagenet as mi

pytestmark = pytest.mark.skipif(
  not (SAMPLE_DIR / "split" / "test.csv").exists(),
  reason=f"mini-ImageNet sample not found in {SAMPLE_DIR}",
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("mini_cache")


@pytest.fixture(scope="module")
def sample(cache_dir):
  return data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=cache_dir, source="folder", existing_only=True
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
