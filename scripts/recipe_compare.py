"""Egbert's pretraining recipe against the stock transformers one at the same CPU budget (#9).

    python scripts/recipe_compare.py --budget-minutes 25 --preset mini [--tasks sst2 rte ...] \\
        [--output-dir runs/recipe-compare] [--data PATH] [--max-train-samples N] \\
        [--ablate local-attention nsp mask-rate whole-word-mask batch-size batch-ramp beta2 lr \\
        seq-len dropout pre-ln sparse-logits] \\
        [--families gpt elmo] [--finetune-seeds 42 43 44]

1. trains the WordPiece tokenizer (16k) once on WikiText-2 train + the Gutenberg books;
2. pretrains bert on that corpus for --budget-minutes twice: with the stock recipe
   (scripts/stock_recipe.py, plain transformers.Trainer) and with egbert's (`egbert pretrain`
   with EGBERT_RECIPE and EGBERT_MODEL), and once more per --ablate candidate, egbert's recipe
   with that one choice flipped; saves egbert's model at its random initial weights as "scratch";
   with --families, also pretrains gpt and/or elmo with their own defaults (FAMILY_RECIPE) and
   saves each at its random initial weights as its twin ("gpt, scratch");
3. fine-tunes every model identically with `egbert finetune` (FINETUNE_FLAGS; the head and lr by
   model type, FINETUNE_BY_TYPE, so a twin is fine-tuned as its pretrained model) on the tasks,
   once per --finetune-seeds seed;
4. writes `results.md` (GLUE scores x 100, the mean over the seeds, and their average, plus a
   table of each seed's average when there are several, and an ablation table),
   `results.json` and `loss_curves.png` (training loss against minutes), and prints them.

A rerun reuses every finished step; a rerun with another preset, budget, vocabulary, sample
count or recipe on the same --output-dir is refused.
"""

from __future__ import annotations

import argparse
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

from egbert import quickstart
from egbert.checkpoints import read_model_config
from egbert.config import PretrainArguments, TrainingArguments, apply_config_overrides, load_preset
from egbert.errors import ConfigError, DataError, EgbertError, TrainingError
from egbert.finetune import run as finetune_run
from egbert.finetune.metrics import glue_score
from egbert.models.bert import EgbertBertConfig
from egbert.pretrain import run as pretrain_run
from egbert.runtime import bf16_pays_off
from egbert.tokenizer import load_tokenizer, train_tokenizer

STOCK_SCRIPT = Path(__file__).resolve().with_name("stock_recipe.py")
PRESETS = ("tiny", "mini", "small", "base")  # the sizes both recipes know
DEFAULT_TASKS = ["sst2", "mrpc", "stsb", "rte", "cola"]
SEED = 42
STOCK, EGBERT, SCRATCH = "stock", "egbert", "scratch"

