"""One line for every interrupt and every fault, in every phase.

`vampire_jax.runs.interrupts` owns these paths; each row is one line, never a traceback, a
silent death or a setting recorded with no effect.
"""

import asyncio
import errno
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import types
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax.runs import algorithms
from vampire_jax.runs import run_folder
from conftest import tiny_regression_config
from experiments import cli, compare, plots, regression
from vampire_jax.runs import interrupts
from vampire_jax.runs import loop as training
from vampire_jax._src.core.errors import ConfigError, DataError, StorageError

REPO = Path(__file__).resolve().parents[1]


def _tiny_config(**changes):
  return tiny_regression_config(**{"num_meta_steps": 4, "num_mc_test": 2, **changes})


# -- The owner's table: how each way of stopping or failing ends ----------------------------

EXIT_ROWS = {  # error -> (exit code, the line), None: a bug, raised with its traceback
  "a user error": (DataError("x.csv, line 2: bad"), 2, "error: x.csv, line 2: bad"),
  "stopped in the loop": (
    interrupts.TrainingInterrupted(40, signal.SIGTERM, Path("runs/x")),
    143,
    "\nSIGTERM: stopped at step 40, checkpoint saved in runs/x; run the same command again "
    "to resume",
  ),
  "Ctrl-C elsewhere": (
    KeyboardInterrupt(),
    130,
    "\nSIGINT: stopped before the run finished; its saved checkpoints are kept: run the same "
    "command again to resume",
  ),
  "SIGTERM elsewhere": (interrupts.Terminated(), 143, "\nSIGTERM: stopped before the run"),
  "divergence": (FloatingPointError("meta-training diverged"), 1, "error: meta-training"),
  "a full disk": (
    OSError(errno.ENOSPC, "No space left on device", "runs/x/a.png"),
    2,
    "error: no space left on device writing runs/x/a.png",
  ),
  "a bug": (ValueError("a bug"), None, None),
}


@pytest.mark.parametrize("row", list(EXIT_ROWS))
def test_each_stop_and_fault_ends_in_one_line_and_its_exit_code(row):
  error, code, line = EXIT_ROWS[row]
  lines = []
  assert interrupts.exit_code(error, lines.append) == code
  assert (lines == []) if line is None else (len(lines) == 1 and lines[0].startswith(line))


def test_training_keeps_the_loop_and_interrupts_own_the_signals():
  source = Path(training.__file__).read_text()
  assert "import signal" not in source and "signal.signal" not in source
  assert vj.TrainingInterrupted is interrupts.TrainingInterrupted
  assert "import signal" not in Path(cli.__file__).read_text()


# -- A signal during validation on a checkpoint step -------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_validation_on_a_checkpoint_step_saves_once_and_resumes(
  signum, tmp_path, monkeypatch
):
  """A signal during validation on a checkpoint step saves the step once, says so in one
  line, exits 128 + the signal, and the run resumes from that step."""
  evaluate_split = training.evaluation.evaluate_split

  def signal_at_step_2(*args, refuse_non_finite=True, **kwargs):
    if not refuse_non_finite and not (tmp_path / "signalled").exists():  # the loop's validation
      (tmp_path / "signalled").touch()
      os.kill(os.getpid(), signum)
    return evaluate_split(*args, refuse_non_finite=refuse_non_finite, **kwargs)

  monkeypatch.setattr(training.evaluation, "evaluate_split", signal_at_step_2)
  run = lambda argv: regression.run_experiment(  # noqa: E731
    _tiny_config(), tmp_path / "run", progress=False, print_fn=lambda m: None
  )
  lines = []
  code = interrupts.run_command(lambda: run([]), print_fn=lines.append)
  assert code == 128 + signum and len(lines) == 1, lines
  assert f"{signal.Signals(signum).name}: stopped at step 2, checkpoint saved" in lines[0]
  assert run_folder.latest_checkpoint_step(tmp_path / "run") == 2
  monkeypatch.setattr(training.evaluation, "evaluate_split", evaluate_split)
  assert run([])["resumed_from_step"] == 2


# -- SIGTERM to paper_runs reaches the child; nothing is orphaned ------------------------------

