"""JSON Lines (one JSON object a line), read with errors that name the file and the line: what
fine-tuning's custom task files and `egbert embed`'s input share."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

from egbert.errors import DataError


def jsonl_objects(path: str | os.PathLike, lines: Iterable[str]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of `lines`, the decoded text of the JSON
    Lines file `path` (each caller decodes as its options say); DataError naming `path:line`
    where a line is no JSON object."""
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        except (ValueError, RecursionError) as error:  # 5000-digit numbers, [[[[...]]]]
            message = str(error).splitlines()[0] if str(error) else "nested too deeply"
            raise DataError(f"{path}:{number}: not valid JSON ({message})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object per line")
        if "\\u" in text and _has_lone_surrogate(row):
            raise DataError(f"{path}:{number}: a \\u escape stands for half a character")
        yield number, row


def _has_lone_surrogate(row: dict) -> bool:
    """Whether a \\uD800-style escape left half a UTF-16 pair (no text file can hold it)."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
