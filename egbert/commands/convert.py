"""`egbert convert`: stock transformers BERT / GPT-2 <-> egbert (egbert.models.convert)."""

from __future__ import annotations

from dataclasses import asdict

from egbert.arguments import parse_args
from egbert.models.convert import ConvertArguments, convert_checkpoint

DESCRIPTION = (
    "Convert a stock transformers BertModel / BertForPreTraining / BertForMaskedLM / "
    "BertForSequenceClassification / GPT2Model / GPT2LMHeadModel / "
    "GPT2ForSequenceClassification checkpoint to egbert, or (--to-transformers) an egbert bert "
    "or gpt checkpoint, fine-tuned classifiers with the 'cls' head included, to the stock "
    "class. The tokenizer comes along, made for the model's family."
)


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((ConvertArguments,), argv, "egbert convert", DESCRIPTION)
    model = convert_checkpoint(**asdict(args))
    print(f"wrote {type(model).__name__} to {args.target}")
