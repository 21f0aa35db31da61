"""`tree N` prints the seed page's listing to the character, for the book's real plan."""

from pathlib import Path

from bookmaker import steps, write_files, write_steps

# The chapters' `new` lists of the book plan (shared/BOOK_PLAN.md), in order.
PLAN = {
    1: "__init__ layers/__init__ layers/base layers/linear layers/embedding layers/norm "
    "utils/__init__ utils/misc",
    2: "layers/rotary layers/activation models/config models/base models/utils models/decoder "
    "models/__init__ models/register utils/registry",
    3: "models/weight utils/hf",
    4: "core engine/__init__ engine/sample",
    5: "kvcache/__init__ kvcache/base kvcache/mha_pool attention/__init__ attention/base "
    "attention/utils attention/torch_backend layers/attention",
    6: "engine/config engine/engine utils/torch_utils utils/logger",
    7: "scheduler/__init__ scheduler/config scheduler/scheduler scheduler/decode scheduler/table "
    "scheduler/utils scheduler/cache kvcache/naive_cache",
    8: "kvcache/radix_cache",
    9: "scheduler/prefill",
    10: "llm/__init__ llm/llm",
    11: "tokenizer/__init__ tokenizer/tokenize tokenizer/detokenize",
    12: "message/__init__ message/utils message/frontend message/backend message/tokenizer "
    "utils/mp tokenizer/server scheduler/io",
    13: "server/__init__ server/args server/launch server/api_server env __main__",
    14: "shell",
    15: "",
    16: "kernel/__init__ kernel/store kernel/attention attention/triton_backend attention/fa "
    "utils/arch",
    17: "engine/graph",
    18: "",
    19: "distributed/__init__ distributed/info distributed/impl",
    20: "layers/moe moe/__init__ moe/base moe/torch_backend moe/fused",
}

SEED_LISTING = """\
Files so far: 79 (5 new, 1 modified, 0 brought in early)

minisgl/
├── __init__.py
├── core.py
├── env.py
├── __main__.py
├── shell.py
├── attention/  (6 files, unchanged)
├── distributed/  (3 files, unchanged)
├── engine/  (5 files, unchanged)
├── kernel/  (3 files, unchanged)
├── kvcache/  (5 files, unchanged)
├── layers/
│   ├── __init__.py
│   ├── base.py
│   ├── linear.py
│   ├── embedding.py
│   ├── norm.py
│   ├── rotary.py
│   ├── activation.py
│   ├── attention.py
│   ├── moe.py  ← new in this chapter
├── llm/  (2 files, unchanged)
├── message/  (5 files, unchanged)
├── models/
│   ├── config.py
│   ├── base.py
│   ├── utils.py  ← modified in this chapter
│   ├── decoder.py
│   ├── __init__.py
│   ├── register.py
│   ├── weight.py
├── moe/
│   ├── __init__.py  ← new in this chapter
│   ├── base.py  ← new in this chapter
│   ├── torch_backend.py  ← new in this chapter
│   ├── fused.py  ← new in this chapter
├── scheduler/  (9 files, unchanged)
├── server/  (4 files, unchanged)
├── tokenizer/  (4 files, unchanged)
├── utils/  (8 files, unchanged)
"""


def plan_book(root: Path) -> Path:
    files: dict[str, str] = {}
    chapters = []
    for number, names in PLAN.items():
        new = [f"minisgl/{name}.py" for name in names.split()]
        modified = ["minisgl/models/utils.py"] if number == 20 else []
        for path in new:
            files[f"python/{path}"] = f"# {path}\n"
        slug = f"step{number}"
        files[f"examples/ch{number:02d}_{slug}.py"] = "print('hi')\n"
        files[f"tests/test_ch{number:02d}_{slug}.py"] = "def test_ok():\n    pass\n"
        entry = {
            "id": f"ch{number:02d}",
            "slug": slug,
            "title": f"Step {number}",
            "main": f"examples/ch{number:02d}_{slug}.py",
            "tests": [f"tests/test_ch{number:02d}_{slug}.py"],
            "new": new,
            "modified": modified,
        }
        chapters.append(entry)
    files["chapters/ch02_step2/python/minisgl/models/utils.py"] = "# the dense-only version\n"
    write_files(root, files)
    write_steps(root, [{"title": "All", "chapters": chapters}])
    return root


def test_chapter_20_listing_is_the_seed_pages(tmp_path):
    root = plan_book(tmp_path)
    done = steps(root, "tree", "20")
    assert done.returncode == 0, done.stderr
    assert done.stdout == SEED_LISTING


def test_counts_add_up_chapter_by_chapter(tmp_path):
    root = plan_book(tmp_path)
    done = steps(root, "list")
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    files_so_far = [int(row[4]) for row in rows]  # stage "All", id, "Step", "N", files, ...
    expected, total = [], 0
    for names in PLAN.values():
        total += len(names.split())
        expected.append(total)
    assert files_so_far == expected
    assert files_so_far[-1] == 79


def test_a_chapter_with_nothing_new_collapses_every_folder(tmp_path):
    root = plan_book(tmp_path)
    lines = steps(root, "tree", "15").stdout.splitlines()
    assert lines[0] == "Files so far: 64 (0 new, 0 modified, 0 brought in early)"
    assert "├── utils/  (7 files, unchanged)" in lines
    assert "├── llm/  (2 files, unchanged)" in lines
    assert not any("←" in line for line in lines)


def test_a_single_file_folder_says_file(tmp_path):
    root = plan_book(tmp_path)
    write_files(root, {"python/minisgl/extra/only.py": "\n"})
    text = (root / "steps.yaml").read_text()
    (root / "steps.yaml").write_text(
        text.replace("- minisgl/shell.py", "- minisgl/shell.py\n    - minisgl/extra/only.py")
    )
    assert "├── extra/  (1 file, unchanged)" in steps(root, "tree", "20").stdout
    assert "│   ├── only.py  ← new in this chapter" in steps(root, "tree", "14").stdout
