import asyncio
import gc
import shutil
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

from experiments import regression
from tests.helpers import _tiny_config
from vampire_jax.runs import run_folder

REPO = Path(__file__).resolve().parents[2]


def _garbage(folder: Path) -> None:
  """Overwrites the array data files orbax reads first, as a damaged disk may."""
  files = list(folder.glob("default/d/*"))
  assert files, folder
  for path in files:
    path.write_bytes(b"garbage\n")


def test_a_damaged_latest_checkpoint_is_one_line_without_orbax_noise(tmp_path):
  """A damaged latest checkpoint gives two one-line warnings (it does not restore; which
  step was loaded instead), without orbax's "Event loop is closed" tracebacks."""
  workdir = tmp_path / "run"
  regression.run_experiment(_tiny_config(), workdir, progress=False, print_fn=lambda message: None)
  shutil.rmtree(workdir / "best")
  copies = []
  for i in range(3):  # the noise comes from threads: three tries make it near certain
    copies.append(tmp_path / f"copy{i}")
    shutil.copytree(workdir, copies[-1])
    _garbage(copies[-1] / "checkpoints" / "4")
  script = textwrap.dedent(f"""
    import gc, time, warnings
    import vampire_jax as vj
    for folder in {[str(c) for c in copies]!r}:
      with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run = vj.load_run(folder)
      print(len(said))
      for w in said:
        print(str(w.message).split(" (")[0])
    gc.collect()
    time.sleep(1)
  """)
  out = subprocess.run(
    [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  # The walk-back line, and (issue 49) which step was loaded: not step 4, the tested one.
  assert out.stdout.splitlines() == [
    line
    for c in copies
    for line in (
      "2",
      f"checkpoint 4 in {c}/checkpoints does not restore",
      f"load_run: {c} gives the meta-parameters of step 2",
    )
  ]
  assert "Event loop is closed" not in out.stderr and "Traceback" not in out.stderr, out.stderr[
    :3000
  ]
  assert "never retrieved" not in out.stderr, out.stderr[:3000]


def test_a_failed_restore_leaves_no_unawaited_coroutine_for_a_later_call():
  """A failed read's abandoned coroutines are collected where they are ignored: a later call
  sees no "coroutine ... was never awaited" warning."""
  from vampire_jax.runs.run_folder.restore_noise import quiet_restore

  async def read_metadata():  # stands for orbax's read that a failed sibling abandoned
    return None

  def failing_restore():
    abandoned = read_metadata()  # created, never started, held by this frame
    cycle = [abandoned]
    cycle.append(cycle)  # only the collector frees it, at a moment of its choosing
    raise ValueError("OUT_OF_RANGE: Error reading byte range")

  gc.disable()  # the collector runs when told to, not at whichever allocation comes next
  try:
    with warnings.catch_warnings(record=True) as said:
      warnings.simplefilter("always")
      state, error = quiet_restore(failing_restore)
      gc.collect()  # what a later, unrelated call would trigger
  finally:
    gc.enable()
  assert state is None and isinstance(error, ValueError) and "OUT_OF_RANGE" in str(error)
  assert [str(w.message) for w in said] == []
  assert quiet_restore(lambda: {"w": 1}) == ({"w": 1}, None)


def test_asyncio_logs_of_a_failed_restore_are_dropped_and_others_kept(caplog):
  """The futures of TensorStore's opens that failed log "Future exception was never retrieved"."""
  run_folder.drop_restore_noise()

  def abandon_a_future(message):
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_exception(ValueError(message))
    del future  # collected unretrieved: asyncio logs it
    gc.collect()
    loop.close()

  with caplog.at_level("ERROR", logger="asyncio"):
    abandon_a_future("OUT_OF_RANGE: Error opening \"zarr\" driver [tensorstore_spec='{}']")
    abandon_a_future("a user's own future")
  logged = [record.getMessage() for record in caplog.records]
  assert len(logged) == 1 and "a user's own future" in logged[0], logged


def test_the_unraisable_errors_of_a_failed_restore_are_dropped_and_others_passed_on(monkeypatch):
  """What the garbage collector leaves after a failed restore reaches `sys.unraisablehook` only
  when it happens to run then; here each kind is handed to the hook directly."""
  from vampire_jax.runs.run_folder import restore_noise

  passed_on = []
  monkeypatch.setattr(sys, "unraisablehook", passed_on.append)  # pytest's own, in a session
  monkeypatch.setattr(restore_noise, "_noise_filter_installed", False)
  run_folder.drop_restore_noise()

  async def _read_array_index_and_device_put():  # orbax's read coroutine, by name
    pass

  def unraisable(error, where=None):
    return types.SimpleNamespace(
      exc_type=type(error), exc_value=error, exc_traceback=None, err_msg=None, object=where
    )

  sys.unraisablehook(unraisable(RuntimeError("Event loop is closed")))
  sys.unraisablehook(
    unraisable(
      ValueError("Encountered error while reading array index: OUT_OF_RANGE"),
      _read_array_index_and_device_put,
    )
  )
  users = unraisable(RuntimeError("a user's own error"))
  sys.unraisablehook(users)
  # The restore's message from another object is not the restore's noise.
  elsewhere = unraisable(ValueError("Encountered error while reading array index"))
  sys.unraisablehook(elsewhere)
  assert passed_on == [users, elsewhere]
