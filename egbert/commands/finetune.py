"""`egbert finetune`: fine-tune and evaluate a model on GLUE or your own tasks
(egbert.finetune.run)."""

from __future__ import annotations

from accelerate import PartialState

from egbert.finetune.run import finetune, parse_finetune_args


def main(argv: list[str] | None = None) -> None:
    output = finetune(*parse_finetune_args(argv))
    PartialState().print(output.table)  # once, under torchrun too