# How every egbert run reads the corpus (the precision comes from precision_flags).
CORPUS = [
    "--doc-boundary", "wikitext",
    # Two Gutenberg books are Latin-1 in a few bytes: replace those rather than stop.
    "--encoding-errors", "replace",
]  # fmt: skip
# Egbert's recipe: `egbert pretrain --model bert --preset P --budget-minutes M` plus these
# options; everything not named here is a default of `egbert pretrain` or of the preset. AdamW's
# beta2 is the default 0.999: in the fp32 ablation 0.98 did not help (0.2 GLUE points less, the
# same MLM loss per minute, 0.07 nats more per step; README).
EGBERT_RECIPE = [
    *CORPUS,
    "--seq-len", "128",
    "--nsp", "false",
    "--batch-size", "16",
    "--mlm-probability", "0.4",
    "--lr", "1e-3",
    "--warmup-steps", "0.06",
]  # fmt: skip
# ...and the fields of the preset's model config it changes (pretraining only: fine-tuning
# puts BERT's dropout back, see dropout_overrides). The blocks stay post-LN, the preset's:
# pre-LN averaged 1.8 GLUE points less in the 25-minute ablation (README).
EGBERT_MODEL = {
    "local_attention_init": True,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# gpt and elmo (--families): `egbert pretrain --model F --preset P --budget-minutes M` with the
# family's defaults (elmo's FAMILY_DEFAULTS in egbert.pretrain.run: lr, dropout, 64-token blocks);
# only the corpus reading, the precision and the budget's warmup are set.
FAMILIES = ("gpt", "elmo")
FAMILY_RECIPE = [*CORPUS, "--warmup-steps", "0.06"]

# The same fine-tuning for every model (SST-2, 67k examples, gets one epoch instead of three);
# dev scores are all the tables need, so no test-set prediction files. The seed is
# --finetune-seeds'.
FINETUNE_FLAGS = ["--batch-size", "32", "--max-seq-length", "128", "--no-predict"]
FINETUNE_DROPOUT = 0.1  # on every dropout field the model has (see dropout_overrides)
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
# What the classifier reads and the peak lr, by model type (a model and its twin alike; others:
# the summary vector, `--features cls`, at lr 1e-4). elmo gets ELMo's own task head, a learned
# mix of its layers averaged over the tokens: in an 8-minute tiny pilot it gave the pretrained
# elmo 53.1 SST-2 / 19.5 STS-B against 51.8 / 13.2 with cls, and its twin 50.9 / 5.9 against
# 50.9 / 4.0. Each layer brought to one scale before the mix and lr 1e-3: the pretrained mini
# elmo's LSTM states are ~200x its twin's, and on 8,000 SST-2 examples (1 epoch) these took it
# from 58.6 (with the layer norm, at 1e-4) and 75.0 (at 1e-3, without) to 77.1, its twin from
# 72.4 and 76.9 to 77.4 (README).
FINETUNE_DEFAULTS: dict[str, Any] = {
    "features": "cls",
    "pool": "cls",
    "layer_norm": False,
    "lr": 1e-4,
}
FINETUNE_BY_TYPE: dict[str, dict[str, Any]] = {
    "egbert-elmo": {"features": "scalar-mix", "pool": "mean", "layer_norm": True, "lr": 1e-3}
}
FINETUNE_EPOCHS, SST2_EPOCHS = 3, 1


@dataclass(frozen=True)
class Candidate:
    """A choice of egbert's recipe that --ablate flips: options of `egbert pretrain`, or fields
    of the bert model config (passed through --config-overrides), all set to one value."""

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


# ---------------------------------------------------------------- data and options


def find_corpus(data_arg: str | None) -> tuple[Path, list[Path]]:
    """The data folder and its pretraining files: WikiText-2 train + the Gutenberg books."""
    data = Path(data_arg or os.environ.get("EGBERT_DATA") or quickstart.DEFAULT_DATA)
    train_files, _ = quickstart.corpus_files(data)
    if not train_files[0].is_file():
        raise DataError(
            f"{train_files[0]}: not found; point --data (or EGBERT_DATA) at a folder with "
            "corpus/wikitext-2/wiki.train.tokens, corpus/gutenberg/*.txt and glue/<TASK>/"
        )
    return data, train_files


def check_options(output_dir: Path, options: dict[str, Any]) -> None:
    """Record the options that shape every run; refuse to mix runs made with other ones (an
    option the folder has no record of is new to it, so nothing there used it: it is added)."""
    path = output_dir / "options.json"
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    changed = [f"{k} {saved[k]} -> {v}" for k, v in options.items() if saved.get(k, v) != v]
    if changed:
        raise ConfigError(
            f"{output_dir} holds runs made with other options ({'; '.join(changed)}); "
            "pass another --output-dir, or the same options"
        )
    if options.keys() - saved.keys():
        output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved | options, indent=2) + "\n", encoding="utf-8")


def prepare_tokenizer(output_dir: Path, files: Sequence[Path], vocab_size: int) -> Path:
    """Train the shared WordPiece tokenizer once; later runs reuse it."""
    tokenizer_dir = output_dir / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        print(f"  reusing {tokenizer_dir}", flush=True)
        return tokenizer_dir
    print(f"  training WordPiece ({vocab_size:,}) on {len(files)} files", flush=True)
    # Two Gutenberg books are Latin-1 in a few bytes: replace those rather than stop.
    train_tokenizer(
        files,
        vocab_size=vocab_size,
        out_dir=tokenizer_dir,
        show_progress=False,
        encoding_errors="replace",
    )
    return tokenizer_dir


