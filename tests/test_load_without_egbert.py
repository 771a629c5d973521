"""A folder written by save_pretrained loads through transformers' Auto classes in a Python where
egbert cannot be imported (the folder's own copies of egbert/models' files, named in config.json's
auto_map), and gives egbert's outputs; with egbert imported, the same folder loads egbert's own
classes without running or asking about the folder's code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.heads import (
    EgbertBertForSequenceClassification,
    EgbertElmoForSequenceClassification,
)

REPO = Path(__file__).resolve().parents[1]
TRANSFORMER = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
ELMO = dict(vocab_size=60, hidden_size=8, cell_size=16, num_hidden_layers=2)

# Loads every Auto class the auto_map of every folder under argv[1]/models names, runs it on
# argv[1]/inputs.pt and saves the outputs to argv[1]/<argv[2]>.pt. "without": egbert cannot be
# imported and the folders' code is trusted; "with": egbert is imported, nothing is trusted, and
# any question to the user fails.
LOADER = """
import builtins, json, sys
from pathlib import Path

if sys.argv[2] == "without":
    sys.modules["egbert"] = None  # any `import egbert...` now raises ImportError
    trust = {"trust_remote_code": True}
else:
    import egbert  # registers egbert's classes
    trust = {}
    def no_questions(prompt=""):
        raise AssertionError(f"asked: {prompt}")
    builtins.input = no_questions

import torch
import transformers

root = Path(sys.argv[1])
inputs = torch.load(root / "inputs.pt")
results = {}
for folder in sorted((root / "models").iterdir()):
    for auto_name in json.loads((folder / "config.json").read_text())["auto_map"]:
        loaded = getattr(transformers, auto_name).from_pretrained(folder, **trust)
        key = f"{folder.name}/{auto_name}"
        results[f"{key}/module"] = type(loaded).__module__
        if auto_name == "AutoConfig":
            results[f"{key}/config"] = json.dumps(loaded.to_diff_dict(), sort_keys=True)
            continue
        with torch.no_grad():
            output = loaded.eval()(**inputs)
        for field, value in output.items():
            if isinstance(value, torch.Tensor):
                results[f"{key}/{field}"] = value
        if auto_name == "AutoModelForCausalLM":
            prompt = inputs["input_ids"][:1, :4]
            results[f"{key}/generate"] = loaded.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False
            )
results["egbert modules"] = sorted(
    name for name, module in sys.modules.items()
    if module is not None and name.split(".")[0] == "egbert"
)
results["folder modules"] = sorted(
    name for name in sys.modules if name.startswith("transformers_modules")
)
torch.save(results, root / f"{sys.argv[2]}.pt")
"""


# Saves a tiny bert pretraining model and classifier sharded with FSDP2 (one CPU process), whose
# classes torch swaps for ones it derives at run time, into argv[1]/<class name>.
FSDP2_SAVER = """
import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.heads import EgbertBertForSequenceClassification

root = Path(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
for model_class in (EgbertBertForPreTraining, EgbertBertForSequenceClassification):
    config = EgbertBertConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_labels=3
    )
    model = fully_shard(model_class(config), mesh=mesh)
    state = {name: getattr(tensor, "full_tensor", lambda: tensor)()
             for name, tensor in model.state_dict().items()}  # fmt: skip
    model.save_pretrained(root / model_class.__name__, state_dict=state)
    (root / f"{model_class.__name__}.sharded").write_text(type(model).__name__)
