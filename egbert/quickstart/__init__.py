"""`egbert quickstart`: the main job end to end on local data, in a wall-clock budget; a rerun
reuses every finished step.

    egbert quickstart [--data PATH] [--output-dir runs/quickstart] [--budget-minutes 30]

1. trains the shared WordPiece tokenizer on WikiText-2 train;
2. pretrains bert (masked LM + next-sentence prediction), gpt and elmo at one preset on
   WikiText-2 train + the Gutenberg books with `egbert pretrain`'s defaults, each for its share of
   the budget, and saves each family's twin at its random initial weights;
3. probes every model and twin with frozen features (`egbert probe`), and scores gpt and its twin
   by k-shot prompting (`egbert prompt-eval`);
4. fine-tunes bert and its twin, gpt and elmo on every GLUE task whose train and dev files are
   present, every model of a task for the same time; then bert and its twin with more seeds on
   the averaged tasks while the budget allows (the table gives each seed's average);
5. writes `results.md` and `results.json` (every table: pretraining, fine-tuning, probe, k-shot)
   and `results.png`, and prints the tables.

The budget is wall-clock time on whatever device runs it. Pretraining gets PRETRAIN_SHARE of it.
The probe and the prompts get EVALUATION_SHARE at most: they start at a size (examples per task)
set by the budget, and a model and its twin after the first pair run smaller where the runs
measured before say the share left needs it (the probe of every model still runs, at its
smallest size; the prompts are skipped when even theirs would not fit; results say which sizes
were used). Fine-tuning gets what is left, each run its share less the per-run costs (start-up,
data, evaluation, saving) measured on the runs before it. So the whole run ends within about 20%
of --budget-minutes on a CPU or GPU. `plan.json` keeps the options, each run's allotted minutes
and sizes and the time spent, so that a rerun after an interruption (SIGTERM or Ctrl-C stop the
run in progress with a checkpoint) goes on where it stopped, with the same allotments.

The package: `options` (QuickstartArguments and every default, in one block), `budget` (the plan:
pure functions, and plan.json), `steps` (the stages' reusable parts, public for scripts),
`report` (typed rows and tables), `run` (the pipeline, top to bottom).
"""

from egbert.quickstart.budget import Budget, EvaluationRun, Plan, evaluation_size, planned_size
from egbert.quickstart.options import NOT_AVERAGED, QuickstartArguments
from egbert.quickstart.report import Evaluation, Row, score_table, task_average
from egbert.quickstart.run import main, quickstart, run_quickstart
from egbert.quickstart.steps import (
    PretrainingSummary,
    RunStopped,
    corpus_files,
    find_data,
    finetune_once,
    finetune_options,
    is_finished,
    local_glue_tasks,
    prepare_tokenizer,
    pretraining_summary,
    save_untrained,
)

__all__ = [
    "Budget",
    "Evaluation",
    "EvaluationRun",
    "NOT_AVERAGED",
    "Plan",
    "PretrainingSummary",
    "QuickstartArguments",
    "Row",
    "RunStopped",
    "corpus_files",
    "evaluation_size",
    "find_data",
    "finetune_once",
    "finetune_options",
    "is_finished",
    "local_glue_tasks",
    "main",
    "planned_size",
    "prepare_tokenizer",
    "pretraining_summary",
    "quickstart",
    "run_quickstart",
    "save_untrained",
    "score_table",
    "task_average",
]
