"""Omniglot as small uint8 arrays: loading (TFDS, zips, cache) and splits.

`load_omniglot` returns all 1623 characters x 20 drawings at 28x28, strokes
bright (255) on a black (0) background, i.e. inverted from the PNGs as MAML
does. Characters are in a fixed order: the background set's 964 first, then
the evaluation set's 659; within a set by alphabet name (`sorted`), then by
character folder (`character01`, `character02`, ...). Alphabet ids index
`ALPHABETS`.

`make_split` picks train / val / test characters; `save_split_indices` writes
them to a JSON file so that a run's split is on record.
"""

import json
import logging
import os
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from vampire_jax._src.core.errors import ConfigError, DataError, MissingDataError
from vampire_jax.data.omniglot_format import (
  _CACHE_FORMAT,
  _HELP,
)
from vampire_jax.data.omniglot_format import (
  ALPHABETS as ALPHABETS,
)
from vampire_jax.data.omniglot_format import (
  BACKGROUND_ALPHABETS as BACKGROUND_ALPHABETS,
)
from vampire_jax.data.omniglot_format import (
  CACHE_FILENAME as CACHE_FILENAME,
)
from vampire_jax.data.omniglot_format import (
  EVALUATION_ALPHABETS as EVALUATION_ALPHABETS,
)
from vampire_jax.data.omniglot_format import (
  IMAGE_SIZE as IMAGE_SIZE,
)
from vampire_jax.data.omniglot_format import (
  NUM_BACKGROUND_CHARACTERS as NUM_BACKGROUND_CHARACTERS,
)
from vampire_jax.data.omniglot_format import (
  NUM_CHARACTERS as NUM_CHARACTERS,
)
from vampire_jax.data.omniglot_format import (
  NUM_DRAWINGS as NUM_DRAWINGS,
)
from vampire_jax.data.omniglot_format import (
  NUM_EVALUATION_CHARACTERS as NUM_EVALUATION_CHARACTERS,
)
from vampire_jax.data.omniglot_format import (
  NUM_RANDOM_TRAIN_CHARACTERS as NUM_RANDOM_TRAIN_CHARACTERS,
)
from vampire_jax.data.omniglot_format import (
  SOURCES as SOURCES,
)
from vampire_jax.data.omniglot_format import (
  SPLITS as SPLITS,
)
from vampire_jax.data.omniglot_format import (
  OmniglotArrays as OmniglotArrays,
)
from vampire_jax.data.omniglot_tfds import (
  _load_tfds,
)
from vampire_jax.data.omniglot_zips import (
  _check_folder,
  _fingerprint,
  _load_zips,
)

PathLike = Union[str, os.PathLike]


def default_cache_dir() -> Path:
  """The data cache's folder (the XLA cache is its `xla/`), the first that is set of:
  `$VAMPIRE_JAX_CACHE`; `$XDG_CACHE_HOME/vampire_jax` (an absolute path, as the XDG
  base-directory spec asks; a relative one is ignored); `~/.cache/vampire_jax`.
  `cache_dir=` overrides all three."""
  env = os.environ.get("VAMPIRE_JAX_CACHE")
  if env:
    return Path(env)
  xdg = os.environ.get("XDG_CACHE_HOME")
  base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
  return base / "vampire_jax"


def read_cache_or_none(
  cache_path: Path, read, source: str, dataset: str, loader: str, help_text: str
):
  """`read(cache_path)` if the source allows the cache and it is valid, else None.

  With source 'cache', a missing or invalid cache is an error; with 'auto', an
  invalid one is reported and None says to rebuild it.
  """
  if source in ("auto", "cache") and cache_path.exists():
    try:
      return read(cache_path)
    except ValueError as e:
      if source == "cache":
        raise
      print(f"{dataset}: rebuilding the cache ({e})", file=sys.stderr)
  if source == "cache":
    raise FileNotFoundError(
      f"No {dataset} cache at {cache_path}; call {loader} with another "
      f"source once to build it. {help_text}"
    )
  return None


# Where `load_omniglot`'s progress lines go unless a `print_fn` is given (issue 59: a library
# logs; `logging.basicConfig(level=logging.INFO)` shows them, the experiments pass `print`).
logger = logging.getLogger(__name__)


