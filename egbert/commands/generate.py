"""`egbert generate`: continue a prompt with a gpt model (egbert.generate)."""

from __future__ import annotations

from dataclasses import asdict

from egbert.arguments import parse_args
from egbert.generate import GenerateArguments, generate_text

DESCRIPTION = "Continue a prompt with a gpt model, streaming the text to stdout."


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((GenerateArguments,), argv, "egbert generate", DESCRIPTION)
    options = asdict(args)
    generate_text(options.pop("model"), **options)  # --model is generate_text's model_dir
