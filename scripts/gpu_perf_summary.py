"""scripts/gpu_perf.sh's table, from the files its runs left: `egbert pretrain`'s metrics.jsonl and
train_results.json, and the bench rows' JSON.

    python scripts/gpu_perf_summary.py OUTPUT_DIR GPT_SEQ_LEN GPT_BATCH BERT_BATCH ELMO_BATCH

Each row's tokens/s and MFU, against the matmul peak the run measured and against the card's
datasheet dense bf16 peak (known cards only, by the name torch gives the device); the reference's;
`egbert pretrain` against the bench's loop of the same model. The loop trains on random batches
without padding, so pretrain's tokens/s are counted the loop's way (batch x seq a step, padding
included) for the ratios, and its real tokens/s (what its log reports) are shown beside them.
For gpt, the note also gives MFU counted as llm.c counts it, for its anchors.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from math import prod
from pathlib import Path

import torch
from safetensors import safe_open

# Dense bf16 tensor-core peaks from the datasheets (TFLOP/s; "with sparsity" halved), matched
# against torch.cuda.get_device_name(); the first pattern that matches wins.
SPEC_DENSE_BF16_TFLOPS = (
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756.0),
    (r"\bH100\b.*\b(SXM|HBM3)\b", "H100 SXM", 989.0),
    (r"\bH200\b", "H200", 989.0),
)
ROWS = {"gpt": "gpt seq {seq}", "bert": "bert NSP seq 128", "elmo": "elmo seq 64"}
FLOPS_NOTE = (
    "FLOPs per token, egbert's count (egbert.models.layers.training_flops_per_token, the bench's "
    "too): 6 x the weights outside the embeddings + 12 x layers x hidden x seq (attention scores "
    "and values, all of them) + 6 x vocab x hidden at each predicted position (the tied softmax; "
    "bert's sparse MLM: the masked 15%). llm.c's count (train_gpt2.cu, gpt2_estimate_mfu): 6 x "
    "every weight (the tied embedding once, the position table included) + 6 x layers x hidden x "
    "seq (attention halved: causal), against the datasheet peak."
)


@dataclass(frozen=True)
class SpecPeak:
    name: str
    flops: float  # FLOP/s


def spec_peak(device_name: str) -> SpecPeak | None:
    """The datasheet dense bf16 peak of a known card, by its torch device name; None if unknown."""
    for pattern, name, tflops in SPEC_DENSE_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return SpecPeak(name, tflops * 1e12)
    return None


@dataclass(frozen=True)
class PretrainNumbers:
    """`egbert pretrain`'s speed over its log windows but the first (warm-up, compiling)."""

    tokens_per_s: float  # real tokens (the log's)
    batch_tokens_per_s: float  # batch x seq a step, padding included, as the bench loop counts
    mfu: float  # against the run's measured peak
    peak_flops: float | None  # the run's measured matmul peak
    compile_seconds: float


def pretrain_numbers(folder: Path, batch_size: int, seq_len: int) -> PretrainNumbers | None:
    metrics, results = folder / "metrics.jsonl", folder / "train_results.json"
    if not (metrics.is_file() and results.is_file()):
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = [record for record in records if record["split"] == "train"]
    if len(train) < 2:
        return None
    # each window's seconds: its rates weighted by them are the rates of the whole span
    seconds = [now["elapsed_s"] - before["elapsed_s"] for before, now in itertools.pairwise(train)]
    windows = list(zip(train[1:], seconds, strict=True))
    total = sum(seconds)
    steps = train[-1]["step"] - train[0]["step"]
    finished = json.loads(results.read_text())
    return PretrainNumbers(
        tokens_per_s=sum(record["tokens_per_s"] * s for record, s in windows) / total,
        batch_tokens_per_s=steps * batch_size * seq_len / total,
        mfu=sum(record.get("mfu", math.nan) * s for record, s in windows) / total,
        peak_flops=finished.get("matmul_peak_flops"),
        compile_seconds=finished.get("compile_seconds", 0.0),
    )


def bench_row(path: Path) -> dict | None:
    rows = json.loads(path.read_text())["training"] if path.is_file() else []
    return rows[-1] if rows else None


def mfu_text(mfu: float, measured_peak: float | None, spec: SpecPeak | None) -> str:
    """'measured / spec' MFU: the same model FLOP/s over the run's peak and the datasheet's."""
    if spec is None or measured_peak is None:
        return f"{mfu:.3f} / -"
    return f"{mfu:.3f} / {mfu * measured_peak / spec.flops:.3f}"


