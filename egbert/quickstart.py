"""`egbert quickstart`: the main job end to end on local data; a rerun reuses finished steps.

    egbert quickstart [--data PATH] [--output-dir runs/quickstart] [--budget-minutes 30]

1. train the shared WordPiece tokenizer on WikiText-2 train;
2. pretrain bert, gpt and elmo at one preset on WikiText-2 train + the Gutenberg books, all for
   the same number of training sequences (the pretraining share of the budget is split by each
   family's step time, measured on a few random batches first);
3. fine-tune each of them, and a randomly initialised bert ("no pretraining"), on every GLUE task
   whose train and dev files are present;
4. write `results.md` (rows: models; columns: tasks and their average), `results.json` and
   `results.png` (grouped bars) in the output directory, and print the table.

The plan (preset, budget, steps) is saved in `plan.json`, so a rerun trains nothing that is
already trained: a finished model or fine-tune is reused, an interrupted one resumes from its
last checkpoint. `scripts/glue_table.py` runs the same pipeline with more classifier heads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, set_seed

from egbert.config import MODEL_FAMILIES, PretrainArguments
from egbert.errors import ConfigError, DataError
from egbert.finetune import run as finetune_run
from egbert.finetune.metrics import glue_score
from egbert.finetune.tasks import GLUE_TASKS, available_tasks, get_task
from egbert.optimization import adamw
from egbert.pretrain import run as pretrain_run
from egbert.pretrain.data import load_hub_documents
from egbert.runtime import bf16_pays_off, keep_freed_memory_in_process
from egbert.tokenizer import format_stats, load_tokenizer, tokenizer_stats, train_tokenizer

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WIKITEXT = Path("corpus") / "wikitext-2"
GUTENBERG = Path("corpus") / "gutenberg"
SCRATCH = "bert-random"  # the randomly initialised twin of bert
PRETRAIN_SHARE = 0.45  # of the budget; fine-tuning gets the rest
BATCH_SIZE, SEQ_LEN = 32, 128
# Fine-tuning examples per task at a 30-minute budget with six tasks, scaled with the budget
# and shared out among the fine-tunes of each model; tuned where the three families' tiny
# training steps took this long together (bf16 on a 2-core CPU with native bf16), and scaled by
# the measured step times elsewhere, so that a slower machine or a larger preset keeps to the
# budget.
SAMPLES_PER_30_MINUTES = 3000
REFERENCE_STEP_SECONDS = 0.19 + 0.34 + 1.11
PRETRAIN_LR = 1e-3
FINETUNE_LR = 1e-4


@dataclass(frozen=True)
class Head:
    """How a classifier reads its model: features, pooling, and whether the model is frozen."""

    features: str = "cls"
    pool: str = "cls"
    freeze: bool = False

    @property
    def name(self) -> str:
        pool = f"-{self.pool}" if self.pool != "cls" else ""
        return f"{self.features}{pool}{'-frozen' if self.freeze else ''}"

    def flags(self) -> list[str]:
        flags = ["--features", self.features, "--pool", self.pool]
        return flags + (["--freeze"] if self.freeze else [])


@dataclass
class Plan:
    """The scale of a run, fixed at its first start so that a rerun reuses what it made."""

    preset: str
    budget_minutes: float
    vocab_size: int
    pretrain_steps: int
    step_seconds: dict[str, float]
    finetune_samples: int
    epochs: int
    seed: int
    families: list[str] = field(default_factory=lambda: list(MODEL_FAMILIES))
    # bf16 autocast where it is faster than fp32 (plans written before this field used it)
    bf16: bool = True

    def precision_flags(self) -> list[str]:
        return ["--bf16"] if self.bf16 else []


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


# ---------------------------------------------------------------- tokenizer


def prepare_tokenizer(output_dir: Path, corpus: Path, vocab_size: int) -> PreTrainedTokenizerBase:
    tokenizer_dir = output_dir / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        print(f"  reusing {tokenizer_dir}", flush=True)
        return load_tokenizer(tokenizer_dir)
    print(f"  training WordPiece ({vocab_size:,}) on {corpus}", flush=True)
    start = time.perf_counter()
    tokenizer = train_tokenizer([corpus], vocab_size=vocab_size, out_dir=tokenizer_dir)
    print(f"  trained in {time.perf_counter() - start:.1f} s, saved to {tokenizer_dir}")
    print(format_stats(tokenizer_stats(tokenizer, [corpus])), flush=True)
    return tokenizer


# ---------------------------------------------------------------- planning


def probe_batch(family: str, vocab_size: int, generator: torch.Generator) -> dict:
    """A random training batch of the family's shape: 15% masked labels and NSP labels for bert,
    next-token labels (shifted inside the model) for gpt and elmo."""
    input_ids = torch.randint(10, vocab_size, (BATCH_SIZE, SEQ_LEN), generator=generator)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if family != "bert":
        return batch | {"labels": input_ids}
    masked = torch.rand(input_ids.shape, generator=generator) < 0.15
    return batch | {
        "token_type_ids": torch.zeros_like(input_ids),
        "labels": input_ids.masked_fill(~masked, -100),
        "next_sentence_label": torch.randint(0, 2, (BATCH_SIZE,), generator=generator),
    }


def training_device() -> str:
    """Where the trainer will train: the GPU if there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def seconds_per_step(family: str, preset: str, tokenizer, bf16: bool, steps: int = 3) -> float:
    """Median wall time of an AdamW training step of the family at the preset."""
    args = PretrainArguments(model=family, tokenizer="", train_files=[], preset=preset)
    model, _ = pretrain_run.build_model(args, tokenizer)
    device = training_device()
    model.to(device).train()
    keep_freed_memory_in_process(device)  # as the trainer does
    optimizer = adamw(model.parameters(), device, lr=1e-4)  # the trainer's optimizer
    batch = probe_batch(family, model.config.vocab_size, torch.Generator().manual_seed(0))
    batch = {name: tensor.to(device) for name, tensor in batch.items()}
    times = []
    for _ in range(steps + 1):  # the first step pays for allocations
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):  # as training will
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def make_plan(args: argparse.Namespace, tokenizer, n_finetunes: int) -> Plan:
    """Share the budget out: one step count for every family, from their measured step times."""
    device = training_device()
    bf16 = bf16_pays_off(device)
    precision = "bf16 autocast" if bf16 else f"fp32 (bf16 is slower than fp32 on this {device})"
    print(f"  timing a few training steps of each family in {precision}", flush=True)
    step_seconds = {f: seconds_per_step(f, args.preset, tokenizer, bf16) for f in MODEL_FAMILIES}
    seconds_per_round = sum(step_seconds.values())  # one step of every family
    pretrain_seconds = args.budget_minutes * 60 * PRETRAIN_SHARE
    steps = max(1, int(pretrain_seconds / seconds_per_round))
    speed = REFERENCE_STEP_SECONDS / seconds_per_round
    per_finetune = 6 / max(n_finetunes, 1)
    samples = args.max_train_samples or max(
        32, round(SAMPLES_PER_30_MINUTES * speed * args.budget_minutes / 30 * per_finetune)
    )
    return Plan(
        preset=args.preset,
        budget_minutes=args.budget_minutes,
        vocab_size=args.vocab_size,
        pretrain_steps=steps,
        step_seconds={f: round(s, 3) for f, s in step_seconds.items()},
        finetune_samples=samples,
        epochs=args.epochs,
        seed=args.seed,
        bf16=bf16,
    )


