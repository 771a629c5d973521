"""Training speed and memory of egbert's models side by side with the transformers references.

For each model family it builds egbert's model and its reference at the same size (one of
egbert's presets, `--preset`, mini by default; bert vs
`BertForPreTraining` with MLM+NSP, gpt vs `GPT2LMHeadModel`, elmo vs a plain two-`nn.LSTM`
bidirectional LM), feeds both the same random batches, and times full AdamW training steps,
alternating egbert and reference step by step in one process so that a ratio holds on a noisy
machine. Reports the median tokens/s over the timed steps, MFU against the matmul peak measured
in the same run (a 2048x2048 `torch.mm` on the CPU, 8192x8192 on a GPU, where a small product
falls far short of the peak), and peak memory (each model measured alone in a fresh subprocess:
RSS on the CPU, since it only grows within a process; the allocator's peak on a GPU).
`--device cuda` runs the same rows on a GPU. `--compile` rows run in a subprocess with a time
limit, so that a model torch.compile cannot handle, or takes too long over, gives a row that says
so instead of ending the run.

A second table times egbert's data pipeline on real text (WikiText-2 and the shared WordPiece
tokenizer): tokenization, NSP pair building, and the collators that run between training steps,
in tokens/s next to training's, so a reader sees whether data could ever starve training.

    python scripts/bench.py --model all --precision all --json bench.json
    python scripts/bench.py --device cuda --no-data --json bench-gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from bench_downstream import PARTS as DOWNSTREAM_PARTS
from bench_downstream import downstream_rows, downstream_table
from datasets import Dataset
from torch import nn
from transformers import BertConfig, BertForPreTraining, GPT2Config, GPT2LMHeadModel

from egbert import (
    CausalLMCollator,
    EgbertBertConfig,
    EgbertBertForPreTraining,
    EgbertElmoConfig,
    EgbertElmoForBidirectionalLM,
    EgbertGPTConfig,
    EgbertGPTForCausalLM,
    MLMCollator,
    adamw,
    available_presets,
    bf16_pays_off,
    build_nsp_examples,
    load_preset,
    load_tokenizer,
    matmul_peak_flops,
    pack_blocks,
    read_documents,
    run_pretraining,
    tokenize_documents,
    train_tokenizer,
)

REPOSITORY = Path(__file__).resolve().parents[1]

MLM_PROBABILITY = 0.15


@dataclass(frozen=True)
class Sizes:
    """The shapes of one of egbert's presets: bert's (gpt's presets have the same) and ELMo's."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    elmo_layers: int
    elmo_hidden: int
    elmo_cell: int


def preset_sizes(preset: str) -> Sizes:
    """Sizes read from egbert/configs, so the bench times what `--preset` trains."""
    bert, elmo = load_preset("bert", preset), load_preset("elmo", preset)
    return Sizes(
        layers=bert["num_hidden_layers"],
        hidden=bert["hidden_size"],
        heads=bert["num_attention_heads"],
        ffn=bert["intermediate_size"],
        elmo_layers=elmo["num_hidden_layers"],
        elmo_hidden=elmo["hidden_size"],
        elmo_cell=elmo["cell_size"],
    )


@dataclass
class Workload:
    """A model pair and the batch they both train on."""

    egbert: nn.Module
    reference: nn.Module
    batch: dict[str, torch.Tensor]
    flops_per_step: float


def count_params(module: nn.Module, skip: tuple[type, ...] = (nn.Embedding,)) -> int:
    skipped = {id(p) for m in module.modules() if isinstance(m, skip) for p in m.parameters()}
    return sum(p.numel() for p in module.parameters() if id(p) not in skipped)


def transformer_flops(model: nn.Module, tokens: int, predicted: int, vocab: int, seq: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward, as nanoGPT/PaLM count):
    the dense weights, the attention scores and values, and the output softmax only at the
    positions the objective predicts (the same count for egbert and the reference)."""
    config = model.config
    dense = 6 * count_params(model) * tokens
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq * tokens
    softmax = 6 * vocab * config.hidden_size * predicted
    return float(dense + attention + softmax)


def random_batch(vocab: int, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(5, vocab, (batch, seq), generator=generator)


def bert_workload(
    sizes: Sizes, vocab: int, batch: int, seq: int, dropout: float, sparse: bool
) -> Workload:
    generator = torch.Generator().manual_seed(0)
    input_ids = random_batch(vocab, batch, seq, generator)
    masked = torch.rand(batch, seq, generator=generator) < MLM_PROBABILITY
    labels = torch.where(masked, input_ids, -100)
    shape = dict(
        vocab_size=vocab,
        hidden_size=sizes.hidden,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        intermediate_size=sizes.ffn,
        max_position_embeddings=max(512, seq),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    egbert = EgbertBertForPreTraining(EgbertBertConfig(**shape, sparse_mlm_logits=sparse))
    reference = BertForPreTraining(BertConfig(**shape))
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2 :] = 1
    inputs = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch,), generator=generator),
    }
    flops = transformer_flops(egbert.bert, batch * seq, int(masked.sum()), vocab, seq)
    return Workload(egbert, reference, inputs, flops)


def gpt_workload(sizes: Sizes, vocab: int, batch: int, seq: int, dropout: float) -> Workload:
    input_ids = random_batch(vocab, batch, seq, torch.Generator().manual_seed(0))
    egbert = EgbertGPTForCausalLM(
        EgbertGPTConfig(
            vocab_size=vocab,
            hidden_size=sizes.hidden,
            num_hidden_layers=sizes.layers,
            num_attention_heads=sizes.heads,
            intermediate_size=sizes.ffn,
            max_position_embeddings=max(512, seq),
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
    )
    reference = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_embd=sizes.hidden,
            n_layer=sizes.layers,
            n_head=sizes.heads,
            n_inner=sizes.ffn,
            n_positions=max(512, seq),
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            # GPT-2's end-of-text id (50256) is outside this vocabulary; use the last id.
            bos_token_id=vocab - 1,
            eos_token_id=vocab - 1,
        )
    )
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    inputs["labels"] = input_ids
    flops = transformer_flops(egbert.gpt, batch * seq, batch * seq, vocab, seq)
    return Workload(egbert, reference, inputs, flops)


class PlainBiLSTMLM(nn.Module):
    """The reference biLM: two stock multi-layer `nn.LSTM`s with projections, one reading the text
    reversed, sharing a tied softmax, with the same dropout as egbert's (on the embeddings, between
    layers and before the softmax); no residuals, no padding handling."""

    def __init__(self, vocab: int, hidden: int, cell: int, layers: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.dropout = nn.Dropout(dropout)
        lstm = partial(nn.LSTM, hidden, cell, layers, batch_first=True, proj_size=hidden)
        self.forward_lstm = lstm(dropout=dropout)
        self.backward_lstm = lstm(dropout=dropout)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **_: torch.Tensor):
        embeddings = self.dropout(self.embed(input_ids))
        forward_states, _ = self.forward_lstm(embeddings)
        backward_states, _ = self.backward_lstm(embeddings.flip(1))
        backward_states = self.dropout(backward_states.flip(1))
        forward_logits = self.dropout(forward_states[:, :-1]) @ self.embed.weight.T
        backward_logits = backward_states[:, 1:] @ self.embed.weight.T
        cross_entropy = nn.functional.cross_entropy
        loss = 0.5 * (
            cross_entropy(forward_logits.flatten(0, 1), labels[:, 1:].flatten())
            + cross_entropy(backward_logits.flatten(0, 1), labels[:, :-1].flatten())
        )
        return SimpleNamespace(loss=loss)


def elmo_workload(sizes: Sizes, vocab: int, batch: int, seq: int, dropout: float) -> Workload:
    input_ids = random_batch(vocab, batch, seq, torch.Generator().manual_seed(0))
    egbert = EgbertElmoForBidirectionalLM(
        EgbertElmoConfig(
            vocab_size=vocab,
            hidden_size=sizes.elmo_hidden,
            cell_size=sizes.elmo_cell,
            num_hidden_layers=sizes.elmo_layers,
            hidden_dropout_prob=dropout,
        )
    )
    reference = PlainBiLSTMLM(vocab, sizes.elmo_hidden, sizes.elmo_cell, sizes.elmo_layers, dropout)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    inputs["labels"] = input_ids
    tokens = batch * seq
    flops = 6.0 * count_params(reference) * tokens + 2 * 6.0 * vocab * sizes.elmo_hidden * tokens
    return Workload(egbert, reference, inputs, flops)


def workloads(args: argparse.Namespace) -> list[tuple[str, Callable[[], Workload]]]:
    """(row name, builder) of each workload of --model ("all": every family), in table order."""
    sizes = preset_sizes(args.preset)
    shape = (sizes, args.vocab_size, args.batch_size, args.seq_len, args.dropout)
    builders = {
        "bert": [
            ("bert (sparse MLM)", lambda: bert_workload(*shape, sparse=True)),
            ("bert (dense MLM)", lambda: bert_workload(*shape, sparse=False)),
        ][: 1 if args.sparse_mlm_only else 2],
        "gpt": [("gpt", lambda: gpt_workload(*shape))],
        "elmo": [("elmo", lambda: elmo_workload(*shape))],
    }
    families = list(builders) if args.model == "all" else [args.model]
    return [named for family in families for named in builders[family]]


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a timer read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, dtype) -> float:
    device = batch["input_ids"].device
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - start


def batch_on(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in batch.items()}


def on_device(work: Workload, device: torch.device) -> Workload:
    work.egbert.to(device)
    work.reference.to(device)
    work.batch = batch_on(work.batch, device)
    return work


def prepare(model: nn.Module, compile_model: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    model.train()
    # the optimizer egbert's trainer builds (fused where torch has the kernel), for both sides
    optimizer = adamw(model.parameters(), next(model.parameters()).device, lr=1e-4)
    return (torch.compile(model) if compile_model else model), optimizer


@dataclass
class PairTimes:
    """Seconds per training step of egbert and the reference: the median of the timed steps, and
    the first step (which includes torch.compile's compilation)."""

    egbert: float
    reference: float
    egbert_first: float
    reference_first: float


def egbert_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch as egbert's collators give it: without padding, no attention_mask (the models
    then take SDPA's unmasked or causal kernels without asking the device; transformers'
    references get the mask of ones their collators give)."""
    return {name: tensor for name, tensor in batch.items() if name != "attention_mask"}


def time_pair(
    work: Workload, dtype: torch.dtype, compile_model: bool, warmup: int, steps: int
) -> PairTimes:
    """Egbert and the reference trained alternately, step by step, in this process."""
    egbert, egbert_optimizer = prepare(work.egbert, compile_model)
    reference, reference_optimizer = prepare(work.reference, compile_model)
    egbert_times, reference_times = [], []
    egbert_batch = egbert_inputs(work.batch)
    for _ in range(warmup + steps):
        egbert_times.append(training_step(egbert, egbert_optimizer, egbert_batch, dtype))
        reference_times.append(training_step(reference, reference_optimizer, work.batch, dtype))
    return PairTimes(
        statistics.median(egbert_times[warmup:]),
        statistics.median(reference_times[warmup:]),
        egbert_times[0],
        reference_times[0],
    )


def timing_row(
    args: argparse.Namespace, index: int, precision: str, compile_model: bool, peak: float
) -> dict:
    """One table row, timed in this process (peak RSS is filled in by the caller)."""
    name, build = workloads(args)[index]
    work = on_device(build(), torch.device(args.device))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    times = time_pair(work, dtype, compile_model, args.warmup, args.steps)
    tokens = args.batch_size * args.seq_len
    note = ""
    if compile_model:
        note = (
            f"first step (compiling) {times.egbert_first:.0f} s egbert, "
            f"{times.reference_first:.0f} s reference"
        )
    return {
        "model": name,
        "precision": precision,
        "compile": compile_model,
        "egbert_tokens_per_s": tokens / times.egbert,
        "reference_tokens_per_s": tokens / times.reference,
        "ratio": times.reference / times.egbert,
        "egbert_mfu": work.flops_per_step / times.egbert / peak,
        "reference_mfu": work.flops_per_step / times.reference / peak,
        "peak_flops": peak,  # what both MFUs divide by
        f"egbert_{memory_key(args)}": float("nan"),
        f"reference_{memory_key(args)}": float("nan"),
        "egbert_first_step_s": times.egbert_first,
        "reference_first_step_s": times.reference_first,
        "note": note,
    }


def compiled_row(args: argparse.Namespace, index: int, precision: str, peak: float) -> dict:
    """A --compile row, timed in a subprocess with a time limit: torch.compile can fail, or take
    far longer than the steps it speeds up, on some models and machines; either becomes the
    row's note rather than the end of the run."""
    command = [
        *_child_command(args),
        "--row-of",
        f"{index}:{precision}",
        "--compile",
        "--peak-flops",
        str(peak),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    try:
        result = subprocess.run(
            command, check=True, capture_output=True, text=True, timeout=args.compile_timeout
        )
        return json.loads(result.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        note = f"torch.compile: no result within {args.compile_timeout} s"
    except subprocess.CalledProcessError as error:
        note = f"torch.compile failed: {last_error_line(error)}"
    name = workloads(args)[index][0]
    numbers = [*ROW_NUMBERS, f"egbert_{memory_key(args)}", f"reference_{memory_key(args)}"]
    row = dict.fromkeys(numbers, float("nan"))
    row["peak_flops"] = peak
    return {"model": name, "precision": precision, "compile": True, **row, "note": note}


def last_error_line(error: subprocess.CalledProcessError) -> str:
    """The line a failed child process ended its stderr with (its exception), shortened."""
    lines = error.stderr.strip().splitlines() or [f"exit status {error.returncode}"]
    return lines[-1][:160]


ROW_NUMBERS = (
    "egbert_tokens_per_s",
    "reference_tokens_per_s",
    "ratio",
    "egbert_mfu",
    "reference_mfu",
    "egbert_first_step_s",
    "reference_first_step_s",
)


def memory_key(args: argparse.Namespace) -> str:
    """The row's memory numbers: process RSS on the CPU, the CUDA allocator's peak on a GPU."""
    return "peak_cuda_mb" if args.device == "cuda" else "peak_rss_mb"


def _child_command(args: argparse.Namespace) -> list[str]:
    """This script, run again on the same workloads, for the parts measured in a subprocess."""
    return [
        sys.executable,
        __file__,
        "--model",
        args.model,
        "--preset",
        args.preset,
        "--batch-size",
        str(args.batch_size),
        "--seq-len",
        str(args.seq_len),
        "--vocab-size",
        str(args.vocab_size),
        "--device",
        args.device,
        "--dropout",
        str(args.dropout),
        *(["--sparse-mlm-only"] if args.sparse_mlm_only else []),
    ]


def peak_memory_mb(args: argparse.Namespace, index: int, side: str, precision: str) -> float:
    """Peak memory (see `memory_key`) of one model training alone, in a fresh interpreter."""
    command = [*_child_command(args), "--memory-of", f"{index}:{side}:{precision}"]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return float(result.stdout.strip().splitlines()[-1])


def release_cached_memory(device: torch.device) -> None:
    """Give the GPU memory that this process's allocator still caches from the timed models back
    to the driver: a memory run in a child process beside 42 GiB of it ran out of memory (gpt at
    the base preset, batch 256, on an 80 GiB H100)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_rss_of_this_process_mb() -> float:
    # VmHWM, not ru_maxrss: on Linux a child's ru_maxrss starts at its parent's RSS at fork time.
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def measure_memory_alone(args: argparse.Namespace) -> None:
    index, side, precision = args.memory_of.split(":")
    _, build = workloads(args)[int(index)]
    work = build()
    device = torch.device(args.device)
    model = (work.egbert if side == "egbert" else work.reference).to(device)
    del work.egbert, work.reference
    batch = batch_on(egbert_inputs(work.batch) if side == "egbert" else work.batch, device)
    model, optimizer = prepare(model, compile_model=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    for _ in range(3):
        training_step(model, optimizer, batch, dtype)
    if device.type == "cuda":
        print(torch.cuda.max_memory_allocated(device) / 2**20)
    else:
        print(peak_rss_of_this_process_mb())


# ---------------------------------------------------------------- egbert pretrain beside the loop


def pretrain_tokenizer(args: argparse.Namespace, folder: Path) -> Path:
    """A WordPiece tokenizer of --vocab-size entries on WikiText-2 train, for `--pretrain`."""
    corpus = wikitext(args)
    if args.tokenizer:
        return Path(args.tokenizer)
    print(f"training a {args.vocab_size}-entry WordPiece tokenizer on {corpus} ...", flush=True)
    train_tokenizer([corpus], vocab_size=args.vocab_size, out_dir=folder, show_progress=False)
    return folder


def loop_tokens_per_s(args: argparse.Namespace, family: str, vocab: int, dtype) -> float:
    """The bench's own loop (egbert's model alone, random batches): median tokens/s."""
    sizes = preset_sizes(args.preset)
    shape = (sizes, vocab, args.batch_size, args.seq_len, args.dropout)
    build = {
        "bert": lambda: bert_workload(*shape, sparse=True),
        "gpt": lambda: gpt_workload(*shape),
        "elmo": lambda: elmo_workload(*shape),
    }[family]
    work = on_device(build(), torch.device(args.device))
    model, optimizer = prepare(work.egbert, args.compile or args.compile_only)
    batch = egbert_inputs(work.batch)
    times = [training_step(model, optimizer, batch, dtype) for _ in range(args.warmup + args.steps)]
    return args.batch_size * args.seq_len / statistics.median(times[args.warmup :])


def pretrain_overrides(family: str, dropout: float, seq_len: int) -> str:
    """--config-overrides that give `egbert pretrain`'s model the loop's dropout and room for its
    sequence (elmo, an LSTM, has neither attention nor positions)."""
    overrides = f"hidden_dropout_prob={dropout}"
    if family != "elmo":
        overrides += f",attention_probs_dropout_prob={dropout}"
        overrides += f",max_position_embeddings={max(512, seq_len)}"
    return overrides


def pretrain_run(args: argparse.Namespace, family: str, tokenizer: Path, out: Path) -> dict:
    """`egbert pretrain` (egbert.run_pretraining) on WikiText-2 at the bench's model, batch,
    sequence, precision and dropout; tokens/s and MFU from its own log, the first log window
    (warm-up, and compiling with --compile) left out."""
    result = run_pretraining(
        model=family,
        preset=args.preset,
        tokenizer=str(tokenizer),
        train_files=[str(wikitext(args))],
        doc_boundary="wikitext",
        output_dir=str(out),
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        mlm_probability=MLM_PROBABILITY,
        config_overrides=pretrain_overrides(family, args.dropout, args.seq_len),
        bf16=args.precision == "bf16",
        compile=args.compile or args.compile_only,
        max_steps=args.pretrain_steps,
        log_every=args.pretrain_log_every,
        report_to=["none"],
        use_cpu=args.device == "cpu",
    )
    records = [record for record in result.history if record["split"] == "train"]
    train = records[1:]
    if not train:
        raise SystemExit("--pretrain-steps: give at least two --pretrain-log-every windows")
    steps = records[-1]["step"] - records[0]["step"]
    seconds = records[-1]["elapsed_s"] - records[0]["elapsed_s"]
    return {
        # batch x seq a step, padding included, as the loop counts: bert's NSP batches hold
        # padding that the log's tokens/s (real tokens) leaves out
        "batch_tokens_per_s": steps * args.batch_size * args.seq_len / seconds,
        "tokens_per_s": statistics.median(record["tokens_per_s"] for record in train),
        "mfu": statistics.median(record.get("mfu", math.nan) for record in train),
        "compile_s": result.compile_seconds,
    }


def pretrain_rows(args: argparse.Namespace) -> list[dict]:
    """For each family: the bench's loop, then `egbert pretrain`, then the loop again (the two
    loop runs averaged, so that a machine that got busier in between shows as their spread)."""
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    families = ["bert", "gpt", "elmo"] if args.model == "all" else [args.model]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-pretrain-") as folder:
        tokenizer = pretrain_tokenizer(args, Path(folder) / "tokenizer")
        vocab = len(load_tokenizer(tokenizer))
        for family in families:
            before = loop_tokens_per_s(args, family, vocab, dtype)
            run = pretrain_run(args, family, tokenizer, Path(folder) / family)
            after = loop_tokens_per_s(args, family, vocab, dtype)
            loop = (before + after) / 2
            rows.append(
                {
                    "model": family,
                    "precision": args.precision,
                    "loop_tokens_per_s": loop,
                    "loop_spread": abs(before - after) / loop,
                    "pretrain_tokens_per_s": run["tokens_per_s"],
                    "pretrain_batch_tokens_per_s": run["batch_tokens_per_s"],
                    "ratio": run["batch_tokens_per_s"] / loop,
                    "pretrain_mfu": run["mfu"],
                    "compile_s": run["compile_s"],
                }
            )
            print(pretrain_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def pretrain_table(rows: list[dict]) -> str:
    lines = [
        "| model | precision | bench loop tokens/s | egbert pretrain batch tokens/s "
        "| pretrain / loop | pretrain real tokens/s and MFU (its log) | loop spread | compile s |",
        "|" + "---|" * 8,
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['loop_tokens_per_s']:,.0f} "
            f"| {row['pretrain_batch_tokens_per_s']:,.0f} | {row['ratio']:.3f} "
            f"| {row['pretrain_tokens_per_s']:,.0f}, "
            f"MFU {row['pretrain_mfu']:.3f} | {row['loop_spread']:.1%} | {row['compile_s']:.0f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the data pipeline


def data_folder(path: str | None) -> Path:
    """--data, else $EGBERT_DATA, else ../shared/data beside the checkout (as the quickstart)."""
    return Path(path or os.environ.get("EGBERT_DATA") or REPOSITORY.parent / "shared" / "data")


def wikitext(args: argparse.Namespace) -> Path:
    corpus = data_folder(args.data) / "corpus" / "wikitext-2" / "wiki.train.tokens"
    if not corpus.is_file():
        raise SystemExit(f"{corpus}: not found; pass --data (or set EGBERT_DATA), or --no-data")
    return corpus


def timed(function: Callable, *args, **kwargs) -> tuple[object, float]:
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def collated_tokens_per_s(examples, collator, batch_size: int, batches: int) -> float:
    """Padded tokens/s of fetching random rows from the data set and collating them, the work
    the training loop's DataLoader does between steps (the trainer's default: no workers)."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(0)).tolist()
    tokens, seconds = 0, 0.0
    for start in range(0, min(batches * batch_size, len(order) - batch_size + 1), batch_size):
        begin = time.perf_counter()
        batch = collator(examples.__getitems__(order[start : start + batch_size]))
        seconds += time.perf_counter() - begin
        tokens += batch["input_ids"].numel()
    return tokens / seconds


