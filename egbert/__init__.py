"""egbert: pretrain and fine-tune BERT-, GPT- and ELMo-like models with the Hugging Face interfaces.

Importing the package registers egbert's models with the transformers Auto classes. Everything
below is importable from `egbert` itself (loaded on first use, so `import egbert` stays quick):
one function per job, each taking the command's options as keyword arguments, e.g.

    import egbert
    egbert.run_pretraining(model="bert", tokenizer="tok/", train_files=["wiki.txt"],
                           output_dir="runs/bert", budget_minutes=10)
    egbert.run_finetuning(task="rte", model="runs/bert", data_dir="glue/", output_dir="runs/rte")

and the pieces a custom pipeline builds on (configs, the trainer, the models, the data builders).
docs/layout.md ("The public API") lists every name with what it is for; the rest is private.
"""

from __future__ import annotations

import importlib
from typing import Any

from egbert import models  # noqa: F401  (registers the Auto classes)
from egbert.errors import CheckpointError, ConfigError, DataError, EgbertError, TrainingError

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "egbert.pretrain.run": [
        "run_pretraining",
        "pretrain_arguments",
        "build_model",
        "CONFIG_CLASSES",
        "FAMILY_DEFAULTS",
        "EVAL_METRICS",
    ],
    "egbert.pretrain.corpus": ["build_examples"],
    "egbert.pretrain.options": ["ModelArguments", "DataArguments", "ObjectiveArguments"],
    "egbert.embedding": ["embed", "load_model", "TokenEmbeddings", "EmbedOptions"],
    "egbert.pretrain.prepare": ["prepare_corpus"],
    "egbert.finetune.options": ["FinetuneArguments"],
    "egbert.finetune.run": ["run_finetuning", "FinetuneOutput", "write_predictions"],
    "egbert.quickstart.run": ["run_quickstart"],
    "egbert.alignment.reward": ["run_reward_training", "RewardArguments", "RewardOutput"],
    "egbert.alignment.rlhf": ["run_rlhf", "RLHFArguments", "RLHFOutput"],
    "egbert.quickstart.options": ["QuickstartArguments"],
    "egbert.quickstart.steps": ["save_untrained", "finetune_options"],
    "egbert.evaluation": ["run_probe", "run_prompt_eval"],
    "egbert.push": ["push_to_hub"],
    "egbert.generate": ["generate_text"],
    "egbert.models.convert": ["convert_checkpoint"],
    "egbert.tokenizer": ["train_tokenizer", "load_tokenizer"],
    "egbert.config": [
        "TrainingArguments",
        "load_preset",
        "available_presets",
        "apply_config_overrides",
        "load_recipe",
    ],
    "egbert.arguments": ["parse_args"],
    "egbert.training.trainer": ["Trainer", "TrainOutput"],
    "egbert.training.batches": ["TrainingData"],
    "egbert.training.evaluator": ["EvalMetrics"],
    "egbert.training.model_saving": ["SavedWithModel"],
    "egbert.report": ["read_train_results"],
    "egbert.model_files": ["load_pretrained", "read_model_config"],
    "egbert.training.checkpoints": ["checkpoints_in"],
    "egbert.training.optimization": ["adamw"],
    "egbert.training.runtime": ["bf16_pays_off", "matmul_peak_flops", "training_device"],
    "egbert.finetune.metrics": [
        "compute_task_metrics",
        "task_score",
        "glue_average",
        "GlueAverage",
    ],
    "egbert.finetune.tasks": ["Task", "get_task", "read_glue_split", "split_file"],
    "egbert.finetune.tables": ["glue_score_table"],
    "egbert.sources": ["read_documents", "load_documents"],
    "egbert.pretrain.data": ["tokenize_documents", "build_nsp_examples", "pack_blocks"],
    "egbert.pretrain.collators": ["MLMCollator", "CausalLMCollator"],
    "egbert.models.bert": ["EgbertBertConfig", "EgbertBertForPreTraining"],
    "egbert.models.gpt": ["EgbertGPTConfig", "EgbertGPTForCausalLM"],
    "egbert.models.elmo": ["EgbertElmoConfig", "EgbertElmoForBidirectionalLM"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EgbertError",
    "TrainingError",
    *sorted(_MODULE_OF),
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'egbert' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
