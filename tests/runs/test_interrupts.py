"""One line for every interrupt and every fault, in every phase.

`vampire_jax.runs.interrupts` owns these paths; each row is one line, never a traceback, a
silent death or a setting recorded with no effect.
"""

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import vampire_jax as vj
from experiments import cli, regression
from tests.helpers import _tiny_config
from vampire_jax._src.core.errors import DataError
from vampire_jax.runs import interrupts, run_folder
from vampire_jax.runs import loop as training

REPO = Path(__file__).resolve().parents[2]


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


FULL_DISK_RUN = """
import sys
sys.path.insert(0, "tests")
from tests.conftest import tiny_regression_config
from experiments import cli, regression
config = tiny_regression_config(num_meta_steps=16, num_mc_test=2)
sys.exit(cli.main_entry(
  lambda argv: regression.run_experiment(config, sys.argv[1], progress=False),
  ["--no-compilation-cache"]))
"""


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
