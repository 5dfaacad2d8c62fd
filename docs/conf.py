"""Sphinx configuration of the API reference (built in CI with -W: a broken docstring fails)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import vampire_jax  # noqa: E402

project = "vampire_jax"
author = "vampire_jax contributors"
copyright = "vampire_jax contributors, Apache-2.0"
release = vampire_jax.__version__
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
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
