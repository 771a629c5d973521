"""`egbert quickstart`'s options (QuickstartArguments) and the defaults of its pipeline, in one
block: the budget's shares, the fine-tuning recipe, the probe's and the prompts' sizes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egbert.config import load_recipe
from egbert.errors import ConfigError
from egbert.models.heads import CLASSIFIER_FEATURES

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
WIKITEXT = Path("corpus") / "wikitext-2"
GUTENBERG = Path("corpus") / "gutenberg"
PLAN_FILE = "plan.json"
# The budget's shares. Pretraining gets what the fine-tuning (as planned: egbert.quickstart.planner)
# and the evaluation leave, at least the first of PRETRAIN_SHARES and at most the second, split
# among the families: bert, the family the fine-tuning comparison is about, gets half. (At 0.4 on
# 2 CPU cores bert would pretrain 5.7 minutes: its margins over the twin were measured after 7.)
PRETRAIN_SHARES = (0.45, 0.6)
FAMILY_SHARES = {"bert": 0.5, "gpt": 0.25, "elmo": 0.25}
# The probe and the prompts: at most this share of the whole budget, whatever the machine (their
# size alone, fixed by the budget, took 148 of a 3-minute run's 180 s on a busy GPU machine).
EVALUATION_SHARE = 0.2
# Of that share, the prompts take this part first: after the probes, which can run slower than
# measured, they were skipped (79e464e) or cut to a tenth of their size.
PROMPT_SHARE = 0.25
# Fine-tuning: each run trains for its share of the time left with the options of the
# quickstart-finetune section of its family's recipe (egbert/configs/recipes/); a family's own
# classifier head there (bert's last four layers, elmo's scalar mix) is for the summary-vector
# head (`cls`) only.
HEAD_OPTIONS = ("features", "pool", "layer_norm")
# Measuring each family's training steps at its presets and batches before planning: this
# share of the budget at most (egbert.quickstart.throughput).
MEASURE_SHARE = 0.03
# Fine-tuning seeds of bert and its twin at most (while the time left allows them).
MAX_SEEDS = 3
# Per-run costs assumed before any run of a stage has been measured.
FIRST_OVERHEAD_SECONDS = {"pretrain": 20.0, "finetune": 8.0}
MIN_TRAIN_SECONDS = 1.0
REPORT_RESERVE_SECONDS = 10.0  # tables and plot at the end
# The prompts at full size (dev examples a task), small enough for seconds per task on a CPU; the
# probe's is its recipe's max_train_samples (probe_options).
PROMPT_TASKS = ("sst2", "rte", "mrpc", "qnli", "cola")
PROMPT_SHOTS = (0, 4)
PROMPT_EVAL_SAMPLES = 200
# Below this budget the probe's training examples and the prompts' dev examples start smaller
# (to a tenth at most); within the run they shrink further to fit EVALUATION_SHARE, never below
# MIN_EVALUATION_SCALE of the full size.
EVALUATION_FULL_MINUTES = 10.0
MIN_EVALUATION_SCALE = 0.1
# Dev sets that do not move at this scale (scores near the majority class, a few examples apart):
# shown apart, not averaged.
NOT_AVERAGED = ("wnli",)
# Pretraining's final evaluation: the first examples of WikiText-2 valid (all of it took elmo
# 100 s of a 30-minute budget on 2 CPU cores).
VALIDATION_EXAMPLES = 512
# WikiText-2 and Project Gutenberg on the Hub, for the model cards' metadata.
CARD_DATASETS = ["Salesforce/wikitext", "manu/project_gutenberg"]

# Classifier heads by name: what the classifier reads (egbert finetune --features), and "-frozen"
# to train the head alone (--freeze).
HEADS = [f"{features}{frozen}" for features in CLASSIFIER_FEATURES for frozen in ("", "-frozen")]

DESCRIPTION = (
    "Run egbert's main pipeline on local data in a wall-clock budget: train the tokenizer, "
    "pretrain bert, gpt and elmo, probe every model and its random twin with frozen features, "
    "prompt gpt, fine-tune on the GLUE tasks present, and write results.md/.json/.png. A rerun "
    "reuses every finished step."
)


def probe_options(family: str | None) -> dict[str, Any]:
    """The probe's options for a family's models (features, pool, max_train_samples at full
    size): the quickstart-probe section of its recipe (egbert/configs/recipes/), common.yaml's
    for None."""
    return load_recipe(family, "quickstart-probe")


@dataclass
class QuickstartArguments:
    """The options of `egbert quickstart` (also `egbert.run_quickstart(**options)`)."""

    data: str | None = field(
        default=None,
        metadata={
            "help": "data folder with corpus/ and glue/ (default: $EGBERT_DATA, else "
            "../shared/data beside the checkout)"
        },
    )
    output_dir: str = field(default="runs/quickstart", metadata={"help": "where it all goes"})
    budget_minutes: float = field(
        default=30.0,
        metadata={"help": "wall-clock minutes for the whole run, on whatever device runs it"},
    )
    preset: str | None = field(
        default=None,
        metadata={
            "help": "model size of all three families (tiny, mini, small, base or a YAML file); "
            "default: the plan's choice for this machine, from measured throughput"
        },
    )
    tasks: list[str] = field(
        default_factory=list, metadata={"help": "GLUE tasks (default: all with local files)"}
    )
    vocab_size: int = field(default=16000, metadata={"help": "the tokenizer's vocabulary"})
    seed: int = field(default=42, metadata={"help": "pretraining and first fine-tuning seed"})
    from_hub: bool = field(
        default=False,
        metadata={"help": "load WikiText-2 and GLUE from the Hugging Face hub (needs the network)"},
    )
    replay: str | None = field(
        default=None,
        metadata={
            "help": "a finished quickstart folder: run its plan again into a new, empty "
            "--output-dir with its recorded steps, evaluation sizes and fine-tuning runs, the "
            "clock deciding nothing (the same results.json scores on the same machine); every "
            "other option is that run's"
        },
    )
    heads: list[str] = field(
        default_factory=lambda: ["cls"],
        metadata={
            "help": "classifier heads to fine-tune with: "
            f"{', '.join(HEADS)} (-frozen trains the head alone; cls is each family's own "
            "summary-vector head: bert's last four layers mean-pooled, elmo's scalar mix); "
            "each adds a row per model"
        },
    )

    def __post_init__(self) -> None:
        unknown = [head for head in self.heads if head not in HEADS]
        if unknown or not self.heads:
            raise ConfigError(f"--heads {' '.join(unknown)}: choose from {', '.join(HEADS)}")
        if not self.budget_minutes > 0:
            raise ConfigError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if self.from_hub and self.data:
            raise ConfigError("--from-hub and --data exclude each other: pick one source")
