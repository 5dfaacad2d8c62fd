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

import concurrent.futures
import csv
import errno
import functools
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np

from vampire_jax.data.omniglot import default_cache_dir, read_cache_or_none
from vampire_jax.data.preprocessing import pil_image, resize_to_84
from vampire_jax.errors import ConfigError, DataError, MissingDataError, StorageError

PathLike = Union[str, os.PathLike]

SPLITS = ("train", "val", "test")
NUM_CLASSES = {"train": 64, "val": 16, "test": 20}
IMAGES_PER_CLASS = 600
IMAGE_SIZE = 84
SOURCES = ("auto", "folder", "pickle", "tfds", "cache")
PICKLE_NAME = "mini-imagenet-cache-{split}.pkl"
CACHE_FILENAME = "mini_imagenet84.npz"

_CACHE_FORMAT = 2  # 2: with the fingerprint of the source it was built from
_HELP = (
  "Expected a mini-ImageNet folder in Ravi & Larochelle's layout: "
  "<root>/images/<filename>.jpg (all 60,000 images, one flat folder) and "
  '<root>/split/train.csv, val.csv, test.csv (header "filename,label", rows '
  '"n0153282900000005.jpg,n01532829"; the CSVs of '
  "github.com/twitter/meta-learning-lstm, data/miniImagenet/), or the "
  "pickle caches <root>/mini-imagenet-cache-{train,val,test}.pkl (dicts "
  'with "image_data" uint8 [N, 84, 84, 3] and "class_dict" {wnid: '
  "[indices]}). Pass the folder as `data_dir` / --data-dir or set "
  "MINI_IMAGENET_DIR. mini-ImageNet cannot be downloaded automatically: "
  "its images come from ImageNet (image-net.org, non-commercial research "
  "use only)."
)


class MiniImagenetSplit(NamedTuple):
  """One split's classes.

  Attributes:
    images: uint8 `[classes, images_per_class, 84, 84, 3]`.
    wnids: str `[classes]`, the classes' WordNet ids, sorted.
  """

  images: np.ndarray
  wnids: np.ndarray


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
    splits = _load_tfds(folder, tfds_dir, existing_only)
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


def find_csvs(folder: PathLike) -> Optional[dict[str, Path]]:
  """{split: CSV path} from `<folder>/split/` or `<folder>/`, else None."""
  folder = Path(folder)
  for place in (folder / "split", folder):
    paths = {split: place / f"{split}.csv" for split in SPLITS}
    if all(p.is_file() for p in paths.values()):
      return paths
  return None


def read_split_csv(path: PathLike) -> list[tuple[str, str]]:
  """[(filename, wnid)] rows of a Ravi & Larochelle CSV, in file order.

  A UTF-8 byte-order mark (as spreadsheet programs write) is skipped; blank
  lines are skipped.

  Raises:
    DataError: no "filename,label" header, fields separated by something
      else than commas, a row without a label, or an image listed twice
      (it would make a class of copies); the message names the file and line.
  """
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      rows = list(csv.reader(f))
  except UnicodeDecodeError as error:
    raise DataError(f"{path} is not UTF-8 text ({error}). {_HELP}") from None
  header = [c.strip() for c in rows[0]] if rows else []
  if header != ["filename", "label"]:
    if len(header) == 1 and ";" in header[0]:
      raise DataError(
        f'{path}: fields are separated by ";"; the CSV must be comma-separated, '
        f'"filename,label" then "<image>,<wnid>" rows. {_HELP}'
      )
    raise DataError(
      f'{path} does not start with the header "filename,label" (line 1 is '
      f"{','.join(rows[0]) if rows else 'empty'!r}). {_HELP}"
    )
  result, first_line = [], {}
  for line, row in enumerate(rows[1:], start=2):
    if not any(cell.strip() for cell in row):
      continue
    if len(row) != 2 or not row[0].strip() or not row[1].strip():
      raise DataError(
        f'{path}, line {line}: expected "<image>,<wnid>", got {",".join(row)!r}. {_HELP}'
      )
    filename, wnid = row[0].strip(), row[1].strip()
    if filename in first_line:
      raise DataError(
        f"{path}, line {line}: {filename} is listed again (first on line "
        f"{first_line[filename]}); each image is one row"
      )
    first_line[filename] = line
    result.append((filename, wnid))
  return result


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
      "pass another --cache-dir (or set VAMPIRE_JAX_CACHE)",
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


def _auto_source(folder: Path) -> str:
  if find_csvs(folder) is not None:
    return "folder"
  if all((folder / PICKLE_NAME.format(split=s)).is_file() for s in SPLITS):
    return "pickle"
  raise MissingDataError(
    f"{folder} holds neither split/{{train,val,test}}.csv nor "
    f"{PICKLE_NAME.format(split='{train,val,test}')}. {_HELP}"
  )


