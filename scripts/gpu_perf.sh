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
# 4. elmo, base, bf16, seq 64, batch 32, the same two ways beside a plain cuDNN nn.LSTM language
#    model of the same size (eager: both run cuDNN's LSTM).
# It prints one summary table (scripts/gpu_perf_summary.py; also OUTPUT_DIR/summary.md): each
# row's tokens/s and MFU against the measured matmul peak and the card's datasheet peak, the
# reference's, the ratio, and `egbert pretrain` against the bench's own loop of the same model.
# GPU_PERF_TINY=1 shrinks every row (tiny preset, fp32, short runs, the first 2,000 lines of
# WikiText-2) to try the script on a CPU (tests/test_gpu_scripts.py runs it so);
# GPU_PERF_COMPILE=0 leaves torch.compile out; GPU_PERF_COMPILE_MODE=max-autotune-no-cudagraphs
# (or another --compile-mode) compiles `egbert pretrain`'s rows in that mode, to choose the
# default by measurement; GPU_PERF_TOKENIZER=DIR uses that tokenizer instead of training one.
# EGBERT_DATA must point at the shared data.
# Record the table in docs/performance.md with the date, device and commit.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-runs/gpu-perf}
python=${PYTHON:-python}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export EGBERT_DATA=${EGBERT_DATA:-$(pwd)/../shared/data}
corpus=$EGBERT_DATA/corpus/wikitext-2/wiki.train.tokens
rm -rf "$out" && mkdir -p "$out"
if [ "${GPU_PERF_TINY:-0}" = 1 ]; then  # the tokenizer and the runs on a slice: seconds, not minutes
    head -n 2000 "$corpus" >"$out/corpus.txt" && corpus=$out/corpus.txt
fi

device=$($python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
compile=(--compile --compile-mode "${GPU_PERF_COMPILE_MODE:-default}")
bench_compile=(--compile-only)
if [ "${GPU_PERF_COMPILE:-1}" = 0 ]; then compile=(); bench_compile=(); fi
precision=bf16
if [ "${GPU_PERF_TINY:-0}" = 1 ]; then
    preset=tiny gpt_seq=64 gpt_batch=8 bert_batch=16 elmo_batch=8 steps=4 log_every=2
    bench_steps=2 bench_warmup=1
    precision=fp32  # a CPU without native bf16 emulates it, and elmo's LSTM has no bf16 kernel there
else
    preset=base gpt_seq=1024 gpt_batch=32 bert_batch=256 elmo_batch=32 steps=60 log_every=10
    bench_steps=10 bench_warmup=3
fi
if [ "$device" = cpu ] && [ "${GPU_PERF_TINY:-0}" != 1 ]; then
    echo "gpu_perf: no CUDA GPU visible to torch; GPU_PERF_TINY=1 tries the script on a CPU" >&2
    exit 2
fi
bf16=(--bf16 "$([ "$precision" = bf16 ] && echo true || echo false)")
failed=0

tokenizer=${GPU_PERF_TOKENIZER:-}
if [ -z "$tokenizer" ]; then
    echo "gpu_perf: training a WordPiece tokenizer on $corpus ..."
    tokenizer=$out/tokenizer
    $python -m egbert.cli tokenizer train --files "$corpus" --out "$tokenizer" >"$out/tokenizer.log" 2>&1 || failed=1
fi

pretrain() {  # family, seq, batch, extra options...
    local family=$1 seq=$2 batch=$3
    shift 3
    $python -m egbert.cli pretrain --model "$family" --preset "$preset" --tokenizer "$tokenizer" \
        --train-files "$corpus" --doc-boundary wikitext --output-dir "$out/pretrain-$family" \
        --seq-len "$seq" --batch-size "$batch" "${bf16[@]}" --max-steps "$steps" \
        --log-every "$log_every" --report-to none "$@" >"$out/pretrain-$family.log" 2>&1 || failed=1
}
bench() {  # family, seq, batch, extra options...
    local family=$1 seq=$2 batch=$3
    shift 3
    $python scripts/bench.py --device "$device" --model "$family" --preset "$preset" --seq-len "$seq" \
        --batch-size "$batch" --precision "$precision" --no-data --steps "$bench_steps" \
        --warmup "$bench_warmup" \
        --json "$out/bench-$family.json" "$@" >"$out/bench-$family.log" 2>&1 || failed=1
}

dropout0=hidden_dropout_prob=0,attention_probs_dropout_prob=0
pretrain gpt "$gpt_seq" "$gpt_batch" "${compile[@]}" \
    --config-overrides "$dropout0,max_position_embeddings=1024"
bench gpt "$gpt_seq" "$gpt_batch" "${bench_compile[@]}" --dropout 0 --no-memory
pretrain bert 128 "$bert_batch" "${compile[@]}" --mlm-probability 0.15 --config-overrides "$dropout0"
bench bert 128 "$bert_batch" "${bench_compile[@]}" --dropout 0 --no-memory --sparse-mlm-only
# elmo eager on both sides, as the bench row: cuDNN's LSTM is one kernel either way
pretrain elmo 64 "$elmo_batch" --config-overrides hidden_dropout_prob=0
bench elmo 64 "$elmo_batch" --dropout 0 --no-memory

$python scripts/gpu_perf_summary.py "$out" "$gpt_seq" "$gpt_batch" "$bert_batch" "$elmo_batch" \
    | tee "$out/summary.md"
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
exit $failed
