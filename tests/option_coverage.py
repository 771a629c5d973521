"""Which test proves which option: `@proves("pretrain", "--lr")` on a test says that it fails when
that option of that command is ignored or wired to the wrong thing, against an expectation from
outside the code under test (a value computed from the option's definition, a reference library's
result, or a pair of runs that differ in what the option claims to change and agree elsewhere).

tests/test_option_coverage.py reads these marks from every test module (by import, so the check
holds under pytest-xdist and in any order) and fails for an option of a command that no test
proves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Test = TypeVar("Test", bound=Callable)


def proves(command: str, *options: str) -> Callable[[Test], Test]:
    """Mark a test as the proof of `options` (as typed: "--lr") of `egbert command`."""
    if not options or not all(option.startswith("--") for option in options):
        raise ValueError(f"proves({command!r}, ...): name options as typed, e.g. '--lr'")

    def mark(test: Test) -> Test:
        test.proves = (*getattr(test, "proves", ()), *((command, o) for o in options))
        return test

    return mark
