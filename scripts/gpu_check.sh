#!/usr/bin/env bash
# The GPU check: what CI (CPU only) cannot see, on a machine with one NVIDIA GPU, in about 8 minutes.
#
#   scripts/gpu_check.sh [--bench] [--no-suite] [--no-quickstart] [OUTPUT_DIR]
#                                                      (default OUTPUT_DIR: runs/gpu-check)
#
# 1. the whole test suite with the GPU visible (pytest -n 8 where pytest-xdist is installed, a
#    per-test timeout of 300 s where pytest-timeout is), each test's outcome written to
#    OUTPUT_DIR/pytest.log as it ends (-v), so that a run cut short still names its failures;
# 2. `egbert quickstart --budget-minutes 3`: it must end within 20% of its budget and write its
#    tables;
# 3. scripts/resume_check.py, beside the suite: pretrain each family to the end, and again killed
#    with SIGKILL after a checkpoint and resumed with the same command: the final weights must
#    equal (every checkpoint must hold every weight), on the GPU, then the same through
#    `accelerate launch` with configs/accelerate/ddp.yaml (every family) and fsdp.yaml (bert, gpt:
#    sharded checkpoints, gathered final model), one process each; the three engines side by side;
# 4. with --bench, also the compiled base-preset bench rows of bert and gpt (about 5 minutes more).
# --no-suite and --no-quickstart leave out checks 1 and 2 (their rows say so).
# It prints one summary table (also OUTPUT_DIR/summary.md) and exits 1 if any check failed.
# EGBERT_DATA must point at the shared data; GPU_CHECK_ALLOW_CPU=1 runs it on a CPU (to try the
# script itself); GPU_CHECK_TINY=1 shortens check 3 to gpt on the plain engine, 8 steps
# (tests/test_gpu_scripts.py runs `GPU_CHECK_ALLOW_CPU=1 GPU_CHECK_TINY=1 scripts/gpu_check.sh
# --no-suite --no-quickstart` in CI). Record the result in docs/gpu.md with the date, device and
# commit.
set -uo pipefail
cd "$(dirname "$0")/.."

bench=0 suite=1 quickstart=1
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=1 ;;
        --no-suite) suite=0 ;;
        --no-quickstart) quickstart=0 ;;
        -*) echo "gpu_check: unknown option $1 (--bench, --no-suite, --no-quickstart)" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
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

# 3. kill and resume, started first: it runs beside the suite. "engine port families...".
resume_checks=("plain 0 bert gpt elmo" "ddp 29561 bert gpt elmo" "fsdp 29562 bert gpt")
resume_length=()
if [ "${GPU_CHECK_TINY:-0}" = 1 ]; then
    resume_checks=("plain 0 gpt")
    resume_length=(--steps 8 --save-every 2)
fi
resume() {  # engine, port, families...
    local engine=$1 port=$2
    shift 2
    $python scripts/resume_check.py --engine "$engine" --port "$port" --families "$@" \
        "${resume_length[@]}" --output-dir "$out/resume-$engine" >"$out/resume-$engine.log" 2>&1
    echo $? >"$out/resume-$engine.code"
}
rm -rf "$out"/resume-*
# the engines side by side (their own ports): one after another, they outlasted the suite and
# quickstart together on an H200 (2026-11-27: plain and DDP took the whole 470 s, FSDP never ran)
resume_jobs=()
for check in "${resume_checks[@]}"; do
    resume $check &
    resume_jobs+=($!)
done

# 1. the test suite
if [ "$suite" = 1 ]; then
    options=(-v -rfE -p no:cacheprovider)
    if $python -c "import xdist" 2>/dev/null; then options+=(-n 8 --dist loadfile); fi
    if $python -c "import pytest_timeout" 2>/dev/null; then options+=(--timeout 300); fi
    start=$(date +%s)
    $python -m pytest "${options[@]}" tests >"$out/pytest.log" 2>&1
    code=$?
    summary=$(grep -E "[0-9]+ (passed|failed|error)" "$out/pytest.log" | tail -1 | tr -d '=')
    # the failures by name (-v writes each as it ends; -rfE lists them again at the end)
    names=$(grep -oE "(FAILED|ERROR) tests/[^ ]+|tests/[^ ]+ (FAILED|ERROR)" "$out/pytest.log" \
        | grep -oE "tests/[^ ]+" | sort -u | paste -sd' ' -)
    record "test suite" "$code" "${summary:-no summary: see $out/pytest.log} ($(( $(date +%s) - start )) s)${names:+; failed: $names}"
else
    rows+=("| test suite | skipped | --no-suite |")
fi

# 2. quickstart within 20% of a 3-minute budget, its tables written
if [ "$quickstart" = 1 ]; then
    rm -rf "$out/quickstart"
    start=$(date +%s)
    $python -m egbert.cli quickstart --budget-minutes 3 --output-dir "$out/quickstart" >"$out/quickstart.log" 2>&1
    code=$?
    wall=$(( $(date +%s) - start ))
    within=$(( wall >= 144 && wall <= 216 ))
    tables=$([ -s "$out/quickstart/results.md" ] && echo 1 || echo 0)
    record "quickstart --budget-minutes 3" "$(( code != 0 || within != 1 || tables != 1 ))" \
        "exit $code, ${wall} s of 180 (144-216 allowed), results.md $([ "$tables" = 1 ] && echo written || echo missing)"
else
    rows+=("| quickstart --budget-minutes 3 | skipped | --no-quickstart |")
fi

# 3. kill and resume (started above)
wait "${resume_jobs[@]}"
declare -A expected=([plain]=NO [ddp]=MULTI_GPU [fsdp]=FSDP)
for check in "${resume_checks[@]}"; do
    engine=${check%% *}
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