def data_rows(args: argparse.Namespace) -> list[dict]:
    """Tokens/s of each stage of egbert's pretraining data path on the first WikiText-2
    articles: the once-per-corpus stages (tokenizing, building NSP pairs) and the per-step ones
    (the collators that make each batch_size x seq_len batch)."""
    corpus = wikitext(args)
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:
        print(f"training a {args.vocab_size}-entry WordPiece tokenizer on {corpus} ...", flush=True)
        tokenizer = train_tokenizer([corpus], vocab_size=args.vocab_size, show_progress=False)
    documents = read_documents([corpus], doc_boundary="wikitext")
    # in memory, so that no stage below is answered from the Arrow cache of an earlier run
    articles = Dataset.from_dict({"text": documents["text"][: args.data_documents]})
    tokenized, tokenize_s = timed(tokenize_documents, articles, tokenizer)
    corpus_tokens = sum(len(segment) for row in tokenized["input_ids"] for segment in row)
    pairs, pairs_s = timed(
        build_nsp_examples,
        tokenized,
        args.seq_len,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
    )
    pair_tokens = sum(len(ids) for ids in pairs["input_ids"])
    blocks = pack_blocks(tokenized, args.seq_len, tokenizer.eos_token_id)
    batches = dict(batch_size=args.batch_size, batches=args.data_batches)
    size = f"batch {args.batch_size}"
    stages = [
        ("tokenize_documents (WordPiece, sentences)", "once", corpus_tokens / tokenize_s),
        (f"build_nsp_examples (seq {args.seq_len})", "once", pair_tokens / pairs_s),
        (
            f"MLMCollator, NSP pairs, dynamic masking ({size})",
            "every step",
            collated_tokens_per_s(pairs, MLMCollator(tokenizer), **batches),
        ),
        (
            f"CausalLMCollator, packed blocks ({size})",
            "every step",
            collated_tokens_per_s(blocks, CausalLMCollator(tokenizer), **batches),
        ),
    ]
    rows = [{"stage": stage, "runs": runs, "tokens_per_s": rate} for stage, runs, rate in stages]
    padding = nsp_padding(pairs, tokenizer, args)
    rows.append({"stage": "padding of the NSP batches (share of their tokens)", **padding})
    return rows


