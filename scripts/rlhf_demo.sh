#!/usr/bin/env bash
# RLHF on 2 CPU cores, from the shared data alone (issue 80's demo): pretrain a gpt and a bert on
# WikiText-2, fine-tune the bert on SST-2 into a sentiment scorer, then tune the gpt with
# `egbert rlhf` for the scorer's probability of "positive" on SST-2 prefixes.
#
#   scripts/rlhf_demo.sh                       # about an hour: 15 + 10 + 6 + 20 minutes and the reports
#   GPT_MINUTES=2 BERT_MINUTES=2 SCORER_MINUTES=1 RLHF_MINUTES=2 scripts/rlhf_demo.sh   # a quick check
#
# Options after the script name go to `egbert rlhf` (e.g. --lr 3e-5 --algorithm grpo). Environment:
# EGBERT_DATA (the shared data folder), OUT (default runs/rlhf-demo), EGBERT (default: the
# checkout's .venv/bin/egbert, else egbert on PATH), the minutes above, BF16=1 (pretrain and
# fine-tune in bf16: about 2x faster on CPUs with AVX512-BF16 or AMX, far slower on others; rlhf
# decides by itself). A rerun with the same OUT skips every step whose result is there, so a
# stopped demo goes on where it stopped.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=${EGBERT_DATA:-$ROOT/../shared/data}
OUT=${OUT:-runs/rlhf-demo}
if [[ -z ${EGBERT:-} ]]; then
    EGBERT=$ROOT/.venv/bin/egbert
    [[ -x $EGBERT ]] || EGBERT=egbert
fi
WIKI=$DATA/corpus/wikitext-2
PRECISION=()
[[ ${BF16:-0} == 1 ]] && PRECISION=(--bf16)
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}

step() {  # step DONE_FILE DESCRIPTION COMMAND...: run COMMAND unless DONE_FILE is there
    local done_file=$1 description=$2
    shift 2
    if [[ -f $done_file ]]; then
        echo "== $description: done before ($done_file)"
        return
    fi
    echo "== $description"
    "$@"
}

step "$OUT/tokenizer/tokenizer.json" "tokenizer (WordPiece, 16k, WikiText-2 train)" \
    "$EGBERT" tokenizer train --files "$WIKI/wiki.train.tokens" --vocab-size 16000 \
    --out "$OUT/tokenizer"
step "$OUT/gpt/model/config.json" "gpt: pretrain, mini, ${GPT_MINUTES:-15} minutes" \
    "$EGBERT" pretrain --model gpt --preset mini --tokenizer "$OUT/tokenizer" "${PRECISION[@]}" \
    --train-files "$WIKI/wiki.train.tokens" --budget-minutes "${GPT_MINUTES:-15}" \
    --output-dir "$OUT/gpt"
step "$OUT/bert/model/config.json" "bert: pretrain, mini, ${BERT_MINUTES:-10} minutes" \
    "$EGBERT" pretrain --model bert --preset mini --tokenizer "$OUT/tokenizer" "${PRECISION[@]}" \
    --train-files "$WIKI/wiki.train.tokens" --budget-minutes "${BERT_MINUTES:-10}" \
    --output-dir "$OUT/bert"
step "$OUT/scorer/model/config.json" "scorer: bert fine-tuned on SST-2, ${SCORER_MINUTES:-6} minutes" \
    "$EGBERT" finetune --model "$OUT/bert" --task sst2 --data-dir "$DATA/glue" "${PRECISION[@]}" \
    --epochs 1 --budget-minutes "${SCORER_MINUTES:-6}" --no-predict --output-dir "$OUT/scorer"
step "$OUT/rlhf/rlhf_results.json" "rlhf: gpt tuned for positive sentiment, ${RLHF_MINUTES:-20} minutes" \
    "$EGBERT" rlhf --model "$OUT/gpt" --reward-model "$OUT/scorer/model" --reward-label positive \
    --prompts-from-task sst2 --data-dir "$DATA/glue" --validation-text "$WIKI/wiki.valid.tokens" \
    --budget-minutes "${RLHF_MINUTES:-20}" --output-dir "$OUT/rlhf" "$@"
echo "results: $OUT/rlhf/rlhf_results.json, $OUT/rlhf/reward_kl.png"
