"""`egbert prompt-eval`: score a gpt model by k-shot prompting (egbert.evaluation.prompting)."""

from __future__ import annotations

from dataclasses import asdict

from egbert.arguments import parse_args
from egbert.evaluation.prompting import (
    RESULTS_FILE,
    PromptEvalArguments,
    prompt_table,
    run_prompt_eval,
)
from egbert.evaluation.results import print_results

DESCRIPTION = (
    "k-shot prompting of a gpt model: each dev example follows k demonstrations from the "
    "training split, and the label whose answer words the model finds likeliest is the "
    "prediction. Scored with GLUE's metric; nothing is trained."
)
EPILOG = (
    "For each k, one draw of demonstrations (balanced over the labels, seeded) serves every "
    "example; whole demonstrations are dropped from the front when the prompt would not fit the "
    "model's positions (the table's 'demonstrations kept' column). QNLI has no train split in "
    "the shared data: its demonstrations come from dev and are not scored. --calibrate divides "
    "each example's label probabilities by those the same demonstrations give a content-free "
    '"N/A" example (Zhao et al. 2021). Example: egbert prompt-eval --model runs/gpt-mini --task '
    "sst2 rte --shots 0 4 16 --calibrate --max-eval-samples 500 --data-dir data/glue"
)


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args(
        (PromptEvalArguments,), argv, "egbert prompt-eval", DESCRIPTION, epilog=EPILOG
    )
    results = run_prompt_eval(**asdict(args))
    for name, task in results["tasks"].items():
        if "note" in task:
            print(f"egbert prompt-eval: {name}: {task['note']}")
    print_results("prompt-eval", prompt_table(results), args.output_dir, RESULTS_FILE)
