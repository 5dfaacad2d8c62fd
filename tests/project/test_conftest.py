"""The test set-up of `tests/conftest.py`: the slow tier's list, `tests/slow_tier.txt`."""

from pathlib import Path

import pytest

from tests.conftest import stale_slow_tier_lines

COLLECTED = [
  "tests/test_x.py::test_plain",
  "tests/test_x.py::test_y[a]",
  "tests/test_x.py::test_y[b-1]",
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests/test_x.py").write_text(
    "def test_plain():\n  pass\n\n\ndef test_y(p):\n  pass\n\n\ndef test_not_run_now():\n  pass\n"
  )
  return tmp_path


def _stale(root: Path, listed: list[str], partly: tuple = ()) -> dict[str, str]:
  return dict(stale_slow_tier_lines(listed, COLLECTED, root, partly_selected=partly))


def test_lines_that_name_collected_tests_pass(root):
  """A listed id, a test's name without its parameters, and a test of a collected file that
  this run did not collect (some of a file's tests were selected) are all accepted."""
  listed = [
    "tests/test_x.py::test_plain",
    "tests/test_x.py::test_y",
    "tests/test_x.py::test_y[a]",
    "tests/test_x.py::test_y[b-1]",
    "tests/test_x.py::test_not_run_now",
  ]
  assert _stale(root, listed) == {}


@pytest.mark.parametrize(
  "line, cause",
  [
    ("tests/test_renamed.py::test_plain", "tests/test_renamed.py"),
    ("tests/test_x.py::test_gone", "test_gone"),
    ("tests/test_x.py::test_gone[a]", "test_gone"),
    ("tests/test_x.py::test_y[no_such_param]", "test_y[a], test_y[b-1]"),
    ("tests/test_x.py::test_plain[a]", "test_plain"),
  ],
  ids=["file", "function", "function-with-parameters", "parameter", "parameter-of-plain"],
)
def test_a_line_that_names_no_collected_test_is_refused_naming_it(root, line, cause):
  """A line naming a file that does not exist, a test its file does not define, or parameters
  its test was not collected with is reported with what it names that does not exist."""
  stale = _stale(root, ["tests/test_x.py::test_plain", line])
  assert list(stale) == [line]
  assert cause in stale[line], stale


def test_parameters_are_not_checked_where_the_command_line_chose_some():
  """Where the command line named one parameter set of a test, its other listed parameter sets
  are not reported (they were not collected, and exist)."""
  root = Path(__file__).resolve().parents[2]
  this = (
    "tests/project/test_conftest.py::test_a_line_that_names_no_collected_test_is_refused_naming_it"
  )
  collected = [f"{this}[file]"]
  listed = [f"{this}[parameter]"]
  assert stale_slow_tier_lines(listed, collected, root, partly_selected=(this,)) == []
  assert stale_slow_tier_lines(listed, collected, root) != []
