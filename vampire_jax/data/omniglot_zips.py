"""Omniglot from its zips (or the folders they unpack to): the PNGs as 28x28 uint8 arrays."""

import hashlib
import io
import os
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Union

import numpy as np

from vampire_jax._src.core.errors import ConfigError, DataError, MissingDataError
from vampire_jax.data.omniglot_format import (
  _HELP,
  _SETS,
  _SMALL_ZIPS,
  ALPHABETS,
  NUM_DRAWINGS,
  OmniglotArrays,
)
from vampire_jax.data.preprocessing import omniglot_drawing_to_28, pil_image

PathLike = Union[str, os.PathLike]


# Building.


def _zip_names(all_four: bool) -> list[str]:
  names = [f"{name}.zip" for name, _ in _SETS]
  return names + list(_SMALL_ZIPS) if all_four else names


def _check_folder(folder: Path, cache_dir: Path) -> None:
  """Raises unless `folder` holds both sets (zipped or extracted) and is not written to."""
  if folder.is_file():
    raise MissingDataError(f"Omniglot folder {folder} is a file, not a folder. {_HELP}")
  if not folder.is_dir():
    raise MissingDataError(f"Omniglot folder {folder} does not exist. {_HELP}")
  if cache_dir.resolve().is_relative_to(folder.resolve()):
    raise ConfigError(
      f"cache_dir {cache_dir} is inside the data folder {folder}; the data folder is only read."
    )
  missing = [
    f"{name}.zip"
    for name, _ in _SETS
    if not (folder / f"{name}.zip").is_file() and not (folder / name).is_dir()
  ]
  if missing:
    raise MissingDataError(
      f"{', '.join(missing)} not found in the Omniglot folder {folder}. {_HELP}"
    )


def _fingerprint(folder: Path) -> list:
  """What identifies the data in `folder`: each set's zip name, size and SHA-256.

  An extracted set counts its PNGs and their bytes instead.
  """
  parts = []
  for name, _ in _SETS:
    path = folder / f"{name}.zip"
    if path.is_file():
      parts.append([path.name, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()])
    else:
      pngs = list((folder / name).rglob("*.png"))
      parts.append([name, len(pngs), sum(p.stat().st_size for p in pngs)])
  return parts


def _assemble(groups: dict[tuple[bool, str, int], list[np.ndarray]]) -> OmniglotArrays:
  """{(is_background, alphabet, character number): drawings} -> arrays."""
  keys = sorted(groups, key=lambda k: (not k[0], k[1], k[2]))
  unknown = sorted({alphabet for _, alphabet, _ in keys} - set(ALPHABETS))
  if unknown:
    raise DataError(f"Unknown Omniglot alphabets {unknown}. {_HELP}")
  for key in keys:
    if len(groups[key]) != NUM_DRAWINGS:
      raise DataError(
        f"Character {key[1]}/{key[2]} has {len(groups[key])} "
        f"drawings, expected {NUM_DRAWINGS}. {_HELP}"
      )
  return OmniglotArrays(
    images=np.stack([np.stack(groups[k]) for k in keys]),
    alphabet=np.array([ALPHABETS.index(k[1]) for k in keys], np.int32),
    is_background=np.array([k[0] for k in keys], bool),
  )


def _load_zips(folder: Optional[Path]) -> OmniglotArrays:
  """Reads and resizes the PNGs of both sets with PIL."""
  if folder is None:
    raise MissingDataError(f"The zip source needs a folder. {_HELP}")
  groups = {}
  for set_name, is_background in _SETS:
    zip_path, tree = folder / f"{set_name}.zip", folder / set_name
    if zip_path.is_file():
      files = _read_zip(zip_path)
    else:  # An extracted folder.
      files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in tree.rglob("*.png")}
    # '<set>/<alphabet>/<characterNN>/<id>_<drawer>.png', in drawer order.
    names = sorted(
      n for n in files if n.endswith(".png") and n.count("/") == 3 and not n.startswith("__MACOSX")
    )
    for name in names:  # (a thread pool was slower: these small images hold the GIL)
      _, alphabet, character, _ = name.split("/")
      image = _drawing_28(files[name], name, zip_path if zip_path.is_file() else folder)
      groups.setdefault((is_background, alphabet, int(character[len("character") :])), []).append(
        image
      )
  return _assemble(groups)


def _drawing_28(data: bytes, name: str, source: Path) -> np.ndarray:
  """One PNG's 28x28 array; a damaged image is a DataError naming it and its zip (or folder)."""
  try:
    return omniglot_drawing_to_28(pil_image().open(io.BytesIO(data)))
  except (OSError, SyntaxError, ValueError) as error:  # PIL's errors for broken images
    raise DataError(
      f"{name} in {source} is not a readable image ({type(error).__name__}). Download the "
      f"zip again. {_HELP}"
    ) from None


def _read_zip(path: Path) -> dict[str, bytes]:
  """`{member name: bytes}` of a zip; a corrupt zip is a DataError naming the file."""
  try:
    with zipfile.ZipFile(path) as archive:
      return {name: archive.read(name) for name in archive.namelist() if name.endswith(".png")}
  except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as error:
    raise DataError(
      f"{path} is not a readable zip file ({error}); it may be truncated. "
      f"Download it again. {_HELP}"
    ) from None
