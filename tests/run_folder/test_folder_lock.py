import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vampire_jax as vj
from experiments import cli
from experiments import omniglot as omniglot_experiment
from tests.conftest import needs_omniglot
from tests.helpers import _one_line_error
from vampire_jax.runs import run_folder

REPO = Path(__file__).resolve().parents[2]


QUIET = dict(progress=False, print_fn=lambda message: None)


def _copy(run_dir: Path, tmp_path: Path) -> Path:
  copy = tmp_path / "run"
  shutil.copytree(run_dir, copy)
  return copy


def test_a_second_process_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken(tmp_path):
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      textwrap.dedent("""
          import sys, time
          from vampire_jax.runs import run_folder
          with run_folder.lock(sys.argv[1]):
            print("held", flush=True)
            time.sleep(120)
      """),
      str(tmp_path),
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(
      vj.RunFolderError, match=f"in use by process {holder.pid} on host {os.uname().nodename}"
    ):
      with run_folder.lock(tmp_path):
        pass
    with pytest.raises(vj.RunFolderError, match=f"process {holder.pid}"):
      run_folder.check_not_in_use(tmp_path)  # the check before loading data
  finally:
    holder.kill()  # as kill -9: the lock file still names it, but the OS dropped the flock
    holder.wait()
  notes = []
  with run_folder.lock(tmp_path, print_fn=notes.append):
    assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
    with run_folder.lock(tmp_path):  # nested in the same process
      pass
  assert len(notes) == 1 and f"from process {holder.pid}" in notes[0]
  assert (tmp_path / ".lock").read_text() == ""  # released cleanly
  with run_folder.lock(tmp_path, is_main=False):  # other hosts of a job share the folder
    pass


@needs_omniglot
def test_the_cli_refuses_a_folder_in_use_in_one_line(tiny_omniglot_run, tmp_path, capsys):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  fd = os.open(workdir / ".lock", os.O_RDWR)  # another open file: as another process holds it
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242 otherhost\n")
    code = cli.main_entry(
      lambda argv: omniglot_experiment.run_experiment(tiny_omniglot_run[1], workdir, **QUIET),
      ["--no-compilation-cache"],
    )
  finally:
    os.close(fd)
  assert code == 2
  _one_line_error(capsys.readouterr().err, f"{workdir} is in use by process 4242 on host otherhost")
