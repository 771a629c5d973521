"""`egbert reward`: train a scoring model on preference pairs (egbert.alignment.reward)."""

from __future__ import annotations

from egbert.alignment.reward import RewardArguments, accuracy_line, train_reward_model
from egbert.arguments import parse_args

DESCRIPTION = (
    "Train a scoring (reward) model on preference pairs with TRL's RewardTrainer: the model "
    "learns to score each pair's chosen text above its rejected one. The result is a sequence "
    "classifier with one output, its logit the reward, which egbert rlhf (or any "
    "AutoModelForSequenceClassification user) reads."
)
EPILOG = (
    "Pairs come from a file or data set with chosen and rejected (and optionally prompt) "
    "columns, or from a labelled task's sentences (--pairs-from-task sst2: a positive sentence "
    "over a negative one). The held-out pairs' accuracy (the share scored the right way round) "
    "is printed with its 95% bootstrap interval and written to OUTPUT_DIR/reward_results.json; "
    "the model goes to OUTPUT_DIR/model/. Example: egbert reward --model runs/bert-mini "
    "--pairs-from-task sst2 --data-dir data/glue --output-dir runs/reward"
)


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((RewardArguments,), argv, "egbert reward", DESCRIPTION, epilog=EPILOG)
    output = train_reward_model(args)
    print(f"egbert reward: {accuracy_line(output.results)}; the model: {output.model_dir}")
