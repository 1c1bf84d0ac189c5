"""The repository explains itself: no code, test or doc cites a file outside the repository or a
tracker number, and the landing page stays a landing page.

Readers of the repository have neither the steering documents the platform was built from nor
its tracker: a fact the code relies on lives, with its measurement, in a docstring or in
``docs/adr/``; a figure lives in ``docs/performance.md`` beside ``bench/results/``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Names of documents that live outside the repository, a path out of it, and tracker numbers
#: ("issue 12", "issue 9.7", "issues 10.9").
OUTSIDE = re.compile(
    r"\b(?:PERFORMANCE|STYLE|ARCHITECTURE|DEVELOPERS)\.md\b"
    r"|\.\./shared/"
    r"|\b[Ii]ssues? #?\d+(?:\.\d+)?\b"
)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".html", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".js",
                 ".css", ".in", ".json"}
#: Recorded bench runs keep the command lines and notes they were run with.
SKIPPED_DIRS = ("bench/results/",)


def _tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return [
        ROOT / name for name in listed
        if not name.startswith(SKIPPED_DIRS)
        and (Path(name).suffix in TEXT_SUFFIXES or name.startswith(".ci/"))
        and (ROOT / name).is_file()
    ]


def test_nothing_cites_a_document_outside_the_repository_or_a_tracker_number():
    this = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path in _tracked_files() if path != this
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert hits == [], "put the fact in a docstring or docs/adr/ instead:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_is_for():
    for line in ("see PERFORMANCE.md", "(issue 9.7)", "issue 12's target", "../shared/STYLE.md",
                 "Issues 10 and 11"):
        assert OUTSIDE.search(line), line
    for line in ("the issue is", "re-issue", "issuer", "0.8x of its ceiling"):
        assert not OUTSIDE.search(line), line


def test_the_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for heading in ("## The two commands", "## Using it", "## Limits", "## Documentation"):
        assert heading in readme