CHILD = """
import os, signal, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
def saved(signum, frame):
  open(sys.argv[1] + ".saved", "w").write(signal.Signals(signum).name)
  sys.exit(128 + signum)
signal.signal(signal.SIGTERM, saved)
signal.signal(signal.SIGINT, saved)
time.sleep(120)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_to_paper_runs_stops_its_child_first(name, tmp_path):
  """SIGTERM or SIGINT to paper_runs reaches its child once and stops it before the runner
  exits, in one line."""
  pid_file = tmp_path / "child.pid"
  script = textwrap.dedent(f"""
    import sys
    from experiments import paper_runs
    paper_runs.child_command = lambda *a: [sys.executable, "-c", {CHILD!r}, {str(pid_file)!r}]
    paper_runs.skip_reason = lambda cell: None
    sys.exit(paper_runs.entry(["--root", {str(tmp_path / "root")!r}, "--cells",
                               "regression", "--grace", "20"]))
  """)
  runner = subprocess.Popen(
    [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
  )
  deadline = time.monotonic() + 120
  while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
    time.sleep(0.2)
  child = int(pid_file.read_text())
  runner.send_signal(getattr(signal, name))
  out, err = runner.communicate(timeout=60)
  assert runner.returncode == 128 + getattr(signal, name), err.decode()
  lines = [line for line in err.decode().splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{name}: stopped before the run finished"), lines
  assert (tmp_path / "child.pid.saved").read_text() == name  # the child got it, once
  with pytest.raises(ProcessLookupError):
    os.kill(child, 0)


# -- Faults: a full disk while a figure is written; a damaged checkpoint ------------------------


def test_a_full_disk_while_a_figure_is_written_keeps_the_old_image(tmp_path, monkeypatch):
  """A full disk while a figure is written is one StorageError naming the file; the old
  image stays whole and no temporary file is left."""
  from matplotlib.figure import Figure

  path = tmp_path / "reliability.png"

  def figure():
    fig, [ax] = plots._new_figure(1)
    ax.plot(np.arange(5.0))
    return fig

  plots._save(figure(), path, "a figure")
  before = path.read_bytes()
  assert before.startswith(b"\x89PNG")
  savefig = Figure.savefig

  def full_disk(self, target, *args, **kwargs):
    if isinstance(target, (str, os.PathLike)):  # savefig(path) opens the file itself
      with open(target, "wb") as f:
        f.write(b"\x89PNG\r\n")
    else:
      target.write(b"\x89PNG\r\n")  # a few bytes, then the disk is full
    raise OSError(errno.ENOSPC, "No space left on device", str(path))

  monkeypatch.setattr(Figure, "savefig", full_disk)
  with pytest.raises(StorageError, match=f"no space left on device writing {path}"):
    plots._save(figure(), path, "a figure")
  assert path.read_bytes() == before
  assert [p.name for p in tmp_path.iterdir()] == ["reliability.png"]  # no temporary file left
  monkeypatch.setattr(Figure, "savefig", savefig)


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


# -- Configuration conflicts: refused in one line, or said and not recorded -----------------------

OTHER_ALGORITHMS_OPTIONS = {  # an algorithm, an option it does not take -> who takes it
  "--algorithm maml --kl-weight 0.5": ("maml", dict(kl_weight=0.5), "Maml", "Vampire"),
  "--algorithm bmaml --log-std-init -5 -4": (
    "bmaml",
    dict(log_std_init=(-5.0, -4.0)),
    "Bmaml",
    "Vampire",
  ),
  "--algorithm vampire --num-particles 4": ("vampire", dict(num_particles=4), "Vampire", "Bmaml"),
  "--algorithm platipus --second-order-steps 1": (
    "platipus",
    dict(second_order_steps=1),
    "Platipus",
    "Maml",
  ),
}


@pytest.mark.parametrize("row", list(OTHER_ALGORITHMS_OPTIONS))
def test_an_option_of_another_algorithm_is_refused_at_construction(row):
  """A config holds only its algorithm's options: another algorithm's is refused when the
  config is made, in one line naming the option, the algorithm and the specs that take it."""
  algorithm, changes, spec, owner = OTHER_ALGORITHMS_OPTIONS[row]
  ((name, _),) = changes.items()
  config = _tiny_config().replace(algorithm=algorithm)
  with pytest.raises(ConfigError) as raised:
    config.replace(**changes)
  message = str(raised.value)
  assert message.startswith(f"{name} is not a setting of {algorithm} ({spec})"), message
  assert re.search(rf"it is an option of .*\b{owner}\b", message), message
  assert len(message.splitlines()) == 1 and raised.value.fields == (name,)
  with pytest.raises(ConfigError, match=f"^{name} is not a setting of {algorithm}"):
    getattr(vj.specs, spec)(**changes)


def test_a_setting_with_no_effect_is_refused_before_anything_runs(tmp_path):
  """second_order_steps with first_order=True (every step is then first-order) is refused
  before the run folder is made, naming both fields; the command line names both flags."""
  config = _tiny_config().replace(first_order=True, second_order_steps=1)
  with pytest.raises(
    ConfigError, match=r"^second_order_steps 1 has no effect with first_order=True"
  ):
    regression.run_experiment(config, tmp_path / "run", progress=False)
  assert not (tmp_path / "run").exists()


def test_the_command_line_says_what_its_algorithm_ignores_and_does_not_record_it(capsys):
  from experiments import omniglot
  from vampire_jax.runs import config_records

  config, _, _ = omniglot.parse_args(
    ["--algorithm", "maml", "--kl-weight", "0.5", "--num-mc-test", "4"]
  )
  err = capsys.readouterr().err
  assert (
    "note: --algorithm maml ignores --kl-weight 0.5 (an option of vampire, platipus, abml, "
    "vampire2); not applied" in err
  )
  assert "ignores --num-mc-test 4 (an option of " in err
  assert config.algorithm == vj.specs.Maml(**config.algorithm.settings())
  assert not {"kl_weight", "num_mc_test"} & set(config.flat())  # MAML's config has neither
  assert not {"kl_weight", "num_mc_test"} & set(config_records.to_record(config)["algorithm"])
  algorithms.check_config(config)  # what is recorded acts
  contradiction = ["--first-order", "--second-order-steps", "1"]  # refused: which one was meant?
  code = cli.main_entry(
    lambda argv: algorithms.check_config(omniglot.parse_args(contradiction)[0]),
    ["--no-compilation-cache"],
  )
  err = capsys.readouterr().err
  assert code == 2 and err.startswith(
    "error: --second-order-steps 1 has no effect with --first-order"
  ), err
  assert len(err.strip().splitlines()) == 1


def test_a_comparison_drops_what_a_method_ignores_and_says_so(tmp_path, monkeypatch, capsys):
  trained = {}

  def fake_train(config, workdir, progress=True):
    trained[config.algorithm.name] = config
    return {
      "test": {"mse": 1.0},
      "kind": "regression",
      "wall_time_s": {},
      "calibration": {},
      "config": config.flat(),
    }

  monkeypatch.setattr(regression, "run_experiment", fake_train)
  compare.run_methods(
    regression, ["vampire", "maml"], "quick", tmp_path, {"kl_weight": 0.5}, progress=False
  )
  assert trained["vampire"].algorithm.kl_weight == 0.5
  assert "kl_weight" not in trained["maml"].flat()
  assert (
    "note: --algorithm maml ignores --kl-weight 0.5 (an option of vampire, platipus, abml, "
    "vampire2); not applied" in capsys.readouterr().out
  )


def test_an_older_run_that_recorded_an_ignored_setting_still_resumes(tmp_path):
  """A run.json of the flat format (before the specs), whose MAML run recorded another
  algorithm's option (kl_weight 0.5), resumes with today's MAML config: the option is left
  behind when the record is read."""
  from vampire_jax.runs.config_records import OLD_NAMES

  config = _tiny_config().replace(algorithm="maml")
  results = regression.run_experiment(config, tmp_path, progress=False, print_fn=print)
  record = json.loads((tmp_path / "run.json").read_text())
  new_names = {new: old for old, new in OLD_NAMES.items()}
  record["config"] = {new_names.get(name, name): value for name, value in config.flat().items()}
  record["config"]["kl_weight"] = 0.5  # an option MAML never read, in a flat record
  del record["format"]
  (tmp_path / "run.json").write_text(json.dumps(record))
  run_folder.check_resumable(tmp_path, config.replace(num_meta_steps=6))
  assert results["meta_steps"] == 4


FULL_DISK_RUN = """
import sys
sys.path.insert(0, "tests")
from conftest import tiny_regression_config
from experiments import cli, regression
config = tiny_regression_config(num_meta_steps=16, num_mc_test=2)
sys.exit(cli.main_entry(
  lambda argv: regression.run_experiment(config, sys.argv[1], progress=False),
  ["--no-compilation-cache"]))
"""


@pytest.mark.slow  # 1 to 2.5 min on 2 cores; `pytest -m slow` runs it
def test_a_full_disk_and_a_rerun_while_it_is_still_full_are_one_line_each(tmp_path):
  """A 400 kB tmpfs (skipped where mounting is not allowed): the first run and each rerun
  while it is still full print one error line and exit 2, with no orbax or TensorBoard
  traceback from threads or exit handlers."""
  disk = tmp_path / "disk"
  disk.mkdir()
  mount = ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)]
  if subprocess.run(mount, capture_output=True).returncode != 0:
    pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
  try:
    # The noise came from threads and exit handlers: two reruns make it near certain.
    for attempt in ("first", "rerun while still full", "again"):
      out = subprocess.run(
        [sys.executable, "-c", FULL_DISK_RUN, str(disk / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
      )
      assert out.returncode == 2, (attempt, out.stderr[-3000:])
      lines = [line for line in out.stderr.splitlines() if line.strip()]
      assert len(lines) == 1 and lines[0].startswith("error: no space left on device writing"), (
        attempt,
        out.stderr[-3000:],
      )
  finally:
    subprocess.run(["umount", "--lazy", str(disk)], check=True)
