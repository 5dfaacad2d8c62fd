"""The wheel's code speaks its own API: no string of the library names a command line's flag
or points at BUILD_NOTES.md (which the wheel does not ship)."""

import ast
import re
import sys

from tests.conftest import REPO

# A flag of a command line: `--num-meta-steps`. XLA's own flags (`--xla_...`) are the
# library's to set; the authors' code's (`--KL-weight`, their `main.py`'s) and TensorBoard's,
# quoted in docstrings that say what their defaults were, are theirs.
FLAG = re.compile(r"(?<![\w-])--(?!xla_)[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


THEIRS = {
  "--resume-epoch",
  "--num-inner-updates",
  "--num-models",
  "--inner-lr",
  "--first-order",
  "--logdir",
}


def _strings(path):
  """`(line, text, is_docstring)` of every string constant of a module."""
  tree = ast.parse(path.read_text())
  docstrings = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      first = node.body[0] if node.body else None
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        docstrings.add(id(first.value))
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      yield node.lineno, node.value, id(node) in docstrings


def _found():
  for path in sorted((REPO / "vampire_jax").rglob("*.py")):
    for line, text, is_docstring in _strings(path):
      for flag in FLAG.findall(text):
        if not (is_docstring and flag in THEIRS):
          yield f"{path.relative_to(REPO)}:{line}: {flag}"
      if "BUILD_NOTES" in text:
        yield f"{path.relative_to(REPO)}:{line}: BUILD_NOTES"


def test_no_string_of_the_library_names_a_flag_or_build_notes():
  assert list(_found()) == []


def test_the_check_finds_a_flag_and_a_pointer_to_build_notes(tmp_path, monkeypatch):
  package = tmp_path / "vampire_jax"
  package.mkdir()
  (package / "module.py").write_text(
    'def f():\n  """Docs: see BUILD_NOTES.md."""\n  raise ValueError("pass --num-meta-steps 5")\n'
  )
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  assert list(_found()) == [
    "vampire_jax/module.py:2: BUILD_NOTES",
    "vampire_jax/module.py:3: --num-meta-steps",
  ]
