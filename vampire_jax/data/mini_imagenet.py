"""mini-ImageNet (Ravi & Larochelle split) as uint8 arrays, from user data.

mini-ImageNet cannot be downloaded freely, so `load_mini_imagenet` reads a
copy the user supplies, in one of the layouts that circulate::

  Ravi & Larochelle's layout (their `split/*.csv`, one flat image folder):
    <root>/images/<filename>            e.g. images/n0153282900000005.jpg
    <root>/split/{train,val,test}.csv   header `filename,label`, then one
                                        row per image: `<filename>,<wnid>`
    (CSVs directly in <root>, or images in per-class folders
    `images/<wnid>/<filename>`, are accepted too.)
  Pickle caches (as shared with several few-shot code bases):
    <root>/mini-imagenet-cache-{train,val,test}.pkl, each a pickled dict
    {'image_data': uint8 [N, 84, 84, 3], 'class_dict': {wnid: [indices]}}

The result is 64 / 16 / 20 classes of 600 images, 84x84x3 uint8, per split.
Classes are sorted by WordNet id (the CSVs' order); a class's images keep
their CSV row order (or `class_dict` order). Images of any other size are
resized to 84x84 with PIL's LANCZOS filter, as Ravi & Larochelle's and
MAML's preprocessing scripts do; 84x84 images are kept exactly.

`mini_imagenet_builder_class()` gives a TFDS builder (manual download) over
the same layouts; `load_mini_imagenet(source='tfds')` builds and reads it.
Only that source imports TensorFlow.
"""

import errno
import hashlib
import json
import os
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Union

import numpy as np

from vampire_jax._src import deprecations
from vampire_jax._src.core.errors import ConfigError, MissingDataError, StorageError
from vampire_jax.data.mini_imagenet_files import (
  _CACHE_FORMAT,
  _HELP,
  _assemble,
  _auto_source,
  _read_folder_split,
  _read_pickle_split,
  _validate,
)
from vampire_jax.data.mini_imagenet_files import (
  CACHE_FILENAME as CACHE_FILENAME,
)
from vampire_jax.data.mini_imagenet_files import (
  IMAGE_SIZE as IMAGE_SIZE,
)
from vampire_jax.data.mini_imagenet_files import (
  IMAGES_PER_CLASS as IMAGES_PER_CLASS,
)
from vampire_jax.data.mini_imagenet_files import (
  NUM_CLASSES as NUM_CLASSES,
)
from vampire_jax.data.mini_imagenet_files import (
  PICKLE_NAME as PICKLE_NAME,
)
from vampire_jax.data.mini_imagenet_files import (
  SOURCES as SOURCES,
)
from vampire_jax.data.mini_imagenet_files import (
  SPLITS as SPLITS,
)
from vampire_jax.data.mini_imagenet_files import (
  MiniImagenetSplit as MiniImagenetSplit,
)
from vampire_jax.data.mini_imagenet_files import (
  find_csvs as find_csvs,
)
from vampire_jax.data.mini_imagenet_files import (
  read_split_csv as read_split_csv,
)
from vampire_jax.data.omniglot import default_cache_dir, read_cache_or_none

PathLike = Union[str, os.PathLike]