def _image_rows(folder: Path, split: str, existing_only: bool) -> list[tuple[Path, str, int]]:
  """[(image path, wnid, CSV row)] of a split, missing files checked."""
  csvs = find_csvs(folder)
  if csvs is None:
    raise MissingDataError(f"No split/{{train,val,test}}.csv in {folder}. {_HELP}")
  image_dir = folder / "images"
  if not image_dir.is_dir():
    raise MissingDataError(f"No images/ folder in {folder}. {_HELP}")
  flat = {p.name for p in os.scandir(image_dir) if p.is_file()}
  rows, missing = [], []
  for row, (filename, wnid) in enumerate(read_split_csv(csvs[split])):
    if filename in flat:
      rows.append((image_dir / filename, wnid, row))
    elif (image_dir / wnid / filename).is_file():
      rows.append((image_dir / wnid / filename, wnid, row))
    else:
      missing.append(filename)
  if missing and not existing_only:
    raise MissingDataError(
      f"{len(missing)} of the {len(missing) + len(rows)} images listed in "
      f"{csvs[split]} are not in {image_dir} (first: {missing[:3]}). For a "
      f"partial copy pass existing_only=True (--existing-only) to use the "
      f"images present. {_HELP}"
    )
  return rows


def _decode(path: Path) -> np.ndarray:
  """One image at 84x84; a DataError naming the file if it does not decode."""
  try:
    with pil_image().open(path) as image:
      return resize_to_84(image)
  except (OSError, SyntaxError, ValueError) as error:  # PIL's UnidentifiedImageError is an OSError
    raise DataError(
      f"{path} is not a readable image ({type(error).__name__}: {error}); replace or remove it"
    ) from error


def _read_folder_split(
  folder: Path, split: str, existing_only: bool
) -> dict[str, list[np.ndarray]]:
  rows = _image_rows(folder, split, existing_only)
  # PIL decodes outside the GIL, so threads help on a many-core machine.
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    images = list(pool.map(_decode, [path for path, _, _ in rows]))
  classes = {}
  for (_, wnid, _), image in zip(rows, images):
    classes.setdefault(wnid, []).append(image)
  return classes


def _read_pickle(path: Path) -> dict:
  with open(path, "rb") as f:
    try:
      return pickle.load(f)
    except UnicodeDecodeError:  # Written by Python 2.
      f.seek(0)
      return pickle.load(f, encoding="latin1")


def _read_pickle_split(
  folder: Path, split: str, existing_only: bool
) -> dict[str, list[np.ndarray]]:
  del existing_only  # A pickle holds what it holds.
  path = folder / PICKLE_NAME.format(split=split)
  if not path.is_file():
    raise MissingDataError(f"{path} not found. {_HELP}")
  content = _read_pickle(path)
  if not isinstance(content, dict) or not {"image_data", "class_dict"} <= set(content):
    raise DataError(f'{path} is not a dict with "image_data" and "class_dict". {_HELP}')
  image_data = np.asarray(content["image_data"])
  if image_data.ndim != 4 or image_data.shape[-1] != 3:
    raise DataError(
      f"{path}: image_data has shape {image_data.shape}, expected [N, H, W, 3]. {_HELP}"
    )
  classes = {}
  for wnid, indices in content["class_dict"].items():
    wnid = wnid.decode() if isinstance(wnid, bytes) else str(wnid)
    images = image_data[np.asarray(indices, np.int64)]
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, 3):
      images = [resize_to_84(pil_image().fromarray(np.asarray(i, np.uint8))) for i in images]
    classes[wnid] = [np.asarray(i, np.uint8) for i in images]
  return classes


def _assemble(
  classes: dict[str, list[np.ndarray]], split: str, existing_only: bool
) -> MiniImagenetSplit:
  """{wnid: images} -> arrays, classes sorted; equal counts enforced."""
  if not classes:
    raise DataError(f"The {split} split has no images. {_HELP}")
  wnids = sorted(classes)
  counts = {len(classes[w]) for w in wnids}
  if len(counts) > 1 and not existing_only:
    raise DataError(
      f"Classes of the {split} split have different numbers of images: {sorted(counts)}. {_HELP}"
    )
  keep = min(counts)
  if len(counts) > 1:
    print(
      f"mini-ImageNet: {split} classes have {min(counts)} to "
      f"{max(counts)} images; keeping the first {keep} of each",
      file=sys.stderr,
    )
  images = np.stack([np.stack(classes[w][:keep]) for w in wnids])
  return MiniImagenetSplit(images, np.array(wnids))


def _validate(splits: dict[str, MiniImagenetSplit], existing_only: bool) -> None:
  """Raises ValueError unless the splits look like mini-ImageNet."""
  problems, seen = [], set()
  for split in SPLITS:
    images, wnids = splits[split]
    shape = images.shape
    if images.dtype != np.uint8 or shape[2:] != (IMAGE_SIZE, IMAGE_SIZE, 3):
      problems.append(f"{split} images are {images.dtype}{shape}")
    if not existing_only and (len(wnids), shape[1]) != (NUM_CLASSES[split], IMAGES_PER_CLASS):
      problems.append(
        f"{split} has {len(wnids)} classes of {shape[1]} "
        f"images, expected {NUM_CLASSES[split]} of "
        f"{IMAGES_PER_CLASS} (existing_only=True accepts "
        "fewer)"
      )
    shared = seen & set(wnids.tolist())
    if shared:
      problems.append(f"{split} shares classes with an earlier split: {sorted(shared)[:3]}")
    seen |= set(wnids.tolist())
  if problems:
    raise DataError(f"Not the mini-ImageNet split: {'; '.join(problems)}. {_HELP}")


# Cache.


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


def _load_tfds(folder: Path, tfds_dir: Path, existing_only: bool) -> dict[str, MiniImagenetSplit]:
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
