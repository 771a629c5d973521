"""`egbert push`: upload a model folder to the Hugging Face Hub (egbert.push)."""

from __future__ import annotations

from dataclasses import asdict

from egbert.arguments import parse_args
from egbert.push import PushArguments, describe, push_to_hub

DESCRIPTION = (
    "Upload a model folder (or a run directory's model/ folder) to the Hugging Face Hub: "
    "weights, config, tokenizer, model card and modeling code, nothing else."
)


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((PushArguments,), argv, "egbert push", DESCRIPTION)
    plan = push_to_hub(**asdict(args))
    print(describe(plan, args.repo_id, args.dry_run))
