"""Sphinx configuration of the docs: the user guide, the history pages (MyST markdown) and
the API reference, built in CI with -W (a broken docstring or page fails)."""

import ast
import dataclasses
import importlib
import inspect
import os
import re
import sys
import textwrap

sys.path.insert(0, os.path.abspath(".."))

import vampire_jax  # noqa: E402

project = "vampire_jax"
author = "vampire_jax contributors"
copyright = "vampire_jax contributors, Apache-2.0"
release = vampire_jax.__version__
version = release

extensions = [
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx.ext.viewcode",
  "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# Every cross-reference must resolve (the test command builds with -W): a link to one of the
# library's names that moved fails the build. Types of other packages in signatures have no
# page here (no intersphinx offline) and are not links.
nitpicky = True
nitpick_ignore_regex = [
  ("py:class", r"(jax|jaxlib|numpy|flax|optax|os|pathlib|collections|typing|types|PIL|Image)\b.*"),
  ("py:class", r"(tuple|ArrayTree)\b.*"),
  # Private types in public signatures (the implementation under _src/ is not documented).
  ("py:class", r"vampire_jax\._src\..*"),
  ("py:class", r"vampire_jax\.baselines\._.*"),  # private modules of the baselines
]
# The history pages were BUILD_NOTES.md's sections: headings start at any level, and they
# name files of the repository (README.md, tests/...) that are not pages of this site.
suppress_warnings = ["myst.header", "myst.xref_missing"]
myst_heading_anchors = 3
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" as a field list: NamedTuple fields are not described twice.
napoleon_use_ivar = True
# "Sources:" of the data loaders reads as "Args:" does.
napoleon_custom_sections = [("Sources", "params_style")]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Docstrings write code and shapes in single backticks (Markdown style).
default_role = "code"
exclude_patterns = ["_build", "*.png", "import_graph.py"]
html_theme = "alabaster"
# Wide enough for the signatures and code blocks; a long line scrolls instead of being cut.
html_theme_options = {"page_width": "min(1400px, 96%)", "sidebar_width": "260px"}
html_static_path = ["_static"]


# -- NamedTuple fields and config settings, documented by name ------------------------

_ALIAS = re.compile(r"^Alias for field number \d+$")


def _owner(name: str):
  """The class of the member `module.Class.field` (None if it does not import)."""
  module_name, _, rest = name.rpartition(".")
  parts = module_name.split(".")
  for cut in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:cut]))
    except ImportError:
      continue
    for attr in parts[cut:]:
      obj = getattr(obj, attr, None)
    return obj if inspect.isclass(obj) else None
  return None


def _attributes_section(cls) -> dict:
  """`{field: description}` from the class docstring's "Attributes:" section."""
  doc = inspect.getdoc(cls) or ""
  match = re.search(r"^Attributes:\n((?:[ \t]+.*\n?|\n)+)", doc, flags=re.M)
  if not match:
    return {}
  fields, current = {}, None
  for line in textwrap.dedent(match.group(1)).splitlines():
    head = re.match(r"^(\w+)(?: \([^)]*\))?: ?(.*)$", line)
    if head:
      current = head.group(1)
      fields[current] = head.group(2)
    elif current and line.strip():
      fields[current] += " " + line.strip()
  return fields


def _field_comments(cls) -> dict:
  """`{field: comment}` from `field: type  # comment` lines of the class body."""
  try:
    source = textwrap.dedent(inspect.getsource(cls))
  except (OSError, TypeError):
    return {}
  comments = {}
  for node in ast.parse(source).body[0].body:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      line = source.splitlines()[node.end_lineno - 1]
      if "#" in line:  # as literal text: `|a - b|` is not a substitution
        comments[node.target.id] = line.split("#", 1)[1].strip().replace("|", "\\|")
  return comments


def _describe_field(app, what, name, obj, options, lines):
  """Gives each NamedTuple field and config setting its own description.

  A NamedTuple field's "Alias for field number N" becomes the field's line of the class's
  "Attributes:" section, or its `# comment` in the class body; a NamedTuple field left with
  no description is a warning, so the -W build fails. A config dataclass (fields made with
  `config.setting`) lists each setting with its help text and default.
  """
  field = name.rpartition(".")[2]
  if what in ("attribute", "property") and len(lines) == 1 and _ALIAS.match(lines[0]):
    cls = _owner(name)
    described = {**_field_comments(cls), **_attributes_section(cls)} if cls else {}
    if field in described:
      lines[:] = [described[field]]
    else:
      from sphinx.util import logging

      logging.getLogger(__name__).warning(f"{name}: NamedTuple field with no description")
  elif what == "class" and hasattr(obj, "_fields"):
    # A NamedTuple's fields are its members, each with its own entry (above): the class's
    # "Attributes:" section, as napoleon's `:ivar` lines, would describe each a second time.
    kept, skipping = [], False
    for line in lines:
      head = re.match(r"^:ivar (\w+):", line)
      if head or not line.startswith(" "):
        skipping = bool(head) and head.group(1) in obj._fields
      if not skipping:
        kept.append(line)
    lines[:] = kept
  elif what == "class" and dataclasses.is_dataclass(obj):
    documented = {f.name for f in dataclasses.fields(obj) if f.metadata.get("help")}
    if documented:  # a config: each setting with its help text, as --help prints it
      lines.append("")
      for spec in dataclasses.fields(obj):
        if spec.name in documented:
          lines.append(f":ivar {spec.name}: {spec.metadata['help']} (default `{spec.default!r}`)")


def setup(app):
  app.connect("autodoc-process-docstring", _describe_field)
