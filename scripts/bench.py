"""Training speed and memory of egbert's models side by side with the transformers references.

For each model family it builds egbert's model and its reference at the same size (bert vs
`BertForPreTraining` with MLM+NSP, gpt vs `GPT2LMHeadModel`, elmo vs a plain two-`nn.LSTM`
bidirectional LM), feeds both the same random batches, and times full AdamW training steps,
alternating egbert and reference step by step in one process so that a ratio holds on a noisy
machine. Reports the median tokens/s over the timed steps, MFU against the matmul peak measured
in the same run (a 2048x2048 `torch.mm`), and peak RSS (each model measured alone in a fresh
subprocess, since RSS only grows within a process).

    python scripts/bench.py --model all --precision all --json bench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import torch
from torch import nn
from transformers import BertConfig, BertForPreTraining, GPT2Config, GPT2LMHeadModel

from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM

# The mini preset: L4 H256 A4 FFN1024; ELMo at a comparable size (2 layers, 256 proj, 1024 cell).
LAYERS, HIDDEN, HEADS, FFN = 4, 256, 4, 1024
ELMO_LAYERS, ELMO_CELL = 2, 1024
MLM_PROBABILITY = 0.15


@dataclass
class Workload:
    """A model pair and the batch they both train on."""

    name: str
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
    dense = 6 * count_params(model) * tokens
    attention = 12 * LAYERS * HIDDEN * seq * tokens
    softmax = 6 * vocab * HIDDEN * predicted
    return float(dense + attention + softmax)


def random_batch(vocab: int, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(5, vocab, (batch, seq), generator=generator)


def bert_workload(vocab: int, batch: int, seq: int, sparse: bool) -> Workload:
    generator = torch.Generator().manual_seed(0)
    input_ids = random_batch(vocab, batch, seq, generator)
    masked = torch.rand(batch, seq, generator=generator) < MLM_PROBABILITY
    labels = torch.where(masked, input_ids, -100)
    sizes = dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=max(512, seq),
    )
    egbert = EgbertBertForPreTraining(EgbertBertConfig(**sizes, sparse_mlm_logits=sparse))
    reference = BertForPreTraining(BertConfig(**sizes))
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
    name = f"bert ({'sparse' if sparse else 'dense'} MLM)"
    return Workload(name, egbert, reference, inputs, flops)


def gpt_workload(vocab: int, batch: int, seq: int) -> Workload:
    input_ids = random_batch(vocab, batch, seq, torch.Generator().manual_seed(0))
    egbert = EgbertGPTForCausalLM(
        EgbertGPTConfig(
            vocab_size=vocab,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            max_position_embeddings=max(512, seq),
        )
    )
    reference = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=FFN,
            n_positions=max(512, seq),
        )
    )
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    inputs["labels"] = input_ids
    flops = transformer_flops(egbert.gpt, batch * seq, batch * seq, vocab, seq)
    return Workload("gpt", egbert, reference, inputs, flops)


class PlainBiLSTMLM(nn.Module):
    """The reference biLM: two stock multi-layer `nn.LSTM`s with projections, one reading the text
    reversed, sharing a tied softmax, with the same dropout as egbert's (on the embeddings, between
    layers and before the softmax); no residuals, no padding handling."""

    def __init__(self, vocab: int, hidden: int, cell: int, layers: int, dropout: float = 0.1):
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


def elmo_workload(vocab: int, batch: int, seq: int) -> Workload:
    input_ids = random_batch(vocab, batch, seq, torch.Generator().manual_seed(0))
    egbert = EgbertElmoForBidirectionalLM(
        EgbertElmoConfig(
            vocab_size=vocab,
            hidden_size=HIDDEN,
            cell_size=ELMO_CELL,
            num_hidden_layers=ELMO_LAYERS,
        )
    )
    reference = PlainBiLSTMLM(vocab, HIDDEN, ELMO_CELL, ELMO_LAYERS)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    inputs["labels"] = input_ids
    tokens = batch * seq
    flops = 6.0 * count_params(reference) * tokens + 2 * 6.0 * vocab * HIDDEN * tokens
    return Workload("elmo", egbert, reference, inputs, flops)


def workloads(model: str, vocab: int, batch: int, seq: int) -> list[Callable[[], Workload]]:
    builders = {
        "bert": [
            lambda: bert_workload(vocab, batch, seq, sparse=True),
            lambda: bert_workload(vocab, batch, seq, sparse=False),
        ],
        "gpt": [lambda: gpt_workload(vocab, batch, seq)],
        "elmo": [lambda: elmo_workload(vocab, batch, seq)],
    }
    names = list(builders) if model == "all" else [model]
    return [builder for name in names for builder in builders[name]]


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, dtype) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def matmul_peak_flops(dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times)


def prepare(model: nn.Module, compile_model: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return (torch.compile(model) if compile_model else model), optimizer


def time_pair(work: Workload, dtype: torch.dtype, compile_model: bool, warmup: int, steps: int):
    """Median seconds per step of egbert and the reference, alternating step by step."""
    egbert, egbert_optimizer = prepare(work.egbert, compile_model)
    reference, reference_optimizer = prepare(work.reference, compile_model)
    egbert_times, reference_times = [], []
    for step in range(warmup + steps):
        egbert_seconds = training_step(egbert, egbert_optimizer, work.batch, dtype)
        reference_seconds = training_step(reference, reference_optimizer, work.batch, dtype)
        if step >= warmup:
            egbert_times.append(egbert_seconds)
            reference_times.append(reference_seconds)
    return statistics.median(egbert_times), statistics.median(reference_times)


def peak_rss_mb(args: argparse.Namespace, index: int, side: str, precision: str) -> float:
    """Peak RSS of one model training alone, in a fresh interpreter."""
    command = [
        sys.executable,
        __file__,
        "--memory-of",
        f"{index}:{side}:{precision}",
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--seq-len",
        str(args.seq_len),
        "--vocab-size",
        str(args.vocab_size),
    ]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return float(result.stdout.strip().splitlines()[-1])


def peak_rss_of_this_process_mb() -> float:
    # VmHWM, not ru_maxrss: on Linux a child's ru_maxrss starts at its parent's RSS at fork time.
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def measure_memory_alone(args: argparse.Namespace) -> None:
    index, side, precision = args.memory_of.split(":")
    work = workloads(args.model, args.vocab_size, args.batch_size, args.seq_len)[int(index)]()
    model = work.egbert if side == "egbert" else work.reference
    del work.egbert, work.reference
    model, optimizer = prepare(model, compile_model=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    for _ in range(3):
        training_step(model, optimizer, work.batch, dtype)
    print(peak_rss_of_this_process_mb())


def markdown_table(rows: list[dict]) -> str:
    header = (
        "| model | precision | compile | egbert tokens/s | reference tokens/s | ratio "
        "| egbert MFU | reference MFU | egbert peak RSS MB | reference peak RSS MB |"
    )
    lines = [header, "|" + "---|" * 10]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['compile']} "
            f"| {row['egbert_tokens_per_s']:,.0f} | {row['reference_tokens_per_s']:,.0f} "
            f"| {row['ratio']:.2f}x | {row['egbert_mfu']:.2f} | {row['reference_mfu']:.2f} "
            f"| {row['egbert_peak_rss_mb']:,.0f} | {row['reference_peak_rss_mb']:,.0f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["bert", "gpt", "elmo", "all"], default="all")
    parser.add_argument("--precision", choices=["fp32", "bf16", "all"], default="all")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak RSS runs")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    torch.manual_seed(0)
    if args.memory_of:
        measure_memory_alone(args)
        return
    precisions = ["fp32", "bf16"] if args.precision == "all" else [args.precision]
    compile_modes = [False, True] if args.compile else [False]
    peaks = {
        p: matmul_peak_flops(torch.bfloat16 if p == "bf16" else torch.float32) for p in precisions
    }
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; matmul peak "
        + ", ".join(f"{p} {flops / 1e9:.0f} GFLOP/s" for p, flops in peaks.items()),
        flush=True,
    )
    rows = []
    tokens = args.batch_size * args.seq_len
    for index, build in enumerate(
        workloads(args.model, args.vocab_size, args.batch_size, args.seq_len)
    ):
        for precision in precisions:
            for compile_model in compile_modes:
                work = build()
                dtype = torch.bfloat16 if precision == "bf16" else torch.float32
                egbert_s, reference_s = time_pair(
                    work, dtype, compile_model, args.warmup, args.steps
                )
                no_memory = args.no_memory or compile_model
                row = {
                    "model": work.name,
                    "precision": precision,
                    "compile": compile_model,
                    "egbert_tokens_per_s": tokens / egbert_s,
                    "reference_tokens_per_s": tokens / reference_s,
                    "ratio": reference_s / egbert_s,
                    "egbert_mfu": work.flops_per_step / egbert_s / peaks[precision],
                    "reference_mfu": work.flops_per_step / reference_s / peaks[precision],
                    "egbert_peak_rss_mb": float("nan")
                    if no_memory
                    else peak_rss_mb(args, index, "egbert", precision),
                    "reference_peak_rss_mb": float("nan")
                    if no_memory
                    else peak_rss_mb(args, index, "reference", precision),
                }
                rows.append(row)
                print(markdown_table([row]).splitlines()[-1], flush=True)
    print()
    print(markdown_table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
