"""egbert: pretrain and fine-tune BERT-, GPT- and ELMo-like models with the Hugging Face interfaces.

Importing the package registers egbert's models with the transformers Auto classes. Everything
below is importable from `egbert` itself (loaded on first use, so `import egbert` stays quick):
one function per job, each taking the command's options as keyword arguments, e.g.

    import egbert
    egbert.run_pretraining(model="bert", tokenizer="tok/", train_files=["wiki.txt"],
                           output_dir="runs/bert", budget_minutes=10)
    egbert.run_finetuning(task="rte", model="runs/bert", data_dir="glue/", output_dir="runs/rte")

and the pieces scripts build on (configs, the trainer, the models, the data builders).
"""

from __future__ import annotations

import importlib
from typing import Any

from egbert import models  # noqa: F401  (registers the Auto classes)

# Imported now, not on first use: `embed` is also a submodule's name, which an import of that
# submodule would bind here instead of the function.
from egbert.embed import TokenEmbeddings, embed, load_model
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
        "build_examples",
        "EVAL_METRICS",
    ],
    "egbert.finetune.run": ["run_finetuning", "FinetuneOutput", "write_predictions"],
    "egbert.quickstart": ["run_quickstart"],
    "egbert.evaluation": ["run_probe", "run_prompt_eval"],
    "egbert.push": ["push_to_hub"],
    "egbert.tokenizer": ["train_tokenizer", "load_tokenizer"],
    "egbert.config": [
        "TrainingArguments",
        "PretrainArguments",
        "FinetuneArguments",
        "load_preset",
        "available_presets",
        "apply_config_overrides",
        "parse_args",
    ],
    "egbert.trainer": ["Trainer", "TrainOutput"],
    "egbert.report": ["read_train_results"],
    "egbert.checkpoints": ["load_pretrained", "read_model_config", "checkpoints_in"],
    "egbert.optimization": ["adamw"],
    "egbert.runtime": ["bf16_pays_off", "matmul_gflops", "matmul_peak_flops", "training_device"],
    "egbert.finetune.metrics": ["compute_task_metrics", "glue_score", "task_score"],
    "egbert.finetune.tasks": ["Task", "get_task", "read_glue_split", "split_file"],
    "egbert.pretrain.data": [
        "read_documents",
        "tokenize_documents",
        "build_nsp_examples",
        "pack_blocks",
        "MLMCollator",
        "CausalLMCollator",
    ],
    "egbert.models.bert": ["EgbertBertConfig", "EgbertBertForPreTraining"],
    "egbert.models.gpt": ["EgbertGPTConfig", "EgbertGPTForCausalLM"],
    "egbert.models.elmo": ["EgbertElmoConfig", "EgbertElmoForBidirectionalLM"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
# Modules whose steps scripts reuse: quickstart's pipeline steps (scripts/glue_table.py and
# scripts/recipe_compare.py run them with other models and options).
_SUBMODULES = ["quickstart"]

__all__ = [
    "TokenEmbeddings",
    "embed",
    "load_model",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EgbertError",
    "TrainingError",
    *_SUBMODULES,
    *sorted(_MODULE_OF),
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"egbert.{name}")
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'egbert' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
