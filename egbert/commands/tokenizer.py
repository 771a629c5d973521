"""`egbert tokenizer train|stats`: train the shared tokenizer, or print its statistics on files."""

from __future__ import annotations

import json
import time

from egbert.tokenizer import (
    build_parser,
    format_stats,
    load_tokenizer,
    tokenizer_stats,
    train_tokenizer,
)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.action == "train":
        start = time.perf_counter()
        tokenizer = train_tokenizer(
            args.files,
            kind=args.kind,
            vocab_size=args.vocab_size,
            lowercase=args.lowercase,
            out_dir=args.out,
            min_frequency=args.min_frequency,
            encoding=args.encoding,
            dataset=args.dataset,
            dataset_config=args.dataset_config,
            split=args.split,
            text_column=args.text_column,
            source_weights=args.source_weights,
        )
        seconds = time.perf_counter() - start
        print(f"trained a {args.kind} tokenizer of {len(tokenizer):,} tokens in {seconds:.1f} s")
        print(f"saved to {args.out}")
        return
    stats = tokenizer_stats(load_tokenizer(args.tokenizer), args.files, encoding=args.encoding)
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
