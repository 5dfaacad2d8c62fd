"""mini-ImageNet's files: the split CSVs with an image folder, or the pickles; read into
84x84 uint8 class arrays. Its facts (splits, class counts, image size) live here."""

import concurrent.futures
import csv
import os
import pickle
import sys
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np

from vampire_jax._src.core.errors import DataError, MissingDataError
from vampire_jax.data.preprocessing import pil_image, resize_to_84

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
  "[indices]}). Pass the folder as `data_dir` or set "
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
      f"partial copy pass existing_only=True to use the "
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