# ---------------------------------------------------------------- egbert's recipe and ablations


def recipe_arguments(
    preset: str, extra: Sequence[str] = (), family: str = "bert"
) -> tuple[PretrainArguments, TrainingArguments]:
    """`egbert pretrain`'s options under the family's recipe (files and folders left blank)."""
    argv = ["--model", family, "--tokenizer", "", "--train-files", "", "--output-dir", ""]
    argv += ["--preset", preset, *recipe_options(family), *extra]
    return pretrain_run.parse_pretrain_args(argv)


def recipe_options(family: str = "bert") -> list[str]:
    """bert: EGBERT_RECIPE with EGBERT_MODEL as --config-overrides; gpt, elmo: FAMILY_RECIPE;
    then the precision."""
    options = [*EGBERT_RECIPE, *model_overrides()] if family == "bert" else FAMILY_RECIPE
    return [*options, *precision_flags()]


@functools.cache
def precision_flags() -> tuple[str, ...]:
    """bf16 autocast for every run, the stock one and fine-tuning included, where it is faster
    than fp32 on this machine (CPUs without native bf16 run it hundreds of times slower)."""
    return ("--bf16",) if bf16_pays_off(quickstart.training_device()) else ()


def model_overrides(changed: dict[str, Any] | None = None) -> list[str]:
    """--config-overrides for EGBERT_MODEL with the `changed` fields set instead."""
    fields = EGBERT_MODEL | (changed or {})
    return ["--config-overrides", ",".join(f"{k}={str(v).lower()}" for k, v in fields.items())]


def recipe_value(candidate: Candidate, preset: str) -> Any:
    """What egbert's recipe uses for the candidate's (first) field."""
    pretrain_args, training_args = recipe_arguments(preset)
    name = candidate.fields[0]
    if candidate.in_model_config:
        config = EgbertBertConfig(**load_preset("bert", pretrain_args.preset))
        apply_config_overrides(config, pretrain_args.config_overrides)
        return getattr(config, name)
    return getattr(pretrain_args if hasattr(pretrain_args, name) else training_args, name)


def plan_ablation(name: str, preset: str) -> dict[str, Any]:
    """How candidate `name` flips egbert's recipe: the row label, both settings as the tables
    show them, and the options of `egbert pretrain` that do it."""
    candidate = CANDIDATES[name]
    recipe = recipe_value(candidate, preset)
    value = candidate.flipped(recipe)
    return {
        "label": f"{EGBERT}, {candidate.label(value)}",
        "recipe": candidate.label(recipe),
        "setting": candidate.label(value),
        "flags": ablation_flags(name, value),
    }


def ablation_flags(name: str, value: Any) -> list[str]:
    """Options of `egbert pretrain` that set the candidate's fields to `value` (they come after
    the recipe's, so they win; model config fields go into a whole new --config-overrides)."""
    candidate = CANDIDATES[name]
    if candidate.in_model_config:
        return model_overrides(dict.fromkeys(candidate.fields, value))
    options = [f"--{field.replace('_', '-')}" for field in candidate.fields]
    return [arg for option in options for arg in (option, str(value))]


# ---------------------------------------------------------------- pretraining

SITTING_FILE = "sitting.json"  # when a budget run finished and from which commit


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
    if quickstart.is_finished(run_dir):
        print(f"  {STOCK}: reusing {run_dir}", flush=True)
        return run_dir
    command = [
        sys.executable, str(STOCK_SCRIPT), "--tokenizer", str(tokenizer_dir),
        "--train-files", *map(str, files), "--preset", preset, "--budget-minutes", str(budget),
        "--output-dir", str(run_dir), "--seed", str(SEED),
        "--bf16" if precision_flags() else "--no-bf16",
    ]  # fmt: skip
    print(f"  {STOCK}: {budget:g} min -> {run_dir}", flush=True)
    code = subprocess.run(command, check=False).returncode
    if code != 0 or not quickstart.is_finished(run_dir):
        raise TrainingError(f"{STOCK_SCRIPT.name} failed (exit code {code}); see its output above")
    stamp_sitting(run_dir)
    return run_dir


