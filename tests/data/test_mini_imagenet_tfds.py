import numpy as np

from tests.helpers import needs_mini_imagenet_sample, SAMPLE_DIR
from vampire_jax import data
from vampire_jax.data import mini_imagenet as mi

pytestmark = needs_mini_imagenet_sample


def test_cache_and_tfds_give_the_same_arrays(mini_imagenet_sample, mini_imagenet_cache):
  cached = data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=mini_imagenet_cache, source="cache", existing_only=True
  )
  from_tfds = data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=mini_imagenet_cache, source="tfds", existing_only=True
  )
  for split in mi.SPLITS:
    for loaded in (cached, from_tfds):
      np.testing.assert_array_equal(loaded[split].images, mini_imagenet_sample[split].images)
      assert loaded[split].wnids.tolist() == mini_imagenet_sample[split].wnids.tolist()
