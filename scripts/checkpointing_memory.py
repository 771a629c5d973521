"""Peak memory and step time of bert pretraining steps with and without gradient checkpointing.

One run measures one setting in its own process, so that its peak is its own (VmHWM: the
process's peak resident memory, parameters, AdamW's state and the activations included):

    python scripts/checkpointing_memory.py --batch-size 4 --seq-len 512 --steps 2
    python scripts/checkpointing_memory.py --batch-size 4 --seq-len 512 --steps 2 \\
        --gradient-checkpointing

Each step is egbert's bert (MLM on 15% of random tokens + NSP, the sparse MLM head) forward,
backward and fused AdamW update in fp32, on random ids of the preset's model
(docs/performance.md has the results).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import egbert

VOCAB = 30522  # bert's WordPiece vocabulary


def pretraining_batch(batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Random ids with 15% of them as MLM labels, two segments and NSP labels."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (batch_size, seq_len), generator=generator)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(batch_size, seq_len, generator=generator) < 0.15
    labels[masked] = ids[masked]
    segments = (torch.arange(seq_len) >= seq_len // 2).long().expand(batch_size, seq_len)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": segments,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=generator),
    }


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = egbert.EgbertBertConfig(vocab_size=VOCAB, **egbert.load_preset("bert", args.preset))
    model = egbert.EgbertBertForPreTraining(config).train()
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    optimizer = egbert.adamw(model.parameters(), "cpu", lr=1e-4)
    batch = pretraining_batch(args.batch_size, args.seq_len)
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    print(
        f"{args.preset} batch {args.batch_size} x {args.seq_len}, gradient checkpointing "
        f"{args.gradient_checkpointing}: peak RSS {peak_rss_mb():,.0f} MB, step seconds "
        + " ".join(f"{value:.1f}" for value in seconds)
    )


if __name__ == "__main__":
    main()