def pretrain_egbert(
    label: str,
    run_dir: Path,
    tokenizer_dir: Path,
    files: Sequence[Path],
    preset: str,
    budget: float,
    extra: Sequence[str] = (),
    family: str = "bert",
) -> Path:
    """Egbert's recipe for the family (with `extra` options last, so they win); resumes an
    interrupted run."""
    if quickstart.is_finished(run_dir):
        print(f"  {label}: reusing {run_dir}", flush=True)
        return run_dir
    argv = [
        "--model", family, "--preset", preset, "--tokenizer", str(tokenizer_dir),
        "--train-files", *map(str, files), "--budget-minutes", str(budget),
        "--seed", str(SEED), "--output-dir", str(run_dir),
        "--save-every", "500", "--keep-checkpoints", "1",  # for resuming, not part of the recipe
        *recipe_options(family), *extra,
    ]  # fmt: skip
    if (run_dir / "checkpoints").is_dir():
        argv.append("--resume")
    print(f"  {label}: {budget:g} min -> {run_dir}", flush=True)
    pretrain_run.main(argv)
    stamp_sitting(run_dir)
    return run_dir


def save_scratch(
    label: str, run_dir: Path, tokenizer_dir: Path, preset: str, family: str = "bert"
) -> Path:
    """The family's recipe model at its random initial weights, saved like a pretrained one."""
    if quickstart.is_finished(run_dir):
        print(f"  {label}: reusing {run_dir}", flush=True)
        return run_dir
    tokenizer = load_tokenizer(tokenizer_dir)
    pretrain_args, _ = recipe_arguments(preset, family=family)
    set_seed(SEED)
    model, _ = pretrain_run.build_model(pretrain_args, tokenizer)
    return quickstart.save_untrained(model, tokenizer, run_dir)


# ---------------------------------------------------------------- fine-tuning


def finetune(
    model_dir: Path,
    task: str,
    run_dir: Path,
    glue_dir: Path,
    max_train_samples: int | None,
    seed: int = SEED,
) -> float:
    """One model on one task with FINETUNE_FLAGS; returns its GLUE score (a finished run is
    reused, an interrupted one resumed)."""
    results = run_dir / "eval_results.json"
    if results.is_file():
        check_finetune_options(results, finetune_options(model_dir))
        print(f"    reusing {run_dir}", flush=True)
    else:
        epochs = SST2_EPOCHS if task == "sst2" else FINETUNE_EPOCHS
        argv = ["--task", task, "--model", str(model_dir), "--output-dir", str(run_dir)]
        argv += ["--data-dir", str(glue_dir), "--epochs", str(epochs), *FINETUNE_FLAGS]
        argv += ["--seed", str(seed)]
        argv += precision_flags()
        argv += dropout_overrides(model_dir)
        argv += option_flags(finetune_options(model_dir))
        if max_train_samples:
            argv += ["--max-train-samples", str(max_train_samples)]
        if (run_dir / "checkpoints").is_dir():
            argv.append("--resume")
        finetune_run.main(argv)
    return json.loads(results.read_text(encoding="utf-8"))["score"]


def finetune_dir(output_dir: Path, model_dir: Path, task: str, seed: int) -> Path:
    """finetune/MODEL/TASK for the default seed (so single-seed folders are reused as they
    are), finetune/MODEL/TASK-seedN for the others."""
    name = task if seed == SEED else f"{task}-seed{seed}"
    return output_dir / "finetune" / model_dir.name / name


def model_config(model_dir: Path) -> dict[str, Any]:
    return read_model_config(model_dir)


def dropout_overrides(model_dir: Path) -> list[str]:
    """--config-overrides setting FINETUNE_DROPOUT on the dropout fields the model's config has
    (egbert's bert pretrains without dropout; elmo has no attention dropout)."""
    config = model_config(model_dir)
    fields = [field for field in DROPOUT_FIELDS if field in config]
    return ["--config-overrides", ",".join(f"{field}={FINETUNE_DROPOUT}" for field in fields)]