def llmc_flops_per_token(model_dir: Path, seq_len: int) -> tuple[float, int]:
    """(FLOPs per token as llm.c counts them, the weights N it counts) for a saved gpt."""
    config = json.loads((model_dir / "config.json").read_text())
    with safe_open(model_dir / "model.safetensors", "pt") as weights:
        names = weights.keys()  # a safetensors file is no mapping to iterate
        count = sum(prod(weights.get_slice(name).get_shape()) for name in names)
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    return 6.0 * count + 6.0 * layers * hidden * seq_len, count


def llmc_note(model_dir: Path, seq_len: int, tokens_per_s: float, spec: SpecPeak | None) -> str:
    if not (model_dir / "model.safetensors").is_file():
        return ""
    flops, count = llmc_flops_per_token(model_dir, seq_len)
    achieved = tokens_per_s * flops
    against = f"MFU {achieved / spec.flops:.3f} of the {spec.name}'s" if spec else "no known peak"
    counted = f"6N + 6LCT, N = {count / 1e6:.1f}M"
    return f"; llm.c's count ({counted}): {achieved / 1e12:.3g} TFLOP/s, {against}"


def table(out: Path, device: str, gpt_seq: int, batches: dict[str, int]) -> list[str]:
    spec = spec_peak(device)
    lines = [
        "| row | egbert tokens/s | egbert MFU (measured / spec peak) | reference tokens/s "
        "| reference MFU (measured / spec peak) | ratio to reference | pretrain / bench loop "
        "| note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family, name in ROWS.items():
        name = name.format(seq=gpt_seq)
        seq = {"gpt": gpt_seq, "bert": 128, "elmo": 64}[family]
        bench = bench_row(out / f"bench-{family}.json")
        if bench is None:
            lines.append(
                f"| {name}: bench | - | - | - | - | - | - | failed: see bench-{family}.log |"
            )
        else:
            peak = bench.get("peak_flops")
            lines.append(
                f"| {name}: bench | {bench['egbert_tokens_per_s']:,.0f} "
                f"| {mfu_text(bench['egbert_mfu'], peak, spec)} "
                f"| {bench['reference_tokens_per_s']:,.0f} "
                f"| {mfu_text(bench['reference_mfu'], peak, spec)} | {bench['ratio']:.2f}x | - "
                f"| {bench['note']} |"
            )
        run = out / f"pretrain-{family}"
        numbers = pretrain_numbers(run, batches[family], seq)
        if numbers is None:
            lines.append(
                f"| {name}: egbert pretrain | - | - | - | - | - | - | failed: see {run}.log |"
            )
            continue
        padding = 1 - numbers.tokens_per_s / numbers.batch_tokens_per_s
        note = f"real tokens {numbers.tokens_per_s:,.0f}/s (padding {padding:.1%})"
        if numbers.compile_seconds:
            note += f"; compiled in {numbers.compile_seconds:.0f} s"
        if family == "gpt":
            note += llmc_note(run / "model", seq, numbers.tokens_per_s, spec)
        reference = bench["reference_tokens_per_s"] if bench else float("nan")
        loop = f"{numbers.batch_tokens_per_s / bench['egbert_tokens_per_s']:.3f}" if bench else "-"
        lines.append(
            f"| {name}: egbert pretrain | {numbers.batch_tokens_per_s:,.0f} "
            f"| {mfu_text(numbers.mfu, numbers.peak_flops, spec)} | {reference:,.0f} | - "
            f"| {numbers.batch_tokens_per_s / reference:.2f}x | {loop} | {note} |"
        )
    return lines


def main() -> None:
    out, gpt_seq = Path(sys.argv[1]), int(sys.argv[2])
    batches = dict(zip(ROWS, map(int, sys.argv[3:6]), strict=True))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    spec = spec_peak(device)
    print(f"gpu_perf on {device}, commit {commit.stdout.strip() or 'unknown'}")
    print()
    print(
        "MFU: model FLOP/s over the matmul peak each run measured (egbert.matmul_peak_flops) / "
        + (
            f"over the {spec.name}'s datasheet dense bf16 peak, {spec.flops / 1e12:.0f} TFLOP/s"
            if spec
            else "no datasheet peak known for this device"
        )
        + ". "
        + FLOPS_NOTE
    )
    print()
    print("\n".join(table(out, device, gpt_seq, batches)))


if __name__ == "__main__":
    main()
