"""The run folder survives what happens to real runs (issue 21), one test per row of its table:
a full disk, damaged files of a real tiny run, a second process, a folder that cannot be one,
fewer steps than trained, Ctrl-C and SIGTERM in the test phase, damaged data caches.
Every failure is one line (exit 2 from the command line; 130/143 for a signal)."""

import errno
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import vampire_jax as vj
from vampire_jax.runs import reporting
from conftest import OMNIGLOT_DIR, needs_omniglot, tiny_omniglot_config
from experiments import cli, omniglot
from vampire_jax.runs import run_folder
from vampire_jax.runs.run_folder import storage as run_folder_storage

REPO = Path(__file__).resolve().parents[1]
QUIET = dict(progress=False, print_fn=lambda message: None)


def _copy(run_dir: Path, tmp_path: Path) -> Path:
  copy = tmp_path / "run"
  shutil.copytree(run_dir, copy)
  return copy


def _truncate_data(folder: Path) -> None:
  """Cuts every array data file of an orbax checkpoint to 10 bytes (the metadata stays)."""
  files = list(folder.glob("**/ocdbt.process_0/d/*"))
  assert files, folder
  for path in files:
    with open(path, "r+b") as f:
      f.truncate(10)


def _one_line_error(output: str, *needles: str) -> None:
  errors = [line for line in output.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in output, output
  for needle in needles:
    assert needle in errors[0], (needle, errors[0])


def _leaves_equal(a, b) -> bool:
  return all(
    np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def _checkpoint_params(workdir: Path, step: int):
  return run_folder.read_checkpoint(workdir / "checkpoints", step)["meta_params"]


# -- Whole-or-nothing files, the log, the disk ------------------------------------------------


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


def test_damaged_json_is_read_as_missing_and_a_torn_log_line_is_cut(tmp_path):
  (tmp_path / "train_time.json").write_text("")
  (tmp_path / "best_score.json").write_text('{"st')
  notes = []
  assert run_folder.read_json(tmp_path / "train_time.json", print_fn=notes.append, default={}) == {}
  assert run_folder.read_json(tmp_path / "best_score.json", print_fn=notes.append) is None
  assert len(notes) == 2 and all("is damaged" in note for note in notes)
  log = tmp_path / "metrics.jsonl"
  log.write_text('{"step": 3, "train/loss": 1.5}\n{"step": 6, "train/lo')  # killed mid-write
  assert reporting.read_metrics(tmp_path) == [{"step": 3, "train/loss": 1.5}]
  writer = reporting.MetricWriter(tmp_path)
  writer.write(6, {"train/loss": 1.25})
  writer.close()
  assert reporting.read_metrics(tmp_path) == [
    {"step": 3, "train/loss": 1.5},
    {"step": 6, "train/loss": 1.25},
  ]


def _tensorboard_events(folder: Path):
  """Every event in `folder`'s TensorBoard files, read back with tensorboardX's protos.

  An event file is a TFRecord: per record a little-endian uint64 length, its
  4-byte CRC, the serialised `Event`, and the data's 4-byte CRC.
  """
  from tensorboardX.proto import event_pb2

  for path in sorted(folder.glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i < len(data):
      (length,) = struct.unpack("<Q", data[i : i + 8])
      yield event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
      i += 12 + length + 4


def _scalars(folder: Path) -> dict:
  return {
    (v.tag, e.step): v.simple_value
    for e in _tensorboard_events(folder)
    for v in e.summary.value
    if v.HasField("simple_value")
  }


def test_tensorboard_gets_the_config_as_hparams_the_test_metrics_and_the_figures(tmp_path):
  pytest.importorskip("tensorboardX", reason="tensorboardX (the experiments extra) not installed")
  from tensorboardX.proto import plugin_hparams_pb2

  writer = reporting.MetricWriter(tmp_path)
  writer.write(10, {"train/loss": 1.25})
  config = {
    "algorithm": "vampire",
    "inner_lr": 0.1,
    "num_mc_test": 4,
    "log_std_init": [-4, -3],
    "data_dir": None,
    "remat": False,
  }
  writer.write_test(10, config, {"accuracy": 0.75, "num_tasks": 6, "open_set": {"auroc": 0.5}})
  writer.close()
  scalars = _scalars(tmp_path)
  assert scalars[("train/loss", 10)] == 1.25
  assert scalars[("test/accuracy", 10)] == 0.75 and scalars[("test/num_tasks", 10)] == 6
  assert not any(tag.startswith("test/open_set") for tag, _ in scalars)  # not a number: skipped
  assert reporting.read_metrics(tmp_path) == [{"step": 10, "train/loss": 1.25}]  # as before
  starts = [
    v.metadata.plugin_data.content
    for e in _tensorboard_events(tmp_path / "hparams")
    for v in e.summary.value
    if v.tag == "_hparams_/session_start_info"
  ]
  assert len(starts) == 1
  hparams = plugin_hparams_pb2.HParamsPluginData.FromString(starts[0]).session_start_info.hparams
  assert hparams["algorithm"].string_value == "vampire" and hparams["inner_lr"].number_value == 0.1
  assert hparams["num_mc_test"].number_value == 4 and hparams["remat"].bool_value is False
  assert (
    hparams["log_std_init"].string_value == "[-4, -3]"
    and hparams["data_dir"].string_value == "None"
  )
  assert _scalars(tmp_path / "hparams")[("test/accuracy", 10)] == 0.75
  # The figures: the PNG bytes as they are, with their size; other files skipped.
  png = tmp_path / "reliability.png"
  png.write_bytes(
    b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", 640, 480) + b"rest"
  )
  (tmp_path / "table.md").write_text("# not a figure")
  for event in _tensorboard_events(tmp_path):  # nothing yet
    assert not any(v.HasField("image") for v in event.summary.value)
  assert (
    reporting.write_figures(tmp_path, {"reliability": png, "table": tmp_path / "table.md"}, step=10)
    == 1
  )
  images = [
    (e.step, v.tag, v.image)
    for e in _tensorboard_events(tmp_path)
    for v in e.summary.value
    if v.HasField("image")
  ]
  assert [(step, tag) for step, tag, _ in images] == [(10, "figures/reliability")]
  assert images[0][2].encoded_image_string == png.read_bytes()
  assert (images[0][2].width, images[0][2].height) == (640, 480)


@needs_omniglot
def test_a_run_hands_tensorboard_its_config_test_metrics_and_figures(tiny_omniglot_run):
  pytest.importorskip("tensorboardX", reason="tensorboardX (the experiments extra) not installed")
  workdir, config, results = tiny_omniglot_run
  step = results["meta_steps"]
  hparams = _scalars(workdir / "hparams")
  for name in ("accuracy", "ece", "mce", "nll"):
    assert hparams[(f"test/{name}", step)] == pytest.approx(results["test"][name], rel=1e-6)
    assert _scalars(workdir)[(f"test/{name}", step)] == pytest.approx(
      results["test"][name], rel=1e-6
    )
  figures = {
    v.tag for e in _tensorboard_events(workdir) for v in e.summary.value if v.HasField("image")
  }
  assert figures == {f"figures/{name}" for name in results["plots"]}
  assert {"figures/reliability", "figures/risk_coverage", "figures/training_curves"} <= figures


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


# -- Folders that cannot be run folders ---------------------------------------------------------


def _read_only_folder(tmp_path: Path, monkeypatch) -> tuple[Path, str]:
  """A read-only folder: a read-only tmpfs where mounting works (root ignores permissions),
  else a simulated EROFS from the writability probe."""
  folder = tmp_path / "ro"
  folder.mkdir()
  mounted = (
    subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(folder)], capture_output=True
    ).returncode
    == 0
  )
  if not mounted:

    def read_only(*args, **kwargs):
      raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(run_folder_storage.tempfile, "mkstemp", read_only)
  return folder, "tmpfs" if mounted else "simulated"


@pytest.mark.parametrize("case", ["a file", "under a file", "read-only"])
def test_a_workdir_that_cannot_be_a_run_folder_exits_2_before_any_work(
  case, tmp_path, capsys, monkeypatch
):
  (tmp_path / "afile").write_text("x")
  mounted = None
  if case == "a file":
    workdir, needle = tmp_path / "afile", "is a file, not a folder"
  elif case == "under a file":
    workdir, needle = tmp_path / "afile" / "run", f"{tmp_path / 'afile'} is a file"
  else:
    folder, how = _read_only_folder(tmp_path, monkeypatch)
    mounted = folder if how == "tmpfs" else None
    workdir, needle = folder / "run", "Read-only file system"
  try:
    # The data folder does not exist: the workdir must be refused before data is looked at.
    code = cli.main_entry(
      omniglot.main,
      [
        "--preset",
        "quick",
        "--workdir",
        str(workdir),
        "--data-dir",
        str(tmp_path / "no_data"),
        "--no-compilation-cache",
      ],
    )
  finally:
    if mounted is not None:
      subprocess.run(["umount", str(mounted)], check=True)
  out = capsys.readouterr()
  assert code == 2
  _one_line_error(out.err, f"run folder {workdir}", needle)


# -- One process per folder ------------------------------------------------------------------


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
      lambda argv: omniglot.run_experiment(tiny_omniglot_run[1], workdir, **QUIET),
      ["--no-compilation-cache"],
    )
  finally:
    os.close(fd)
  assert code == 2
  _one_line_error(capsys.readouterr().err, f"{workdir} is in use by process 4242 on host otherhost")


