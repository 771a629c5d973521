"""`egbert quickstart`: the main job on the data in $EGBERT_DATA, reusing finished steps.

For now the pipeline is its first step: train the shared tokenizer on WikiText-2 train and print its
statistics.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from egbert.errors import DataError
from egbert.tokenizer import format_stats, load_tokenizer, tokenizer_stats, train_tokenizer

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def find_data(path: str | None) -> Path:
    data = Path(path or os.environ.get("EGBERT_DATA") or DEFAULT_DATA)
    corpus = data / "corpus" / "wikitext-2" / "wiki.train.tokens"
    if not corpus.is_file():
        raise DataError(
            f"{corpus}: not found; point --data (or EGBERT_DATA) at a folder with "
            "corpus/wikitext-2/wiki.train.tokens and glue/<TASK>/ files"
        )
    return data


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="egbert quickstart",
        description="Run egbert's main pipeline on local data; a rerun reuses finished steps.",
    )
    parser.add_argument("--data", help="data folder (default: $EGBERT_DATA or ../shared/data)")
    parser.add_argument("--output-dir", default="runs/quickstart", help="default: runs/quickstart")
    parser.add_argument("--vocab-size", type=int, default=16000, help="default: 16000")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    corpus = find_data(args.data) / "corpus" / "wikitext-2" / "wiki.train.tokens"
    tokenizer_dir = Path(args.output_dir) / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        print(f"[1/1] tokenizer: reusing {tokenizer_dir}")
        tokenizer = load_tokenizer(tokenizer_dir)
    else:
        print(f"[1/1] tokenizer: training WordPiece ({args.vocab_size:,}) on {corpus}")
        start = time.perf_counter()
        tokenizer = train_tokenizer([corpus], vocab_size=args.vocab_size, out_dir=tokenizer_dir)
        print(f"      trained in {time.perf_counter() - start:.1f} s, saved to {tokenizer_dir}")
    print(format_stats(tokenizer_stats(tokenizer, [corpus])))
