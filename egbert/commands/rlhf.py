"""`egbert rlhf`: tune a gpt model against a scoring model with RL (egbert.alignment.rlhf)."""

from __future__ import annotations

from egbert.alignment.rlhf import RLHFArguments, report_lines, train_policy
from egbert.arguments import parse_args
from egbert.lora import LoraArguments

DESCRIPTION = (
    "Tune a gpt model (an egbert gpt folder or a stock GPT-2) with reinforcement learning "
    "against a scoring model, on TRL's RLOOTrainer (or GRPOTrainer): for each prompt it samples "
    "a group of completions, the scorer scores each, and the policy moves toward the ones "
    "scored above their group's others, held near the starting model by a KL penalty. The "
    "result is a gpt folder that egbert generate and AutoModelForCausalLM load as before."
)
EPILOG = (
    "The scorer reads each prompt and completion with its own tokenizer and special tokens: an "
    "egbert reward output scores by its one logit, a classifier (egbert finetune's) by the "
    "probability of --reward-label. Prompts come from a file, or from a task's sentences "
    "(--prompts-from-task sst2: their first 2-8 words). Before and after training, the "
    "held-out prompts are completed with the same sampling seeds: OUTPUT_DIR/rlhf_results.json "
    "holds the mean reward's change with its 95% paired-bootstrap interval, the KL to the "
    "start per token and, with --validation-text, the perplexity; reward_kl.png plots the "
    "training's reward and KL. Example: egbert rlhf --model runs/gpt --reward-model "
    "runs/sst2/model --reward-label positive --prompts-from-task sst2 --data-dir data/glue "
    "--output-dir runs/rlhf"
)


def main(argv: list[str] | None = None) -> None:
    args, lora = parse_args(
        (RLHFArguments, LoraArguments), argv, "egbert rlhf", DESCRIPTION, epilog=EPILOG
    )
    output = train_policy(args, lora)
    for line in report_lines(output.results):
        print(f"egbert rlhf: {line}")
    print(f"egbert rlhf: the tuned model: {output.model_dir}")
