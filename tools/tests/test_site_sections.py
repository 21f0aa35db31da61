"""tools/site.py's site_sections: a chapter's "Exercises" renamed and its "The judged exercise"
left out, with headings inside code fences of either kind (``` or ~~~) left alone, and a fence
closed only by its own marker (a ~~~ block may quote ``` lines, as model output does). And the
chapter's title numbered as the navigation numbers it, and the home page's install commands the
README's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

SITE = Path(__file__).resolve().parents[1] / "site.py"  # not the standard library's site
_spec = importlib.util.spec_from_file_location("book_site", SITE)
book_site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(book_site)
site_sections = book_site.site_sections

PAGE = """# A chapter

~~~text
```json
## Exercises
~~~

```bash
## The judged exercise
```

## Exercises

Questions.

## The judged exercise

Left out.

## Summary
"""


def test_fences_of_either_kind_hide_headings_and_close_with_their_own_marker():
    lines = site_sections(PAGE).splitlines()
    assert lines.count("## Questions, with answers {#questions}") == 1
    assert lines.count("## Exercises") == 1  # the one inside the ~~~ block stays as it is
    assert "Left out." not in lines and "## Summary" in lines
    assert lines.count("## The judged exercise") == 1  # the one inside the ``` block


def test_a_chapter_title_gets_its_number_as_the_navigation_shows_it():
    chapter = SimpleNamespace(number=5, folder="chapters/ch05_kvcache")
    page = book_site.numbered_title("# The paged KV cache\n\n## A section\n", chapter)
    assert page == "# 5. The paged KV cache\n\n## A section\n"


INSTALL = re.compile(r"\s*(pip|python3 -m venv) ")


def _install_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if INSTALL.match(line)]


def test_the_home_page_installs_as_the_readme_does():
    """Its venv and pip lines are the README's, torch pinned to the CPU build's version."""
    home = _install_lines((book_site.ASSETS / "home.md").read_text(encoding="utf-8"))
    readme = _install_lines((book_site.ROOT / "README.md").read_text(encoding="utf-8"))
    assert home and any("torch==" in line for line in home)
    assert [line for line in home if line not in readme] == []
