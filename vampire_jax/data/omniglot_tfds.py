"""Omniglot through TFDS: its builder, offline from a folder's zips with their own checksums."""

import contextlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

from vampire_jax._src.core.errors import DataError, MissingDataError
from vampire_jax.data.omniglot_format import (
  _HELP,
  OmniglotArrays,
)
from vampire_jax.data.omniglot_zips import (
  _assemble,
  _zip_names,
)
from vampire_jax.data.preprocessing import omniglot_drawing_to_28, pil_image

PathLike = Union[str, os.PathLike]


@contextlib.contextmanager
def _local_checksums(tfds, folder: Path):
  """Gives TFDS's omniglot builder the checksums of the zips in `folder`.

  The big zips in the shared data folder were rebuilt, so their checksums are
  not the ones TFDS registers (recipe 1 of that folder's README). The builder
  class is restored on exit.
  """
  builder_cls = tfds.builder_cls("omniglot")
  had_own = "url_infos" in vars(builder_cls)
  previous = vars(builder_cls).get("url_infos")
  builder_cls.url_infos = {
    url: tfds.core.download.checksums.compute_url_info(folder / info.filename)
    for url, info in builder_cls.url_infos.items()
  }
  try:
    yield
  finally:
    if had_own:
      builder_cls.url_infos = previous
    else:
      del builder_cls.url_infos


def _load_tfds(folder: Optional[Path], cache_dir: Path) -> OmniglotArrays:
  """Prepares the TFDS `omniglot` builder (offline if `folder`) and reads it.

  The builder's files go to a temporary folder beside `<cache_dir>/tfds`,
  renamed into place only when the build succeeded: a failure leaves nothing.
  """
  if importlib.util.find_spec("tensorflow") is None:
    raise MissingDataError(
      "Building Omniglot with TFDS needs TensorFlow, which is not installed: "
      'run `pip install -e ".[data]"` (or pip install tensorflow), or give a folder with the '
      f"zips, which is read without TensorFlow. {_HELP}"
    )
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tfds.disable_progress_bar()
  tfds_dir = cache_dir / "tfds"
  if folder is not None:
    missing = [f for f in _zip_names(all_four=True) if not (folder / f).is_file()]
    if missing:
      raise MissingDataError(f"The TFDS source needs {missing} in {folder}. {_HELP}")
  if not tfds_dir.exists():
    cache_dir.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=cache_dir, prefix="tfds.partial-"))
    try:
      _prepare_tfds(tfds, folder, building)
    except Exception as error:
      shutil.rmtree(building, ignore_errors=True)
      raise DataError(
        f"TFDS could not build Omniglot ({type(error).__name__}: {error}); "
        f"nothing was kept. {_HELP}"
      ) from error
    os.replace(building, tfds_dir)
  builder = tfds.builder("omniglot", data_dir=os.fspath(tfds_dir))
  names = builder.info.features["alphabet"].names
  groups = {}
  for split, is_background in (("train", True), ("test", False)):
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    dataset = dataset.map(lambda ex: {**ex, "image": ex["image"][..., 0]})
    for batch in tfds.as_numpy(dataset.batch(1000)):
      for image, alphabet, character in zip(
        batch["image"], batch["alphabet"], batch["alphabet_char_id"]
      ):
        # alphabet_char_id is the character folder's number minus one.
        key = (is_background, names[alphabet], int(character) + 1)
        groups.setdefault(key, []).append(omniglot_drawing_to_28(pil_image().fromarray(image)))
  return _assemble(groups)


def _prepare_tfds(tfds, folder: Optional[Path], tfds_dir: Path) -> None:
  with contextlib.ExitStack() as stack:
    download_config = None
    if folder is not None:
      stack.enter_context(_local_checksums(tfds, folder))
      download_config = tfds.download.DownloadConfig(
        manual_dir=os.fspath(folder), try_download_gcs=False
      )
    builder = tfds.builder("omniglot", data_dir=os.fspath(tfds_dir))
    builder.download_and_prepare(download_config=download_config)
