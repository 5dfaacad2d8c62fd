"""Shared test set-up: float64 is enabled per test where it is needed."""

import os

# Quieter TensorFlow if a data test imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long-running; excluded from CI, run with `pytest -m slow`")
