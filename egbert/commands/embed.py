"""`egbert embed`: the command line's options mapped onto `egbert.embed` (the same defaults and
checks), its input read from a file or stdin and its output to a file or stdout."""

from __future__ import annotations

import argparse
import io
import json
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from egbert.arguments import ArgumentParser, BooleanFlag
from egbert.embedding.extract import embed
from egbert.embedding.options import COMBINES, POOLS, EmbedOptions
from egbert.embedding.vectors import TextOrPair
from egbert.embedding.writers import STDOUT
from egbert.errors import ConfigError, DataError
from egbert.model_files import ALLOW_PICKLE_HELP
from egbert.tokenizer import check_encoding

PAIR_SEPARATOR = "|||"  # in text input: "first text ||| second text"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(_attach_layers_value(sys.argv[1:] if argv is None else argv))
    source = read_input(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        embed(
            args.model,
            source,
            layers=_parse_layers(args.layers),
            combine=args.combine,
            pool=args.pool,
            batch_size=args.batch_size,
            max_length=args.max_length,
            normalize=args.normalize,
            word_level=args.word_level,
            stride=args.stride,
            output=args.output,
            device=args.device,
            allow_pickle=args.allow_pickle,
            bf16=args.bf16,
            fp16=args.fp16,
        )
    for warning in caught:
        print(f"egbert embed: warning: {warning.message}", file=sys.stderr)
    where = "stdout" if args.output == STDOUT else args.output
    print(f"egbert embed: wrote {len(source)} embeddings to {where}", file=sys.stderr)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        "egbert embed",
        description=(
            "Extract sentence or token embeddings from chosen layers of a saved model (egbert "
            "bert/gpt/elmo or a stock transformers BERT/GPT-2 directory), as egbert.embed(...) "
            "does with the same defaults. The input is streamed and the output written in "
            "chunks to a temp file renamed at the end; - reads stdin or writes JSONL to stdout."
        ),
    )
    add_file_arguments(parser)
    add_vector_arguments(parser, EmbedOptions())
    add_reading_arguments(parser)
    return parser


def add_file_arguments(parser: ArgumentParser) -> None:
    """--model, --input and --output."""
    parser.add_argument("--model", required=True, help="model directory (with its tokenizer)")
    parser.add_argument(
        "--input",
        required=True,
        help='.jsonl (one object per line) or text, one input per line ("a ||| b" for a pair); '
        "- reads text lines from stdin",
    )
    parser.add_argument(
        "--output",
        required=True,
        help=".npy or .safetensors (pooled vectors, one row per input) or .jsonl (one record "
        "per input: a pooled vector, or tokens, offsets and vectors with --pool none); - writes "
        "JSONL to stdout (progress and messages go to stderr)",
    )


def add_vector_arguments(parser: ArgumentParser, defaults: EmbedOptions) -> None:
    """How texts become vectors: the options of EmbedOptions, with its defaults."""
    parser.add_argument(
        "--layers",
        help="comma-separated layer indices: -1 last layer, 0 embeddings (default: the last 4, "
        "-1,-2,-3,-4, or all of a model with fewer)",
    )
    parser.add_argument(
        "--combine",
        choices=COMBINES,
        default=defaults.combine,
        help="per token: concat (in --layers order), sum, mean, scalar-mix (untrained: equal "
        "weights, gamma 1) or none (one layer) (default: %(default)s)",
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default=defaults.pool,
        help="cls: first token, mean: average of the real tokens, last: last real token, "
        "none: per-token vectors, .jsonl only (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="(default: %(default)s)"
    )
    parser.add_argument(
        "--max-length", type=int, help="truncate to N tokens (default: model maximum)"
    )
    parser.add_argument("--normalize", action=BooleanFlag, help="unit-length vectors")
    parser.add_argument(
        "--word-level", action=BooleanFlag, help="average word pieces per word (--pool none)"
    )
    parser.add_argument(
        "--stride",
        type=int,
        help="embed long texts in windows overlapping by N tokens instead of truncating them",
    )


