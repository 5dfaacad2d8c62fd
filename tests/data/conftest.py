"""The Omniglot arrays built once from the shared zips, for every data test that reads them."""

import pytest

from tests.helpers import BIG_ZIPS, DATA_DIR
from vampire_jax.data import load_omniglot


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("omniglot_cache")


@pytest.fixture(scope="session")
def data_listing():
  """The data folder's files and times, taken before the arrays are built from it."""
  if not DATA_DIR.is_dir():
    pytest.skip(f"No Omniglot folder {DATA_DIR} (set OMNIGLOT_DIR).")
  return sorted((p.name, p.stat().st_mtime) for p in DATA_DIR.iterdir())


@pytest.fixture(scope="session")
def arrays(cache_dir, data_listing):
  """All of Omniglot at 28x28, built from the zips into `cache_dir` (once per session)."""
  del data_listing  # Taken before the build.
  if not all((DATA_DIR / f).is_file() for f in BIG_ZIPS):
    pytest.skip(f"Omniglot zips not found in {DATA_DIR} (set OMNIGLOT_DIR).")
  return load_omniglot(DATA_DIR, cache_dir=cache_dir, source="zip")