# -- Damaged files of a real run -----------------------------------------------------------------

DAMAGE = {  # what is damaged -> what load_run must still do
  "run.json truncated": lambda w: (w / "run.json").write_text('{"for'),
  "run.json deleted": lambda w: (w / "run.json").unlink(),
  "train_time.json empty": lambda w: (w / "train_time.json").write_text(""),
  "best_score.json truncated": lambda w: (w / "best_score.json").write_text('{"st'),
  "best/ truncated": lambda w: _truncate_data(w / "best"),
}


@needs_omniglot
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_load_run_survives_a_damaged_file(damage, tiny_omniglot_run, tmp_path):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  intact = vj.load_run(workdir).meta_params
  DAMAGE[damage](workdir)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = vj.load_run(workdir)
  said = " ".join(str(w.message) for w in caught)
  assert run.config == tiny_omniglot_run[1]
  if damage == "best/ truncated":  # the latest checkpoint instead, with a warning
    assert f"{workdir / 'best'} does not restore" in said and "latest checkpoint" in said
    assert _leaves_equal(run.meta_params._asdict(), _checkpoint_params(workdir, 6))
  else:
    assert _leaves_equal(run.meta_params, intact)
  if damage.startswith("run.json"):
    assert "using the run record its checkpoints carry" in said