def load_mini_imagenet(
  data_dir: Optional[PathLike] = None,
  *,
  cache_dir: Optional[PathLike] = None,
  source: str = "auto",
  existing_only: bool = False,
) -> dict[str, MiniImagenetSplit]:
  """Loads mini-ImageNet at 84x84, building and caching it on first use.

  The arrays are cached in `<cache_dir>/mini_imagenet84_<hash of the
  folder>.npz` (1.3 GB for the full set), so later calls take a second or so.

  Sources:
    'auto': the cache if present; else 'folder' if `data_dir` (or
      `$MINI_IMAGENET_DIR`) holds the CSVs, else 'pickle'.
    'folder': the CSVs and JPEGs, decoded with PIL (no TensorFlow).
    'pickle': the `mini-imagenet-cache-*.pkl` files. Unpickling runs code
      from the file: only use pickles you trust.
    'tfds': the TFDS builder of `mini_imagenet_builder_class`, built from
      the folder into `<cache_dir>/tfds`, then read back (needs TensorFlow).
      It gives the same arrays as 'folder'.
    'cache': only the cache; raises FileNotFoundError if it is missing.

  Args:
    data_dir: the mini-ImageNet folder; defaults to `$MINI_IMAGENET_DIR`.
    cache_dir: where the cache goes; defaults to `default_cache_dir()`.
    source: one of `SOURCES`.
    existing_only: keep only the CSV rows whose image file exists, then the
      first n images of each class, n the smallest class's count in that
      split; the counts of the full set are not required. For partial copies
      such as the project's 12-images-per-class sample. Its cache is
      `mini_imagenet84_existing_<hash of the folder path>.npz` (the full
      set's `mini_imagenet84_<hash>.npz`).

  The cache is named after the folder and records what it was built from
  (`_fingerprint`: the CSVs' bytes and every image file's name, size and
  modification time, or the pickles' sizes and times). With source 'auto' a
  cache whose record differs from the folder's files (an image removed,
  added or replaced, another CSV) is rebuilt, with a line saying why; the
  folder is looked at before the cache is read, and a missing folder is an
  error, never replaced by an older cache. Without a folder (no `data_dir`,
  no `$MINI_IMAGENET_DIR`) only the cache `mini_imagenet84.npz` is read, as
  it is: there is no source to compare it with.

  Returns:
    {'train', 'val', 'test'} -> `MiniImagenetSplit`; classes of the three
    splits are disjoint.

  Raises:
    MissingDataError: (a FileNotFoundError) no folder, a file given as the
      folder, no known layout in it, or (without `existing_only`) image
      files missing; the message gives the layout.
    DataError: (a ValueError) a CSV that is not "filename,label" rows (another
      separator, a row without a label, an image listed twice), or not
      64/16/20 classes of 600 images.
    StorageError: the cache folder cannot be written (checked before any
      image is decoded).
  """
  if source not in SOURCES:
    raise ConfigError(f"source must be one of {SOURCES}, got {source!r}.")
  if data_dir is None and os.environ.get("MINI_IMAGENET_DIR"):
    data_dir = os.environ["MINI_IMAGENET_DIR"]
  folder = Path(data_dir) if data_dir is not None else None
  cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
  if existing_only and folder is None:
    raise ConfigError("existing_only needs the data folder (its cache is named after it).")
  fingerprint = None
  if folder is not None and source != "cache":
    _check_folder(folder)
    fingerprint = _fingerprint(folder)
  cache_path = cache_dir / _cache_name(folder, existing_only)
  cached = read_cache_or_none(
    cache_path,
    lambda path: _read_cache(path, existing_only, fingerprint),
    source,
    "mini-ImageNet",
    "load_mini_imagenet",
    _HELP,
  )
  if cached is not None:
    return cached
  if folder is None:
    raise MissingDataError(f"No mini-ImageNet folder given. {_HELP}")
  _check_folder(folder)
  if source == "auto":
    source = _auto_source(folder)
  _check_cache_writable(cache_dir)

  start = time.perf_counter()
  if source == "tfds":
    tfds_dir = cache_dir / "tfds" / cache_path.stem
    from vampire_jax.data import mini_imagenet_tfds  # imports TFDS; lazily

    splits = mini_imagenet_tfds.load_tfds(folder, tfds_dir, existing_only)
  else:
    read = _read_folder_split if source == "folder" else _read_pickle_split
    splits = {
      split: _assemble(read(folder, split, existing_only), split, existing_only) for split in SPLITS
    }
  _validate(splits, existing_only)
  _write_cache(cache_path, splits, source, fingerprint)
  print(
    f"mini-ImageNet: built from {source} in "
    f"{time.perf_counter() - start:.0f}s, cached in {cache_path}",
    file=sys.stderr,
  )
  return splits


def _check_folder(folder: Path) -> None:
  """Raises MissingDataError unless `folder` is an existing folder (not a file)."""
  if folder.is_file():
    raise MissingDataError(f"mini-ImageNet folder {folder} is a file, not a folder. {_HELP}")
  if not folder.is_dir():
    raise MissingDataError(f"mini-ImageNet folder {folder} does not exist. {_HELP}")


