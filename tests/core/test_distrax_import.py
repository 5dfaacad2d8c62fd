import math
import os
import subprocess
import sys

import pytest

from tests.helpers import NOISE


def test_distrax_loads_without_importing_tensorflow():
  """The first `vj.predictive` loads distrax without importing TensorFlow (which TFP's JAX
  substrate tries where it is installed, to copy docstrings, at 16-22 s on a loaded 2-core
  CPU): its log-probability is right, no TensorFlow module or start-up line appears, and
  TensorFlow stays importable as usual."""
  code = (
    "import sys, jax, vampire_jax as vj\n"
    "dist = vj.predictive_distribution(jax.numpy.zeros((2, 3, 1)), vj.gaussian_nll(0.3))\n"
    "print(float(dist.log_prob(jax.numpy.zeros((3, 1))).sum()))\n"
    "print('tensorflow' in sys.modules, sys.modules.get('tensorflow', 'absent'))\n"
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
  )
  log_prob, imported = out.stdout.strip().splitlines()[-2:]
  expected = 3 * (-math.log(NOISE) - 0.5 * math.log(2 * math.pi))
  assert float(log_prob) == pytest.approx(expected, rel=1e-5)
  assert imported == "False absent"
  assert "oneDNN" not in out.stderr and "cpu_feature_guard" not in out.stderr
