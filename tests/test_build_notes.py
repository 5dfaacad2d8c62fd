"""BUILD_NOTES.md stays short: current facts first, the history in the docs (issue 59, item 7)."""

import re

from conftest import REPO

NOTES = REPO / "BUILD_NOTES.md"
HISTORY = REPO / "docs" / "history.md"


def test_build_notes_hold_at_most_450_lines_and_link_their_history():
  text = NOTES.read_text()
  assert len(text.splitlines()) <= 450
  assert "(docs/history.md)" in text
  assert "\n   history\n" in (REPO / "docs" / "index.rst").read_text()  # in the Sphinx toctree


def test_the_history_page_says_it_is_history_and_keeps_the_shortened_sections_whole():
  history = HISTORY.read_text()
  assert history.splitlines()[2].startswith("**This page is history.**")
  headings = re.findall(r"^## (.+)$", history, flags=re.M)
  # Each section that BUILD_NOTES.md shortened is here in full, under its old heading, and
  # BUILD_NOTES.md keeps a section of that name with the current facts.
  notes = NOTES.read_text()
  for heading in headings:
    assert f"### {heading}\n" in notes, heading
  assert "SImPa, as `Simpa.py` runs it (issue 51)" in headings
