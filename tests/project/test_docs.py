"""BUILD_NOTES.md stays short: current facts first, the history in the docs (issue 59, item 7)."""

import re

import pytest

from tests.conftest import REPO

NOTES = REPO / "BUILD_NOTES.md"


HISTORY = REPO / "docs" / "history.md"


SUPERSEDED = "\n# Superseded sections of the docs pages\n"


@pytest.mark.parametrize("page", ["README.md", "docs/experiments.md", "docs/reproducing.md"])
def test_the_authors_later_algorithms_are_named_with_which_method_when(page):
  text = (REPO / page).read_text()
  assert all(name in text for name in ("Vampire2", "ProtoNet", "SImPa")), page
  assert "which method when" in text.lower()


def test_the_which_method_when_table_says_what_each_models_costs_and_its_uncertainty():
  text = (REPO / "docs" / "experiments.md").read_text()
  table = text[text.index("### Which method when") :].split("\n\n")[2].splitlines()
  assert (
    table[0].startswith("| method | what it models | cost per step") and "uncertainty" in table[0]
  )
  methods = [row.split("|")[1] for row in table[2:]]
  for name in ("VAMPIRE", "Vampire2", "MAML", "ProtoNet", "SImPa"):
    assert any(name in m for m in methods), name


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