def finetune_options(model_dir: Path) -> dict[str, Any]:
    """The head and lr this model is fine-tuned with (FINETUNE_BY_TYPE over FINETUNE_DEFAULTS)."""
    return FINETUNE_DEFAULTS | FINETUNE_BY_TYPE.get(model_config(model_dir)["model_type"], {})


def option_flags(options: dict[str, Any]) -> list[str]:
    """{"pool": "mean", "layer_norm": True} -> ["--pool=mean", "--layer-norm"]."""
    flags = []
    for name, value in options.items():
        flag = f"--{name.replace('_', '-')}"
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags.append(f"{flag}={value}")
    return flags


def check_finetune_options(results: Path, wanted: dict[str, Any]) -> None:
    """Refuse to reuse a fine-tuning made with another head or lr (an option it did not record
    was `egbert finetune`'s default then, which FINETUNE_DEFAULTS matches)."""
    options = json.loads(results.read_text(encoding="utf-8")).get("options", {})
    used = {name: options.get(name, FINETUNE_DEFAULTS[name]) for name in wanted}
    if used != wanted:
        raise ConfigError(
            f"{results.parent} was fine-tuned with {used}, the comparison now uses {wanted}; "
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
        summary = {k: v for k, v in quickstart.pretraining_summary(run_dir).items() if k != "eval"}
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


def seed_table(seed_scores: dict[str, dict[str, list[float]]], seeds: Sequence[int]) -> str:
    """Markdown: each model's task average per fine-tuning seed, their mean and their range."""
    header = "| model | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean | range |"
    lines = [header, "|---|" + "---:|" * (len(seeds) + 2)]
    for label, by_task in seed_scores.items():
        # zip(*...) turns {task: [score per seed]} into one (score per task) tuple per seed
        averages = [
            100 * glue_score(dict(zip(by_task, seed_run, strict=True)))
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
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, run_dir in run_dirs.items():
        curve = loss_curve(run_dir)
        if curve:
            minutes, losses = zip(*curve, strict=True)
            style = "-" if label in (STOCK, EGBERT) else "--"
            axes.plot(minutes, losses, style, label=f"{label} ({curve_loss(run_dir)[1]})")
    axes.set_xlabel("minutes of training")
    axes.set_ylabel("training loss")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


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
        run_dirs[label] = pretrain_egbert(label, run_dir, *shared, extra=ablation["flags"])
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
    data, files = find_corpus(args.data)
    tasks = quickstart.resolve_tasks(args.tasks or DEFAULT_TASKS, data)
    output_dir = args.output_dir
    check_options(
        output_dir,
        {
            "preset": args.preset,
            "budget_minutes": args.budget_minutes,
            "vocab_size": args.vocab_size,
            "max_train_samples": args.max_train_samples,
            "egbert_recipe": recipe_options(),
            "family_recipe": recipe_options("gpt"),
        },
    )
    print(f"[1/4] tokenizer -> {output_dir / 'tokenizer'}", flush=True)
    tokenizer_dir = prepare_tokenizer(output_dir, files, args.vocab_size)

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
    averages = {label: glue_score(by_task) for label, by_task in scores.items()}
    tables = [quickstart.results_table(scores, tasks)]
    if len(seeds) > 1:
        tables.append(seed_table(seed_scores, seeds))
    if ablations:
        tables.append(ablation_table(ablations, averages))
    report = {
        "preset": args.preset,
        "budget_minutes": args.budget_minutes,
        "tasks": tasks,
        "egbert_recipe": recipe_options(),
        "family_recipe": recipe_options("gpt"),
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
        prog="scripts/recipe_compare.py", description=__doc__.split("\n\n")[0]
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
    quickstart.check_scale_args(args)
    unknown = [name for name in args.ablate if name not in CANDIDATES]
    if unknown:
        raise ConfigError(
            f"--ablate {', '.join(unknown)}: unknown candidate; use any of {', '.join(CANDIDATES)}"
        )
    if len(set(args.finetune_seeds)) < len(args.finetune_seeds):
        raise ConfigError(f"--finetune-seeds {args.finetune_seeds}: name each seed once")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        return run_comparison(args)
    except EgbertError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()
