"""orbax.checkpoint is imported when a checkpoint is first read or written, not by
`import vampire_jax` (`vampire_jax.runs.run_folder.orbax_module`)."""

import subprocess
import sys

from tests.conftest import REPO


def _modules_after(code: str) -> set[str]:
  out = subprocess.run(
    [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  return set(out.split())


def test_importing_the_library_leaves_orbax_unimported_until_a_checkpoint_is_used():
  assert not any(m.startswith("orbax") for m in _modules_after("import vampire_jax"))
  used = _modules_after(
    "from vampire_jax.runs.run_folder.orbax_module import ocp\n"
    "assert ocp.CheckpointManager.__module__.startswith('orbax')"
  )
  assert "orbax.checkpoint" in used
