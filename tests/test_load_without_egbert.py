"""A folder written by save_pretrained loads through transformers' Auto classes in a Python where
egbert cannot be imported (the folder's own copies of egbert/models' files, named in config.json's
auto_map), and gives egbert's outputs; with egbert imported, the same folder loads egbert's own
classes without running or asking about the folder's code. transformers' Trainer fine-tunes
every pretrained folder there, through AutoModelForSequenceClassification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.heads import (
    CLASSIFIERS,
    EgbertBertForSequenceClassification,
    EgbertElmoForSequenceClassification,
)
from egbert.tokenizer import SPECIAL_TOKENS, load_tokenizer, tokenizer_for_model

REPO = Path(__file__).resolve().parents[1]
TRANSFORMER = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
ELMO = dict(vocab_size=60, hidden_size=8, cell_size=16, num_hidden_layers=2)
OPTIONS = dict(
    gated_mlp=True, hidden_act="silu", norm_type="rmsnorm", qk_norm=True, attention_bias=False,
    mlp_bias=False, position_embedding_type="rotary", rope_theta=500.0,
)  # fmt: skip

# Loads every Auto class the auto_map of every folder under argv[1]/models names (each from the
# same seed: a head the folder lacks starts alike in both runs) and the folder's tokenizer, runs
# it on argv[1]/inputs.pt and saves the outputs to argv[1]/<argv[2]>.pt. "without": egbert cannot
# be imported and the folders' code is trusted; "with": egbert is imported, nothing is trusted,
# and any question to the user fails. Then, "without" only: transformers' Trainer fine-tunes each
# pretrained folder's AutoModelForSequenceClassification for three steps on the first 200 RTE
# pairs of argv[3], and the weights it ends with and its logits on the first 8 dev pairs go to
# argv[1]/finetuned-<folder>.pt.
LOADER = """
import builtins, csv, json, sys
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
    if (folder / "tokenizer.json").is_file():
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **trust)
        results[f"{folder.name}/tokenizer/class"] = type(tokenizer).__module__
    for auto_name in json.loads((folder / "config.json").read_text())["auto_map"]:
        torch.manual_seed(0)
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
if sys.argv[2] == "with":
    sys.exit()


def rte_pairs(split, count):
    with open(Path(sys.argv[3]) / f"{split}.tsv", encoding="utf-8") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
    return rows


labels = {"entailment": 0, "not_entailment": 1}
for name in ("bert", "gpt", "elmo"):
    folder = root / "models" / name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **trust)
    encode = lambda rows: tokenizer(
        [row["sentence1"] for row in rows], [row["sentence2"] for row in rows],
        truncation=True, max_length=64,
    )
    train = rte_pairs("train", 200)
    encoded = encode(train)
    examples = [
        {**{key: values[i] for key, values in encoded.items()}, "labels": labels[row["label"]]}
        for i, row in enumerate(train)
    ]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=2, **trust
    )
    arguments = transformers.TrainingArguments(
        output_dir=str(root / "trainer" / name), max_steps=3, per_device_train_batch_size=8,
        learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True, seed=0,
        disable_tqdm=True,
    )
    transformers.Trainer(
        model=model, args=arguments, train_dataset=examples,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
    ).train()
    dev = tokenizer.pad(encode(rte_pairs("dev", 8)), return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**dev).logits
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    torch.save(
        {"module": type(model).__module__, "inputs": dict(dev), "logits": logits, "state": state},
        root / f"finetuned-{name}.pt",
    )
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


def letter_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer whose 58 tokens, egbert's specials and the letters (word-initial
    and not), fit the tiny models' vocabulary: every word of letters is read letter by letter."""
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)]
    vocab = [*SPECIAL_TOKENS, *letters, *(f"##{letter}" for letter in letters)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return load_tokenizer(folder / "vocab.txt")


def save_tiny_models(models_dir: Path) -> None:
    """One tiny model of each kind egbert saves, built directly from its config; the pretrained
    ones with their family's tokenizer, as egbert's runs save them."""
    torch.manual_seed(0)
    models_dir.mkdir(parents=True)
    tokenizer = letter_tokenizer(models_dir.parent)
    bert = EgbertBertConfig(**TRANSFORMER, intermediate_size=32)
    gpt = EgbertGPTConfig(**TRANSFORMER, intermediate_size=32, initializer_range=0.2)
    pretrained = {
        "bert": EgbertBertForPreTraining(bert),
        "gpt": EgbertGPTForCausalLM(gpt),
        "elmo": EgbertElmoForBidirectionalLM(EgbertElmoConfig(**ELMO)),
    }
    for name, model in pretrained.items():
        model.save_pretrained(models_dir / name)
        tokenizer_for_model(tokenizer, model.config).save_pretrained(models_dir / name)
    # the architecture options (docs/models.md), each away from its default: the folders' copies
    # of layers.py must build them alike
    EgbertBertForPreTraining(
        EgbertBertConfig(**TRANSFORMER, intermediate_size=32, residual_attention=True, **OPTIONS)
    ).save_pretrained(models_dir / "bert-options")
    EgbertGPTForCausalLM(
        EgbertGPTConfig(**TRANSFORMER, intermediate_size=32, embedding_norm=True, **OPTIONS)
    ).save_pretrained(models_dir / "gpt-options")
    bert = EgbertBertConfig(**TRANSFORMER, intermediate_size=32, num_labels=3)
    EgbertBertForSequenceClassification(bert, classifier_features="cls").save_pretrained(
        models_dir / "bert-classifier"
    )
    elmo = EgbertElmoConfig(**ELMO, num_labels=2)
    classifier = EgbertElmoForSequenceClassification(elmo, classifier_features="scalar-mix")
    with torch.no_grad():  # away from the plain average, so a lost mix would show
        classifier.scalar_mix.layer_weights.copy_(torch.tensor([1.0, -0.5, 0.3]))
    classifier.save_pretrained(models_dir / "elmo-classifier")


def load_in_subprocess(root: Path, mode: str, rte_dir: Path) -> dict:
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
        [sys.executable, str(root / "loader.py"), str(root), mode, str(rte_dir)],
        check=True,
        cwd=root,  # not the repository: its egbert/ must not be found as a folder
        env=env,
        stdin=subprocess.DEVNULL,  # a question to the user fails at once
    )
    return torch.load(root / f"{mode}.pt")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Path, dict, dict]:
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
    rte = data_dir / "glue" / "RTE"
    return root, load_in_subprocess(root, "without", rte), load_in_subprocess(root, "with", rte)