def load_or_make_plan(args: argparse.Namespace, tokenizer, n_finetunes: int) -> Plan:
    path = args.output_dir / "plan.json"
    if path.is_file():
        plan = Plan(**json.loads(path.read_text(encoding="utf-8")))
        asked = {"preset": args.preset, "budget_minutes": args.budget_minutes}
        asked |= {"vocab_size": args.vocab_size, "epochs": args.epochs, "seed": args.seed}
        if args.max_train_samples:
            asked["finetune_samples"] = args.max_train_samples
        changed = [
            f"{k} {getattr(plan, k)} -> {v}" for k, v in asked.items() if getattr(plan, k) != v
        ]
        if changed:
            raise ConfigError(
                f"{args.output_dir} holds a quickstart run made with other options "
                f"({'; '.join(changed)}); pass another --output-dir, or the same options"
            )
        print(f"  reusing {path}", flush=True)
        return plan
    plan = make_plan(args, tokenizer, n_finetunes)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".partial")
    temp.write_text(json.dumps(asdict(plan), indent=2) + "\n", encoding="utf-8")
    temp.replace(path)
    return plan


# ---------------------------------------------------------------- pretraining


def is_finished(run_dir: Path) -> bool:
    """The trainer writes the final model only after a run that was not interrupted."""
    model = run_dir / "model"
    return (model / "model.safetensors").is_file() and (model / "config.json").is_file()


