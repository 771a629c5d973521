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

The budget is wall-clock time on whatever device runs it. Pretraining gets PRETRAIN_SHARE of it;
the probe and the prompts are of fixed size from a 10-minute budget up (smaller below); fine-tuning
gets what is left, each run its share less the per-run costs (start-up, data, evaluation, saving)
measured on the runs before it. So the whole run ends within about 20% of --budget-minutes on a
CPU or GPU. `plan.json` keeps the options, each run's allotted minutes and the time spent, so
that a rerun after an interruption (SIGTERM or Ctrl-C stop the run in progress with a
checkpoint) goes on where it stopped, with the same allotments.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import transformers
from transformers import PreTrainedTokenizerBase, set_seed

from egbert.arguments import arguments_from_options, parse_args
from egbert.config import MODEL_FAMILIES, load_recipe
from egbert.errors import ConfigError, DataError
from egbert.evaluation import probe, prompting
from egbert.finetune import run as finetune_run
from egbert.finetune.metrics import glue_score
from egbert.finetune.tasks import GLUE_TASKS, available_tasks, get_task, split_file
from egbert.models.heads import CLASSIFIER_FEATURES
from egbert.pretrain import run as pretrain_run
from egbert.pretrain.sources import load_hub_documents
from egbert.report import read_train_results
from egbert.runtime import bf16_pays_off, training_device
from egbert.tokenizer import (
    FAMILY_OF_MODEL_TYPE,
    format_stats,
    load_tokenizer,
    tokenizer_stats,
    train_tokenizer,
)

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WIKITEXT = Path("corpus") / "wikitext-2"
GUTENBERG = Path("corpus") / "gutenberg"
PLAN_FILE = "plan.json"
# The budget's shares. Pretraining: of the whole budget, split among the families; bert, the
# family the fine-tuning comparison is about, gets half. (At 0.4 a 30-minute run on 2 CPU cores
# ended after 23.6 minutes: the fine-tunes of the tiny preset finish their epochs early.)
PRETRAIN_SHARE = 0.5
FAMILY_SHARES = {"bert": 0.5, "gpt": 0.25, "elmo": 0.25}
# Fine-tuning: each run trains for its share of the time left with the options of the
# quickstart-finetune section of its family's recipe (egbert/configs/recipes/).
# Fine-tuning seeds of bert and its twin at most (while the time left allows them).
MAX_SEEDS = 3
# Per-run costs assumed before any run of a stage has been measured.
FIRST_OVERHEAD_SECONDS = {"pretrain": 20.0, "finetune": 8.0}
MIN_TRAIN_SECONDS = 1.0
# The probe and the prompts: fixed sizes, small enough for seconds per task on a CPU. The probe's
# options: the quickstart-probe section of the recipes (egbert/configs/recipes/common.yaml).
PROBE_RECIPE = load_recipe(None, "quickstart-probe")
PROBE_TRAIN_SAMPLES = PROBE_RECIPE["max_train_samples"]
PROMPT_TASKS = ("sst2", "rte", "mrpc", "qnli", "cola")
PROMPT_SHOTS = (0, 4)
PROMPT_EVAL_SAMPLES = 200
# Below this budget the probe's training examples and the prompts' dev examples shrink with it
# (to a tenth at most): at full size they took 100 s of a 3-minute run's 180 on a busy GPU machine.
EVALUATION_FULL_MINUTES = 10.0


def evaluation_sizes(budget_minutes: float) -> tuple[int, int]:
    """(probe training examples, prompt dev examples) per task for a budget."""
    scale = min(max(budget_minutes / EVALUATION_FULL_MINUTES, 0.1), 1.0)
    return round(PROBE_TRAIN_SAMPLES * scale), round(PROMPT_EVAL_SAMPLES * scale)


# Dev sets that do not move at this scale (scores near the majority class, a few examples apart):
# shown apart, not averaged.
APART = ("wnli",)
# Pretraining's final evaluation: the first examples of WikiText-2 valid (all of it took elmo
# 100 s of a 30-minute budget on 2 CPU cores).
VALIDATION_EXAMPLES = 512
# WikiText-2 and Project Gutenberg on the Hub, for the model cards' metadata.
CARD_DATASETS = ["Salesforce/wikitext", "manu/project_gutenberg"]


