"""Reference GLUE fine-tuning with plain `transformers.Trainer`, to compare with `egbert finetune`.

It reads the same files with the same reader (egbert.finetune.tasks) and scores with the same
metrics (egbert.finetune.metrics); everything else is stock transformers: the model is
AutoModelForSequenceClassification on the checkpoint directory (a BERT [CLS]-pooler head),
the hyperparameters those of scripts/glue_minilm.sh. Like egbert it evaluates on dev after every
epoch, keeps the best epoch and writes the test predictions (OUTPUT_DIR/predictions/<TASK>.tsv).
One JSON line per task on stdout:
{"task", "metrics", "score", "seconds"}.

    python scripts/glue_reference.py --tasks rte mrpc --model DIR --data-dir GLUE --output-dir OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    Trainer,
    TrainingArguments,
)

from egbert import (
    Task,
    compute_task_metrics,
    get_task,
    read_glue_split,
    split_file,
    task_score,
    write_predictions,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", required=True, help="GLUE task names, e.g. rte sst2")
    parser.add_argument("--model", required=True, help="a stock transformers checkpoint directory")
    parser.add_argument("--data-dir", required=True, help="the GLUE folder (RTE/train.tsv, ...)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-train-samples", type=int, default=None)
    parser.add_argument("--bf16", action="store_true")
    return parser.parse_args(argv)


def fine_tune(task_name: str, args: argparse.Namespace) -> dict:
    task = get_task(task_name)
    eval_split = task.eval_splits[0]
    train = read_glue_split(task, "train", args.data_dir)
    if args.max_train_samples:
        train = train.select(range(min(args.max_train_samples, len(train))))
    dev = read_glue_split(task, eval_split, args.data_dir)

    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def tokenize(batch: dict) -> dict:
        texts = [batch[column] for column in task.text_columns]
        return tokenizer(*texts, truncation=True, max_length=args.max_seq_length)

    drop = [*task.text_columns, "idx"]
    train = train.map(tokenize, batched=True, remove_columns=drop).rename_column("label", "labels")
    dev = dev.map(tokenize, batched=True, remove_columns=drop).rename_column("label", "labels")

    def compute_metrics(prediction: EvalPrediction) -> dict:
        logits = prediction.predictions
        predicted = logits[:, 0] if task.is_regression else np.argmax(logits, axis=-1)
        metrics = compute_task_metrics(task, predicted.tolist(), prediction.label_ids.tolist())
        return {**metrics, "task_score": task_score({eval_split: metrics})}

    model = AutoModelForSequenceClassification.from_pretrained(
        args.model,
        num_labels=task.num_labels,
        id2label=task.id2label,
        label2id={label: i for i, label in task.id2label.items()},
    )
    training_args = TrainingArguments(
        output_dir=str(Path(args.output_dir) / task.name),
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        warmup_steps=args.warmup_ratio,  # transformers 5: a float below 1 is the warmup ratio
        weight_decay=args.weight_decay,
        lr_scheduler_type="linear",
        seed=args.seed,
        bf16=args.bf16,
        eval_strategy="epoch",
        save_strategy="epoch",
        save_only_model=True,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="task_score",
        logging_strategy="epoch",
        report_to="none",
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=dev,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
    )
    start = time.perf_counter()
    trainer.train()
    evaluation = trainer.evaluate()
    write_test_predictions(trainer, task, args, tokenize, drop)  # the same work egbert does
    seconds = time.perf_counter() - start
    metric_names = [key for key in evaluation if key.startswith("eval_")]
    metrics = {
        key.removeprefix("eval_"): float(evaluation[key])
        for key in metric_names
        if key.removeprefix("eval_") not in ("loss", "task_score", "epoch")
        and not key.endswith(("_runtime", "_per_second"))
    }
    return {
        "task": task.name,
        "metrics": metrics,
        "score": float(evaluation["eval_task_score"]),
        "seconds": round(seconds, 1),
    }


def write_test_predictions(
    trainer: Trainer, task: Task, args: argparse.Namespace, tokenize, drop: list[str]
) -> None:
    for split, stem in task.submission.items():
        if split_file(task, split, args.data_dir) is None:
            continue
        test = read_glue_split(task, split, args.data_dir)
        logits = trainer.predict(test.map(tokenize, batched=True, remove_columns=drop)).predictions
        predicted = logits[:, 0] if task.is_regression else np.argmax(logits, axis=-1)
        path = Path(args.output_dir) / "predictions" / f"{stem}.tsv"
        write_predictions(path, task, test["idx"], predicted)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for task_name in args.tasks:
        result = fine_tune(task_name, args)
        out = Path(args.output_dir) / result["task"] / "eval_results.json"
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