def load_omniglot(
  data_dir: Optional[PathLike] = None,
  *,
  cache_dir: Optional[PathLike] = None,
  source: str = "auto",
  print_fn: Optional[Callable[[str], None]] = None,
) -> OmniglotArrays:
  """Loads Omniglot at 28x28, building and caching it on first use.

  Each 105x105 drawing is converted to 8-bit grey, resized to 28x28 with
  PIL's LANCZOS filter and inverted (`preprocessing.omniglot_drawing_to_28`).
  The result is cached in `<cache_dir>/omniglot28.npz` (25 MB) with a record
  of what it was built from.

  Sources:
    'auto': with a data folder (`data_dir` or `$OMNIGLOT_DIR`), the cache if
      it was built from that folder's zips, else 'zip'; without a folder,
      the cache if there is one, else 'tfds' (a download).
    'zip': reads the PNGs from the zips in the folder with PIL, in seconds
      (no TensorFlow needed). Extracted `images_background/` folders work too.
    'tfds': the TFDS `omniglot` builder, its files in `<cache_dir>/tfds`;
      with a folder it builds offline from the four zips there (checksums
      replaced by those of the local files), without one it downloads.
      Needs TensorFlow (`pip install "vampire-jax[data]"`).
    'cache': only the cache.

  A named folder must hold the data: an empty or missing one is an error,
  never silently replaced by an older cache. Building never leaves partial
  files: the cache is written whole or not at all, and a failed TFDS build
  is removed. The data folder is only read. The order of a character's 20
  drawings is drawer order (01-20) from 'zip'; from 'tfds' it is TFDS's.

  Args:
    data_dir: folder with the Omniglot zips; defaults to `$OMNIGLOT_DIR`.
    cache_dir: where the cache (and TFDS's files) go; defaults to
      `default_cache_dir()`.
    source: one of `SOURCES`.
    print_fn: where the one progress line per phase goes; None (the default):
      the `vampire_jax.data.omniglot` logger, at INFO (nothing is printed
      unless logging is configured to show it).

  Returns:
    `OmniglotArrays` with 1623 characters and their provenance.

  Raises:
    MissingDataError: the folder, a zip in it, or the cache is missing (the
      message says which files are expected and where to get them).
    DataError: a zip is corrupt, or the data does not have Omniglot's counts.
  """
  if source not in SOURCES:
    raise ConfigError(f"source must be one of {SOURCES}, got {source!r}.")
  print_fn = logger.info if print_fn is None else print_fn
  cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
  cache_path = cache_dir / CACHE_FILENAME
  if data_dir is None and os.environ.get("OMNIGLOT_DIR"):
    data_dir = os.environ["OMNIGLOT_DIR"]
  folder = Path(data_dir) if data_dir is not None else None
  fingerprint = None
  if folder is not None and source != "cache":
    _check_folder(folder, cache_dir)
    fingerprint = _fingerprint(folder)
  cached = _cached_if_current(cache_path, source, folder, fingerprint, print_fn)
  if cached is not None:
    return cached
  if source == "auto":
    source = "zip" if folder is not None else "tfds"
  print_fn(
    f"Omniglot: building 28x28 arrays from {_describe(source, folder)} (once; then cached)..."
  )
  start = time.perf_counter()
  arrays = _load_zips(folder) if source == "zip" else _load_tfds(folder, cache_dir)
  _validate(arrays)
  provenance = {
    "source": source,
    "folder": None if folder is None else str(folder.resolve()),
    "fingerprint": fingerprint,
    "cache": str(cache_path.resolve()),
  }
  _write_cache(cache_path, arrays, provenance)
  print_fn(f"Omniglot: built in {time.perf_counter() - start:.0f} s; cached in {cache_path}")
  return arrays._replace(provenance=dict(provenance, loaded="built"))


def _describe(source: str, folder: Optional[Path]) -> str:
  if source == "zip":
    return f"the zips in {folder}"
  return f"TFDS (offline, from the zips in {folder})" if folder else "TFDS (downloading)"


def _cached_if_current(
  cache_path: Path, source: str, folder: Optional[Path], fingerprint: Optional[list], print_fn
) -> Optional[OmniglotArrays]:
  """The cache, if the source allows it and it was built from `folder`'s data."""
  if source not in ("auto", "cache"):
    return None
  if not cache_path.exists():
    if source == "cache":
      raise MissingDataError(
        f"No Omniglot cache at {cache_path}; load it once from the zips "
        f'(source "zip" or "auto") to build it. {_HELP}'
      )
    return None
  try:
    arrays = _read_cache(cache_path)
  except ValueError as error:
    if source == "cache":
      raise DataError(f"The Omniglot cache {cache_path} is unusable: {error}") from error
    print_fn(f"Omniglot: rebuilding the cache ({error})")
    return None
  built_from = arrays.provenance.get("fingerprint")
  if source == "auto" and folder is not None and built_from != fingerprint:
    print_fn(
      f"Omniglot: the cache {cache_path} was not built from the zips in {folder} "
      f"(it came from {arrays.provenance.get('folder') or 'a download'}); rebuilding it"
    )
    return None
  print_fn(
    f"Omniglot: cached arrays {cache_path} (built from "
    f"{_describe(arrays.provenance.get('source', '?'), _as_path(arrays.provenance))})"
  )
  return arrays._replace(provenance=dict(arrays.provenance, loaded="cache"))