@needs_omniglot
def test_load_run_with_nothing_restorable_is_one_error_naming_the_folder(
  tiny_omniglot_run, tmp_path
):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  for folder in [workdir / "best", *(workdir / "checkpoints").iterdir()]:
    _truncate_data(folder)
  with (
    pytest.warns(UserWarning),
    pytest.raises(
      vj.RunFolderError,
      match=f"no checkpoint in {workdir}/checkpoints restores \\(tried steps 6, 3\\)",
    ),
  ):
    vj.load_run(workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["3", "6"]  # untouched


@needs_omniglot
def test_a_damaged_latest_checkpoint_walks_back_and_the_rerun_ends_the_same(
  tiny_omniglot_run, omniglot_cache, tmp_path
):
  straight, config, full = tiny_omniglot_run
  workdir = _copy(straight, tmp_path)
  _truncate_data(workdir / "checkpoints" / "6")
  (workdir / "train_time.json").write_text("")  # as a full disk left it before
  (workdir / "best_score.json").write_text('{"st')
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 9, "train/lo')
  lines = []
  results = omniglot.run_experiment(config, workdir, progress=False, print_fn=lines.append)
  said = "\n".join(lines)
  assert (
    "checkpoint 6 in" in said and "does not restore" in said and "trying the next older" in said
  )
  assert "resuming from step 3" in said and results["resumed_from_step"] == 3
  assert [p.name.split("_")[1] for p in (workdir / "damaged").iterdir()] == ["6"]
  # Step 6 again, bit for bit, and the same test.
  assert _leaves_equal(_checkpoint_params(workdir, 6), _checkpoint_params(straight, 6))
  assert results["test"]["accuracy"] == full["test"]["accuracy"]
  assert results["meta_steps"] == 6
  assert reporting.read_metrics(workdir)[-1]["step"] == 6  # the torn line was cut off


# -- The config check never depends on run.json alone --------------------------------------------

TINY_FLAGS = [
  "--num-filters",
  "8",
  "--num-inner-steps",
  "1",
  "--tasks-per-step",
  "2",
  "--num-meta-steps",
  "6",
  "--num-val-tasks",
  "4",
  "--num-test-tasks",
  "6",
  "--eval-batch-tasks",
  "3",
  "--eval-every",
  "3",
  "--checkpoint-every",
  "3",
  "--log-every",
  "3",
  "--num-mc-test",
  "2",
]  # conftest's tiny_omniglot_config
REFUSED = [  # (flags, what the one line names: the fields that differ, as the command's flags)
  (["--kl-weight", "0.5"], "--kl-weight: 0.001 -> 0.5"),
  (["--num-filters", "32"], "--num-filters: 8 -> 32"),
  (["--algorithm", "maml"], "--algorithm: 'vampire' -> 'maml'"),
  (["--num-meta-steps", "3"], "--num-meta-steps 3: "),  # fewer steps than trained
]


@needs_omniglot
@pytest.mark.parametrize("flags, needle", REFUSED, ids=[f[0][0] for f in REFUSED])
def test_without_run_json_another_config_is_refused_from_the_checkpoint(
  flags, needle, tiny_omniglot_run, tmp_path, capsys
):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  (workdir / "run.json").unlink()
  argv = [
    "--preset",
    "quick",
    "--workdir",
    str(workdir),
    "--no-compilation-cache",
    "--data-dir",
    str(OMNIGLOT_DIR),
    "--cache-dir",
    tiny_omniglot_run[1].cache_dir,
  ]
  argv += TINY_FLAGS
  before = sorted(p.name for p in workdir.iterdir())
  code = cli.main_entry(omniglot.main, argv + flags)
  assert code == 2
  _one_line_error(capsys.readouterr().err, needle)
  assert sorted(p.name for p in workdir.iterdir()) == before  # nothing written, run.json too


# -- A full disk during training -------------------------------------------------------------------


@needs_omniglot
def test_a_full_disk_at_a_checkpoint_names_it_and_the_intact_one(
  omniglot_cache, tmp_path, monkeypatch
):
  """Simulated: orbax's save of step 6 fails as tensorstore fails on a full disk."""
  save = ocp.CheckpointManager.save

  def full_at_6(self, step, *args, **kwargs):
    if step == 6 and self.directory.name == "checkpoints":
      raise ValueError(
        "RESOURCE_EXHAUSTED: Error writing local file: Failed to write 6051 "
        "bytes to file 8: No space left on device [os_error_code='28']"
      )
    return save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_at_6)
  config = tiny_omniglot_config(omniglot_cache)
  with pytest.raises(vj.StorageError) as error:
    omniglot.run_experiment(config, tmp_path, **QUIET)
  message = str(error.value)
  assert len(message.splitlines()) == 1, message
  assert message.startswith(f"no space left on device writing {tmp_path}/checkpoints/6")
  assert "checkpoint 3 is intact" in message and "free space and run again" in message
  assert not (tmp_path / "results.json").exists()
  monkeypatch.setattr(ocp.CheckpointManager, "save", save)  # space freed
  assert omniglot.run_experiment(config, tmp_path, **QUIET)["resumed_from_step"] == 3