def pretrain_family(
    family: str, plan: Plan, output_dir: Path, data: Path, tokenizer_dir: Path
) -> Path:
    run_dir = output_dir / "pretrain" / family
    if is_finished(run_dir):
        print(f"  {family}: reusing {run_dir}", flush=True)
        return run_dir
    train_files, valid_files = corpus_files(data)
    argv = [
        "--model", family, "--preset", plan.preset, "--tokenizer", str(tokenizer_dir),
        "--train-files", *map(str, train_files),
        "--doc-boundary", "wikitext",
        # Two Gutenberg books are Latin-1; their 7 non-ASCII bytes are not worth a second pass.
        "--encoding-errors", "replace",
        "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH_SIZE),
        "--max-steps", str(plan.pretrain_steps),
        "--lr", str(PRETRAIN_LR), "--warmup-steps", "0.06",
        "--save-every", str(max(50, plan.pretrain_steps // 5)), "--keep-checkpoints", "1",
        *plan.precision_flags(), "--seed", str(plan.seed), "--output-dir", str(run_dir),
    ]  # fmt: skip
    if valid_files:
        argv += ["--validation-files", *map(str, valid_files)]
    if (run_dir / "checkpoints").is_dir():
        argv.append("--resume")
    print(f"  {family}: {plan.pretrain_steps:,} steps of {BATCH_SIZE} x {SEQ_LEN} -> {run_dir}")
    pretrain_run.main(argv)
    return run_dir


def random_bert(plan: Plan, output_dir: Path, tokenizer) -> Path:
    """bert at the same preset with its initial random weights, saved like a pretrained one."""
    run_dir = output_dir / "pretrain" / SCRATCH
    if is_finished(run_dir):
        print(f"  {SCRATCH}: reusing {run_dir}", flush=True)
        return run_dir
    set_seed(plan.seed)
    args = PretrainArguments(model="bert", tokenizer="", train_files=[], preset=plan.preset)
    model, _ = pretrain_run.build_model(args, tokenizer)
    return save_untrained(model, tokenizer, run_dir)


def save_untrained(model, tokenizer, run_dir: Path) -> Path:
    """Save a model at its random initial weights like a pretrained one (all at once: a run
    killed meanwhile leaves no half-written folder for a rerun to mistake for a finished one)."""
    staging = run_dir / ".model.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(run_dir / "model")
    print(f"  {run_dir.name}: saved random weights to {run_dir}", flush=True)
    return run_dir


def pretraining_summary(run_dir: Path) -> dict:
    """Steps, tokens, minutes and the final validation metrics of a pretraining run."""
    records = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    state_files = sorted(run_dir.glob("checkpoints/step-*/trainer_state.json"))
    tokens = json.loads(state_files[-1].read_text())["tokens_seen"] if state_files else None
    return {
        "steps": train[-1]["step"] if train else 0,
        "tokens": tokens,
        "minutes": round(train[-1]["elapsed_s"] / 60, 2) if train else 0.0,
        "eval": {k: v for k, v in (evals[-1] if evals else {}).items() if k not in ("split",)},
    }


# ---------------------------------------------------------------- fine-tuning


def finetune(
    model_dir: Path, task: str, head: Head, plan: Plan, run_dir: Path, data: Path | None
) -> dict:
    """Fine-tune one model on one task with one head; reuses a finished result."""
    results = run_dir / "eval_results.json"
    if results.is_file():
        print(f"    reusing {run_dir}", flush=True)
        return json.loads(results.read_text(encoding="utf-8"))
    argv = [
        "--task", task, "--model", str(model_dir), "--output-dir", str(run_dir),
        "--epochs", str(1 if task == "sst2" else plan.epochs), "--lr", str(FINETUNE_LR),
        "--batch-size", "32", "--max-seq-length", "128", "--seed", str(plan.seed),
        "--max-train-samples", str(plan.finetune_samples), *plan.precision_flags(), "--no-predict",
        *head.flags(),
    ]  # fmt: skip
    if data is not None:
        argv += ["--data-dir", str(data / "glue")]
    if (run_dir / "checkpoints").is_dir():
        argv.append("--resume")
    finetune_run.main(argv)
    return json.loads(results.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- results


def row_label(model: str, head: Head, several_heads: bool) -> str:
    name = "bert (no pretraining)" if model == SCRATCH else model
    return f"{name}, {head.name}" if several_heads else name


def results_table(scores: dict[str, dict[str, float]], tasks: Sequence[str]) -> str:
    """Markdown: one row per model, one column per task (its GLUE score x 100) and the average."""
    header = "| model | " + " | ".join(metric_header(t) for t in tasks) + " | average |"
    lines = [header, "|---|" + "---:|" * (len(tasks) + 1)]
    for label, by_task in scores.items():
        cells = [f"{100 * by_task[t]:.1f}" for t in tasks]
        average = 100 * glue_score({t: by_task[t] for t in tasks})
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {average:.1f} |")
    return "\n".join(lines)


def metric_header(task: str) -> str:
    metric = {
        "cola": "Matthews",
        "mrpc": "F1/acc",
        "qqp": "F1/acc",
        "stsb": "Pearson/Spearman",
    }.get(task, "acc")
    return f"{task} ({metric})"


def plot_results(path: Path, scores: dict[str, dict[str, float]], tasks: Sequence[str]) -> None:
    """Grouped bars: one group per task (and the average), one bar per model."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    groups = [*tasks, "average"]
    width = 0.8 / max(len(scores), 1)
    figure, axes = plt.subplots(figsize=(max(6, 1.4 * len(groups)), 4))
    for index, (label, by_task) in enumerate(scores.items()):
        values = [100 * by_task[t] for t in tasks]
        values.append(100 * glue_score({t: by_task[t] for t in tasks}))
        positions = [g + (index - (len(scores) - 1) / 2) * width for g in range(len(groups))]
        axes.bar(positions, values, width, label=label)
    axes.set_xticks(range(len(groups)), groups)
    axes.axhline(0, color="black", linewidth=0.5)
    axes.set_ylabel("dev score (GLUE metric x 100)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_results(output_dir: Path, report: dict, table: str, tasks: Sequence[str]) -> None:
    (output_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (output_dir / "results.md").write_text(table + "\n", encoding="utf-8")
    plot_results(output_dir / "results.png", report["scores"], tasks)


# ---------------------------------------------------------------- the pipeline


def resolve_tasks(requested: Sequence[str] | None, data: Path | None) -> list[str]:
    """The tasks to fine-tune on: those asked for, else every task with local train+dev files."""
    if requested:
        names = [get_task(name).name for name in requested]  # unknown names raise
        unusable = [n for n in names if "train" not in GLUE_TASKS[n].files]
        if unusable:
            raise ConfigError(f"--tasks {', '.join(unusable)}: no training split in GLUE")
        if data is not None:
            present = set(available_tasks(data / "glue"))
            missing = [n for n in names if n not in present]
            if missing:
                raise DataError(
                    f"{data / 'glue'}: no train and dev files for {', '.join(missing)}; "
                    f"present: {', '.join(sorted(present)) or 'none'}"
                )
        return names
    if data is None:
        return ["cola", "sst2", "mrpc", "stsb", "rte"]
    names = available_tasks(data / "glue") if (data / "glue").is_dir() else []
    if not names:
        raise DataError(
            f"{data / 'glue'}: no GLUE task with train and dev files (e.g. RTE/train.tsv and "
            "RTE/dev.tsv); point --data at a folder with glue/<TASK>/ or pass --tasks with "
            "--from-hub"
        )
    return names


def run_pipeline(args: argparse.Namespace, heads: Sequence[Head] = (Head(),)) -> dict:
    """Tokenizer -> pretraining -> fine-tuning -> results; returns the report it writes."""
    start = time.perf_counter()
    output_dir = args.output_dir
    if args.from_hub:
        check_hub_reachable()
        data = export_hub_corpus(output_dir / "hub-data")
        glue_data = None
    else:
        data = glue_data = find_data(args.data)
    tasks = resolve_tasks(args.tasks, glue_data)
    print(f"[1/4] tokenizer -> {output_dir / 'tokenizer'}", flush=True)
    tokenizer = prepare_tokenizer(
        output_dir, data / WIKITEXT / "wiki.train.tokens", args.vocab_size
    )
    plan = load_or_make_plan(args, tokenizer, len(tasks) * len(heads))
    print(
        f"[2/4] pretraining bert, gpt and elmo ({plan.preset}) for {plan.pretrain_steps:,} "
        f"steps of {BATCH_SIZE} x {SEQ_LEN} tokens each",
        flush=True,
    )
    model_dirs = {
        family: pretrain_family(family, plan, output_dir, data, output_dir / "tokenizer")
        for family in plan.families
    }
    pretraining = {family: pretraining_summary(path) for family, path in model_dirs.items()}
    model_dirs[SCRATCH] = random_bert(plan, output_dir, tokenizer)

    runs = [(model, head, task) for model in model_dirs for head in heads for task in tasks]
    print(
        f"[3/4] fine-tuning {len(model_dirs)} models x {len(heads)} head(s) on "
        f"{', '.join(tasks)} ({len(runs)} runs, at most {plan.finetune_samples:,} training "
        "examples each)",
        flush=True,
    )
    scores: dict[str, dict[str, float]] = {}
    for number, (model, head, task) in enumerate(runs, 1):
        run_dir = output_dir / "finetune" / model / head.name / task
        print(f"  ({number}/{len(runs)}) {model} / {head.name} / {task}", flush=True)
        result = finetune(model_dirs[model], task, head, plan, run_dir, glue_data)
        label = row_label(model, head, len(heads) > 1)
        scores.setdefault(label, {})[task] = result["score"]

    print(f"[4/4] results -> {output_dir / 'results.md'}", flush=True)
    table = results_table(scores, tasks)
    report = {
        "plan": asdict(plan),
        "tasks": tasks,
        "scores": scores,
        "pretraining": pretraining,
        "minutes": round((time.perf_counter() - start) / 60, 2),
    }
    write_results(output_dir, report, table, tasks)
    print(pretraining_table(pretraining))
    print()
    print(table, flush=True)
    return report


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


def build_parser(prog: str = "egbert quickstart") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run egbert's main pipeline on local data: train the tokenizer, pretrain "
        "bert, gpt and elmo for the same number of tokens, fine-tune each (and a randomly "
        "initialised bert) on the GLUE tasks present, and write results.md/.json/.png. A rerun "
        "reuses every finished step.",
    )
    parser.add_argument(
        "--data", help="data folder with corpus/ and glue/ (default: $EGBERT_DATA, else "
        "../shared/data beside the checkout)"
    )  # fmt: skip
    parser.add_argument(
        "--output-dir", type=Path, default=Path("runs/quickstart"), help="default: %(default)s"
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=30.0,
        help="about how long the whole run takes on 2 CPU cores (default: %(default)s); "
        f"{PRETRAIN_SHARE * 100:.0f}%% of it pretrains, the rest fine-tunes",
    )
    parser.add_argument(
        "--preset", default="tiny", help="model size of all three families (default: %(default)s)"
    )
    parser.add_argument(
        "--tasks", nargs="+", metavar="TASK", help="GLUE tasks (default: all with local files)"
    )
    parser.add_argument("--vocab-size", type=int, default=16000, help="default: %(default)s")
    parser.add_argument(
        "--max-train-samples",
        type=int,
        metavar="N",
        help="fine-tuning examples per task (default: scaled with the budget and the measured "
        "speed of training steps)",
    )
    parser.add_argument(
        "--epochs", type=int, default=3, help="fine-tuning epochs; SST-2 gets 1 (default: 3)"
    )
    parser.add_argument("--seed", type=int, default=42, help="default: %(default)s")
    parser.add_argument(
        "--from-hub",
        action="store_true",
        help="load WikiText-2 and GLUE from the Hugging Face hub (needs the network)",
    )
    return parser


def check_scale_args(args: argparse.Namespace) -> None:
    """--budget-minutes and --max-train-samples, shared with scripts that run at a budget."""
    if not args.budget_minutes > 0:
        raise ConfigError(f"--budget-minutes must be > 0, got {args.budget_minutes}")
    if args.max_train_samples is not None and args.max_train_samples < 1:
        raise ConfigError(f"--max-train-samples must be >= 1, got {args.max_train_samples}")


def check_args(args: argparse.Namespace) -> None:
    check_scale_args(args)
    if args.epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {args.epochs}")
    if args.from_hub and args.data:
        raise ConfigError("--from-hub and --data exclude each other: pick one source")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check_args(args)
    run_pipeline(args)


if __name__ == "__main__":
    main()