dist.destroy_process_group()
"""


def save_tiny_models(models_dir: Path) -> None:
    """One tiny model of each kind egbert saves, built directly from its config."""
    torch.manual_seed(0)
    EgbertBertForPreTraining(EgbertBertConfig(**TRANSFORMER, intermediate_size=32)).save_pretrained(
        models_dir / "bert"
    )
    gpt = EgbertGPTConfig(**TRANSFORMER, intermediate_size=32, initializer_range=0.2)
    EgbertGPTForCausalLM(gpt).save_pretrained(models_dir / "gpt")
    EgbertElmoForBidirectionalLM(EgbertElmoConfig(**ELMO)).save_pretrained(models_dir / "elmo")
    bert = EgbertBertConfig(**TRANSFORMER, intermediate_size=32, num_labels=3)
    EgbertBertForSequenceClassification(bert, classifier_features="cls").save_pretrained(
        models_dir / "bert-classifier"
    )
    elmo = EgbertElmoConfig(**ELMO, num_labels=2)
    classifier = EgbertElmoForSequenceClassification(elmo, classifier_features="scalar-mix")
    with torch.no_grad():  # away from the plain average, so a lost mix would show
        classifier.scalar_mix.layer_weights.copy_(torch.tensor([1.0, -0.5, 0.3]))
    classifier.save_pretrained(models_dir / "elmo-classifier")


def load_in_subprocess(root: Path, mode: str) -> dict:
    # the caller's PYTHONPATH but this checkout (packages may come from there, as on a GPU
    # machine with wheels installed into a folder); "with" puts the checkout first
    inherited = [
        entry
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != REPO
    ]
    paths = [str(REPO), *inherited] if mode == "with" else inherited
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(root / "modules"),
        "PYTHONPATH": os.pathsep.join(paths),
    }
    subprocess.run(
        [sys.executable, str(root / "loader.py"), str(root), mode],
        check=True,
        cwd=root,  # not the repository: its egbert/ must not be found as a folder
        env=env,
    )
    return torch.load(root / f"{mode}.pt")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """The folders, and what they give when loaded without egbert and with it."""
    root = tmp_path_factory.mktemp("folders")
    save_tiny_models(root / "models")
    ids = torch.randint(1, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    torch.save(
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
        root / "inputs.pt",
    )
    (root / "loader.py").write_text(LOADER, encoding="utf-8")
    return root, load_in_subprocess(root, "without"), load_in_subprocess(root, "with")


EXPECTED_AUTO_MAPS = {
    "bert": {
        "AutoConfig": "bert.EgbertBertConfig",
        "AutoModel": "bert.EgbertBertModel",
        "AutoModelForPreTraining": "bert.EgbertBertForPreTraining",
        "AutoModelForMaskedLM": "bert.EgbertBertForMaskedLM",
    },
    "gpt": {
        "AutoConfig": "gpt.EgbertGPTConfig",
        "AutoModel": "gpt.EgbertGPTModel",
        "AutoModelForCausalLM": "gpt.EgbertGPTForCausalLM",
    },
    "elmo": {
        "AutoConfig": "elmo.EgbertElmoConfig",
        "AutoModel": "elmo.EgbertElmoModel",
        "AutoModelForPreTraining": "elmo.EgbertElmoForBidirectionalLM",
    },
    "bert-classifier": {
        "AutoConfig": "bert.EgbertBertConfig",
        "AutoModel": "bert.EgbertBertModel",
        "AutoModelForSequenceClassification": "heads.EgbertBertForSequenceClassification",
    },
    "elmo-classifier": {
        "AutoConfig": "elmo.EgbertElmoConfig",
        "AutoModel": "elmo.EgbertElmoModel",
        "AutoModelForSequenceClassification": "heads.EgbertElmoForSequenceClassification",
    },
}


MODEL_FILES = {"layers.py", "kernels.py"}
CLASSIFIER_FILES = MODEL_FILES | {"heads.py", "bert.py", "gpt.py", "elmo.py"}


@pytest.mark.slow
def test_every_folder_names_its_auto_classes_and_holds_their_files(loaded) -> None:
    root, without, _ = loaded
    for folder, expected in EXPECTED_AUTO_MAPS.items():
        path = root / "models" / folder
        assert json.loads((path / "config.json").read_text())["auto_map"] == expected, folder
        files = {file.name for file in path.glob("*.py")}
        family = expected["AutoConfig"].split(".")[0]
        assert files == (
            CLASSIFIER_FILES if "classifier" in folder else MODEL_FILES | {f"{family}.py"}
        )
        assert {key.split("/")[1] for key in without if key.startswith(f"{folder}/")} == set(
            expected
        )


def test_folders_load_without_egbert_and_give_egbert_s_outputs(loaded) -> None:
    _, without, with_egbert = loaded
    assert without["egbert modules"] == []
    assert without.keys() == with_egbert.keys()
    compared = 0
    for key, value in without.items():
        if key.endswith("/module"):
            assert value.startswith("transformers_modules."), key
            assert with_egbert[key].startswith("egbert.models."), key
        elif key.endswith("/config"):
            assert json.loads(value) == json.loads(with_egbert[key]), key
        elif isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, with_egbert[key], atol=1e-5, rtol=0, msg=key)
            compared += 1
    assert compared >= 15
    assert without["gpt/AutoModelForCausalLM/generate"].shape == (1, 10)


def test_with_egbert_imported_the_folder_s_code_is_never_run(loaded) -> None:
    _, _, with_egbert = loaded
    assert with_egbert["folder modules"] == []


def test_a_model_sharded_with_fsdp2_saves_the_same_folder(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    (tmp_path / "saver.py").write_text(FSDP2_SAVER, encoding="utf-8")
    subprocess.run(
        [sys.executable, str(tmp_path / "saver.py"), str(tmp_path)],
        check=True,
        env=subprocess_env,
    )
    for class_name, folder in (
        ("EgbertBertForPreTraining", "bert"),
        ("EgbertBertForSequenceClassification", "bert-classifier"),
    ):
        path = tmp_path / class_name
        assert (tmp_path / f"{class_name}.sharded").read_text() == f"FSDP{class_name}"
        config = json.loads((path / "config.json").read_text())
        assert config["auto_map"] == EXPECTED_AUTO_MAPS[folder]
        expected_files = CLASSIFIER_FILES if "classifier" in folder else MODEL_FILES | {"bert.py"}
        assert {file.name for file in path.glob("*.py")} == expected_files
