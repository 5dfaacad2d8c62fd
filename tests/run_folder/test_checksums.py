"""A run folder whose files' sha256 are recorded beside it (a zoo cell) is checked when loaded.

`vj.load_run("zoo/<cell>")` refuses a cell whose file is not the one `zoo/manifest.json`
records, naming the file, before it is read. The zoo here is a copy of one of
the repository's cells with its manifest entry, in a temporary folder.
"""

import json
import shutil

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import zoo

CELL = "regression_cpu_maml"  # the smallest cell (0.4 MB)


@pytest.fixture
def cell(tmp_path):
  """A zoo of one cell: its folder and a manifest holding its entry (the files' sha256)."""
  zoo_dir = tmp_path / "zoo"
  shutil.copytree(zoo.ZOO / CELL, zoo_dir / CELL)
  entry = zoo.read_manifest(zoo.ZOO)["cells"][CELL]
  (zoo_dir / "manifest.json").write_text(json.dumps({"format": 1, "cells": {CELL: entry}}))
  return zoo_dir / CELL


def _largest_checkpoint_file(cell):
  return max(
    (p for p in (cell / "checkpoints").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
  )


def test_a_changed_byte_in_a_cells_checkpoint_is_refused_naming_the_file(cell):
  """One changed byte in a cell's checkpoint (whose sha256 the manifest beside it holds) is
  refused naming the file, the manifest and the fix; a copy outside a zoo is not checked."""
  unchanged = vj.load_run(cell).meta_params
  data = _largest_checkpoint_file(cell)
  content = bytearray(data.read_bytes())
  content[len(content) // 5] ^= 0x40  # a weight of the meta-parameters (Adam's state follows)
  data.write_bytes(bytes(content))
  with pytest.raises(vj.RunFolderError) as raised:
    vj.load_run(cell)
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert message.startswith(f"{data} has changed since it was recorded")  # the file, the cause
  assert f"its sha256 is not the one {cell.parent.resolve() / 'manifest.json'} holds" in message
  assert f"restore it (git checkout -- {data})" in message  # the fix, or the way out:
  assert "or load a copy of the folder made elsewhere, which is not checked" in message
  # Outside a zoo the folder is not checked: a copy loads as it is (here, other parameters).
  copy = cell.parent.parent / "copy"
  shutil.copytree(cell, copy)
  changed = vj.load_run(copy).meta_params
  differs = jax.tree.map(lambda a, b: not np.array_equal(a, b, equal_nan=True), unchanged, changed)
  assert any(jax.tree.leaves(differs))


def test_a_missing_file_of_a_cell_is_refused_naming_it(cell):
  (cell / "metrics.jsonl").unlink()
  with pytest.raises(vj.RunFolderError) as raised:
    vj.load_run(cell)
  assert str(raised.value).startswith(
    f"{cell / 'metrics.jsonl'} is missing, though {cell.parent.resolve() / 'manifest.json'} "
    "records it: restore it"
  )
