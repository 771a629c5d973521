"""`egbert pretrain`: pretrain a bert, gpt or elmo model (egbert.pretrain.run)."""

from __future__ import annotations

from egbert.pretrain.run import parse_pretrain_args, pretrain


def main(argv: list[str] | None = None) -> None:
    pretrain(*parse_pretrain_args(argv))
