"""A run folder whose files' checksums are recorded beside it (a zoo cell) is checked when read.

A zoo (`experiments.zoo`) keeps trained run folders side by side and records, in
`manifest.json` next to them, the sha256 of every file of each: `{"cells": {<folder name>:
{"files": {<relative path>: {"sha256", "bytes"}}}}}`. `load_run` reads a changed checkpoint
as it reads any (one changed byte can make every prediction NaN, or move them a little):
`check_recorded_files` refuses the folder instead, naming the file, before it is read.
"""

import hashlib
from pathlib import Path
from typing import Optional

from vampire_jax._src.core.errors import RunFolderError
from vampire_jax.runs.run_folder.storage import read_json

MANIFEST = "manifest.json"


def recorded_files(workdir: Path) -> Optional[dict]:
  """`{relative path: {"sha256", "bytes"}}` that a manifest beside `workdir` records for it;
  None where there is none (a run folder outside a zoo)."""
  folder = Path(workdir).resolve()
  manifest = read_json(folder.parent / MANIFEST)
  cells = manifest.get("cells") if isinstance(manifest, dict) else None
  entry = cells.get(folder.name) if isinstance(cells, dict) else None
  files = entry.get("files") if isinstance(entry, dict) else None
  return files if isinstance(files, dict) else None


def check_recorded_files(workdir: Path) -> None:
  """Refuses a run folder whose file is missing or not the one its manifest records.

  Raises:
    RunFolderError: in one line naming the file, the manifest and the fix.
  """
  files = recorded_files(workdir)
  if files is None:
    return
  manifest = Path(workdir).resolve().parent / MANIFEST
  for relative, recorded in sorted(files.items()):
    path = Path(workdir) / relative
    if not path.is_file():
      raise RunFolderError(
        f"{path} is missing, though {manifest} records it: restore it (git checkout -- "
        f"{path}), or load a copy of the folder made elsewhere, which is not checked"
      )
    if hashlib.sha256(path.read_bytes()).hexdigest() != recorded.get("sha256"):
      raise RunFolderError(
        f"{path} has changed since it was recorded (its sha256 is not the one {manifest} "
        f"holds): restore it (git checkout -- {path}), or load a copy of the folder made "
        "elsewhere, which is not checked"
      )
