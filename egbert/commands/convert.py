"""`egbert convert`: stock transformers BERT / GPT-2 <-> egbert (egbert.models.convert)."""

from __future__ import annotations

from egbert.arguments import ArgumentParser, BooleanFlag
from egbert.model_files import ALLOW_PICKLE_HELP
from egbert.models.convert import convert_checkpoint


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(
        "egbert convert",
        description="Convert a stock transformers BertModel / BertForPreTraining / BertForMaskedLM "
        "/ BertForSequenceClassification / GPT2Model / GPT2LMHeadModel / "
        "GPT2ForSequenceClassification checkpoint to egbert, or (--to-transformers) an egbert bert "
        "or gpt checkpoint, fine-tuned classifiers with the 'cls' head included, to the stock "
        "class. The tokenizer comes along, made for the model's family.",
    )
    parser.add_argument("--from", dest="source", required=True, help="model directory to read")
    parser.add_argument("--to", dest="target", required=True, help="directory to write")
    parser.add_argument(
        "--to-transformers",
        action=BooleanFlag,
        help="convert egbert -> stock transformers classes (default: stock -> egbert)",
    )
    parser.add_argument("--allow-pickle", action=BooleanFlag, help=ALLOW_PICKLE_HELP)
    args = parser.parse_args(argv)
    model = convert_checkpoint(
        args.source, args.target, args.to_transformers, allow_pickle=args.allow_pickle
    )
    print(f"wrote {type(model).__name__} to {args.target}")
