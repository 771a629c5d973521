"""`egbert prompt-eval`: score a gpt model by k-shot prompting (egbert.evaluation.prompting)."""

from __future__ import annotations

from egbert.evaluation.prompting import (
    RESULTS_FILE,
    build_parser,
    results_table,
    run_prompt_eval,
)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    results = run_prompt_eval(**vars(args))
    for name, task in results["tasks"].items():
        if "note" in task:
            print(f"egbert prompt-eval: {name}: {task['note']}")
    print(results_table(results))
    if args.output_dir is not None:
        print(f"egbert prompt-eval: wrote {args.output_dir / RESULTS_FILE}")
