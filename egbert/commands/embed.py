"""`egbert embed`: the command line's options mapped onto `egbert.embed` (the same defaults and
checks), its input read from a file or stdin and its output to a file or stdout."""

from __future__ import annotations

import io
import sys
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from egbert.arguments import parse_args
from egbert.embedding.extract import embed
from egbert.embedding.options import EMBED_ARGUMENTS, EmbedLoading
from egbert.embedding.vectors import TextOrPair
from egbert.embedding.writers import STDOUT
from egbert.errors import DataError
from egbert.jsonl import jsonl_objects
from egbert.tokenizer import check_encoding

PAIR_SEPARATOR = "|||"  # in text input: "first text ||| second text"
DESCRIPTION = (
    "Extract sentence or token embeddings from chosen layers of a saved model (egbert "
    "bert/gpt/elmo or a stock transformers BERT/GPT-2 directory), as egbert.embed(...) does with "
    "the same defaults. The input is streamed and the output written in chunks to a temp file "
    "renamed at the end; - reads stdin or writes JSONL to stdout."
)


def main(argv: list[str] | None = None) -> None:
    argv = _attach_layers_value(sys.argv[1:] if argv is None else argv)
    files, options, loading = parse_args(EMBED_ARGUMENTS, argv, "egbert embed", DESCRIPTION)
    source = read_input(files.input, loading)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        embed(
            files.model,
            source,
            **asdict(options),
            output=files.output,
            device=loading.device,
            allow_pickle=loading.allow_pickle,
            bf16=loading.bf16,
            fp16=loading.fp16,
        )
    for warning in caught:
        print(f"egbert embed: warning: {warning.message}", file=sys.stderr)
    where = "stdout" if files.output == STDOUT else files.output
    print(f"egbert embed: wrote {len(source)} embeddings to {where}", file=sys.stderr)


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


def read_input(path: str, loading: EmbedLoading) -> InputFile | list[TextOrPair]:
    """--input checked: a file (read as it is embedded), or "-", the text lines of stdin."""
    check_encoding(loading.encoding)
    if path == "-":
        stdin = sys.stdin
        if hasattr(stdin, "buffer"):  # decode as --encoding says, not as the terminal's locale
            stdin = io.TextIOWrapper(stdin.buffer, encoding=loading.encoding)
        try:
            texts = [text_or_pair(line) for line in stdin]
        except UnicodeDecodeError as error:
            raise DataError(
                f"--input -: stdin is not {loading.encoding} (byte {error.start}); pass --encoding"
            ) from error
        if not texts:
            raise DataError("--input -: stdin is empty: nothing to embed")
        return texts
    source = InputFile(Path(path), loading.encoding, loading.text_field, loading.pair_field)
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
    """The text (or the pair of texts) of each object, one a line; blank lines are skipped."""
    fields = [text_field] if pair_field is None else [text_field, pair_field]
    with path.open(encoding=encoding) as handle:
        for number, record in jsonl_objects(path, handle):
            for field in fields:
                if not isinstance(record.get(field), str):
                    raise DataError(
                        f"{path} line {number}: no text field {field!r}; "
                        "name the field with --text-field / --pair-field"
                    )
            yield (
                record[text_field]
                if pair_field is None
                else (record[text_field], record[pair_field])
            )


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
