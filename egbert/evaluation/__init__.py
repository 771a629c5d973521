"""What a model learned without fine-tuning: a frozen-feature probe and k-shot prompting.

`run_probe` (`egbert probe`) fits a linear model on pooled frozen features; `run_prompt_eval`
(`egbert prompt-eval`) scores each label's words after k demonstrations with a gpt model. Both
score with GLUE's metrics from `egbert.finetune.metrics`.
"""

from egbert.evaluation.probe import run_probe
from egbert.evaluation.prompting import run_prompt_eval

__all__ = ["run_probe", "run_prompt_eval"]
