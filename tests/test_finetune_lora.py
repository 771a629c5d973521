"""`egbert finetune --lora`: LoRA adapters (PEFT) on egbert's attention and feed-forward linears,
the new classifier head trained whole beside them, the rest of the model frozen.

The expectations come from LoRA's definition (the adapters' sizes, counted here from the tiny
model's config), from PEFT (PeftModel.from_pretrained of the saved adapter) and from the saved
files, read with safetensors; none from the code under test.

Cost: two RTE runs of 24 rows (a few seconds each) and one tiny model built.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from option_coverage import proves
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification

import egbert.models.heads  # noqa: F401  (registers egbert's classifiers with the Auto classes)
from egbert.commands.finetune import main
from egbert.errors import ConfigError
from egbert.lora import LoraArguments, with_adapters
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoModel
from egbert.training.checkpoints import TrainerState
from egbert.training.model_saving import BestModel, save_model_folder

pytestmark = pytest.mark.usefixtures("one_thread_and_fresh_accelerate")


def rte(model: Path, micro_data: Path, out: Path, *argv: str) -> list[str]:
    """`egbert finetune` of RTE's 24 training rows (16 dev rows), without trackers."""
    common = ["--task", "rte", "--model", str(model), "--data-dir", str(micro_data / "glue")]
    return [*common, "--output-dir", str(out), "--report-to", "none", "--no-predict", *argv]


def token_ids(count: int = 3, length: int = 12) -> torch.Tensor:
    return torch.randint(5, 200, (count, length), generator=torch.Generator().manual_seed(0))


@proves(
    "finetune", "--lora", "--lora-rank", "--lora-alpha", "--lora-dropout", "--lora-target-modules"
)
def test_lora_trains_adapters_and_the_head_and_saves_both_ways(
    tiny_egbert_bert_dir: Path, micro_data: Path, tmp_path: Path
) -> None:
    """Rank 4 on qkv and down only: per layer 4 x (h + 3h) + 4 x (I + h) adapter weights, and the
    classifier (h x 2 + 2) whole; adapter/ loads with PeftModel.from_pretrained onto the base its
    config names and gives the logits of model/ (the adapters merged in), whose other weights
    (embeddings, up, out) are the base's, untouched."""
    out = tmp_path / "lora"
    main(rte(tiny_egbert_bert_dir, micro_data, out, "--epochs", "2", "--lr", "1e-2", "--lora",
             "--lora-rank", "4", "--lora-alpha", "12", "--lora-dropout", "0.1",
             "--lora-target-modules", "qkv", "down"))  # fmt: skip
    config = AutoConfig.from_pretrained(tiny_egbert_bert_dir)
    h, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    results = json.loads((out / "eval_results.json").read_text())
    adapters = layers * (4 * (h + 3 * h) + 4 * (inner + h))
    assert results["trainable_parameters"] == adapters + h * 2 + 2
    assert results["options"]["lora_rank"] == 4 and results["steps"] > 0
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(tiny_egbert_bert_dir)
    # alpha 12: neither egbert's default (16) nor PEFT's (8), so the option reached the adapter
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 12)
    assert adapter_config["lora_dropout"] == 0.1
    assert sorted(adapter_config["target_modules"]) == ["down", "qkv"]

    base = AutoModelForSequenceClassification.from_pretrained(tiny_egbert_bert_dir, num_labels=2)
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    merged = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    with torch.no_grad():
        adapter_logits = adapted(input_ids=token_ids()).logits
        torch.testing.assert_close(merged(input_ids=token_ids()).logits, adapter_logits)
        with adapted.disable_adapter():  # the classifier head is trained, the rest the base's
            assert not torch.allclose(adapted(input_ids=token_ids()).logits, adapter_logits)
    start = load_file(tiny_egbert_bert_dir / "model.safetensors")
    tuned = load_file(out / "model" / "model.safetensors")
    untouched = [name for name in start if ".qkv." not in name and ".down." not in name]
    assert untouched and all(torch.equal(tuned[f"bert.{n}"], start[n]) for n in untouched)
    adapted_weight = next(name for name in start if ".qkv.weight" in name)
    assert not torch.equal(tuned[f"bert.{adapted_weight}"], start[adapted_weight])


def test_the_best_epochs_adapters_are_loaded_back(tiny_egbert_bert_dir: Path, tmp_path: Path):
    """The kept (best) model of a LoRA run is its adapters: saved as PEFT saves them and loaded
    back over later ones, so the model gives the best step's logits again."""
    base = AutoModelForSequenceClassification.from_pretrained(tiny_egbert_bert_dir, num_labels=2)
    model = with_adapters(base, LoraArguments(lora=True), tiny_egbert_bert_dir, ["classifier"])
    accelerator = Accelerator(cpu=True)
    save = functools.partial(save_model_folder, accelerator, model)
    best = BestModel("accuracy", None, tmp_path / "best", save, lambda folder: None)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        model.eval()
        kept = model(input_ids=token_ids()).logits
        best.track({"accuracy": 0.8}, TrainerState())
        assert (tmp_path / "best" / "adapter_model.safetensors").is_file()
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.5)
        assert not torch.allclose(model(input_ids=token_ids()).logits, kept)
        best.load_into(model, torch.device("cpu"))
        torch.testing.assert_close(model(input_ids=token_ids()).logits, kept)


def test_lora_refuses_freeze_and_elmo_in_one_line(
    tiny_egbert_bert_dir: Path, micro_data: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="--lora with --freeze: .* choose one"):
        main(rte(tiny_egbert_bert_dir, micro_data, tmp_path / "f", "--lora", "--freeze"))
    assert not (tmp_path / "f").exists()
    elmo_dir = tmp_path / "elmo"
    sizes = {"hidden_size": 8, "cell_size": 16, "num_hidden_layers": 1}
    EgbertElmoModel(EgbertElmoConfig(vocab_size=50, **sizes)).save_pretrained(elmo_dir)
    with pytest.raises(ConfigError, match="egbert-elmo model cannot take LoRA: .*nn.LSTM"):
        main(rte(elmo_dir, micro_data, tmp_path / "e", "--lora"))
    assert not (tmp_path / "e").exists()
