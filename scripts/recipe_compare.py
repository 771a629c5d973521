"""Egbert's pretraining recipe against the stock transformers one at the same CPU budget (#9).

    python scripts/recipe_compare.py --budget-minutes 25 --preset mini [--tasks sst2 rte ...] \\
        [--output-dir runs/recipe-compare] [--data PATH] [--max-train-samples N] \\
        [--ablate local-attention nsp mask-rate whole-word-mask batch-size batch-ramp beta2 lr \\
        seq-len dropout pre-ln sparse-logits] \\
        [--families gpt elmo] [--finetune-seeds 42 43 44]

1. trains the WordPiece tokenizer (16k) once on WikiText-2 train + the Gutenberg books;
2. pretrains bert on that corpus for --budget-minutes twice: with the stock recipe
   (scripts/stock_recipe.py, plain transformers.Trainer) and with egbert's
   (`egbert.run_pretraining` with `egbert pretrain`'s bert defaults and EGBERT_RECIPE over them),
   and once more per --ablate candidate, egbert's recipe with that one choice flipped; saves
   egbert's model at its random initial weights as "scratch"; with --families, also pretrains gpt
   and/or elmo with their own defaults (FAMILY_RECIPE) and saves each at its random initial
   weights as its twin ("gpt, scratch");
3. fine-tunes every model identically with `egbert.run_finetuning` (quickstart's fine-tuning
   options, the head and lr by model type among them, so a twin is fine-tuned as its pretrained
   model; SST-2 for SST2_EPOCHS, the other tasks FINETUNE_EPOCHS) on the tasks, once per
   --finetune-seeds seed;
4. writes `results.md` (GLUE scores x 100, the mean over the seeds, and their average, plus a
   table of each seed's average when there are several, and an ablation table),
   `results.json` and `loss_curves.png` (training loss against minutes), and prints them.

With --time-to-loss FAMILY [...] it compares pretraining recipes by time instead (no GLUE):

    python scripts/recipe_compare.py --time-to-loss bert gpt elmo [--flip muon wsd ...] \\
        [--combine muon wsd ...] [--budget-minutes 25] [--preset mini]

each family's recipe twice (seeds 42 and 43: the run-to-run spread), each --flip option the
family has alone on top of it (default: all of them), and the --combine options together, each
validated on the first 256 examples of WikiText-2 valid every minute of training time (evaluation
not counted) and at the budget's end; time-to-loss/results.md tabulates tokens/s, the validation
loss at the budget's end and the minutes each run needs to reach the recipe's (the mean of its
seeds, interpolated on each run's curve), time-to-loss/loss_curves.png plots validation loss
against minutes.

A rerun reuses every finished step; a rerun with another preset, budget, vocabulary, sample
count or recipe on the same --output-dir is refused. SIGTERM or Ctrl-C stop the run in progress
with a checkpoint; the same command goes on from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import set_seed

import egbert

STOCK_SCRIPT = Path(__file__).resolve().with_name("stock_recipe.py")
# The data folder's layout (egbert quickstart's): WikiText-2, the Gutenberg books, GLUE's tasks.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WIKITEXT_TRAIN = Path("corpus") / "wikitext-2" / "wiki.train.tokens"
GUTENBERG = Path("corpus") / "gutenberg"
PRESETS = ("tiny", "mini", "small", "base")  # the sizes both recipes know
DEFAULT_TASKS = ["sst2", "mrpc", "stsb", "rte", "cola"]
SEED = 42
STOCK, EGBERT, SCRATCH = "stock", "egbert", "scratch"

# How every egbert run reads the corpus (the precision comes from use_bf16).
CORPUS = {
    "doc_boundary": "wikitext",
    # Two Gutenberg books are Latin-1 in a few bytes: replace those rather than stop.
    "encoding_errors": "replace",
}
# Egbert's recipe: `egbert.run_pretraining(model="bert", preset=P, budget_minutes=M)` with these
# options over its bert defaults (FAMILY_DEFAULTS in egbert.pretrain.run, which this comparison
# chose: batch 16, 40% masking, lr 1e-3, 6% warmup, heads that start on their neighbours, no
# dropout while pretraining; fine-tuning puts BERT's dropout back) and the preset's model
# config (sparse MLM logits, post-LN blocks: pre-LN averaged 1.8 GLUE points less in the
# 25-minute ablation). NSP is off, packing 128-token blocks: it cost 4.5 points in that
# ablation. AdamW's beta2 is the default 0.999: in the fp32 ablation 0.98 did not help (0.2 GLUE
# points less, the same MLM loss per minute, 0.07 nats more per step; README).
EGBERT_RECIPE: dict[str, Any] = {**CORPUS, "nsp": False}
# gpt and elmo (--families): `egbert.run_pretraining(model=F, ...)` with the family's defaults
# (elmo's FAMILY_DEFAULTS: lr, dropout, 64-token blocks); only the corpus reading, the precision
# and the budget's warmup are set.
FAMILIES = ("gpt", "elmo")
FAMILY_RECIPE: dict[str, Any] = {**CORPUS, "warmup_steps": 0.06}

# The same fine-tuning for every model: quickstart's (egbert.finetune_options: lr 1e-4,
# batch 32, 128 tokens, dropout 0.1 on whichever dropout the model has, no test predictions;
# elmo and its twin ELMo's own task head at lr 1e-3 (elmo's quickstart-finetune recipe), chosen
# by this comparison's pilots) with its summary-vector head, on every training example unless
# --max-train-samples; SST-2, 67k examples, gets one epoch instead of three.
HEAD = "cls"
FINETUNE_EPOCHS, SST2_EPOCHS = 3, 1
# WNLI's dev set (71 examples) does not move at this scale: shown apart, out of the averages.
NOT_AVERAGED = ("wnli",)
# A finished fine-tuning is reused only if it was made with this head and lr.
CHECKED_OPTIONS = ("features", "pool", "layer_norm", "lr")


@dataclass(frozen=True)
class Candidate:
    """A choice of egbert's recipe that --ablate flips: options of `egbert pretrain`, or fields
    of the bert model config (set through its config_overrides), all set to one value."""

    fields: tuple[str, ...]
    in_model_config: bool
    settings: tuple[Any, Any]  # the ablation uses the first of these the recipe does not use
    label: Callable[[Any], str]  # a setting as the row label shows it

    def flipped(self, recipe_value: Any) -> Any:
        return next(value for value in self.settings if value != recipe_value)


CANDIDATES = {
    "nsp": Candidate(("nsp",), False, (False, True), lambda on: "NSP" if on else "no NSP"),
    "mask-rate": Candidate(("mlm_probability",), False, (0.15, 0.4), lambda p: f"mask {p:.0%}"),
    "whole-word-mask": Candidate(
        ("whole_word_mask",),
        False,
        (True, False),
        lambda whole: "whole-word masking" if whole else "token masking",
    ),
    "batch-size": Candidate(("batch_size",), False, (32, 16), lambda size: f"batch {size}"),
    # The batch grows from --batch-size to 64 over the budget by accumulation (as in Cramming).
    "batch-ramp": Candidate(
        ("batch_ramp_to",),
        False,
        (64, None),
        lambda final: f"batch ramp to {final}" if final else "fixed batch",
    ),
    "beta2": Candidate(("adam_beta2",), False, (0.98, 0.999), lambda b: f"beta2 {b:g}"),
    "lr": Candidate(("lr",), False, (1e-3, 2e-3), lambda lr: f"lr {lr:.0e}".replace("e-0", "e-")),
    # Half-length blocks make about twice the steps; fine-tuning still reads 128 tokens.
    "seq-len": Candidate(("seq_len",), False, (64, 128), lambda n: f"{n}-token blocks"),
    "dropout": Candidate(
        ("hidden_dropout_prob", "attention_probs_dropout_prob"),
        True,
        (0.0, 0.1),
        lambda p: f"dropout {p:g}" if p else "no dropout",
    ),
    "pre-ln": Candidate(
        ("pre_layernorm",), True, (True, False), lambda pre: "pre-LN" if pre else "post-LN"
    ),
    "local-attention": Candidate(
        ("local_attention_init",),
        True,
        (False, True),
        lambda local: "heads start on neighbours" if local else "random attention init",
    ),
    "sparse-logits": Candidate(
        ("sparse_mlm_logits",),
        True,
        (False, True),
        lambda sparse: f"{'sparse' if sparse else 'dense'} MLM logits",
    ),
}


class RunStopped(Exception):
    """A signal stopped a training run; its checkpoint is saved (the same command goes on)."""


# ---------------------------------------------------------------- data and tokenizer


def find_data(path: str | None) -> Path:
    """The data folder: --data, else $EGBERT_DATA, else ../shared/data beside the checkout."""
    data = Path(path or os.environ.get("EGBERT_DATA") or DEFAULT_DATA)
    if not (data / WIKITEXT_TRAIN).is_file():
        raise egbert.DataError(
            f"{data / WIKITEXT_TRAIN}: not found; point --data (or EGBERT_DATA) at a folder "
            "with corpus/wikitext-2/wiki.train.tokens and glue/<TASK>/ files"
        )
    return data


def corpus_files(data: Path) -> list[Path]:
    """The pretraining corpus: WikiText-2 train and any Gutenberg books."""
    return [data / WIKITEXT_TRAIN, *sorted((data / GUTENBERG).glob("*.txt"))]


def glue_tasks(requested: Sequence[str], glue: Path) -> list[str]:
    """The tasks' names (an unknown one raises), checked for train and dev files before any
    pretraining starts."""
    tasks = [egbert.get_task(name) for name in requested]
    missing = [
        task.name
        for task in tasks
        if not all(egbert.split_file(task, split, glue) for split in ("train", task.eval_splits[0]))
    ]
    if missing:
        raise egbert.DataError(f"{glue}: no train and dev files for {', '.join(missing)}")
    return [task.name for task in tasks]


def train_tokenizer(output_dir: Path, files: Sequence[Path], vocab_size: int) -> Path:
    """The WordPiece tokenizer in output_dir/tokenizer, trained on the corpus unless it is there."""
    tokenizer_dir = output_dir / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        print(f"  reusing {tokenizer_dir}", flush=True)
    else:
        egbert.train_tokenizer(
            files, vocab_size=vocab_size, out_dir=tokenizer_dir, encoding_errors="replace"
        )
    return tokenizer_dir


# ---------------------------------------------------------------- options


def check_options(output_dir: Path, options: dict[str, Any]) -> None:
    """Record the options that shape every run; refuse to mix runs made with other ones (an
    option the folder has no record of is new to it, so nothing there used it: it is added)."""
    path = output_dir / "options.json"
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    changed = [f"{k} {saved[k]} -> {v}" for k, v in options.items() if saved.get(k, v) != v]
    if changed:
        raise egbert.ConfigError(
            f"{output_dir} holds runs made with other options ({'; '.join(changed)}); "
            "pass another --output-dir, or the same options"
        )
    if options.keys() - saved.keys():
        output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved | options, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- egbert's recipe and ablations


def recipe_options(family: str = "bert") -> dict[str, Any]:
    """What the comparison sets over `egbert pretrain`'s defaults for the family: bert
    EGBERT_RECIPE, gpt and elmo FAMILY_RECIPE; then the precision."""
    options = EGBERT_RECIPE if family == "bert" else FAMILY_RECIPE
    return {**options, "bf16": use_bf16()}


def recipe_record(family: str = "bert") -> dict[str, Any]:
    """The family's recipe as the folder and the report record it: its defaults in `egbert
    pretrain` with the comparison's options over them, so that a change of either shows."""
    return {**egbert.FAMILY_DEFAULTS.get(family, {}), **recipe_options(family)}


def recipe_arguments(
    preset: str, changes: dict[str, Any] | None = None, family: str = "bert"
) -> tuple[
    egbert.ModelArguments, egbert.DataArguments, egbert.ObjectiveArguments, egbert.TrainingArguments
]:
    """`egbert.run_pretraining`'s options under the family's recipe with `changes` over it, as
    it resolves them (files and folders left blank)."""
    blank = {"model": family, "tokenizer": "", "train_files": [], "output_dir": ""}
    options = {**blank, "preset": preset, **recipe_options(family), **(changes or {})}
    return egbert.pretrain_arguments(**options)


@functools.cache
def use_bf16() -> bool:
    """bf16 autocast for every run, the stock one and fine-tuning included, where it is faster
    than fp32 on this machine (CPUs without native bf16 run it hundreds of times slower)."""
    return egbert.bf16_pays_off(egbert.training_device())


def recipe_value(candidate: Candidate, preset: str) -> Any:
    """What egbert's recipe uses for the candidate's (first) field."""
    parts = recipe_arguments(preset)
    name = candidate.fields[0]
    if candidate.in_model_config:
        config = egbert.CONFIG_CLASSES["bert"](**egbert.load_preset("bert", preset))
        egbert.apply_config_overrides(config, parts[0].config_overrides)
        return getattr(config, name)
    return getattr(next(part for part in parts if hasattr(part, name)), name)


def plan_ablation(name: str, preset: str) -> dict[str, Any]:
    """How candidate `name` flips egbert's recipe: the row label, both settings as the tables
    show them, and the options of `egbert.run_pretraining` that do it."""
    candidate = CANDIDATES[name]
    recipe = recipe_value(candidate, preset)
    value = candidate.flipped(recipe)
    return {
        "label": f"{EGBERT}, {candidate.label(value)}",
        "recipe": candidate.label(recipe),
        "setting": candidate.label(value),
        "options": ablation_options(name, value, preset),
    }


def ablation_options(name: str, value: Any, preset: str) -> dict[str, Any]:
    """Options that set the candidate's fields to `value` over the recipe's (model config
    fields: the recipe's config_overrides with those fields changed)."""
    candidate = CANDIDATES[name]
    if not candidate.in_model_config:
        return dict.fromkeys(candidate.fields, value)
    overrides = recipe_arguments(preset)[0].config_overrides
    return {"config_overrides": with_fields(overrides, dict.fromkeys(candidate.fields, value))}


def with_fields(overrides: str | None, fields: dict[str, Any]) -> str:
    """--config-overrides `overrides` ("field=value,...") with `fields` set over it."""
    merged = dict(item.split("=") for item in overrides.split(",")) if overrides else {}
    merged |= {field: str(value).lower() for field, value in fields.items()}
    return ",".join(f"{field}={text}" for field, text in merged.items())


# ---------------------------------------------------------------- pretraining

SITTING_FILE = "sitting.json"  # when a budget run finished and from which commit


def is_finished(run_dir: Path) -> bool:
    """A training run writes its final model only when nothing interrupted it."""
    model = run_dir / "model"
    return (model / "model.safetensors").is_file() and (model / "config.json").is_file()


def stamp_sitting(run_dir: Path) -> None:
    """Record the day and the code of a budget run that just finished. A shared machine's speed
    changes from day to day (here the stock recipe's step took 2.5 s one day and 3.9 s another),
    so the same budget buys another number of steps, and a folder that reuses older runs has to
    show where they came from."""
    git = ["git", "-C", str(STOCK_SCRIPT.parent), "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    finished = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    sitting = {"finished_utc": finished, "commit": commit or None}
    (run_dir / SITTING_FILE).write_text(json.dumps(sitting) + "\n", encoding="utf-8")


def read_sitting(run_dir: Path) -> dict[str, Any]:
    """The run's stamp; runs made before stamping (or copied without it) have none."""
    path = run_dir / SITTING_FILE
    if not path.is_file():
        return {"finished_utc": None, "commit": None}
    return json.loads(path.read_text(encoding="utf-8"))


def sittings_differ(summaries: dict[str, dict[str, Any]]) -> bool:
    """True when the budget runs did not all finish on one known day."""
    days = {(s["finished_utc"] or "unknown")[:10] for s in summaries.values()}
    return len(days) > 1


def pretrain_stock(
    run_dir: Path, tokenizer_dir: Path, files: Sequence[Path], preset: str, budget: float
) -> Path:
    """The stock recipe in its own process, as a user would run it."""
    if is_finished(run_dir):
        print(f"  {STOCK}: reusing {run_dir}", flush=True)
        return run_dir
    command = [
        sys.executable, str(STOCK_SCRIPT), "--tokenizer", str(tokenizer_dir),
        "--train-files", *map(str, files), "--preset", preset, "--budget-minutes", str(budget),
        "--output-dir", str(run_dir), "--seed", str(SEED),
        "--bf16" if use_bf16() else "--no-bf16",
    ]  # fmt: skip
    print(f"  {STOCK}: {budget:g} min -> {run_dir}", flush=True)
    code = subprocess.run(command, check=False).returncode
    if code != 0 or not is_finished(run_dir):
        raise egbert.TrainingError(
            f"{STOCK_SCRIPT.name} failed (exit code {code}); see its output above"
        )
    stamp_sitting(run_dir)
    return run_dir


def pretrain_egbert(
    label: str,
    run_dir: Path,
    tokenizer_dir: Path,
    files: Sequence[Path],
    preset: str,
    budget: float,
    changes: dict[str, Any] | None = None,
    family: str = "bert",
    seed: int = SEED,
) -> Path:
    """Egbert's recipe for the family (with `changes` over it); resumes an interrupted run."""
    if is_finished(run_dir):
        print(f"  {label}: reusing {run_dir}", flush=True)
        return run_dir
    print(f"  {label}: {budget:g} min -> {run_dir}", flush=True)
    result = egbert.run_pretraining(
        model=family,
        preset=preset,
        tokenizer=str(tokenizer_dir),
        train_files=[str(path) for path in files],
        budget_minutes=budget,
        seed=seed,
        output_dir=str(run_dir),
        # for resuming, not part of the recipe
        save_every=500,
        keep_checkpoints=1,
        resume=(run_dir / "checkpoints").is_dir(),
        **{**recipe_options(family), **(changes or {})},
    )
    if result.interrupted:
        raise RunStopped
    stamp_sitting(run_dir)
    return run_dir


def save_scratch(
    label: str, run_dir: Path, tokenizer_dir: Path, preset: str, family: str = "bert"
) -> Path:
    """The family's recipe model at its random initial weights, saved like a pretrained one."""
    if is_finished(run_dir):
        print(f"  {label}: reusing {run_dir}", flush=True)
        return run_dir
    tokenizer = egbert.load_tokenizer(tokenizer_dir)
    model_args, _, objective_args, _ = recipe_arguments(preset, family=family)
    set_seed(SEED)
    model, _ = egbert.build_model(model_args, objective_args, tokenizer)
    return egbert.save_untrained(model, tokenizer, run_dir)


# ---------------------------------------------------------------- fine-tuning


def finetune(
    model_dir: Path,
    task: str,
    run_dir: Path,
    glue_dir: Path,
    max_train_samples: int | None,
    seed: int = SEED,
) -> float:
    """One model on one task with quickstart's fine-tuning; returns its GLUE score (a finished
    run made with the same head and lr is reused, an interrupted one resumed)."""
    options = egbert.finetune_options(model_dir, task, HEAD, seed, glue_dir, use_bf16())
    options["epochs"] = SST2_EPOCHS if task == "sst2" else FINETUNE_EPOCHS
    options["max_train_samples"] = max_train_samples
    finished = run_dir / "eval_results.json"
    if finished.is_file():
        results = json.loads(finished.read_text(encoding="utf-8"))
        check_finetune_options(run_dir, results, options)
        print(f"    reusing {run_dir}", flush=True)
        return results["score"]
    resume = (run_dir / "checkpoints").is_dir()
    output = egbert.run_finetuning(output_dir=str(run_dir), resume=resume, **options)
    if output.interrupted:
        raise RunStopped
    return output.results[0]["score"]


def finetune_dir(output_dir: Path, model_dir: Path, task: str, seed: int) -> Path:
    """finetune/MODEL/TASK for the default seed (so single-seed folders are reused as they
    are), finetune/MODEL/TASK-seedN for the others."""
    name = task if seed == SEED else f"{task}-seed{seed}"
    return output_dir / "finetune" / model_dir.name / name


def check_finetune_options(run_dir: Path, results: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse to reuse a fine-tuning made with another head or lr (CHECKED_OPTIONS; an option
    that neither names is `egbert finetune`'s default)."""
    defaults = {field.name: field.default for field in dataclasses.fields(egbert.FinetuneArguments)}
    recorded = results.get("options", {})
    used = {name: recorded.get(name, defaults.get(name)) for name in CHECKED_OPTIONS}
    wanted = {name: options.get(name, defaults.get(name)) for name in CHECKED_OPTIONS}
    if used != wanted:
        raise egbert.ConfigError(
            f"{run_dir} was fine-tuned with {used}, the comparison now uses {wanted}; "
            "pass another --output-dir, or delete that folder to fine-tune it again"
        )


# ---------------------------------------------------------------- results


def read_jsonl(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def loss_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(minutes of training, training loss) as the run logged them: the stock script's
    loss_curve.jsonl, or the train records of egbert's metrics.jsonl (curve_loss's field)."""
    if (run_dir / "loss_curve.jsonl").is_file():
        return [(r["minutes"], r["loss"]) for r in read_jsonl(run_dir / "loss_curve.jsonl")]
    records = read_jsonl(run_dir / "metrics.jsonl")
    field = curve_loss(run_dir)[0]
    return [(r["elapsed_s"] / 60, r[field]) for r in records if r.get("split") == "train"]


LOSS_NAMES = {"gpt": "causal LM", "elmo": "mean of forward and backward LM"}


def curve_loss(run_dir: Path) -> tuple[str, str]:
    """Which logged loss the curve shows and its name: the loss, except with replaced token
    detection, whose loss weighs the detection 50 times: there the generator's MLM loss."""
    args_file = run_dir / "pretrain_args.json"
    if not args_file.is_file():
        return "loss", "MLM"
    pretrain_args = json.loads(args_file.read_text(encoding="utf-8"))["pretrain"]
    if pretrain_args["model"] in LOSS_NAMES:
        return "loss", LOSS_NAMES[pretrain_args["model"]]
    if pretrain_args.get("objective") == "rtd":
        return "generator_loss", "generator's MLM"
    return "loss", "MLM + NSP" if pretrain_args["nsp"] else "MLM"


def pretraining_summary(run_dir: Path) -> dict[str, Any]:
    """Steps, minutes of training and the last logged training loss of a pretraining run."""
    curve = loss_curve(run_dir)
    if (run_dir / "recipe.json").is_file():
        recipe = json.loads((run_dir / "recipe.json").read_text(encoding="utf-8"))
        summary = {"steps": recipe["steps"], "minutes": recipe["minutes"]}
    else:
        results = egbert.read_train_results(run_dir)
        summary = {
            "steps": results.get("step", 0),
            "tokens": results.get("tokens"),
            "minutes": round(results.get("elapsed_seconds", 0.0) / 60, 2),
        }
    final_loss = curve[-1][1] if curve else None
    return (
        summary | {"loss": curve_loss(run_dir)[1], "final_loss": final_loss} | read_sitting(run_dir)
    )


def pretraining_table(summaries: dict[str, dict[str, Any]]) -> str:
    lines = ["| model | steps | minutes | final training loss | finished (UTC), commit |"]
    lines.append("|---|---:|---:|---|---|")
    for label, s in summaries.items():
        loss = f"{s['final_loss']:.3f} ({s['loss']})" if s["final_loss"] is not None else "none"
        sitting = f"{s['finished_utc']}, {s['commit']}" if s["finished_utc"] else "not recorded"
        lines.append(f"| {label} | {s['steps']:,} | {s['minutes']:.1f} | {loss} | {sitting} |")
    if sittings_differ(summaries):
        lines.append(
            "\nThe budget runs above did not all finish on one day: step counts (and so scores) "
            "compare fairly only within one sitting; a new --output-dir reruns them together."
        )
    return "\n".join(lines)


def task_average(scores: dict[str, float]) -> float | None:
    """The GLUE average of a row's scores, NOT_AVERAGED left out (None: no task left)."""
    average = egbert.glue_average(scores, leave_out=NOT_AVERAGED)
    return None if average is None else average.score


def seed_table(seed_scores: dict[str, dict[str, list[float]]], seeds: Sequence[int]) -> str:
    """Markdown: each model's task average per fine-tuning seed, their mean and their range."""
    header = "| model | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean | range |"
    lines = [header, "|---|" + "---:|" * (len(seeds) + 2)]
    for label, by_task in seed_scores.items():
        # zip(*...) turns {task: [score per seed]} into one (score per task) tuple per seed
        averages = [
            100 * task_average(dict(zip(by_task, seed_run, strict=True)))
            for seed_run in zip(*by_task.values(), strict=True)
        ]
        cells = [f"{average:.1f}" for average in averages]
        spread = max(averages) - min(averages)
        mean = sum(averages) / len(averages)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean:.1f} | {spread:.1f} |")
    return "\n".join(lines)


def ablation_table(ablations: dict[str, dict[str, Any]], averages: dict[str, float]) -> str:
    """One row per flipped candidate: the recipe's setting, the ablation's, and the GLUE
    average against egbert's."""
    lines = ["| candidate | egbert's recipe | ablation | average | vs egbert |"]
    lines.append("|---|---|---|---:|---:|")
    for name, ablation in ablations.items():
        average = averages[ablation["label"]]
        delta = average - averages[EGBERT]
        lines.append(
            f"| {name} | {ablation['recipe']} | {ablation['setting']} | {100 * average:.1f} "
            f"| {100 * delta:+.1f} |"
        )
    return "\n".join(lines)


def plot_loss_curves(path: Path, run_dirs: dict[str, Path]) -> None:
    """Training loss against minutes of training, one line per pretraining run."""
    figure, axes = pyplot().subplots(figsize=(7, 4.5))
    for label, run_dir in run_dirs.items():
        curve = loss_curve(run_dir)
        if curve:
            minutes, losses = zip(*curve, strict=True)
            style = "-" if label in (STOCK, EGBERT) else "--"
            axes.plot(minutes, losses, style, label=f"{label} ({curve_loss(run_dir)[1]})")
    label_axes(axes, "training loss")
    save_figure(figure, path)


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (no display on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label_axes(axes: Any, loss: str) -> None:
    axes.set_xlabel("minutes of training")
    axes.set_ylabel(loss)
    axes.legend(fontsize="small")


def save_figure(figure: Any, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot().close(figure)


# ---------------------------------------------------------------- time to loss (--time-to-loss)

# Every run is evaluated on the same held-out text, the first VALIDATION_SAMPLES examples of
# WikiText-2 valid (128-token blocks for bert and gpt, elmo's 64), at every EVAL_EVERY_MINUTES of
# training time (evaluation is not counted) and at the budget's end.
WIKITEXT_VALID = Path("corpus") / "wikitext-2" / "wiki.valid.tokens"
VALIDATION_SAMPLES = 256
EVAL_EVERY_MINUTES = 1.0
RECIPE_SEEDS = (SEED, SEED + 1)  # the family's recipe twice: the run-to-run spread
ALL_FAMILIES = ("bert", *FAMILIES)
TRANSFORMERS = ("bert", "gpt")


@dataclass(frozen=True)
class TimedOption:
    """An option --time-to-loss flips on a family's recipe: options of `egbert pretrain` and
    fields of the model config, for the families that have them."""

    options: dict[str, Any]
    config: dict[str, Any]
    families: tuple[str, ...]
    # bert's recipe starts its heads on their neighbours, which needs learned positions and
    # sets the query and key scale: rotary positions and QK-norm take that start's place there
    bert_config: dict[str, Any] = dataclasses.field(default_factory=dict)


NOT_LOCAL = {"local_attention_init": False}
NO_BIASES = dict.fromkeys(("attention_bias", "mlp_bias", "norm_bias"), False)
TIMED_OPTIONS = {
    "muon": TimedOption({"optim": "muon"}, {}, ALL_FAMILIES),
    "wsd": TimedOption({"schedule": "wsd"}, {}, ALL_FAMILIES),
    "rotary": TimedOption({}, {"position_embedding_type": "rotary"}, TRANSFORMERS, NOT_LOCAL),
    "gated-mlp": TimedOption({}, {"gated_mlp": True}, TRANSFORMERS),
    "rmsnorm": TimedOption({}, {"norm_type": "rmsnorm"}, TRANSFORMERS),
    "qk-norm": TimedOption({}, {"qk_norm": True}, TRANSFORMERS, NOT_LOCAL),
    "no-bias": TimedOption({}, NO_BIASES, TRANSFORMERS),
    "embedding-norm": TimedOption({}, {"embedding_norm": True}, ("gpt",)),  # bert has one
    "residual-attention": TimedOption({}, {"residual_attention": True}, ("bert",)),
}


@dataclass(frozen=True)
class TimedRun:
    """One --time-to-loss pretraining: the family's recipe with `changes` over it."""

    family: str
    label: str
    folder: str
    seed: int = SEED
    changes: dict[str, Any] = dataclasses.field(default_factory=dict)


def timed_runs(family: str, flip: Sequence[str], combine: Sequence[str], preset: str) -> list:
    """The family's runs: its recipe once per RECIPE_SEEDS seed, each option of `flip` it has
    alone, then the options of `combine` it has together (when that is not one of those)."""
    runs = [
        TimedRun(family, family, family)
        if seed == SEED
        else TimedRun(family, f"{family}, seed {seed}", f"{family}-seed{seed}", seed)
        for seed in RECIPE_SEEDS
    ]
    for group in [*([name] for name in flip), combine]:
        names = [name for name in group if family in TIMED_OPTIONS[name].families]
        label = f"{family}, {' + '.join(names)}"
        if names and label not in (run.label for run in runs):
            changes = timed_changes(names, family, preset)
            runs.append(TimedRun(family, label, f"{family}-{'+'.join(names)}", SEED, changes))
    return runs


def timed_changes(names: Sequence[str], family: str, preset: str) -> dict[str, Any]:
    """The options of `egbert.run_pretraining` that turn the named options on over the family's
    recipe (model config fields: the recipe's config_overrides with those fields set)."""
    options: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for name in names:
        option = TIMED_OPTIONS[name]
        options |= option.options
        config |= option.config | (option.bert_config if family == "bert" else {})
    if config:
        overrides = recipe_arguments(preset, family=family)[0].config_overrides
        options["config_overrides"] = with_fields(overrides, config)
    return options


def validation_options(data: Path) -> dict[str, Any]:
    """What every timed run adds to its recipe: the held-out text and its minute marks."""
    return {
        "validation_files": [str(data / WIKITEXT_VALID)],
        "max_eval_samples": VALIDATION_SAMPLES,
        "eval_every_minutes": EVAL_EVERY_MINUTES,
    }


def validation_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(minutes of training, validation loss) at each evaluation of the run."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    return [(r["elapsed_s"] / 60, r["loss"]) for r in records if r.get("split") == "eval"]


def minutes_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The training minutes at which the curve first reaches `target`, interpolated linearly
    between the evaluations on either side (None: it never does)."""
    before = None
    for minutes, loss in curve:
        if loss <= target:
            if before is None:
                return minutes
            return before[0] + (minutes - before[0]) * (before[1] - target) / (before[1] - loss)
        before = (minutes, loss)
    return None


def timed_summary(run: TimedRun, run_dir: Path) -> dict[str, Any]:
    """Steps, tokens/s, the validation curve and its last loss (the budget's end) of a run."""
    results = egbert.read_train_results(run_dir)
    curve = validation_curve(run_dir)
    return {
        "family": run.family,
        "seed": run.seed,
        "changes": run.changes,
        "steps": results["step"],
        "tokens_per_second": results["tokens"] / results["elapsed_seconds"],
        "curve": curve,
        "final_loss": curve[-1][1],
    } | read_sitting(run_dir)


def family_target(summaries: dict[str, dict[str, Any]], family: str) -> tuple[float, float]:
    """The family recipe's validation loss at the budget's end (the mean of its seeds) and the
    spread between its seeds."""
    losses = [
        s["final_loss"] for s in summaries.values() if s["family"] == family and not s["changes"]
    ]
    return sum(losses) / len(losses), max(losses) - min(losses)


def time_to_loss_table(summaries: dict[str, dict[str, Any]], family: str, budget: float) -> str:
    """Markdown: the family's runs, each with its tokens/s, its validation loss at the budget's
    end and the minutes it takes to reach the recipe's (speed-up: budget / those minutes)."""
    target, spread = family_target(summaries, family)
    lines = [
        f"| {family} run | steps | tokens/s | validation loss at {budget:g} min | vs recipe "
        f"| minutes to {target:.3f} | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, s in summaries.items():
        if s["family"] != family:
            continue
        minutes = minutes_to_reach(s["curve"], target)
        reached = "not reached" if minutes is None else f"{minutes:.1f}"
        speedup = "" if minutes is None else f"{budget / minutes:.2f}x"
        lines.append(
            f"| {label} | {s['steps']:,} | {s['tokens_per_second']:,.0f} | {s['final_loss']:.3f} "
            f"| {s['final_loss'] - target:+.3f} | {reached} | {speedup} |"
        )
    lines.append(
        f"\nThe recipe's seeds differ by {spread:.3f} at {budget:g} minutes: a default changes "
        "only on a win larger than that."
    )
    return "\n".join(lines)


def plot_validation_curves(path: Path, summaries: dict[str, dict[str, Any]]) -> None:
    """Validation loss against minutes of training, one panel per family, one line per run."""
    families = list(dict.fromkeys(s["family"] for s in summaries.values()))
    size = (6 * len(families), 4.5)
    figure, panels = pyplot().subplots(1, len(families), figsize=size, squeeze=False)
    for axes, family in zip(panels[0], families, strict=True):
        for label, s in summaries.items():
            if s["family"] == family and s["curve"]:
                minutes, losses = zip(*s["curve"], strict=True)
                axes.plot(minutes, losses, "--" if s["changes"] else "-", label=label)
        axes.set_title(f"{family} ({LOSS_NAMES.get(family, 'MLM')} loss)")
        label_axes(axes, "validation loss")
    save_figure(figure, path)


def run_time_to_loss(args: argparse.Namespace) -> dict[str, Any]:
    """Tokenizer -> each family's timed runs -> the time-to-loss tables; returns the report."""
    data = find_data(args.data)
    files = corpus_files(data)
    if not (data / WIKITEXT_VALID).is_file():
        raise egbert.DataError(f"{data / WIKITEXT_VALID}: not found; the held-out text is needed")
    output_dir, folder = args.output_dir, args.output_dir / "time-to-loss"
    recipes = {family: recipe_record(family) for family in args.time_to_loss}
    check_options(
        output_dir,
        {
            "preset": args.preset,
            "budget_minutes": args.budget_minutes,
            "vocab_size": args.vocab_size,
            "time_to_loss": {
                "recipes": recipes,
                "validation": {"samples": VALIDATION_SAMPLES, "every_minutes": EVAL_EVERY_MINUTES},
            },
        },
    )
    print(f"[1/3] tokenizer -> {output_dir / 'tokenizer'}", flush=True)
    tokenizer_dir = train_tokenizer(output_dir, files, args.vocab_size)
    runs = [
        run
        for family in args.time_to_loss
        for run in timed_runs(family, args.flip, args.combine, args.preset)
    ]
    print(
        f"[2/3] pretraining {len(runs)} runs ({args.preset}) for {args.budget_minutes:g} min "
        f"each, validated every {EVAL_EVERY_MINUTES:g} min",
        flush=True,
    )
    summaries = {}
    for run in runs:
        changes = {**run.changes, **validation_options(data)}
        run_dir = pretrain_egbert(
            run.label, folder / run.folder, tokenizer_dir, files, args.preset,
            args.budget_minutes, changes, run.family, run.seed,
        )  # fmt: skip
        summaries[run.label] = timed_summary(run, run_dir)

    print(f"[3/3] results -> {folder / 'results.md'}", flush=True)
    tables = [time_to_loss_table(summaries, family, args.budget_minutes) for family in recipes]
    report = {"preset": args.preset, "budget_minutes": args.budget_minutes, "recipes": recipes}
    report["runs"] = summaries
    (folder / "results.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (folder / "results.md").write_text("\n\n".join(tables) + "\n", encoding="utf-8")
    plot_validation_curves(folder / "loss_curves.png", summaries)
    print("\n\n".join(tables), flush=True)
    return report


# ---------------------------------------------------------------- the pipeline


def pretrain_all(
    args: argparse.Namespace, tokenizer_dir: Path, files: list[Path]
) -> tuple[dict[str, Path], dict[str, dict[str, Any]]]:
    """Every pretrained model (label -> directory: stock, egbert, the ablations, the families)
    and the ablations it includes."""
    pretrain_dir = args.output_dir / "pretrain"
    shared = (tokenizer_dir, files, args.preset, args.budget_minutes)
    run_dirs = {
        STOCK: pretrain_stock(pretrain_dir / STOCK, *shared),
        EGBERT: pretrain_egbert(EGBERT, pretrain_dir / EGBERT, *shared),
    }
    ablations = {}
    for name in args.ablate:
        ablation = ablations[name] = plan_ablation(name, args.preset)
        run_dir = pretrain_dir / f"{EGBERT}-ablate-{name}"
        label = ablation["label"]
        run_dirs[label] = pretrain_egbert(label, run_dir, *shared, changes=ablation["options"])
    for family in args.families:
        run_dirs[family] = pretrain_egbert(family, pretrain_dir / family, *shared, family=family)
    return run_dirs, ablations


def models_to_finetune(
    args: argparse.Namespace, run_dirs: dict[str, Path], tokenizer_dir: Path
) -> dict[str, Path]:
    """The pretrained bert models, egbert's scratch twin, then each family and its twin."""
    pretrain_dir = args.output_dir / "pretrain"
    model_dirs = {label: path for label, path in run_dirs.items() if label not in args.families}
    model_dirs[SCRATCH] = save_scratch(SCRATCH, pretrain_dir / SCRATCH, tokenizer_dir, args.preset)
    for family in args.families:
        twin = f"{family}, {SCRATCH}"
        model_dirs[family] = run_dirs[family]
        model_dirs[twin] = save_scratch(
            twin, pretrain_dir / f"{family}-{SCRATCH}", tokenizer_dir, args.preset, family
        )
    return model_dirs


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """Tokenizer -> pretraining -> fine-tuning -> results; returns the report it writes."""
    start = time.perf_counter()
    data = find_data(args.data)
    files = corpus_files(data)
    tasks = glue_tasks(args.tasks or DEFAULT_TASKS, data / "glue")
    output_dir = args.output_dir
    recipes = {"egbert_recipe": recipe_record()}
    recipes["family_recipe"] = {family: recipe_record(family) for family in FAMILIES}
    check_options(
        output_dir,
        {
            "preset": args.preset,
            "budget_minutes": args.budget_minutes,
            "vocab_size": args.vocab_size,
            "max_train_samples": args.max_train_samples,
            **recipes,
        },
    )
    print(f"[1/4] tokenizer -> {output_dir / 'tokenizer'}", flush=True)
    tokenizer_dir = train_tokenizer(output_dir, files, args.vocab_size)

    families = ", ".join(["bert", *args.families])
    print(
        f"[2/4] pretraining {families} ({args.preset}) for {args.budget_minutes:g} min each",
        flush=True,
    )
    run_dirs, ablations = pretrain_all(args, tokenizer_dir, files)
    pretraining = {label: pretraining_summary(path) for label, path in run_dirs.items()}
    model_dirs = models_to_finetune(args, run_dirs, tokenizer_dir)

    seeds = args.finetune_seeds
    runs = [(label, task, seed) for label in model_dirs for task in tasks for seed in seeds]
    print(
        f"[3/4] fine-tuning {len(model_dirs)} models on {', '.join(tasks)}, "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}",
        flush=True,
    )
    seed_scores: dict[str, dict[str, list[float]]] = {}
    for number, (label, task, seed) in enumerate(runs, 1):
        print(f"  ({number}/{len(runs)}) {label} / {task} / seed {seed}", flush=True)
        run_dir = finetune_dir(output_dir, model_dirs[label], task, seed)
        score = finetune(
            model_dirs[label], task, run_dir, data / "glue", args.max_train_samples, seed
        )
        seed_scores.setdefault(label, {}).setdefault(task, []).append(score)

    print(f"[4/4] results -> {output_dir / 'results.md'}", flush=True)
    scores = {
        label: {task: sum(per_seed) / len(per_seed) for task, per_seed in by_task.items()}
        for label, by_task in seed_scores.items()
    }
    averages = {label: task_average(by_task) for label, by_task in scores.items()}
    tables = [egbert.glue_score_table(scores, tasks, leave_out=NOT_AVERAGED)]
    if len(seeds) > 1:
        tables.append(seed_table(seed_scores, seeds))
    if ablations:
        tables.append(ablation_table(ablations, averages))
    report = {
        "preset": args.preset,
        "budget_minutes": args.budget_minutes,
        "tasks": tasks,
        **recipes,
        "finetune_seeds": seeds,
        "scores": scores,
        "seed_scores": seed_scores,
        "averages": averages,
        "pretraining": pretraining,
        "ablations": ablations,
        "minutes": round((time.perf_counter() - start) / 60, 2),
    }
    (output_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (output_dir / "results.md").write_text("\n\n".join(tables) + "\n", encoding="utf-8")
    plot_loss_curves(output_dir / "loss_curves.png", run_dirs)
    print(pretraining_table(pretraining))
    print()
    print("\n\n".join(tables), flush=True)
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="scripts/recipe_compare.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=25.0,
        help="pretraining minutes per run (default: %(default)s)",
    )
    parser.add_argument("--preset", choices=PRESETS, default="mini", help="default: %(default)s")
    parser.add_argument(
        "--tasks",
        nargs="+",
        metavar="TASK",
        help=f"GLUE tasks (default: {' '.join(DEFAULT_TASKS)})",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=Path("runs/recipe-compare"), help="default: %(default)s"
    )
    parser.add_argument(
        "--data",
        help="data folder with corpus/ and glue/ (default: $EGBERT_DATA, else ../shared/data "
        "beside the checkout)",
    )
    parser.add_argument(
        "--max-train-samples",
        type=int,
        metavar="N",
        help="fine-tuning examples per task (default: all)",
    )
    parser.add_argument("--vocab-size", type=int, default=16000, help="default: %(default)s")
    parser.add_argument(
        "--ablate",
        nargs="+",
        default=[],
        metavar="CANDIDATE",
        help=f"flip one choice of egbert's recipe per run: {', '.join(CANDIDATES)}",
    )
    parser.add_argument(
        "--families",
        nargs="+",
        default=[],
        choices=FAMILIES,
        help="also pretrain these families with their own defaults at the same budget, and "
        "fine-tune each next to its randomly initialised twin",
    )
    parser.add_argument(
        "--time-to-loss",
        nargs="+",
        default=[],
        choices=ALL_FAMILIES,
        metavar="FAMILY",
        help="instead of the GLUE comparison: pretrain each family's recipe twice (seeds "
        f"{' and '.join(map(str, RECIPE_SEEDS))}), then once per --flip option and once with the "
        "--combine options, validating every minute on WikiText-2 valid, and tabulate the "
        "minutes each run takes to reach the recipe's final validation loss",
    )
    parser.add_argument(
        "--flip",
        nargs="*",
        default=list(TIMED_OPTIONS),
        choices=TIMED_OPTIONS,
        metavar="OPTION",
        help="--time-to-loss: the options flipped alone, one run each, on the families that have "
        f"them ({', '.join(TIMED_OPTIONS)}; default: all; --flip alone: none)",
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        default=[],
        choices=TIMED_OPTIONS,
        metavar="OPTION",
        help="--time-to-loss: one more run per family with these options together",
    )
    parser.add_argument(
        "--finetune-seeds",
        nargs="+",
        type=int,
        default=[SEED],
        metavar="SEED",
        help="fine-tune every model on every task once per seed and report the mean: on the "
        f"small GLUE dev sets one seed's average moves by a point or two (default: {SEED})",
    )
    return parser


def check_args(args: argparse.Namespace) -> None:
    if args.time_to_loss and (args.ablate or args.families):
        raise egbert.ConfigError(
            "--time-to-loss names the families it pretrains and flips --flip's options; "
            "leave out --ablate and --families (they belong to the GLUE comparison)"
        )
    unknown = [name for name in args.ablate if name not in CANDIDATES]
    if unknown:
        raise egbert.ConfigError(
            f"--ablate {', '.join(unknown)}: unknown candidate; use any of {', '.join(CANDIDATES)}"
        )
    if len(set(args.finetune_seeds)) < len(args.finetune_seeds):
        raise egbert.ConfigError(f"--finetune-seeds {args.finetune_seeds}: name each seed once")
    # The jobs' own checks of --budget-minutes and --max-train-samples, before any work.
    recipe_arguments(args.preset, {"budget_minutes": args.budget_minutes})
    egbert.FinetuneArguments(model="", max_train_samples=args.max_train_samples)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        return run_time_to_loss(args) if args.time_to_loss else run_comparison(args)
    except RunStopped:
        print(f"{parser.prog}: stopped; run the same command again to go on from there")
        return {}
    except egbert.EgbertError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()