# Classifier heads by name: what the classifier reads (egbert finetune --features), and "-frozen"
# to train the head alone (--freeze).
HEADS = [f"{features}{frozen}" for features in CLASSIFIER_FEATURES for frozen in ("", "-frozen")]


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
    preset: str = field(default="tiny", metadata={"help": "model size of all three families"})
    tasks: list[str] = field(
        default_factory=list, metadata={"help": "GLUE tasks (default: all with local files)"}
    )
    vocab_size: int = field(default=16000, metadata={"help": "the tokenizer's vocabulary"})
    seed: int = field(default=42, metadata={"help": "pretraining and first fine-tuning seed"})
    from_hub: bool = field(
        default=False,
        metadata={"help": "load WikiText-2 and GLUE from the Hugging Face hub (needs the network)"},
    )
    heads: list[str] = field(
        default_factory=lambda: ["cls"],
        metadata={
            "help": "classifier heads to fine-tune with: "
            f"{', '.join(HEADS)} (-frozen trains the head alone); each adds a row per model"
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


@dataclass
class Plan:
    """What a run was started with and how its time went: the options a rerun must share, the
    minutes allotted to each run (kept, so a resumed run keeps its schedule) and the seconds
    spent on finished work (a rerun goes on with what is left)."""

    options: dict[str, Any]
    bf16: bool
    allotted_minutes: dict[str, float] = field(default_factory=dict)
    run_seconds: dict[str, float] = field(default_factory=dict)  # each fine-tuning run's wall time
    spent_seconds: float = 0.0
    overheads: dict[str, list[float]] = field(default_factory=dict)


class Budget:
    """The run's wall clock, saved in plan.json after each finished step."""

    def __init__(self, plan: Plan, path: Path, minutes: float) -> None:
        self.plan, self.path = plan, path
        self.total = minutes * 60
        self.started = time.perf_counter() - plan.spent_seconds

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.started)

    def save(self) -> None:
        self.plan.spent_seconds = time.perf_counter() - self.started
        temp = self.path.with_suffix(".partial")
        temp.write_text(json.dumps(asdict(self.plan), indent=2) + "\n", encoding="utf-8")
        temp.replace(self.path)

    def overhead(self, stage: str) -> float:
        """The median per-run cost (wall time beyond training) of the stage's runs so far."""
        seen = self.plan.overheads.get(stage)
        return statistics.median(seen) if seen else FIRST_OVERHEAD_SECONDS[stage]

    def allot(self, key: str, seconds: float, stage: str) -> float:
        """Training minutes of the run `key`: its share `seconds` less the stage's per-run cost;
        decided once (a rerun resumes it with the same schedule)."""
        if key not in self.plan.allotted_minutes:
            training = max(seconds - self.overhead(stage), MIN_TRAIN_SECONDS)
            self.plan.allotted_minutes[key] = round(training / 60, 4)
            self.save()
        return self.plan.allotted_minutes[key]

    def record(self, stage: str, wall_seconds: float, train_seconds: float) -> None:
        self.plan.overheads.setdefault(stage, []).append(round(wall_seconds - train_seconds, 2))
        self.save()


class Stopped(Exception):
    """A signal stopped a training run; its checkpoint is saved."""


# ---------------------------------------------------------------- data


def find_data(path: str | os.PathLike | None) -> Path:
    """The data folder: --data, else $EGBERT_DATA, else ../shared/data beside the checkout."""
    data = Path(path or os.environ.get("EGBERT_DATA") or DEFAULT_DATA)
    corpus = data / WIKITEXT / "wiki.train.tokens"
    if not corpus.is_file():
        raise DataError(
            f"{corpus}: not found; point --data (or EGBERT_DATA) at a folder with "
            "corpus/wikitext-2/wiki.{train,valid}.tokens and glue/<TASK>/ files, or pass "
            "--from-hub to download WikiText-2 and GLUE through `datasets`"
        )
    return data


def corpus_files(data: Path) -> tuple[list[Path], list[Path]]:
    """Pretraining files (WikiText-2 train + any Gutenberg books) and validation files."""
    train = [data / WIKITEXT / "wiki.train.tokens", *sorted((data / GUTENBERG).glob("*.txt"))]
    valid = [path for path in [data / WIKITEXT / "wiki.valid.tokens"] if path.is_file()]
    return train, valid


def check_hub_reachable() -> None:
    """Fail in seconds, not after minutes of retries, when the hub cannot be reached."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        raise DataError(
            "--from-hub: HF_HUB_OFFLINE is set, so the hub cannot be used; unset it, or drop "
            "--from-hub and point --data at local files"
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(endpoint, timeout=5)  # noqa: S310 (the hub's own https URL)
    except OSError as error:
        raise DataError(
            f"--from-hub: cannot reach {endpoint} ({error.__class__.__name__}: offline?); drop "
            "--from-hub and point --data at local WikiText-2 and GLUE files"
        ) from None


def export_hub_corpus(target: Path, name: str = "wikitext", config: str = "wikitext-2-v1") -> Path:
    """Write a hub text data set's train and validation splits as the local WikiText-2 files
    under `target` (a data folder), so every later step reads local files; returns `target`."""
    folder = target / WIKITEXT
    for split, file_name in (("train", "wiki.train.tokens"), ("validation", "wiki.valid.tokens")):
        path = folder / file_name
        if path.is_file():
            continue
        documents = load_hub_documents(name, split=split, config_name=config)
        folder.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(".partial")
        with temp.open("w", encoding="utf-8") as out:
            for row in documents:
                out.write(row["text"].rstrip("\n") + "\n")
        temp.replace(path)
    return target


def resolve_tasks(requested: Sequence[str], glue: Path | None) -> list[str]:
    """The tasks to fine-tune on: those asked for, else every task with local train+dev files."""
    if requested:
        names = [get_task(name).name for name in requested]  # unknown names raise
        unusable = [n for n in names if "train" not in GLUE_TASKS[n].files]
        if unusable:
            raise ConfigError(f"--tasks {', '.join(unusable)}: no training split in GLUE")
        if glue is not None:
            present = set(available_tasks(glue))
            missing = [n for n in names if n not in present]
            if missing:
                raise DataError(
                    f"{glue}: no train and dev files for {', '.join(missing)}; "
                    f"present: {', '.join(sorted(present)) or 'none'}"
                )
        return names
    if glue is None:
        return ["cola", "sst2", "mrpc", "stsb", "rte"]
    names = available_tasks(glue) if glue.is_dir() else []
    if not names:
        raise DataError(
            f"{glue}: no GLUE task with train and dev files (e.g. RTE/train.tsv and "
            "RTE/dev.tsv); point --data at a folder with glue/<TASK>/ or pass --tasks with "
            "--from-hub"
        )
    return names


# ---------------------------------------------------------------- steps that reuse their output


def prepare_tokenizer(
    output_dir: Path, corpus: Sequence[Path], vocab_size: int, encoding_errors: str = "strict"
) -> PreTrainedTokenizerBase:
    """The WordPiece tokenizer in output_dir/tokenizer, trained on the `corpus` files unless it
    is there (`encoding_errors`: what undecodable bytes do, as in `egbert tokenizer train`)."""
    tokenizer_dir = output_dir / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        print(f"  reusing {tokenizer_dir}", flush=True)
        return load_tokenizer(tokenizer_dir)
    files = str(corpus[0]) if len(corpus) == 1 else f"{len(corpus)} files"
    print(f"  training WordPiece ({vocab_size:,}) on {files}", flush=True)
    start = time.perf_counter()
    tokenizer = train_tokenizer(
        corpus, vocab_size=vocab_size, out_dir=tokenizer_dir, encoding_errors=encoding_errors
    )
    print(f"  trained in {time.perf_counter() - start:.1f} s, saved to {tokenizer_dir}")
    # Measured on the first file, the main corpus (tokenizer_stats decodes strictly).
    print(format_stats(tokenizer_stats(tokenizer, corpus[:1])), flush=True)
    return tokenizer


def is_finished(run_dir: Path) -> bool:
    """A training run's final model is written only after a run that was not interrupted."""
    model = run_dir / "model"
    return (model / "model.safetensors").is_file() and (model / "config.json").is_file()


def save_untrained(model, tokenizer, run_dir: Path) -> Path:
    """Save a model at its random initial weights like a pretrained one, as run_dir/model (all
    at once: a run killed meanwhile leaves nothing a rerun would take for a finished one)."""
    staging = run_dir / ".model.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(run_dir / "model")
    print(f"  {run_dir.name}: saved random weights to {run_dir}", flush=True)
    return run_dir


def save_twin(family: str, preset: str, seed: int, tokenizer, run_dir: Path) -> Path:
    """The family's model as `egbert pretrain` starts it (the preset with the family's defaults,
    pretraining's seed): its random initial weights."""
    if is_finished(run_dir):
        return run_dir
    set_seed(seed)
    blank = {"tokenizer": "", "train_files": [], "output_dir": ""}
    args, _ = pretrain_run.pretrain_arguments(model=family, preset=preset, **blank)
    model, _ = pretrain_run.build_model(args, tokenizer)
    return save_untrained(model, tokenizer, run_dir)


def pretraining_summary(run_dir: Path) -> dict[str, Any]:
    """Steps, tokens, minutes and the final validation metrics of a finished pretraining run."""
    results = read_train_results(run_dir)
    return {
        "steps": results.get("step", 0),
        "tokens": results.get("tokens"),
        "minutes": round(results.get("elapsed_seconds", 0.0) / 60, 2),
        "eval": results.get("metrics", {}),
    }


def finetune_once(run_dir: Path, **options: Any) -> tuple[dict[str, Any], bool]:
    """(eval results, whether it trained now): `run_finetuning` of one task into run_dir, or
    its eval_results.json if it finished; resumes a run that was stopped. Raises Stopped when a
    signal stops it again."""
    results = run_dir / "eval_results.json"
    if results.is_file():
        return json.loads(results.read_text(encoding="utf-8")), False
    resume = (run_dir / "checkpoints").is_dir()
    output = finetune_run.run_finetuning(output_dir=str(run_dir), resume=resume, **options)
    if output.interrupted:
        raise Stopped
    return output.results[0], True


# ---------------------------------------------------------------- tables


def metric_header(task: str) -> str:
    metric = {"cola": "Matthews", "mrpc": "F1/acc", "qqp": "F1/acc", "stsb": "Pearson/Spearman"}
    return f"{task} ({metric.get(task, 'acc')})"


def score_table(
    rows: dict[str, dict[str, float]], tasks: Sequence[str], extra: dict[str, str] | None = None
) -> str:
    """Markdown: one row per model, a column per task (GLUE score x 100), the average over the
    tasks not in APART, then those apart (and any `extra` column, e.g. per-seed averages)."""
    averaged = averaged_tasks(tasks)
    apart = [t for t in tasks if t in APART]
    columns = [*map(metric_header, averaged), "average", *(f"{metric_header(t)}*" for t in apart)]
    columns += list(extra or {})
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for label, scores in rows.items():
        cells = [f"{100 * scores[t]:.1f}" for t in averaged]
        cells.append(f"{100 * glue_score({t: scores[t] for t in averaged}):.1f}")
        cells += [f"{100 * scores[t]:.1f}" for t in apart]
        cells += [values.get(label, "") for values in (extra or {}).values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if apart:
        lines.append("")
        lines.append(f"\\* not averaged: {', '.join(apart)} dev sets do not move at this scale.")
    return "\n".join(lines)


def pretraining_table(pretraining: dict[str, dict]) -> str:
    lines = ["| model | steps | tokens | minutes | validation |", "|---|---:|---:|---:|---|"]
    for family, summary in pretraining.items():
        shown = ("mlm_loss", "mlm_accuracy", "nsp_accuracy", "perplexity")
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in summary["eval"].items() if k in shown)
        tokens = f"{summary['tokens']:,}" if summary["tokens"] is not None else "?"
        lines.append(
            f"| {family} | {summary['steps']:,} | {tokens} | {summary['minutes']:.1f} "
            f"| {metrics or 'none'} |"
        )
    return "\n".join(lines)


def plot_results(path: Path, scores: dict[str, dict[str, float]], tasks: Sequence[str]) -> None:
    """Grouped bars of the fine-tuning scores: one group per task (and the average)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    groups = [*tasks, "average"]
    width = 0.8 / max(len(scores), 1)
    figure, axes = plt.subplots(figsize=(max(6, 1.4 * len(groups)), 4))
    for index, (label, by_task) in enumerate(scores.items()):
        values = [100 * by_task[t] for t in tasks]
        values.append(100 * average(by_task, tasks))
        positions = [g + (index - (len(scores) - 1) / 2) * width for g in range(len(groups))]
        axes.bar(positions, values, width, label=label)
    axes.set_xticks(range(len(groups)), groups)
    axes.axhline(0, color="black", linewidth=0.5)
    axes.set_ylabel("dev score (GLUE metric x 100)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------------- the pipeline

DESCRIPTION = (
    "Run egbert's main pipeline on local data in a wall-clock budget: train the tokenizer, "
    "pretrain bert, gpt and elmo, probe every model and its random twin with frozen features, "
    "prompt gpt, fine-tune on the GLUE tasks present, and write results.md/.json/.png. A rerun "
    "reuses every finished step."
)
# A family's own classifier head in its recipe (elmo's): for the summary-vector head only.
HEAD_OPTIONS = ("features", "pool", "layer_norm")
TWIN = "{}-random"  # run folder of a family's twin at its random initial weights
REPORT_RESERVE_SECONDS = 10.0  # tables and plot at the end


def main(argv: list[str] | None = None) -> None:
    (args,) = parse_args((QuickstartArguments,), argv, "egbert quickstart", DESCRIPTION)
    quickstart(args)


def run_quickstart(**options: Any) -> dict[str, Any]:
    """`egbert quickstart` from Python: the keyword arguments are its options
    (QuickstartArguments fields); returns the report it writes to results.json ({} when a
    signal stopped it)."""
    (args,) = arguments_from_options((QuickstartArguments,), options)
    return quickstart(args)


def quickstart(args: QuickstartArguments) -> dict[str, Any]:
    """Tokenizer -> pretraining -> probe and prompts -> fine-tuning -> results."""
    output_dir = Path(args.output_dir)
    if args.from_hub:
        check_hub_reachable()
        data, glue = export_hub_corpus(output_dir / "hub-data"), None
    else:
        data = find_data(args.data)
        glue = data / "glue"
    tasks = resolve_tasks(args.tasks, glue)
    budget = start_budget(args, output_dir)
    print(f"[1/5] tokenizer -> {output_dir / 'tokenizer'}", flush=True)
    tokenizer = prepare_tokenizer(
        output_dir, [data / WIKITEXT / "wiki.train.tokens"], args.vocab_size
    )
    # every fine-tune loads a pretrained model under a new head: the report of its missing head
    # weights, dozens of times, would bury the progress
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return run_stages(args, budget, data, glue, tasks, tokenizer)
    except Stopped:
        print(
            "egbert quickstart: stopped; run the same command again to go on from there",
            flush=True,
        )
        return {}
    finally:
        transformers.logging.set_verbosity(verbosity)


def start_budget(args: QuickstartArguments, output_dir: Path) -> Budget:
    """The plan of this output folder: new, or the one a previous start left (then its options
    must be these)."""
    path = output_dir / PLAN_FILE
    options = asdict(args)
    if path.is_file():
        plan = Plan(**json.loads(path.read_text(encoding="utf-8")))
        changed = [
            f"{name} {plan.options.get(name)} -> {value}"
            for name, value in options.items()
            if name != "output_dir" and plan.options.get(name) != value
        ]
        if changed:
            raise ConfigError(
                f"{output_dir} holds a quickstart run made with other options "
                f"({'; '.join(changed)}); pass another --output-dir, or the same options"
            )
        print(f"  reusing {path} ({plan.spent_seconds / 60:.1f} min spent)", flush=True)
    else:
        plan = Plan(options=options, bf16=bf16_pays_off(training_device()))
        output_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(plan, path, args.budget_minutes)
    budget.save()
    return budget


def run_stages(
    args: QuickstartArguments,
    budget: Budget,
    data: Path,
    glue: Path | None,
    tasks: list[str],
    tokenizer: PreTrainedTokenizerBase,
) -> dict[str, Any]:
    output_dir = Path(args.output_dir)
    precision = "bf16" if budget.plan.bf16 else "fp32 (bf16 is slower here)"
    print(
        f"[2/5] pretraining bert, gpt and elmo ({args.preset}, {precision}) for "
        f"{PRETRAIN_SHARE * args.budget_minutes:.1f} of {args.budget_minutes:g} minutes",
        flush=True,
    )
    models = pretrain_families(args, budget, data)
    for family in MODEL_FAMILIES:
        twin = TWIN.format(family)
        models[twin] = save_twin(
            family, args.preset, args.seed, tokenizer, output_dir / "pretrain" / twin
        )
    pretraining = {family: pretraining_summary(models[family]) for family in MODEL_FAMILIES}
    glue_dir = glue or data / "glue"
    probe_size, prompt_size = evaluation_sizes(args.budget_minutes)
    print(
        f"[3/5] probing {len(models)} models ({probe_size} training examples a task); prompting "
        f"gpt and its twin ({prompt_size} dev examples a task)",
        flush=True,
    )
    start = time.perf_counter()
    probes = {
        name: evaluate_once(
            "probe",
            probe.run_probe,
            probe.RESULTS_FILE,
            path,
            budget,
            tasks=tasks,
            data_dir=glue_dir,
            seed=args.seed,
            features=PROBE_RECIPE["features"],
            pool=PROBE_RECIPE["pool"],
            max_train_samples=probe_size,
        )
        for name, path in models.items()
    }
    prompt_tasks = [t for t in PROMPT_TASKS if split_file(get_task(t), "validation", glue_dir)]
    prompts = {
        name: evaluate_once(
            "prompt-eval",
            prompting.run_prompt_eval,
            prompting.RESULTS_FILE,
            models[name],
            budget,
            tasks=prompt_tasks,
            data_dir=glue_dir,
            seed=args.seed,
            shots=PROMPT_SHOTS,
            max_eval_samples=prompt_size,
        )
        for name in ("gpt", TWIN.format("gpt"))
    }
    print(f"  probed and prompted in {time.perf_counter() - start:.0f} s", flush=True)
    finetuned = ["bert", TWIN.format("bert"), "gpt", "elmo"]
    print(f"[4/5] fine-tuning {', '.join(finetuned)} on {', '.join(tasks)}", flush=True)
    finetune = finetune_models({m: models[m] for m in finetuned}, tasks, glue, args, budget)
    print(f"[5/5] results -> {output_dir / 'results.md'}", flush=True)
    return write_report(
        output_dir, budget, tasks, prompt_tasks, pretraining, finetune, probes, prompts
    )


def pretrain_families(args: QuickstartArguments, budget: Budget, data: Path) -> dict[str, Path]:
    """Each family pretrained with `egbert pretrain`'s defaults for its share of the budget."""
    train_files, valid_files = corpus_files(data)
    output_dir = Path(args.output_dir)
    run_dirs = {}
    for family in MODEL_FAMILIES:
        run_dir = run_dirs[family] = output_dir / "pretrain" / family
        if is_finished(run_dir):
            print(f"  {family}: reusing {run_dir}", flush=True)
            continue
        share = budget.total * PRETRAIN_SHARE * FAMILY_SHARES[family]
        minutes = budget.allot(f"pretrain/{family}", share, "pretrain")
        print(f"  {family}: {minutes:.2f} minutes of training -> {run_dir}", flush=True)
        start = time.perf_counter()
        result = pretrain_run.run_pretraining(
            model=family,
            preset=args.preset,
            tokenizer=str(output_dir / "tokenizer"),
            train_files=list(map(str, train_files)),
            validation_files=list(map(str, valid_files)),
            max_eval_samples=VALIDATION_EXAMPLES,
            doc_boundary="wikitext",
            # Two Gutenberg books are Latin-1; their 7 non-ASCII bytes are not worth a pass.
            encoding_errors="replace",
            budget_minutes=minutes,
            bf16=budget.plan.bf16,
            seed=args.seed,
            save_every=500,
            keep_checkpoints=1,
            resume=(run_dir / "checkpoints").is_dir(),
            output_dir=str(run_dir),
            card_datasets=CARD_DATASETS,
        )
        if result.interrupted:
            raise Stopped
        budget.record("pretrain", time.perf_counter() - start, result.elapsed_seconds)
    return run_dirs


def evaluate_once(
    command: str, run: Any, results_file: str, model_dir: Path, budget: Budget, **options: Any
) -> dict:
    """`run`, the Python API of `egbert <command>`, on one model into <output>/<command>/<model>/,
    or the results file a finished run left there."""
    out = model_dir.parent.parent / command / model_dir.name
    if (out / results_file).is_file():
        return json.loads((out / results_file).read_text(encoding="utf-8"))
    print(f"  {command}: {model_dir.name}", flush=True)
    found = run(model_dir, output_dir=out, **options)
    budget.save()
    return found


def finetune_models(
    models: dict[str, Path],
    tasks: list[str],
    glue: Path | None,
    args: QuickstartArguments,
    budget: Budget,
) -> dict[str, dict[str, dict[int, float]]]:
    """{row: {task: {seed: score}}}. First every model with the first seed, task by task, each
    run of a task for the same minutes (its share of the time left); then, while the time left
    allows a task's runs again, bert and its twin with further seeds, task by task (not the
    tasks shown APART: no average holds them)."""
    tasks = sorted(tasks, key=lambda task: train_size(task, glue))  # small first: time left over
    first = [(task, [(name, args.seed) for name in models]) for task in tasks]
    scores = run_finetune_pass(first, models, glue, args, budget)
    pairs = [name for name in models if name in ("bert", TWIN.format("bert"))]
    for seed in range(args.seed + 1, args.seed + MAX_SEEDS):
        for task in averaged_tasks(tasks):
            keys = [run_key(name, head, task, seed) for name in pairs for head in args.heads]
            needed = sum(
                budget.plan.run_seconds.get(run_key(name, head, task, args.seed), 0.0)
                for name in pairs
                for head in args.heads
            )
            done = all(key in budget.plan.run_seconds for key in keys)
            if done or needed < budget.left() - REPORT_RESERVE_SECONDS:
                runs = [(task, [(name, seed) for name in pairs])]
                for row, by_task in run_finetune_pass(runs, models, glue, args, budget).items():
                    scores[row][task] |= by_task[task]
    return scores


def run_finetune_pass(
    plan: list[tuple[str, list[tuple[str, int]]]],
    models: dict[str, Path],
    glue: Path | None,
    args: QuickstartArguments,
    budget: Budget,
) -> dict[str, dict[str, dict[int, float]]]:
    """Fine-tune each (task, [(model, seed), ...]) of `plan` with every head: the runs of a task
    get the same minutes, the time left shared out over the runs left."""
    scores: dict[str, dict[str, dict[int, float]]] = {}
    total = sum(len(runs) for _, runs in plan) * len(args.heads)
    number = 0
    for task, runs in plan:
        for (name, seed), head in ((run, head) for run in runs for head in args.heads):
            key = run_key(name, head, task, seed)
            left = max(budget.left() - REPORT_RESERVE_SECONDS, 0.0)
            share = left / (total - number)
            minutes = budget.allot(f"finetune/{task}/seed{seed}", share, "finetune")
            number += 1
            print(f"  ({number}/{total}) {name} / {head} / {task} / seed {seed}", flush=True)
            start = time.perf_counter()
            options = finetune_options(models[name], task, head, seed, glue, budget.plan.bf16)
            run_dir = Path(budget.path.parent) / "finetune" / key
            result, trained = finetune_once(run_dir, budget_minutes=minutes, **options)
            if trained:
                budget.record("finetune", time.perf_counter() - start, result["train_seconds"])
                budget.plan.run_seconds[key] = round(time.perf_counter() - start, 2)
                budget.save()
            row = name if len(args.heads) == 1 else f"{name}, {head}"
            scores.setdefault(row, {}).setdefault(task, {})[seed] = result["score"]
    return scores


def run_key(name: str, head: str, task: str, seed: int) -> str:
    """A fine-tuning run's folder under finetune/ and its key in plan.json."""
    return f"{name}/{head}/{task}-seed{seed}"


def train_size(task: str, glue: Path | None) -> int:
    """Lines in a local GLUE task's training file (0 where the data comes from the hub)."""
    path = None if glue is None else split_file(get_task(task), "train", glue)
    if path is None:
        return 0
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def finetune_options(
    model_dir: Path, task: str, head: str, seed: int, glue: Path | None, bf16: bool
) -> dict[str, Any]:
    """`run_finetuning`'s options for one run (the budget's minutes are added by the caller):
    the quickstart-finetune recipe of the model's family with the head's options, or for the
    summary-vector head the family's own head where its recipe has one."""
    config = json.loads((model_dir / "model" / "config.json").read_text(encoding="utf-8"))
    recipe = load_recipe(FAMILY_OF_MODEL_TYPE.get(config["model_type"]), "quickstart-finetune")
    features = head.removesuffix("-frozen")
    if features != "cls":
        recipe = {name: value for name, value in recipe.items() if name not in HEAD_OPTIONS}
    return {
        "task": task,
        "model": str(model_dir),
        "data_dir": None if glue is None else str(glue),
        "seed": seed,
        "bf16": bf16,
        "predict": False,
        "features": features,
        "freeze": head.endswith("-frozen"),
        **recipe,
    }


# ---------------------------------------------------------------- the report


def label(name: str) -> str:
    """A table row's name: `bert`, or `bert (no pretraining)` for its twin (`, HEAD` kept)."""
    model, comma, head = name.partition(",")
    for family in MODEL_FAMILIES:
        if model == TWIN.format(family):
            return f"{family} (no pretraining){comma}{head}"
    return name


def averaged_tasks(tasks: Sequence[str]) -> list[str]:
    """The tasks that averages hold: all but those shown APART."""
    return [task for task in tasks if task not in APART]


def average(scores: dict[str, float], tasks: Sequence[str]) -> float:
    return glue_score({task: scores[task] for task in averaged_tasks(tasks)})


def seed_averages(runs: dict[str, dict[int, float]], tasks: Sequence[str]) -> list[float]:
    """The task average of each fine-tuning seed that every averaged task was run with."""
    averaged = averaged_tasks(tasks)
    common = set.intersection(*(set(runs[task]) for task in averaged))
    return [glue_score({task: runs[task][seed] for task in averaged}) for seed in sorted(common)]


def write_report(
    output_dir: Path,
    budget: Budget,
    tasks: list[str],
    prompt_tasks: list[str],
    pretraining: dict[str, dict],
    finetune: dict[str, dict[str, dict[int, float]]],
    probes: dict[str, dict],
    prompts: dict[str, dict],
) -> dict[str, Any]:
    """Every table to results.md/.json (and the fine-tuning scores to results.png), printed."""
    finetuned = {
        label(name): {task: statistics.mean(by_seed.values()) for task, by_seed in runs.items()}
        for name, runs in finetune.items()
    }
    per_seed = {
        label(name): " / ".join(f"{100 * value:.1f}" for value in seed_averages(runs, tasks))
        for name, runs in finetune.items()
        if len(seed_averages(runs, tasks)) > 1
    }
    probed = {label(n): {t: r["tasks"][t]["score"] for t in tasks} for n, r in probes.items()}
    # a regression task's constant prediction correlates with nothing: 0
    majority = {t: probes["bert"]["tasks"][t]["majority_score"] or 0.0 for t in tasks}
    prompted = {
        f"{label(name)}, {k}-shot": {
            t: r["tasks"][t]["shots"][str(k)]["score"] for t in prompt_tasks
        }
        for name, r in prompts.items()
        for k in PROMPT_SHOTS
    }
    tables = {
        "pretraining": pretraining_table(pretraining),
        "fine-tuning": score_table(finetuned, tasks, {"seeds": per_seed} if per_seed else None),
        "probe": score_table({**probed, "majority class": majority}, tasks),
        "k-shot prompting": score_table(prompted, prompt_tasks),
    }
    twin_of = {name: TWIN.format("bert") + name.removeprefix("bert") for name in finetune}
    margins = {
        f"fine-tuning, {name}": average(finetuned[label(name)], tasks)
        - average(finetuned[label(twin_of[name])], tasks)
        for name in finetune
        if name.partition(",")[0] == "bert"
    }
    for family in MODEL_FAMILIES:
        margins[f"probe, {family}"] = average(probed[family], tasks) - average(
            probed[label(TWIN.format(family))], tasks
        )
    report = {
        "plan": asdict(budget.plan),
        "tasks": tasks,
        "not_averaged": [t for t in tasks if t in APART],
        "pretraining": pretraining,
        "scores": finetuned,
        "finetune_by_seed": finetune,
        "probe": probed,
        "probe_majority": majority,
        "prompting": prompted,
        "margins_over_twin": {name: round(100 * value, 2) for name, value in margins.items()},
        "tables": tables,
        "minutes": round((budget.total - budget.left()) / 60, 2),
    }
    markdown = "\n\n".join(f"## {name}\n\n{table}" for name, table in tables.items())
    (output_dir / "results.md").write_text(markdown + "\n", encoding="utf-8")
    (output_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_results(output_dir / "results.png", finetuned, tasks)
    budget.save()
    print(markdown)
    gains = ", ".join(f"{name} {100 * value:+.1f}" for name, value in margins.items())
    print(f"\npretrained against untrained twin (average points): {gains}", flush=True)
    print(f"quickstart: {report['minutes']:.1f} of {budget.total / 60:g} minutes", flush=True)
    return report
