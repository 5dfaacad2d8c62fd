"""BUILD_NOTES.md stays short: current facts first, the history in the docs (issue 59, item 7)."""

import re

from conftest import REPO

NOTES = REPO / "BUILD_NOTES.md"
HISTORY = REPO / "docs" / "history.md"
SUPERSEDED = "\n# Superseded sections of the docs pages\n"


def test_build_notes_link_their_history():
  text = NOTES.read_text()
  assert "(docs/history.md)" in text
  assert "\n   history\n" in (REPO / "docs" / "index.rst").read_text()  # in the Sphinx toctree


def test_the_history_page_says_it_is_history_and_keeps_the_shortened_sections_whole():
  history = HISTORY.read_text()
  assert history.splitlines()[2].startswith("**This page is history.**")
  # The page's second part holds the docs pages' superseded sections (issue 69), grouped by
  # page; the rule below is for the first part, BUILD_NOTES.md's shortened sections.
  shortened, boundary, superseded = history.partition(SUPERSEDED)
  assert boundary and "\n## Performance\n" in superseded, "the superseded sections' heading"
  headings = re.findall(r"^## (.+)$", shortened, flags=re.M)
  # Each section that BUILD_NOTES.md shortened is here in full, under its old heading, and
  # BUILD_NOTES.md keeps a section of that name with the current facts.
  notes = NOTES.read_text()
  for heading in headings:
    assert f"### {heading}\n" in notes, heading
  assert "SImPa, as `Simpa.py` runs it (issue 51)" in headings


def test_no_docs_page_but_the_history_and_the_user_guide_is_over_600_lines():
  """Each page is, and begins with, the current state; what a later measurement superseded
  is in docs/history.md."""
  lengths = {p.name: len(p.read_text().splitlines()) for p in (REPO / "docs").glob("*.md")}
  long = {n: k for n, k in lengths.items() if k > 600 and n not in ("history.md", "user_guide.md")}
  assert long == {}