def nsp_padding(pairs: Dataset, tokenizer, args: argparse.Namespace) -> dict:
    """The share of padding in MLMCollator's batches of NSP pairs, in a shuffled order: what
    unpadding (varlen attention, packing short pairs) could at most save of a bert step."""
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)).tolist()
    collator, real, padded = MLMCollator(tokenizer), 0, 0
    for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
        batch = collator(pairs.__getitems__(order[start : start + args.batch_size]))
        size = batch["input_ids"].numel()
        padded += size
        real += int(batch["attention_mask"].sum()) if "attention_mask" in batch else size
    return {"runs": f"batch {args.batch_size}, seq {args.seq_len}", "share": 1 - real / padded}


# ---------------------------------------------------------------- tables


def markdown_table(rows: list[dict], memory: str) -> str:
    """The rows; `memory`: the key of their memory numbers (see `memory_key`)."""
    label = "peak GPU MB" if memory == "peak_cuda_mb" else "peak RSS MB"
    header = (
        "| model | precision | compile | egbert tokens/s | reference tokens/s | ratio "
        f"| egbert MFU | reference MFU | egbert {label} | reference {label} | note |"
    )
    lines = [header, "|" + "---|" * 11]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['compile']} "
            f"| {row['egbert_tokens_per_s']:,.0f} | {row['reference_tokens_per_s']:,.0f} "
            f"| {row['ratio']:.2f}x | {row['egbert_mfu']:.2f} | {row['reference_mfu']:.2f} "
            f"| {megabytes(row[f'egbert_{memory}'])} | {megabytes(row[f'reference_{memory}'])} "
            f"| {row['note']} |"
        )
    return "\n".join(lines)


