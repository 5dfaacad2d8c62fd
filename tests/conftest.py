"""Shared test set-up: float64 is enabled per test where it is needed."""

import os
import tempfile

# Quieter TensorFlow if a data test imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# XLA's persistent compilation cache, shared by the test processes, their
# subprocesses (the 8-device child, notebook kernels) and later runs: the many
# tests that build the same step (a run and its resumed twin) compile it once.
# Entries are keyed by the program, so a changed program is compiled afresh.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "vampire_jax_test_xla_cache"))


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long-running; excluded from CI, run with `pytest -m slow`")
