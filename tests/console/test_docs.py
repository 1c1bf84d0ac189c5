"""The repository documents itself: README and docs/ link only to files inside the repository
(and those files exist), and docs/configuration.md names every setting config/settings.py
reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_links_stay_inside_the_repository_and_resolve():
    for page in PAGES:
        text = page.read_text()
        assert "../shared" not in text, page
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+://", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT), (page.name, target)
            assert path.exists(), (page.name, target)


def test_configuration_lists_every_setting():
    source = (ROOT / "config" / "settings.py").read_text()
    names = set(re.findall(r'env_(?:str|bool|int|float|list|choice)\(\s*"([A-Z0-9_]+)"', source))
    names |= set(re.findall(r"env_str\('([A-Z0-9_]+)'", source))
    assert len(names) > 50
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", (ROOT / "docs" / "configuration.md")
                                .read_text()))
    assert names - documented == set()
