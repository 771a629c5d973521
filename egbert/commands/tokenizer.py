"""`egbert tokenizer train|stats`: train the shared tokenizer, or print its statistics on files."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from egbert.arguments import Subcommand, parse_subcommand_args
from egbert.tokenizer import (
    TokenizerStatsArguments,
    TokenizerTrainArguments,
    format_stats,
    load_tokenizer,
    tokenizer_stats,
    train_tokenizer,
)

DESCRIPTION = "Train the tokenizer shared by bert, gpt and elmo, or measure one on a corpus."
SUBCOMMANDS = {
    "train": Subcommand(
        (TokenizerTrainArguments,),
        "train a WordPiece or byte-level BPE tokenizer on a corpus",
        "Train a tokenizer on the corpora pretraining reads (streamed: nothing is cached) and "
        "save it as a PreTrainedTokenizerFast that AutoTokenizer.from_pretrained(OUT) loads "
        "offline.",
    ),
    "stats": Subcommand(
        (TokenizerStatsArguments,),
        "tokens per word, unknown rate and length percentiles on text files",
        "Encode text files with a tokenizer and print its statistics.",
    ),
}


def main(argv: list[str] | None = None) -> None:
    action, (args,) = parse_subcommand_args(SUBCOMMANDS, argv, "egbert tokenizer", DESCRIPTION)
    if action == "train":
        train(args)
    else:
        stats(args)


def train(args: TokenizerTrainArguments) -> None:
    options = asdict(args)
    out_dir = options.pop("out")  # --out keeps its name in --print-config and --config files
    start = time.perf_counter()
    tokenizer = train_tokenizer(out_dir=out_dir, **options)
    seconds = time.perf_counter() - start
    print(f"trained a {args.kind} tokenizer of {len(tokenizer):,} tokens in {seconds:.1f} s")
    print(f"saved to {out_dir}")


def stats(args: TokenizerStatsArguments) -> None:
    tokenizer = load_tokenizer(args.tokenizer)  # --tokenizer is its directory
    statistics = tokenizer_stats(
        tokenizer, args.files, encoding=args.encoding, encoding_errors=args.encoding_errors
    )
    print(json.dumps(statistics, indent=2) if args.json else format_stats(statistics))