def _as_path(provenance: dict) -> Optional[Path]:
  return Path(provenance["folder"]) if provenance.get("folder") else None


def split_indices(
  arrays: OmniglotArrays,
  split: str,
  *,
  seed: int = 0,
  num_val_characters: int = 100,
  num_val_alphabets: int = 5,
) -> dict[str, np.ndarray]:
  """Which characters (rows of `arrays`) form train, val and test.

  'original' (Lake et al.): train and val from the background set, test is the
    evaluation set's 659 characters. Val is the last `num_val_alphabets`
    background alphabets in `ALPHABETS` order, taken whole; the default 5 are
    Ojibwe, Sanskrit, Syriac_(Estrangelo), Tagalog and Tifinagh, 151
    characters, leaving 813 for train. `seed` is not used.
  'random' (Vinyals et al., MAML, VAMPIRE): 1200 characters drawn from all
    1623 with `np.random.default_rng(seed)`, of which the last
    `num_val_characters` drawn are val (1100 / 100 by default); the other 423
    are test. Alphabets are mixed across the parts.

  No held-out validation (`num_val_alphabets=0` for 'original',
  `num_val_characters=0` for 'random'): every training character trains
  (the paper's training sets: all 964 background characters, or all 1200)
  and 'val' is the training characters themselves. Validation then draws
  its own tasks (other keys) from them: it follows the fit and picks the
  checkpoint, and never sees a test character, but it cannot detect
  over-fitting to the training classes. Held-out drawers are no option:
  a 5-shot task with 15 queries per class needs all 20 drawings.

  Otherwise characters never appear in two parts, so their rotations (made
  when tasks are sampled) do not either; the test part never overlaps the
  others.

  Args:
    arrays: from `load_omniglot`.
    split: 'original' or 'random'.
    seed: seed of the 'random' draw.
    num_val_characters: val size for 'random', in [0, 1200); 0: val = train.
    num_val_alphabets: val size for 'original', in [0, 30); 0: val = train.

  Returns:
    {'train', 'val', 'test'} -> sorted int64 indices into `arrays`.
  """
  num_characters = len(arrays.images)
  if split == "original":
    if not 0 <= num_val_alphabets < len(BACKGROUND_ALPHABETS):
      raise ValueError(
        f"num_val_alphabets must be in [0, {len(BACKGROUND_ALPHABETS)}), got {num_val_alphabets}."
      )
    background = np.asarray(arrays.is_background, bool)
    background_alphabets = np.unique(arrays.alphabet[background])
    val_alphabets = background_alphabets[len(background_alphabets) - num_val_alphabets :]
    is_val = background & np.isin(arrays.alphabet, val_alphabets)
    train = np.flatnonzero(background & ~is_val)
    return {
      "train": train,
      "val": np.flatnonzero(is_val) if num_val_alphabets else train,
      "test": np.flatnonzero(~background),
    }
  if split == "random":
    num_train = NUM_RANDOM_TRAIN_CHARACTERS
    if not 0 <= num_val_characters < num_train:
      raise ValueError(f"num_val_characters must be in [0, {num_train}), got {num_val_characters}.")
    if num_characters <= num_train:
      raise ValueError(
        f"The random split needs more than {num_train} characters, got {num_characters}."
      )
    order = np.random.default_rng(seed).permutation(num_characters)
    num_fit = num_train - num_val_characters
    train = np.sort(order[:num_fit])
    return {
      "train": train,
      "val": np.sort(order[num_fit:num_train]) if num_val_characters else train,
      "test": np.sort(order[num_train:]),
    }
  raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")


def make_split(
  arrays: OmniglotArrays,
  split: str,
  *,
  seed: int = 0,
  num_val_characters: int = 100,
  num_val_alphabets: int = 5,
) -> dict[str, np.ndarray]:
  """Images of the train, val and test characters (see `split_indices`).

  Args:
    arrays: from `load_omniglot`.
    split: 'original' or 'random'.
    seed: seed of the 'random' draw.
    num_val_characters: val size for 'random'.
    num_val_alphabets: val size for 'original'.

  Returns:
    {'train', 'val', 'test'} -> uint8 `[characters, 20, 28, 28]`. Default
    sizes: 'original' 813 / 151 / 659, 'random' 1100 / 100 / 423; with no
    held-out validation 964 / 964 / 659 and 1200 / 1200 / 423.
  """
  indices = split_indices(
    arrays,
    split,
    seed=seed,
    num_val_characters=num_val_characters,
    num_val_alphabets=num_val_alphabets,
  )
  return {part: arrays.images[idx] for part, idx in indices.items()}