def add_reading_arguments(parser: ArgumentParser) -> None:
    """How the input file and the model are read."""
    parser.add_argument("--text-field", default="text", help="text field of .jsonl input")
    parser.add_argument("--pair-field", help="second text field of .jsonl input, for pairs")
    parser.add_argument("--encoding", default="utf-8", help="input file encoding")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument(
        "--bf16", action=BooleanFlag, default=False, help="bf16 autocast (vectors stay float32)"
    )
    parser.add_argument(
        "--fp16",
        action=BooleanFlag,
        default=False,
        help="fp16 autocast, for GPUs without bf16 (T4, V100); instead of --bf16",
    )
    parser.add_argument("--allow-pickle", action=BooleanFlag, help=ALLOW_PICKLE_HELP)


@dataclass
class InputFile:
    """The --input file as texts or pairs: counted once, read as they are needed (.jsonl: one
    object per line; other files: one text per line)."""

    path: Path
    encoding: str
    text_field: str
    pair_field: str | None

    @cached_property
    def records(self) -> int:
        jsonl = self.path.suffix == ".jsonl"
        try:
            with self.path.open(encoding=self.encoding) as handle:
                return sum(1 for line in handle if not jsonl or line.strip())
        except UnicodeDecodeError as error:
            raise DataError(
                f"--input {self.path} is not {self.encoding} (byte {error.start}); pass --encoding"
            ) from error

    def __len__(self) -> int:
        return self.records

    def __iter__(self) -> Iterator[TextOrPair]:
        if self.path.suffix == ".jsonl":
            return _read_jsonl(self.path, self.encoding, self.text_field, self.pair_field)
        return _read_txt(self.path, self.encoding)


def read_input(args: argparse.Namespace) -> InputFile | list[TextOrPair]:
    """--input checked: a file (read as it is embedded), or "-", the text lines of stdin."""
    check_encoding(args.encoding)
    if args.input == "-":
        stdin = sys.stdin
        if hasattr(stdin, "buffer"):  # decode as --encoding says, not as the terminal's locale
            stdin = io.TextIOWrapper(stdin.buffer, encoding=args.encoding)
        try:
            texts = [text_or_pair(line) for line in stdin]
        except UnicodeDecodeError as error:
            raise DataError(
                f"--input -: stdin is not {args.encoding} (byte {error.start}); pass --encoding"
            ) from error
        if not texts:
            raise DataError("--input -: stdin is empty: nothing to embed")
        return texts
    source = InputFile(Path(args.input), args.encoding, args.text_field, args.pair_field)
    if source.path.is_dir():
        raise DataError(
            f"--input {source.path} is a folder; pass a file (.jsonl, or text with one input "
            "per line) or - for stdin"
        )
    if not source.path.is_file():
        raise DataError(f"--input {source.path} not found")
    if not len(source):
        raise DataError(f"--input {source.path} is empty: nothing to embed")
    return source


def text_or_pair(line: str) -> TextOrPair:
    """A line of text input: a text, or "a ||| b" a pair; an empty line is an empty text."""
    text = line.rstrip("\r\n")
    if PAIR_SEPARATOR in text:
        first, second = text.split(PAIR_SEPARATOR, 1)
        return first.strip(), second.strip()
    return text


def _read_txt(path: Path, encoding: str) -> Iterator[TextOrPair]:
    """One text per line (rows = lines)."""
    with path.open(encoding=encoding) as handle:
        yield from map(text_or_pair, handle)


def _read_jsonl(
    path: Path, encoding: str, text_field: str, pair_field: str | None
) -> Iterator[TextOrPair]:
    """One JSON object per line; blank lines are skipped."""
    with path.open(encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path} line {number}: not valid JSON ({error.msg})") from error
            fields = [text_field] if pair_field is None else [text_field, pair_field]
            for field in fields:
                if not isinstance(record, dict) or not isinstance(record.get(field), str):
                    raise DataError(
                        f"{path} line {number}: no text field {field!r}; "
                        "name the field with --text-field / --pair-field"
                    )
            yield (
                record[text_field]
                if pair_field is None
                else (record[text_field], record[pair_field])
            )


def _parse_layers(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as error:
        raise ConfigError(
            f"--layers {value!r}: give comma-separated integers such as -1,-2,-3,-4"
        ) from error


def _attach_layers_value(argv: list[str]) -> list[str]:
    # argparse reads "-1,-2" as an unknown option, so "--layers -1,-2" would fail: glue the
    # value on as "--layers=-1,-2".
    glued: list[str] = []
    for arg in argv:
        if glued and glued[-1] == "--layers" and arg.startswith("-"):
            glued[-1] = f"--layers={arg}"
        else:
            glued.append(arg)
    return glued
