"""`egbert prompt-eval`: score a gpt model by k-shot prompting (egbert.evaluation.prompting)."""

from __future__ import annotations

from egbert.evaluation.prompting import RESULTS_FILE, build_parser, prompt_table, run_prompt_eval
from egbert.evaluation.results import print_results


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    results = run_prompt_eval(**vars(args))
    for name, task in results["tasks"].items():
        if "note" in task:
            print(f"egbert prompt-eval: {name}: {task['note']}")
    print_results("prompt-eval", prompt_table(results), args.output_dir, RESULTS_FILE)
