import errno
import json
import os

import pytest

import vampire_jax as vj
from vampire_jax.runs import run_folder


def test_a_failed_write_keeps_the_old_file_and_names_the_path(tmp_path, monkeypatch):
  path = tmp_path / "results.json"
  run_folder.write_json(path, {"old": 1})

  def full_disk(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", full_disk)
  with pytest.raises(vj.StorageError, match=f"no space left on device writing {path}") as error:
    run_folder.write_json(path, {"new": 2})
  assert error.value.errno == errno.ENOSPC and isinstance(error.value, vj.UserError)
  assert json.loads(path.read_text()) == {"old": 1}  # the previous version, whole
  assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary left


def test_tensorstore_errors_of_a_full_disk_are_storage_errors():
  text = (
    'RESOURCE_EXHAUSTED: Error writing local file "x/_sharding": Failed to write 13635 '
    "bytes to file 8: No space left on device [os_error_code='28']"
  )
  assert run_folder.storage_errno(ValueError(text)) == errno.ENOSPC
  wrapped = RuntimeError("save failed")
  wrapped.__cause__ = ValueError(text)
  assert run_folder.storage_errno(wrapped) == errno.ENOSPC
  assert run_folder.storage_errno(ValueError("shape mismatch")) is None
