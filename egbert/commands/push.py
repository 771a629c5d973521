"""`egbert push`: upload a model folder to the Hugging Face Hub (egbert.push)."""

from __future__ import annotations

from egbert.arguments import ArgumentParser, BooleanFlag
from egbert.push import describe, push_to_hub


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(
        "egbert push",
        description="Upload a model folder (or a run directory's model/ folder) to the Hugging "
        "Face Hub: weights, config, tokenizer, model card and modeling code, nothing else.",
    )
    parser.add_argument("--repo-id", required=True, help="Hub repository, USER/NAME")
    parser.add_argument("--folder", required=True, help="model folder or run directory")
    parser.add_argument("--private", action=BooleanFlag, help="create the repository private")
    parser.add_argument("--revision", help="branch to push to (default: main)")
    parser.add_argument("--commit-message", help="commit message on the Hub")
    parser.add_argument(
        "--dry-run", action=BooleanFlag, help="print the files that would go up, upload nothing"
    )
    options = vars(parser.parse_args(argv))
    plan = push_to_hub(**options)
    print(describe(plan, options["repo_id"], options["dry_run"]))
