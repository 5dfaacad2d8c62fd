"""Pre-extracted 640-d image embeddings of Rusu et al. (LEO), mini/tiered-ImageNet.

The paper's tiered-ImageNet results (and its mini-ImageNet "features" ones)
use the embeddings released with LEO (github.com/google-deepmind/leo:
storage.googleapis.com/leo-embeddings/embeddings.zip), which its `data.py`
reads from::

  <root>/{miniImageNet,tieredImageNet}/{center,multiview}/{train,val,test}_embeddings.pkl

(`multiview` exists for miniImageNet only). Each file is a pickled dict::

  'embeddings'  float32 `[N, 640]`
  'labels'      int `[N]` (not used by LEO; checked against the keys here)
  'keys'        `[N]` strings '<n>-<wnid>-<wnid>_<n>.JPEG'; the class is the
                middle field (LEO asserts it equals the file name's prefix)

`load_leo_embeddings` groups a split's rows by class: classes sorted by
WordNet id, a class's rows in file order. tiered-ImageNet's classes have
different sizes (732 to 1300 images), so each split is stored padded to its
largest class, with the true counts; `tasks_from_keys(..., class_counts=counts)` draws
episodes from that. As LEO does for every task, each embedding is scaled to
unit L2 norm (`l2_normalize=True`).

The pickles are already arrays, and grouping them takes seconds, so unlike
the image datasets nothing is cached.
"""

import os
import pickle
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np

PathLike = Union[str, os.PathLike]

DATASETS = {"mini": "miniImageNet", "tiered": "tieredImageNet"}
CROPS = ("center", "multiview")
SPLITS = ("train", "val", "test")
EMBEDDING_SIZE = 640
FILENAME = "{split}_embeddings.pkl"

_HELP = (
  "Expected LEO's embeddings (Rusu et al. 2019, "
  "github.com/google-deepmind/leo: embeddings.zip) laid out as "
  "<root>/{miniImageNet,tieredImageNet}/center/{train,val,test}"
  '_embeddings.pkl, each a pickled dict with "embeddings" float32 '
  '[N, 640], "labels" int [N] and "keys" [N] strings like '
  '"1234-n01234567-n01234567_1234.JPEG". Pass <root> (or the dataset or '
  "crop folder inside it) as `data_dir`, or set "
  "LEO_EMBEDDINGS_DIR (TIERED_IMAGENET_DIR / MINI_IMAGENET_FEATURES_DIR "
  "are read too)."
)
_ENV_VARS = {
  "tiered": ("LEO_EMBEDDINGS_DIR", "TIERED_IMAGENET_DIR"),
  "mini": ("LEO_EMBEDDINGS_DIR", "MINI_IMAGENET_FEATURES_DIR"),
}


class FeatureSplit(NamedTuple):
  """One split's embeddings, grouped by class and padded.

  Attributes:
    features: float32 `[classes, max_count, 640]`; class c's rows are
      `features[c, :counts[c]]`, the rest zeros.
    counts: int32 `[classes]`, examples per class.
    wnids: str `[classes]`, WordNet ids, sorted.
  """

  features: np.ndarray
  counts: np.ndarray
  wnids: np.ndarray


def find_embeddings_dir(
  data_dir: Optional[PathLike] = None, dataset: str = "tiered", crop: str = "center"
) -> Path:
  """The folder holding `{train,val,test}_embeddings.pkl`.

  `data_dir` (default: the first of `$LEO_EMBEDDINGS_DIR` and
  `$TIERED_IMAGENET_DIR` / `$MINI_IMAGENET_FEATURES_DIR` that is set) may be
  LEO's root, the dataset folder in it, or the crop folder itself.

  Raises:
    ValueError: unknown dataset or crop.
    FileNotFoundError: no such folder; the message gives the layout.
  """
  if dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {tuple(DATASETS)}, got {dataset!r}.")
  if crop not in CROPS:
    raise ValueError(f"crop must be one of {CROPS}, got {crop!r}.")
  if data_dir is None:
    data_dir = next((os.environ[v] for v in _ENV_VARS[dataset] if os.environ.get(v)), None)
  if data_dir is None:
    raise FileNotFoundError(f"No embeddings folder given. {_HELP}")
  root = Path(data_dir)
  name = DATASETS[dataset]
  for folder in (root / name / crop, root / crop, root):
    if all((folder / FILENAME.format(split=s)).is_file() for s in SPLITS):
      return folder
  raise FileNotFoundError(
    f"No {name}/{crop}/{{train,val,test}}_embeddings.pkl under {root}. {_HELP}"
  )