def save_split_indices(
  path: PathLike,
  arrays: OmniglotArrays,
  split: str,
  *,
  seed: int = 0,
  num_val_characters: int = 100,
  num_val_alphabets: int = 5,
) -> dict[str, np.ndarray]:
  """Writes a split's characters to a JSON file and returns the indices.

  The file holds the split's settings and, per part, the row indices into
  `OmniglotArrays`, the character names ('Tifinagh/character55') and the
  alphabets, so the split can be read without this code.

  Args:
    path: JSON file to write.
    arrays: from `load_omniglot`.
    split: 'original' or 'random'.
    seed: seed of the 'random' draw.
    num_val_characters: val size for 'random'.
    num_val_alphabets: val size for 'original'.

  Returns:
    Same as `split_indices`.
  """
  indices = split_indices(
    arrays,
    split,
    seed=seed,
    num_val_characters=num_val_characters,
    num_val_alphabets=num_val_alphabets,
  )
  names = character_names(arrays)
  record = {
    "dataset": "omniglot",
    "split": split,
    "seed": seed,
    "num_val_characters": num_val_characters,
    "num_val_alphabets": num_val_alphabets,
    "order": "background then evaluation set; alphabets sorted by name; "
    "characters by folder number",
  }
  for part, idx in indices.items():
    record[part] = {
      "num_characters": len(idx),
      "alphabets": sorted({ALPHABETS[a] for a in arrays.alphabet[idx]}),
      "indices": idx.tolist(),
      "characters": [names[i] for i in idx],
    }
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record, indent=1))
  return indices


def character_names(arrays: OmniglotArrays) -> list[str]:
  """'Alphabet/characterNN' for each row (folders are numbered from 01)."""
  names, count = [], {}
  for a in arrays.alphabet.tolist():
    count[a] = count.get(a, 0) + 1
    names.append(f"{ALPHABETS[a]}/character{count[a]:02d}")
  return names


def _validate(arrays: OmniglotArrays) -> None:
  """Raises ValueError unless `arrays` has Omniglot's counts and layout."""
  shape = (NUM_CHARACTERS, NUM_DRAWINGS, IMAGE_SIZE, IMAGE_SIZE)
  problems = []
  if arrays.images.shape != shape or arrays.images.dtype != np.uint8:
    problems.append(f"images are {arrays.images.dtype}{arrays.images.shape}, expected uint8{shape}")
  num_background = int(np.sum(arrays.is_background))
  if num_background != NUM_BACKGROUND_CHARACTERS:
    problems.append(f"{num_background} background characters, expected {NUM_BACKGROUND_CHARACTERS}")
  elif not np.all(arrays.is_background[:num_background]):
    problems.append("background characters do not come first")
  elif set(arrays.alphabet[:num_background].tolist()) != set(
    range(len(BACKGROUND_ALPHABETS))
  ) or set(arrays.alphabet[num_background:].tolist()) != set(
    range(len(BACKGROUND_ALPHABETS), len(ALPHABETS))
  ):
    problems.append("alphabets are not the 30 background and 20 evaluation ones")
  if problems:
    raise DataError(f"Not the full Omniglot set: {'; '.join(problems)}. {_HELP}")


def _read_cache(path: Path) -> OmniglotArrays:
  """The cached arrays; a ValueError if the file is damaged (truncated, not an npz)."""
  try:
    with np.load(path, allow_pickle=False) as f:
      if int(f["format"]) != _CACHE_FORMAT:
        raise ValueError(f"{path} has format {int(f['format'])}, expected {_CACHE_FORMAT}")
      arrays = OmniglotArrays(
        f["images"], f["alphabet"], f["is_background"], json.loads(str(f["provenance"]))
      )
  except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, OSError) as error:
    raise ValueError(f"{path} is damaged ({type(error).__name__}: {error})") from error
  _validate(arrays)
  return arrays


def _write_cache(path: Path, arrays: OmniglotArrays, provenance: dict) -> None:
  """Writes atomically (temporary file, then rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
    np.savez(
      f,
      format=_CACHE_FORMAT,
      provenance=json.dumps(provenance),
      resample="lanczos",
      images=arrays.images,
      alphabet=arrays.alphabet,
      is_background=arrays.is_background,
    )
  os.chmod(f.name, 0o644)  # Not the temporary file's 0o600.
  os.replace(f.name, path)
