"""`egbert tokenizer train|stats`: train the shared tokenizer, or print its statistics on files."""

from __future__ import annotations

import json
import time
from typing import Any

from egbert.tokenizer import (
    build_parser,
    format_stats,
    load_tokenizer,
    tokenizer_stats,
    train_tokenizer,
)


def main(argv: list[str] | None = None) -> None:
    options = vars(build_parser().parse_args(argv))
    action = options.pop("action")  # the subcommand; the other options are its parameters
    if action == "train":
        train(options)
    else:
        stats(options)


def train(options: dict[str, Any]) -> None:
    out_dir = options.pop("out")  # --out keeps its name in --print-config and --config files
    start = time.perf_counter()
    tokenizer = train_tokenizer(out_dir=out_dir, **options)
    seconds = time.perf_counter() - start
    print(f"trained a {options['kind']} tokenizer of {len(tokenizer):,} tokens in {seconds:.1f} s")
    print(f"saved to {out_dir}")


def stats(options: dict[str, Any]) -> None:
    as_json = options.pop("json")  # how to print them, not a statistic
    tokenizer = load_tokenizer(options.pop("tokenizer"))  # --tokenizer is its directory
    statistics = tokenizer_stats(tokenizer, **options)
    print(json.dumps(statistics, indent=2) if as_json else format_stats(statistics))
