#!/usr/bin/env bash
# The GPU check: what CI (CPU only) cannot see, on a machine with one NVIDIA GPU, in about 8 minutes.
#
#   scripts/gpu_check.sh [--bench] [OUTPUT_DIR]        (default OUTPUT_DIR: runs/gpu-check)
#
# 1. the whole test suite with the GPU visible (pytest -n 8 where pytest-xdist is installed);
# 2. `egbert quickstart --budget-minutes 3`: it must end within 20% of its budget and write its
#    tables;
# 3. scripts/resume_check.py, beside the suite: pretrain, SIGKILL and resume each family on the GPU
#    (the resumed weights must equal the checkpoint's, every tensor of them), then the same through
#    `accelerate launch` with configs/accelerate/ddp.yaml (every family) and fsdp.yaml (bert, gpt:
#    sharded checkpoints, gathered final model), one process each;
# 4. with --bench, also the compiled base-preset bench rows of bert and gpt (about 5 minutes more).
# It prints one summary table (also OUTPUT_DIR/summary.md) and exits 1 if any check failed.
# EGBERT_DATA must point at the shared data; GPU_CHECK_ALLOW_CPU=1 runs it on a CPU (to try the
# script itself). Record the result in docs/gpu.md with the date, device and commit.
set -uo pipefail
cd "$(dirname "$0")/.."

bench=0
if [ "${1:-}" = "--bench" ]; then bench=1; shift; fi
out=${1:-runs/gpu-check}
python=${PYTHON:-python}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export EGBERT_DATA=${EGBERT_DATA:-$(pwd)/../shared/data}

device=$($python -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')")
if [ "$device" = cpu ] && [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
    echo "gpu_check: no CUDA GPU visible to torch; run it on a GPU machine (GPU_CHECK_ALLOW_CPU=1 to try it on a CPU)" >&2
    exit 2
fi
rows=()
failed=0
record() {  # check, ok (0/1), detail
    local verdict=ok
    if [ "$2" != 0 ]; then verdict=FAIL; failed=1; fi
    rows+=("| $1 | $verdict | $3 |")
}

# 3. kill and resume, started first: it runs beside the suite
resume() {  # engine, port, families...
    local engine=$1 port=$2
    shift 2
    $python scripts/resume_check.py --engine "$engine" --port "$port" --families "$@" \
        --output-dir "$out/resume-$engine" >"$out/resume-$engine.log" 2>&1
    echo $? >"$out/resume-$engine.code"
}
rm -rf "$out"/resume-*
(resume plain 0 bert gpt elmo; resume ddp 29561 bert gpt elmo; resume fsdp 29562 bert gpt) &
resume_job=$!

# 1. the test suite
parallel=()
if $python -c "import xdist" 2>/dev/null; then parallel=(-n 8 --dist loadfile); fi
start=$(date +%s)
$python -m pytest -q -p no:cacheprovider "${parallel[@]}" tests >"$out/pytest.log" 2>&1
code=$?
summary=$(grep -E "[0-9]+ (passed|failed|error)" "$out/pytest.log" | tail -1)
record "test suite" "$code" "${summary:-no summary: see $out/pytest.log} ($(( $(date +%s) - start )) s)"

# 2. quickstart within 20% of a 3-minute budget, its tables written
rm -rf "$out/quickstart"
start=$(date +%s)
$python -m egbert.cli quickstart --budget-minutes 3 --output-dir "$out/quickstart" >"$out/quickstart.log" 2>&1
code=$?
wall=$(( $(date +%s) - start ))
within=$(( wall >= 144 && wall <= 216 ))
tables=$([ -s "$out/quickstart/results.md" ] && echo 1 || echo 0)
record "quickstart --budget-minutes 3" "$(( code != 0 || within != 1 || tables != 1 ))" \
    "exit $code, ${wall} s of 180 (144-216 allowed), results.md $([ "$tables" = 1 ] && echo written || echo missing)"

# 3. kill and resume (started above)
wait $resume_job
declare -A expected=([plain]=NO [ddp]=MULTI_GPU [fsdp]=FSDP)
for engine in plain ddp fsdp; do
    log="$out/resume-$engine.log"
    code=$(cat "$out/resume-$engine.code" 2>/dev/null || echo 1)
    family_rows=$(grep -E '^\| (bert|gpt|elmo) \|' "$log")
    seen=$(cut -d'|' -f3 <<<"$family_rows" | tr -d ' ' | sort -u | paste -sd, -)
    # on a GPU the run must have used the engine asked for (a CPU try runs them as MULTI_CPU)
    if [ "$device" != cpu ] && [ "$seen" != "${expected[$engine]}" ]; then code=1; fi
    record "pretrain, SIGKILL, resume: $engine" "$code" \
        "$(grep -c '| ok |$' <<<"$family_rows") of $(grep -c . <<<"$family_rows") families ok, engine: ${seen:-?} ($log)"
done

# 4. the compiled base-preset bench rows
if [ "$bench" = 1 ]; then
    for model in bert gpt; do
        $python scripts/bench.py --device cuda --no-data --no-memory --preset base --precision bf16 \
            --batch-size 512 --compile-only --dropout 0.1 --model "$model" >"$out/bench-$model.log" 2>&1
        record "bench $model base bf16 compiled" "$?" "$(grep -E '^\|' "$out/bench-$model.log" | tail -1)"
    done
fi

{
    echo "GPU check on $device, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| check | result | detail |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
exit $failed
