"""tools/site.py's site_sections: a chapter's "Exercises" renamed and its "The judged exercise"
left out, with headings inside code fences of either kind (``` or ~~~) left alone, and a fence
closed only by its own marker (a ~~~ block may quote ``` lines, as model output does)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