def load_leo_embeddings(
  data_dir: Optional[PathLike] = None,
  dataset: str = "tiered",
  *,
  crop: str = "center",
  l2_normalize: bool = True,
) -> dict[str, FeatureSplit]:
  """Loads LEO's embeddings of one dataset, grouped by class.

  Unpickling runs code from the file: only use files you trust (LEO's own).

  Args:
    data_dir: see `find_embeddings_dir`.
    dataset: 'tiered' (351 / 97 / 160 classes) or 'mini' (64 / 16 / 20).
    crop: 'center', or 'multiview' (mini only).
    l2_normalize: scale every embedding to unit L2 norm, as LEO does.

  Returns:
    {'train', 'val', 'test'} -> `FeatureSplit`; class-disjoint splits.

  Raises:
    FileNotFoundError: see `find_embeddings_dir`.
    ValueError: a file does not have LEO's layout, the labels disagree with
      the keys, or two splits share a class.
  """
  folder = find_embeddings_dir(data_dir, dataset, crop)
  splits, seen = {}, {}
  for split in SPLITS:
    path = folder / FILENAME.format(split=split)
    splits[split] = group_by_class(_read_pickle(path), path, l2_normalize)
    for wnid in splits[split].wnids.tolist():
      if wnid in seen:
        raise ValueError(
          f"Class {wnid} is in both the {seen[wnid]} and the {split} embeddings. {_HELP}"
        )
      seen[wnid] = split
  return splits


def class_of_key(key: Union[str, bytes]) -> str:
  """'1234-n01234567-n01234567_1234.JPEG' -> 'n01234567' (as LEO's data.py)."""
  key = key.decode("latin1") if isinstance(key, bytes) else str(key)
  parts = key.split("-")
  if len(parts) != 3 or parts[2].split("_")[0] != parts[1]:
    raise ValueError(f'Key {key!r} is not "<n>-<wnid>-<wnid>_<n>.JPEG". {_HELP}')
  return parts[1]


def group_by_class(
  content: dict, path: PathLike = "<dict>", l2_normalize: bool = True
) -> FeatureSplit:
  """LEO's {'embeddings', 'labels', 'keys'} -> `FeatureSplit`."""
  if not isinstance(content, dict) or not {"embeddings", "keys"} <= set(content):
    raise ValueError(f'{path} is not a dict with "embeddings" and "keys". {_HELP}')
  embeddings = np.asarray(content["embeddings"], np.float32)
  wnid_of_row = np.array([class_of_key(k) for k in content["keys"]])
  if embeddings.ndim != 2 or len(embeddings) != len(wnid_of_row):
    raise ValueError(f"{path}: embeddings {embeddings.shape} for {len(wnid_of_row)} keys. {_HELP}")
  if "labels" in content:
    _check_labels(np.asarray(content["labels"]), wnid_of_row, path)
  if l2_normalize:
    # As tf.nn.l2_normalize: x / sqrt(max(sum x^2, 1e-12)).
    norms = np.sqrt(np.maximum(np.sum(np.square(embeddings), -1), 1e-12))
    embeddings = embeddings / norms[:, None]

  wnids, class_of_row, counts = np.unique(wnid_of_row, return_inverse=True, return_counts=True)
  order = np.argsort(class_of_row, kind="stable")  # By class, file order.
  slot = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
  features = np.zeros((len(wnids), counts.max(), embeddings.shape[1]), np.float32)
  features[class_of_row[order], slot] = embeddings[order]
  return FeatureSplit(features, counts.astype(np.int32), wnids)


def _check_labels(labels: np.ndarray, wnid_of_row: np.ndarray, path: PathLike) -> None:
  """Raises unless labels and key classes map one to one."""
  if labels.shape != wnid_of_row.shape:
    raise ValueError(f"{path}: {labels.shape} labels for {wnid_of_row.shape} keys. {_HELP}")
  pairs = np.unique(np.stack([labels.astype(str), wnid_of_row]), axis=1)
  if len(np.unique(pairs[0])) != pairs.shape[1] or len(np.unique(pairs[1])) != pairs.shape[1]:
    raise ValueError(
      f"{path}: labels and the classes in the keys do not correspond one to one. {_HELP}"
    )


def _read_pickle(path: Path) -> dict:
  with open(path, "rb") as f:
    try:
      return pickle.load(f)
    except UnicodeDecodeError:  # Written by Python 2, as LEO's are.
      f.seek(0)
      return pickle.load(f, encoding="latin1")