EXPECTED_AUTO_MAPS = {
    "bert": {
        "AutoConfig": "bert.EgbertBertConfig",
        "AutoModel": "bert.EgbertBertModel",
        "AutoModelForPreTraining": "bert.EgbertBertForPreTraining",
        "AutoModelForMaskedLM": "bert.EgbertBertForMaskedLM",
        "AutoModelForSequenceClassification": "heads.EgbertBertForSequenceClassification",
    },
    "gpt": {
        "AutoConfig": "gpt.EgbertGPTConfig",
        "AutoModel": "gpt.EgbertGPTModel",
        "AutoModelForCausalLM": "gpt.EgbertGPTForCausalLM",
        "AutoModelForSequenceClassification": "heads.EgbertGPTForSequenceClassification",
    },
    "elmo": {
        "AutoConfig": "elmo.EgbertElmoConfig",
        "AutoModel": "elmo.EgbertElmoModel",
        "AutoModelForPreTraining": "elmo.EgbertElmoForBidirectionalLM",
        "AutoModelForSequenceClassification": "heads.EgbertElmoForSequenceClassification",
    },
    "bert-options": {
        "AutoConfig": "bert.EgbertBertConfig",
        "AutoModel": "bert.EgbertBertModel",
        "AutoModelForPreTraining": "bert.EgbertBertForPreTraining",
        "AutoModelForMaskedLM": "bert.EgbertBertForMaskedLM",
        "AutoModelForSequenceClassification": "heads.EgbertBertForSequenceClassification",
    },
    "gpt-options": {
        "AutoConfig": "gpt.EgbertGPTConfig",
        "AutoModel": "gpt.EgbertGPTModel",
        "AutoModelForCausalLM": "gpt.EgbertGPTForCausalLM",
        "AutoModelForSequenceClassification": "heads.EgbertGPTForSequenceClassification",
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


# every folder: its family's file, the classifier's (heads.py), and the files these import
MODEL_FILES = {"layers.py", "kernels.py", "heads.py", "bert.py", "gpt.py", "elmo.py"}


@pytest.mark.slow
def test_every_folder_names_its_auto_classes_and_holds_their_files(loaded) -> None:
    root, without, _ = loaded
    for folder, expected in EXPECTED_AUTO_MAPS.items():
        path = root / "models" / folder
        assert json.loads((path / "config.json").read_text())["auto_map"] == expected, folder
        assert {file.name for file in path.glob("*.py")} == MODEL_FILES
        loaded_as = {key.split("/")[1] for key in without if key.startswith(f"{folder}/")}
        assert loaded_as - {"tokenizer"} == set(expected)


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
    tmp_path: Path, subprocess_env: dict[str, str], warm_python
) -> None:
    (tmp_path / "saver.py").write_text(FSDP2_SAVER, encoding="utf-8")
    subprocess.run(
        [warm_python(subprocess_env), str(tmp_path / "saver.py"), str(tmp_path)],
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
        assert {file.name for file in path.glob("*.py")} == MODEL_FILES


def test_transformers_trainer_fine_tunes_every_pretrained_folder(loaded) -> None:
    """Fine-tuned without egbert by transformers' Trainer, each pretrained folder's classifier
    ends with weights that egbert's own classifier of that family turns into the same logits."""
    root, without, with_egbert = loaded
    for family, classifier_class in zip(("bert", "gpt", "elmo"), CLASSIFIERS, strict=True):
        finetuned = torch.load(root / f"finetuned-{family}.pt")
        assert finetuned["module"].startswith("transformers_modules."), family
        pretrained = classifier_class.from_pretrained(root / "models" / family, num_labels=2)
        trained = finetuned["state"]
        assert trained.keys() == pretrained.state_dict().keys(), family
        moved = [name for name, weight in pretrained.state_dict().items()
                 if not torch.equal(weight, trained[name])]  # fmt: skip
        assert len(moved) == len(trained), family  # the Trainer updated every weight
        pretrained.load_state_dict(trained)
        with torch.no_grad():
            logits = pretrained.eval()(**finetuned["inputs"]).logits
        torch.testing.assert_close(logits, finetuned["logits"], atol=1e-5, rtol=0, msg=family)
        # the tokenizer is transformers' own class, with egbert or without it
        for loaded_by in (without, with_egbert):
            assert loaded_by[f"{family}/tokenizer/class"].startswith("transformers."), family
