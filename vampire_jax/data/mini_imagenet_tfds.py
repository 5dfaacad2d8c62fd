"""mini-ImageNet through TFDS: a manual-download builder over either layout that
`load_mini_imagenet` reads (imports TensorFlow Datasets when called)."""

import functools
import os
from pathlib import Path

import numpy as np

from vampire_jax.data.mini_imagenet_files import (
  _HELP,
  IMAGE_SIZE,
  PICKLE_NAME,
  SPLITS,
  MiniImagenetSplit,
  _assemble,
  _auto_source,
  _decode,
  _image_rows,
  _read_pickle,
)
from vampire_jax.data.preprocessing import pil_image, resize_to_84

# TFDS.


@functools.lru_cache(maxsize=None)
def mini_imagenet_builder_class():
  """The TFDS builder class `mini_imagenet` (imports TFDS; registers it once).

  A manual-download builder: `manual_dir` is the folder `load_mini_imagenet`
  reads (either layout). Configs: 'full' (every CSV row must have its image)
  and 'existing_files' (rows without an image file are skipped, for partial
  copies). Examples: 'image' uint8 84x84x3 (stored as PNG, lossless), 'wnid'
  text, 'index' the row in the split's CSV (or the index in the pickle's
  image_data). TFDS shuffles records; sort by 'index' for file order. To
  build it::

    builder = mini_imagenet_builder_class()(config='full', data_dir=tfds_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir='/data/mini_imagenet'))
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class MiniImagenet(tfds.core.GeneratorBasedBuilder):
    """mini-ImageNet, Ravi & Larochelle's 64/16/20-class split, 84x84."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Ravi & Larochelle split, 84x84 LANCZOS."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = _HELP
    BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name="full", description="All 60,000 images; all must exist."),
      tfds.core.BuilderConfig(
        name="existing_files", description="Only the CSV rows whose image file exists."
      ),
    ]

    def _info(self):
      return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
          {
            "image": tfds.features.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3), encoding_format="png"),
            "wnid": tfds.features.Text(),
            "index": tfds.features.Scalar(np.int64),
          }
        ),
        homepage="https://github.com/twitter/meta-learning-lstm",
        citation="Ravi & Larochelle, Optimization as a Model for Few-Shot Learning, ICLR 2017.",
      )

    def _split_generators(self, dl_manager):
      folder = Path(dl_manager.manual_dir)
      source = _auto_source(folder)
      existing_only = self.builder_config.name == "existing_files"
      return {
        split: self._generate_examples(folder, split, source, existing_only) for split in SPLITS
      }

    def _generate_examples(self, folder, split, source, existing_only):
      if source == "folder":
        for path, wnid, row in _image_rows(folder, split, existing_only):
          yield row, {"image": _decode(path), "wnid": wnid, "index": row}
      else:
        content = _read_pickle(folder / PICKLE_NAME.format(split=split))
        for wnid, indices in content["class_dict"].items():
          wnid = wnid.decode() if isinstance(wnid, bytes) else str(wnid)
          for index in indices:
            image = pil_image().fromarray(np.asarray(content["image_data"][index]))
            yield int(index), {"image": resize_to_84(image), "wnid": wnid, "index": int(index)}

  return MiniImagenet


def load_tfds(folder: Path, tfds_dir: Path, existing_only: bool) -> dict[str, MiniImagenetSplit]:
  """Prepares the TFDS builder from `folder` (offline) and reads it back."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  _auto_source(folder)  # A clear error before TFDS's own.
  builder = mini_imagenet_builder_class()(
    config="existing_files" if existing_only else "full", data_dir=os.fspath(tfds_dir)
  )
  builder.download_and_prepare(
    download_config=tfds.download.DownloadConfig(
      manual_dir=os.fspath(folder), try_download_gcs=False
    )
  )
  splits = {}
  for split in SPLITS:
    rows = []  # (wnid, index, image)
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    for batch in tfds.as_numpy(dataset.batch(1000)):
      rows += zip([w.decode() for w in batch["wnid"]], batch["index"].tolist(), batch["image"])
    classes = {}
    for wnid, _, image in sorted(rows, key=lambda r: (r[0], r[1])):
      classes.setdefault(wnid, []).append(image)
    splits[split] = _assemble(classes, split, existing_only)
  return splits