@needs_omniglot
def test_a_real_full_disk_is_one_line_and_the_rerun_resumes_once_space_is_freed(
  omniglot_cache, tmp_path, capsys
):
  """A 600 kB tmpfs (skipped where mounting is not allowed): room for about one checkpoint."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if (
    subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(disk)], capture_output=True
    ).returncode
    != 0
  ):
    pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
  try:
    workdir = disk / "run"
    config = tiny_omniglot_config(omniglot_cache, 12)
    run = lambda argv: omniglot.run_experiment(config, workdir, **QUIET)  # noqa: E731
    assert cli.main_entry(run, ["--no-compilation-cache"]) == 2
    err = capsys.readouterr().err
    _one_line_error(err, "no space left on device writing")
    found = re.search(
      r"writing (\S+)/checkpoints/(\d+) \(checkpoint (\d+) is intact; free "
      r"space and run again\)",
      err,
    )
    assert found and found.group(1) == str(workdir), err
    failed, intact = int(found.group(2)), int(found.group(3))
    assert intact < failed and (workdir / "checkpoints" / str(intact)).is_dir()
    assert not (workdir / "train_time.json").exists() or json.loads(
      (workdir / "train_time.json").read_text()
    )  # never left empty
    subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space freed
    assert cli.main_entry(run, ["--no-compilation-cache"]) == 0
    results = json.loads((workdir / "results.json").read_text())
    assert results["resumed_from_step"] == intact and results["meta_steps"] == 12
  finally:
    subprocess.run(["umount", "--lazy", str(disk)], check=True)  # a failed writer may hold a file


# -- Interruptions in the test phase ---------------------------------------------------------------


@needs_omniglot
@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_in_the_test_phase_is_one_line_and_128_plus_its_number(
  name, code, tiny_omniglot_run, tmp_path
):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  script = textwrap.dedent(f"""
      import os, signal, sys
      # As in a terminal: a runner that started this in the background (`cmd &`) hands
      # it SIGINT ignored, and Python then leaves Ctrl-C ignored.
      signal.signal(signal.SIGINT, signal.default_int_handler)
      sys.path.insert(0, {str(REPO / "tests")!r})
      from conftest import tiny_omniglot_config
      from experiments import cli, omniglot
      from vampire_jax.runs import loop as training
      original = training._test
      def _test(session, *args):  # the signal arrives as the test phase starts
        os.kill(os.getpid(), signal.{name})
        return original(session, *args)
      training._test = _test
      config = tiny_omniglot_config({tiny_omniglot_run[1].cache_dir!r})
      sys.exit(cli.main_entry(lambda argv: omniglot.run_experiment(
          config, {str(workdir)!r}, progress=False), ["--no-compilation-cache"]))
  """)
  out = subprocess.run(
    [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == code, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert (
    lines[-1].startswith(f"{name}: stopped before the run finished")
    and "run the same command again" in lines[-1]
  ), out.stderr
  assert not (workdir / ".lock").read_text()  # the lock was released


# -- Damaged caches and images -------------------------------------------------------------------


@needs_omniglot
def test_a_truncated_omniglot_cache_is_rebuilt_from_the_zips(omniglot_cache, tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  data = (omniglot_cache / "omniglot28.npz").read_bytes()
  (cache / "omniglot28.npz").write_bytes(data[: len(data) // 2])
  lines = []
  arrays = vj.data.load_omniglot(OMNIGLOT_DIR, cache_dir=cache, print_fn=lines.append)
  assert any(
    "rebuilding the cache" in line and "omniglot28.npz is damaged" in line for line in lines
  ), lines
  assert arrays.provenance["loaded"] == "built" and arrays.images.shape[0] == 1623
  rebuilt = vj.data.load_omniglot(OMNIGLOT_DIR, cache_dir=cache, source="cache")
  np.testing.assert_array_equal(rebuilt.images, arrays.images)
  with pytest.raises(vj.DataError, match="omniglot28.npz is damaged"):  # only the cache: refused
    (cache / "omniglot28.npz").write_bytes(data[:1000])
    vj.data.load_omniglot(OMNIGLOT_DIR, cache_dir=cache, source="cache")


def test_a_corrupt_image_and_a_missing_one_name_the_file(tmp_path):
  from vampire_jax.data import mini_imagenet_files

  broken = tmp_path / "n01532829_00000005.jpg"
  broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
  with pytest.raises(vj.DataError, match=f"{broken} is not a readable image"):
    mini_imagenet_files._decode(broken)
  (tmp_path / "split").mkdir()
  (tmp_path / "images").mkdir()
  for split in ("train", "val", "test"):
    (tmp_path / "split" / f"{split}.csv").write_text("filename,label\nmissing.jpg,n01532829\n")
  with pytest.raises(vj.MissingDataError, match="missing.jpg"):
    mini_imagenet_files._image_rows(tmp_path, "train", existing_only=False)


def test_a_field_added_since_the_run_was_recorded_counts_as_its_default():
  """Runs recorded before a config field existed resume with its default, and only with it."""
  from vampire_jax.runs import run_config as config_lib
  from vampire_jax.runs import experiment_configs as configs

  current = configs.OmniglotConfig()
  saved = config_lib.jsonable(current.flat())
  del saved["num_val_alphabets"]
  assert config_lib.config_differences(saved, current) == {}
  changed = current.replace(num_val_alphabets=0)
  assert config_lib.config_differences(saved, changed) == {"num_val_alphabets": (5, 0)}
