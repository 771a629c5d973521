"""`egbert quickstart`: the whole pipeline on the data in $EGBERT_DATA (egbert.quickstart)."""

from __future__ import annotations

from egbert.arguments import parse_args
from egbert.quickstart.options import DESCRIPTION, QuickstartArguments
from egbert.quickstart.run import quickstart


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((QuickstartArguments,), argv, "egbert quickstart", DESCRIPTION)
    quickstart(args)