def megabytes(value: float) -> str:
    """Peak memory for the table; compiled rows are timed only, so theirs is NaN and shows as -."""
    return "-" if math.isnan(value) else f"{value:,.0f}"


def data_table(rows: list[dict], training_tokens_per_s: float | None) -> str:
    """The data stages; per-step stages also as the share of a training step they would add
    at the fastest egbert training speed measured in this run."""
    lines = ["| data stage | runs | tokens/s | share of a training step |", "|---|---|---|---|"]
    for row in rows:
        if "share" in row:
            lines.append(f"| {row['stage']} | {row['runs']} | - | {row['share']:.1%} |")
            continue
        share = "-"
        if row["runs"] == "every step" and training_tokens_per_s:
            share = f"{training_tokens_per_s / row['tokens_per_s']:.1%}"
        lines.append(f"| {row['stage']} | {row['runs']} | {row['tokens_per_s']:,.0f} | {share} |")
    return "\n".join(lines)


def run_downstream(args: argparse.Namespace) -> None:
    """--downstream: its rows at --precision (all: fp32, and bf16 where it pays on the CPU)."""
    if args.device != "cpu":
        raise SystemExit("--downstream runs on the CPU only (its references' CPU paths)")
    args.downstream_precisions = ["fp32", "bf16"] if args.precision == "all" else [args.precision]
    if args.precision == "all" and not bf16_pays_off("cpu"):
        args.downstream_precisions = ["fp32"]
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads", flush=True)
    rows = downstream_rows(args, data_folder(args.data))
    print()
    print(downstream_table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"downstream": rows}, handle, indent=2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["bert", "gpt", "elmo", "all"], default="all")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "all"],
        default="all",
        help="all: fp32, and bf16 where it is faster than fp32 on the device",
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="time only the torch.compile'd models (on a GPU, eager references at large batches "
        "run out of memory beside egbert's model)",
    )
    parser.add_argument(
        "--compile-timeout",
        type=int,
        default=1800,
        help="seconds a --compile row may take before it is reported as too slow (default: 1800)",
    )
    parser.add_argument(
        "--sparse-mlm-only",
        action="store_true",
        help="bert: only the sparse MLM row (egbert pretrain's; the dense one shows the saving)",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    parser.add_argument(
        "--preset",
        choices=available_presets("bert"),
        default="mini",
        help="model sizes, from egbert/configs (default: mini, L4 H256 A4 FFN1024; base: L12 H768)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="dropout of both sides, hidden and attention (default: 0.1, the presets' and the "
        "references'; egbert's bert recipe pretrains with 0)",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where both models train (default: cpu; cuda: the first GPU)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory runs")
    parser.add_argument("--no-data", action="store_true", help="skip the data pipeline table")
    parser.add_argument(
        "--data", help="data folder with corpus/wikitext-2 (default: $EGBERT_DATA, else ../shared)"
    )
    parser.add_argument(
        "--tokenizer",
        help="a saved egbert tokenizer for the data table (default: train a WordPiece one)",
    )
    parser.add_argument(
        "--data-documents", type=int, default=100, help="WikiText-2 articles (default: 100)"
    )
    parser.add_argument(
        "--data-batches", type=int, default=50, help="batches per collator (default: 50)"
    )
    parser.add_argument(
        "--pretrain",
        action="store_true",
        help="instead of the reference rows: time `egbert pretrain` (egbert.run_pretraining on "
        "WikiText-2) beside this bench's loop at the same model, batch, sequence, precision "
        "and dropout (one --precision; with --compile or --compile-only, both compiled)",
    )
    parser.add_argument(
        "--pretrain-steps", type=int, default=40, help="--pretrain: steps (default: 40)"
    )
    parser.add_argument(
        "--pretrain-log-every",
        type=int,
        default=10,
        help="--pretrain: steps per log window; the first is left out (default: 10)",
    )
    parser.add_argument(
        "--downstream",
        action="store_true",
        help="instead of the training rows: embedding, fine-tuning and generation side by side "
        "with sentence-transformers, transformers.Trainer and GPT2LMHeadModel "
        "(scripts/bench_downstream.py says how each is timed)",
    )
    parser.add_argument(
        "--downstream-parts",
        nargs="+",
        choices=list(DOWNSTREAM_PARTS),
        default=list(DOWNSTREAM_PARTS),
        help="--downstream: which rows (default: all three)",
    )
    parser.add_argument(
        "--downstream-preset",
        choices=available_presets("bert"),
        default="small",
        help="--downstream: size of the fine-tuned bert and the generating gpt (default: small)",
    )
    parser.add_argument(
        "--downstream-rounds",
        type=int,
        default=3,
        help="--downstream: timed rounds of embedding and generation, the best kept (default: 3)",
    )
    parser.add_argument(
        "--downstream-texts",
        type=int,
        default=4000,
        help="--downstream: SST-2 sentences embedded (default: 4000)",
    )
    parser.add_argument(
        "--downstream-examples",
        type=int,
        default=4000,
        help="--downstream: SST-2 examples fine-tuned on, one epoch (default: 4000)",
    )
    parser.add_argument("--json", help="also write the tables to this JSON file")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--row-of", help=argparse.SUPPRESS)
    parser.add_argument("--peak-flops", type=float, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here (torch.cuda.is_available() is False)")
    torch.manual_seed(0)
    if args.memory_of:
        measure_memory_alone(args)
        return
    if args.row_of:
        index, precision = args.row_of.split(":")
        print(json.dumps(timing_row(args, int(index), precision, args.compile, args.peak_flops)))
        return
    if args.downstream:
        run_downstream(args)
        return
    if args.pretrain:
        if args.precision == "all":
            parser.error("--pretrain: give one --precision (fp32 or bf16)")
        rows = pretrain_rows(args)
        print()
        print(pretrain_table(rows))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"pretrain": rows}, handle, indent=2)
        return
    device = torch.device(args.device)
    precisions = ["fp32", "bf16"] if args.precision == "all" else [args.precision]
    if args.precision == "all" and not bf16_pays_off(device.type):
        print(
            f"skipping bf16: it is slower than fp32 on this {device.type} (no native bf16 "
            "instructions); --precision bf16 times it anyway",
            flush=True,
        )
        precisions = ["fp32"]
    compile_modes = [True] if args.compile_only else ([False, True] if args.compile else [False])
    peaks = {
        p: matmul_peak_flops(device.type, torch.bfloat16 if p == "bf16" else torch.float32)
        for p in precisions
    }
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(
        f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads; matmul peak "
        + ", ".join(f"{p} {flops / 1e9:.0f} GFLOP/s" for p, flops in peaks.items()),
        flush=True,
    )
    memory = memory_key(args)
    rows = []
    named = workloads(args)
    for index in range(len(named)):
        for precision in precisions:
            for compile_model in compile_modes:
                if compile_model:
                    row = compiled_row(args, index, precision, peaks[precision])
                else:
                    row = timing_row(args, index, precision, False, peaks[precision])
                    if not args.no_memory:
                        release_cached_memory(device)
                        for side in ("egbert", "reference"):
                            try:
                                row[f"{side}_{memory}"] = peak_memory_mb(
                                    args, index, side, precision
                                )
                            except subprocess.CalledProcessError as error:
                                failed = f"{side} memory run failed: {last_error_line(error)}"
                                row["note"] = "; ".join(filter(None, [row["note"], failed]))
                rows.append(row)
                print(markdown_table([row], memory).splitlines()[-1], flush=True)
    print()
    print(markdown_table(rows, memory))
    data = [] if args.no_data else data_rows(args)
    if data:
        fastest = max(
            (row["egbert_tokens_per_s"] for row in rows if row["egbert_tokens_per_s"] > 0),
            default=None,
        )
        print()
        print(data_table(data, fastest))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"training": rows, "data": data}, handle, indent=2)


if __name__ == "__main__":
    main()
