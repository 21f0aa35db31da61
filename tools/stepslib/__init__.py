"""The steps tool: rebuild, run and check the book chapter by chapter.

Modules, one concern each:
    errors    -- BookError, an error that carries its location
    book      -- the book model: steps.yaml loaded, validated and queried
    tree      -- which version of which file makes up the tree at a chapter; the listing; diffs
    imports   -- the closure check: every `minisgl` import names something in the tree
    render    -- the text's directives, resolved and expanded
    runner    -- running a main or a chapter's tests in a fixed environment; comparing prints
    report    -- a failed test run made short: the first failure whole, each cut marked
    installed -- the installed packages, to notice one that changes while check runs
    check     -- `check`: the steps of each chapter, cached, in parallel, with a summary
    gitout    -- `checkout --git`: one commit per chapter
    cli       -- the command line
"""
