"""No module of egbert grows past 700 lines: one that long no longer reads top to bottom in a
sitting (STYLE.md) and is split along its seams, as trainer.py was into batches, step_numbers
and evaluator."""

from __future__ import annotations

from pathlib import Path

import egbert

LIMIT = 700


def test_no_module_is_longer_than_the_limit():
    package = Path(egbert.__file__).parent
    lengths = {
        str(path.relative_to(package)): len(path.read_text(encoding="utf-8").splitlines())
        for path in package.rglob("*.py")
    }
    assert len(lengths) > 20, "the walk found egbert's modules"
    too_long = {name: lines for name, lines in lengths.items() if lines > LIMIT}
    assert not too_long, f"split these modules (lines over {LIMIT}): {too_long}"