def _check_cache_writable(cache_dir: Path) -> None:
  """Raises StorageError if the cache cannot be written, before any image is decoded."""
  existing = cache_dir
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  try:
    if not existing.is_dir():
      raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file")
    fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-test-")
    os.close(fd)
    os.unlink(probe)
  except OSError as error:
    raise StorageError(
      error.errno or 0,
      f"the mini-ImageNet cache folder {cache_dir} cannot be written ({error.strerror or error}); "
      "pass another cache_dir (or set VAMPIRE_JAX_CACHE)",
    ) from error


def _fingerprint(folder: Path) -> Optional[dict]:
  """What identifies the data in `folder`, cheaply: the CSVs' SHA-256 and each image
  file's name, size and modification time (or each pickle's size and time).

  None when the folder holds neither layout (the loader then says what it expects).
  """
  csvs = find_csvs(folder)
  if csvs is not None:
    files = hashlib.sha256()
    image_dir = folder / "images"
    count = 0
    if image_dir.is_dir():
      for root, dirs, names in os.walk(image_dir):
        dirs.sort()
        for name in sorted(names):
          stat = os.stat(os.path.join(root, name))
          relative = os.path.relpath(os.path.join(root, name), image_dir)
          files.update(f"{relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
          count += 1
    return {
      "layout": "folder",
      "csvs": {s: hashlib.sha256(p.read_bytes()).hexdigest() for s, p in csvs.items()},
      "images": [count, files.hexdigest()],
    }
  pickles = [folder / PICKLE_NAME.format(split=s) for s in SPLITS]
  if all(p.is_file() for p in pickles):
    return {
      "layout": "pickle",
      "pickles": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in pickles],
    }
  return None


# Reading the layouts: each gives {wnid: [84x84x3 images in order]}.


def _cache_name(folder: Optional[Path], existing_only: bool) -> str:
  """The cache of `folder`: one per folder (and mode), never shared between folders."""
  if folder is None:
    return CACHE_FILENAME
  digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]
  return f"mini_imagenet84_{'existing_' if existing_only else ''}{digest}.npz"


def _read_cache(
  path: Path, existing_only: bool, fingerprint: Optional[dict] = None
) -> dict[str, MiniImagenetSplit]:
  """The cached splits; a ValueError (the loader rebuilds) if damaged or not built from
  the data whose `fingerprint` is given (None: not compared)."""
  try:
    with np.load(path, allow_pickle=False) as f:
      if int(f["format"]) != _CACHE_FORMAT:
        raise ValueError(f"{path} has format {int(f['format'])}, expected {_CACHE_FORMAT}")
      built_from = json.loads(str(f["fingerprint"]))
      if fingerprint is not None and built_from != fingerprint:
        raise ValueError(
          f"{path} was not built from the files now in the folder (an image or CSV was "
          "added, removed or changed)"
        )
      splits = {s: MiniImagenetSplit(f[f"{s}_images"], f[f"{s}_wnids"]) for s in SPLITS}
  except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, OSError) as error:
    raise ValueError(f"{path} is damaged ({type(error).__name__}: {error})") from error
  _validate(splits, existing_only)
  return splits


def _write_cache(
  path: Path, splits: dict[str, MiniImagenetSplit], source: str, fingerprint: Optional[dict]
) -> None:
  """Writes atomically (temporary file, then rename), with the source's fingerprint."""
  path.parent.mkdir(parents=True, exist_ok=True)
  arrays = {}
  for split, (images, wnids) in splits.items():
    arrays[f"{split}_images"], arrays[f"{split}_wnids"] = images, wnids
  with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
    np.savez(f, format=_CACHE_FORMAT, source=source, fingerprint=json.dumps(fingerprint), **arrays)
  os.chmod(f.name, 0o644)
  os.replace(f.name, path)


# Names an earlier version kept here (`deprecations.MOVED_OUT_OF_MODULES`): warn, then work.
__getattr__ = deprecations.module_getattr(__name__)
