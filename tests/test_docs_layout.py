"""The front door stays a front door: the README within its budget, and every experiment file and results folder
listed in its folder's index, so that a newcomer can tell the experiments a user runs from the finished studies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from esper_ray.experiments.spec import ExperimentSpec

REPO = Path(__file__).resolve().parents[1]
README_LINES = 150
PARAGRAPH_CHARS = 700
HEADER_LINES = 8


def paragraphs(markdown: str) -> list[str]:
    """Prose paragraphs of a markdown text: blocks between blank lines (a list is one), code blocks and tables left
    out."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    found = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.strip().splitlines() if line.strip()]
        if not lines or lines[0].startswith(("|", "#")):
            continue
        found.append(" ".join(line.strip() for line in lines))
    return found


def test_paragraphs_splits_blocks_counts_a_list_whole_and_skips_code_and_tables():
    text = "one\ntwo\n\n```bash\nx\n\ny\n```\n\n| a |\n|---|\n\n- item one\n  more\n- item two\n"
    assert paragraphs(text) == ["one two", "- item one more - item two"]


def test_the_readme_stays_within_its_budget_of_lines_and_paragraph_length():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    longest = max(paragraphs(readme), key=len)
    assert len(longest) <= PARAGRAPH_CHARS, f"{len(longest)} characters: {longest[:120]}..."


def index_names(index: Path) -> set[str]:
    """The file and folder names the body rows of an index's tables start with (a header row is the one above
    `|---|`)."""
    lines = index.read_text().splitlines()
    body = [
        line
        for i, line in enumerate(lines)
        if i
        and lines[i - 1].startswith("|")
        and not line.startswith("|---")
        and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))
    ]
    return {m.group(1) for line in body if (m := re.match(r"\| ([A-Za-z0-9_.-]+?)/? \|", line))}


@pytest.mark.parametrize("folder", ["tune_configs", "tune_configs/studies"])
def test_every_experiment_file_parses_and_is_listed_in_its_folders_index(folder):
    files = sorted((REPO / folder).glob("*.yaml"))
    assert files
    listed = index_names(REPO / folder / "README.md")
    for path in files:
        spec = ExperimentSpec.from_yaml(path)
        assert spec.arms and spec.seeds
        assert path.name in listed, f"{path.name} is not in {folder}/README.md"
    assert listed <= {p.name for p in files}, f"{folder}/README.md lists files that do not exist"


def test_the_experiments_a_user_runs_have_a_short_header_with_question_times_and_result():
    for path in sorted((REPO / "tune_configs").glob("*.yaml")):
        lines = path.read_text().splitlines()
        header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
        assert 0 < len(header) <= HEADER_LINES, f"{path.name}: {len(header)} header lines"
        text = " ".join(header)
        for word in ("Question:", "Takes", "Last result:"):
            assert word in text, f"{path.name}'s header does not say {word!r}"


@pytest.mark.parametrize("folder", ["docs/results", "docs/results/studies"])
def test_every_results_folder_is_listed_in_its_index(folder):
    folders = {p.name for p in (REPO / folder).iterdir() if p.is_dir() and p.name != "studies"}
    listed = index_names(REPO / folder / "README.md")
    assert folders and folders <= listed, f"{folder}/README.md leaves out {sorted(folders - listed)}"
    assert listed <= folders, f"{folder}/README.md lists folders that do not exist: {sorted(listed - folders)}"


def test_pytest_says_before_the_first_dot_which_files_run_long(tmp_path):
    """A quiet run prints which files are long before its progress line, so minutes without a dot do not read as a
    hang (tests/conftest.py's pytest_sessionstart)."""
    import subprocess
    import sys

    from tests.conftest import LONGEST_FIRST

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "tests/test_docs_layout.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    first = done.stdout.splitlines()[0]
    assert "long files run first" in first, done.stdout[:500]
    assert all(name in first for name in LONGEST_FIRST)


def test_every_experiment_file_has_a_time_on_2_and_on_16_cores_in_its_index():
    """A newcomer plans by these (issue 74): each row of tune_configs/README.md says a time, or that it was not
    measured, for 2 cores and for 16 (or GPUs), and the files of an hour or more are marked long."""
    rows = [
        line
        for line in (REPO / "tune_configs" / "README.md").read_text().splitlines()
        if re.match(r"^\| [a-z_]+\.yaml \|", line)
    ]
    assert rows and {r.split("|")[1].strip() for r in rows} == {p.name for p in (REPO / "tune_configs").glob("*.yaml")}
    for row in rows:
        two, sixteen = (cell.strip() for cell in row.split("|")[3].split(" / "))
        for cell in (two, sixteen):
            assert re.search(r"\d+(\.\d+)? (min|h|s)\b|not measured|hours", cell), row
        assert ("**long**" in two) == bool(re.search(r"\d+ h\b|hours|50 min", two)), row
