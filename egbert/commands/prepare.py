"""`egbert prepare`: tokenize a corpus once into a prepared folder (egbert.pretrain.prepare)."""

from __future__ import annotations

from egbert.pretrain.prepare import parse_prepare_args, prepare


def main(argv: list[str] | None = None) -> None:
    manifest = prepare(*parse_prepare_args(argv))
    splits = manifest["splits"]
    train, validation = splits["train"], splits.get("validation", {}).get("examples")
    print(
        f"egbert: {manifest['family']} examples in {manifest['folder']}: "
        f"{train['examples']:,} for training ({train['tokens']:,} {manifest['dtype']} tokens "
        f"from {train['documents']:,} documents)"
        + (f", {validation:,} for validation" if validation is not None else ""),
        flush=True,
    )
