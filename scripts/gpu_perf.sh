#!/usr/bin/env bash
# The throughput rows of docs/performance.md on one NVIDIA GPU, in about 6 minutes on an H100:
#
#   scripts/gpu_perf.sh [OUTPUT_DIR]        (default OUTPUT_DIR: runs/gpu-perf)
#
# 1. gpt, base preset, seq 1024, batch 32 (32,768 tokens a step), bf16, compiled, dropout 0,
#    through `egbert pretrain` on WikiText-2: tokens/s and MFU from its own metrics.jsonl;
# 2. the same model in scripts/bench.py beside transformers' GPT2LMHeadModel (SDPA, compiled);
# 3. bert NSP, base, seq 128, batch 256, --mlm-probability 0.15, the same two ways against
#    BertForPreTraining (sparse MLM, the head `egbert pretrain` trains);
# 4. elmo, base, bf16, beside a plain cuDNN nn.LSTM language model of the same size (eager:
#    both run cuDNN's LSTM).
# It prints one summary table (also OUTPUT_DIR/summary.md): each row's tokens/s and MFU, the
# reference's, the ratio, and `egbert pretrain` against the bench's own loop of the same model.
# GPU_PERF_TINY=1 shrinks every row (tiny preset, short runs) to try the script on a CPU;
# GPU_PERF_COMPILE=0 leaves torch.compile out; GPU_PERF_COMPILE_MODE=max-autotune-no-cudagraphs
# (or another --compile-mode) compiles `egbert pretrain`'s rows in that mode, to choose the
# default by measurement. EGBERT_DATA must point at the shared data.
# Record the table in docs/performance.md with the date, device and commit.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-runs/gpu-perf}
python=${PYTHON:-python}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export EGBERT_DATA=${EGBERT_DATA:-$(pwd)/../shared/data}
corpus=$EGBERT_DATA/corpus/wikitext-2/wiki.train.tokens
rm -rf "$out" && mkdir -p "$out"

device=$($python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
compile=(--compile --compile-mode "${GPU_PERF_COMPILE_MODE:-default}")
bench_compile=(--compile-only)
if [ "${GPU_PERF_COMPILE:-1}" = 0 ]; then compile=(); bench_compile=(); fi
if [ "${GPU_PERF_TINY:-0}" = 1 ]; then
    preset=tiny gpt_seq=64 gpt_batch=8 bert_batch=16 elmo_batch=8 steps=8 log_every=2 bench_steps=3
else
    preset=base gpt_seq=1024 gpt_batch=32 bert_batch=256 elmo_batch=32 steps=60 log_every=10 bench_steps=10
fi
if [ "$device" = cpu ] && [ "${GPU_PERF_TINY:-0}" != 1 ]; then
    echo "gpu_perf: no CUDA GPU visible to torch; GPU_PERF_TINY=1 tries the script on a CPU" >&2
    exit 2
fi
bf16=(--bf16)
failed=0

echo "gpu_perf: training a WordPiece tokenizer on $corpus ..."
$python -m egbert.cli tokenizer train --files "$corpus" --out "$out/tokenizer" >"$out/tokenizer.log" 2>&1 || failed=1

pretrain() {  # family, seq, batch, extra options...
    local family=$1 seq=$2 batch=$3
    shift 3
    $python -m egbert.cli pretrain --model "$family" --preset "$preset" --tokenizer "$out/tokenizer" \
        --train-files "$corpus" --doc-boundary wikitext --output-dir "$out/pretrain-$family" \
        --seq-len "$seq" --batch-size "$batch" "${bf16[@]}" "${compile[@]}" --max-steps "$steps" \
        --log-every "$log_every" --report-to none "$@" >"$out/pretrain-$family.log" 2>&1 || failed=1
}
bench() {  # family, seq, batch, extra options...
    local family=$1 seq=$2 batch=$3
    shift 3
    $python scripts/bench.py --device "$device" --model "$family" --preset "$preset" --seq-len "$seq" \
        --batch-size "$batch" --precision bf16 --no-data --steps "$bench_steps" --warmup 3 \
        --json "$out/bench-$family.json" "$@" >"$out/bench-$family.log" 2>&1 || failed=1
}

dropout0=hidden_dropout_prob=0,attention_probs_dropout_prob=0
pretrain gpt "$gpt_seq" "$gpt_batch" --config-overrides "$dropout0,max_position_embeddings=1024"
bench gpt "$gpt_seq" "$gpt_batch" "${bench_compile[@]}" --dropout 0 --no-memory
pretrain bert 128 "$bert_batch" --mlm-probability 0.15 --config-overrides "$dropout0"
bench bert 128 "$bert_batch" "${bench_compile[@]}" --dropout 0 --no-memory --sparse-mlm-only
bench elmo 64 "$elmo_batch" --dropout 0

$python - "$out" "$device" "$gpt_seq" <<'EOF' | tee "$out/summary.md"
"""One table from the runs' files: egbert pretrain's log, the bench rows."""
import json, statistics, subprocess, sys
from pathlib import Path

out, device = Path(sys.argv[1]), sys.argv[2]
if device == "cuda":
    import torch
    device = torch.cuda.get_device_name()
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
print(f"gpu_perf on {device}, commit {commit.stdout.strip() or 'unknown'}")
print()
print("| row | egbert tokens/s | egbert MFU | reference tokens/s | reference MFU | ratio | pretrain / bench loop | note |")
print("|---|---|---|---|---|---|---|---|")


def pretrain_numbers(family):
    path = out / f"pretrain-{family}" / "metrics.jsonl"
    if not path.is_file():
        return None
    train = [json.loads(line) for line in path.read_text().splitlines()]
    train = [record for record in train if record["split"] == "train"][1:]  # warm-up window out
    if not train:
        return None
    results = json.loads((out / f"pretrain-{family}" / "train_results.json").read_text())
    return (
        statistics.median(r["tokens_per_s"] for r in train),
        statistics.median(r.get("mfu", float("nan")) for r in train),
        results.get("compile_seconds", 0.0),
    )


def bench_row(family):
    path = out / f"bench-{family}.json"
    rows = json.loads(path.read_text())["training"] if path.is_file() else []
    return rows[-1] if rows else None


names = {"gpt": f"gpt seq {sys.argv[3]}", "bert": "bert NSP seq 128", "elmo": "elmo seq 64"}
for family, name in names.items():
    bench = bench_row(family)
    if bench is not None:
        print(
            f"| {name}: bench | {bench['egbert_tokens_per_s']:,.0f} | {bench['egbert_mfu']:.3f} "
            f"| {bench['reference_tokens_per_s']:,.0f} | {bench['reference_mfu']:.3f} "
            f"| {bench['ratio']:.2f}x | - | {bench['note']} |"
        )
    numbers = pretrain_numbers(family) if family != "elmo" else None
    if numbers is not None:
        tokens, mfu, compile_s = numbers
        versus = f"{tokens / bench['egbert_tokens_per_s']:.3f}" if bench else "-"
        reference = bench["reference_tokens_per_s"] if bench else float("nan")
        print(
            f"| {name}: egbert pretrain | {tokens:,.0f} | {mfu:.3f} | {reference:,.0f} | - "
            f"| {tokens / reference:.2f}x | {versus} | compiled in {compile_s:.0f} s |"
        )
    elif family != "elmo":
        print(f"| {name}: egbert pretrain | - | - | - | - | - | - | failed: see {out}/pretrain-{family}.log |")
EOF
exit $failed
