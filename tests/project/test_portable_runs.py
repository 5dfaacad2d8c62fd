"""A trained run works wherever it goes: on any device count, to the last bit.

Every check here runs the experiments' command lines in fresh processes, as a user starts
them: the suite's own `JAX_NUM_CPU_DEVICES=1` (tests/conftest.py) is dropped, so a child
without a count of its own gets the default, one XLA:CPU device per core; the others
name 1, 2 or 8 (fake) devices. They show that
  - a run trained on 8 devices loads and predicts on 1 and on 2, alike;
  - the same regression run gives the same logged rows and test numbers on 1 and 8
    devices (1, 2 and 8 over 300 steps in the slow twin), bit for bit, and stopped by SIGTERM on 8 and resumed on 1, it gives every
    row and the test numbers of the uninterrupted run (one row per logged step);
  - a restore that fails because of the loading environment never calls the folder
    damaged nor moves anything.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, user_env
from vampire_jax._src.core.errors import RunFolderError
from vampire_jax.runs import run_folder
from vampire_jax.runs.run_folder import checkpoints as run_folder_checkpoints

# The issue's run: the drift grew to 1 % of the loss by step 120. Its training as the issue
# ran it; its evaluation smaller (16 tasks of 16 draws, every 100 steps, not the quick
# preset's 500 test tasks of 128 draws every 50), which took a third of each run's time.
REGRESSION_300 = [
  "--preset", "quick", "--algorithms", "vampire", "--tasks-per-step", "8",
  "--num-meta-steps", "300", "--log-every", "20", "--no-progress",
  "--eval-every", "100", "--num-val-tasks", "16", "--num-test-tasks", "16", "--num-mc-test", "16",
]  # fmt: skip


# A run to load elsewhere: the shortest that checkpoints and tests.
SHORT_REGRESSION = [
  "--preset", "quick", "--algorithms", "vampire", "--tasks-per-step", "8",
  "--hidden-sizes", "8", "8", "8", "--num-meta-steps", "2", "--log-every", "1", "--eval-every", "2",
  "--checkpoint-every", "2", "--num-val-tasks", "8", "--num-test-tasks", "8",
  "--eval-batch-tasks", "8", "--num-mc-test", "8", "--no-progress",
]  # fmt: skip


def run_command(args, devices=None, cwd=REPO, timeout=900) -> subprocess.CompletedProcess:
  """`python args` in a fresh process: the default device count, or `devices` CPU devices."""
  count = {} if devices is None else {"JAX_NUM_CPU_DEVICES": str(devices)}
  return subprocess.run(
    [sys.executable, *args],
    env=user_env(**count),
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def regression_run(workdir: Path, devices, flags=REGRESSION_300, stop_after=None):
  """`python -m experiments.regression` on `devices`; SIGTERM right after `stop_after`."""
  if stop_after is None:
    args = ["-m", "experiments.regression"]
  else:
    args = [str(REPO / "tests" / "sigterm_at_step.py"), str(stop_after), "experiments.regression"]
  return run_command([*args, *flags, "--workdir", str(workdir)], devices)


def rows_and_test(workdir: Path):
  """The rows of metrics.jsonl without the wall-clock rates, and the test metrics."""
  rows = [
    {k: v for k, v in row.items() if not k.endswith("_per_s")}
    for row in run_folder.read_metrics(workdir / "vampire")
  ]
  results = json.loads((workdir / "vampire" / "results.json").read_text())
  return rows, results["test"]


def check_same_run_on_every_device_count(tmp_path, flags, stop_after, counts=(1, 2, 8)):
  runs = {}
  for devices in counts:
    done = regression_run(tmp_path / f"devices{devices}", devices, flags)
    assert done.returncode == 0, done.stderr[-3000:]
    runs[devices] = rows_and_test(tmp_path / f"devices{devices}")
  rows, test = runs[1]
  assert len(rows) >= 4 and all("train/loss" in r or "val/mse" in r for r in rows)
  for devices in counts[1:]:
    assert runs[devices][0] == rows, f"logged rows differ on {devices} devices"
    assert runs[devices][1] == test, f"test metrics differ on {devices} devices"

  # Stopped by SIGTERM between two logged rows on 8 devices, resumed on 1.
  resumed = tmp_path / "resumed"
  stopped = regression_run(resumed, 8, flags, stop_after=stop_after)
  assert stopped.returncode == 143, stopped.stderr[-3000:]
  assert f"stopped at step {stop_after}, checkpoint saved" in stopped.stdout + stopped.stderr
  done = regression_run(resumed, 1, flags)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"resuming from step {stop_after}" in done.stdout + done.stderr
  resumed_rows, resumed_test = rows_and_test(resumed)
  assert resumed_rows == rows  # every row once, each over the same steps as uninterrupted
  assert resumed_test == test


LOAD_AND_PREDICT = """
import sys, jax, jax.numpy as jnp, numpy as np
import vampire_jax as vj
jnp.ones(3).sum()  # JAX has run other code before the load
run = vj.load_run(sys.argv[1])
x = jnp.linspace(-5.0, 5.0, 20)[:, None]
support_x, query_x = x[::4], x
support_y = jnp.sin(support_x)
key = jax.random.key(3)
np.savez(
  sys.argv[2],
  predict=run.predict(support_x, support_y, query_x, key),
  draws=run.predict_draws(support_x, support_y, query_x, key),
  devices=len(jax.devices()),
)
"""


@pytest.mark.slow
def test_the_issues_300_step_regression_run_is_the_same_on_1_2_and_8_devices(tmp_path):
  """The 300-step regression run gives the same logged rows, from the first, and the same
  test numbers on 1, 2 and 8 devices, bit for bit; stopped after step 150 and resumed, the
  first row after the resume is the uninterrupted run's. The runs of one device count share
  their compiled programs (the test processes' compilation cache)."""
  check_same_run_on_every_device_count(tmp_path, REGRESSION_300, stop_after=150)


@pytest.mark.slow  # command lines across device counts
def test_a_run_trained_on_8_devices_loads_and_predicts_alike_on_1_and_on_2(tmp_path):
  """A run trained on 8 devices loads on 1, on 2 and on every core, and predicts alike."""
  workdir = tmp_path / "trained_on_8"
  done = regression_run(workdir, 8, SHORT_REGRESSION)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads((workdir / "vampire" / "results.json").read_text())["task_mesh_devices"] == 8
  outputs = {}
  for devices in (1, 2, None):  # None: a plain process, one device per core
    out = tmp_path / f"loaded_{devices}.npz"
    loaded = run_command(["-c", LOAD_AND_PREDICT, str(workdir / "vampire"), str(out)], devices)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    outputs[devices] = np.load(out)
  assert int(outputs[1]["devices"]) == 1 and int(outputs[2]["devices"]) == 2
  for devices in (2, None):
    np.testing.assert_allclose(outputs[devices]["predict"], outputs[1]["predict"], atol=1e-5)
    np.testing.assert_allclose(outputs[devices]["draws"], outputs[1]["draws"], atol=1e-5)
  assert np.std(outputs[1]["predict"]) > 0  # a prediction, not zeros


@pytest.mark.parametrize(
  "error, says",
  [
    (
      ValueError(
        "Topology mismatch detected. The checkpoint was saved with a different topology "
        "than the current one."
      ),
      "placed on devices this process does not have",
    ),
    (ModuleNotFoundError("No module named 'tensorstore'", name="tensorstore"), "tensorstore"),
  ],
)
def test_an_environment_failure_leaves_the_folder_alone_and_says_what_differs(
  tiny_omniglot_run, tmp_path, monkeypatch, error, says
):
  """A restore that fails for the environment (a topology mismatch, tensorstore missing) is
  one line naming what differs and saying the folder is intact, never advising removal; a
  training process that meets it moves nothing aside."""
  import shutil

  import vampire_jax as vj

  workdir = tmp_path / "run"
  shutil.copytree(tiny_omniglot_run[0], workdir)
  before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))

  def fail(self, *args, **kwargs):
    raise error

  monkeypatch.setattr(run_folder_checkpoints.ocp.CheckpointManager, "restore", fail)
  with pytest.raises(RunFolderError) as raised:
    vj.load_run(workdir)
  message = str(raised.value)
  assert says in message and "is intact" in message and "remove" not in message
  assert len(message.splitlines()) == 1
  # A training process (create=True) that meets the same error moves nothing aside either.
  checkpoints = run_folder.RunCheckpoints(workdir, print_fn=lambda m: None)
  try:
    with pytest.raises(RunFolderError, match="is intact"):
      checkpoints.restore_latest({"step": np.zeros((), np.int32)})
  finally:
    checkpoints.close()
  assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == before
