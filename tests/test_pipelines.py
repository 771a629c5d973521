"""Every saved folder's tokenizer encodes what its family expects, so transformers' pipelines
work on egbert folders with egbert's own tokenizer: text generation (the same text as `egbert
generate`), fill-mask, feature extraction, text classification, truncation to the model's length.

The models are tiny and untrained (built from their configs), except where a test checks what
pretraining itself saves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, pipeline

from egbert.commands.pretrain import main as pretrain_main
from egbert.generate import generate_text
from egbert.models.bert import EgbertBertConfig, EgbertBertForMaskedLM, EgbertBertModel
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoModel
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM, EgbertGPTModel
from egbert.models.heads import (
    EgbertBertForSequenceClassification,
    EgbertGPTForSequenceClassification,
)
from egbert.tokenizer import RECURRENT_MAX_LENGTH, load_tokenizer, tokenizer_for_model

PROMPT = "the history of"
LONG_TEXT = "the history of the city is long and old . " * 40  # ~400 tokens
MAX_POSITIONS = 48
# initializer_range well above 0.02 so that the context, not only the last token, decides
TRANSFORMER = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=MAX_POSITIONS,
    initializer_range=0.2,
    hidden_dropout_prob=0.0,
)
ELMO = dict(hidden_size=16, cell_size=32, num_hidden_layers=1, hidden_dropout_prob=0.0)


def special_ids(tokenizer) -> dict[str, int]:
    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return ids


def save_model_folder(model, tokenizer_dir: Path, out: Path) -> Path:
    """Save `model` with the shared tokenizer made for its family, as pretraining does."""
    model.save_pretrained(out)
    tokenizer_for_model(load_tokenizer(tokenizer_dir), model.config).save_pretrained(out)
    return out


def build(model_class, config_class, options: dict, tokenizer_dir: Path, out: Path, **extra):
    torch.manual_seed(0)
    config = config_class(**options, **special_ids(load_tokenizer(tokenizer_dir)), **extra)
    return save_model_folder(model_class(config).eval(), tokenizer_dir, out)


@pytest.fixture(scope="module")
def gpt_dir(tiny_tokenizer_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpt")
    return build(EgbertGPTForCausalLM, EgbertGPTConfig, TRANSFORMER, tiny_tokenizer_dir, out)


def test_text_generation_pipeline_gives_the_same_text_as_egbert_generate(gpt_dir: Path) -> None:
    generator = pipeline("text-generation", model=str(gpt_dir), device="cpu")
    options = dict(max_new_tokens=8, do_sample=False)
    new_text = generator(PROMPT, return_full_text=False, **options)[0]["generated_text"]
    full_text = generator(PROMPT, **options)[0]["generated_text"]
    ours = generate_text(gpt_dir, PROMPT, max_new_tokens=8, stream=False)
    assert new_text.strip()
    assert ours == new_text
    assert full_text == PROMPT + ours
    # the prompt reaches the model as its own tokens: no [CLS] before it, no [SEP] after it
    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    ids = tokenizer(PROMPT)["input_ids"]
    assert ids == tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert "token_type_ids" not in tokenizer(PROMPT)


def test_egbert_generate_remakes_an_old_folders_bert_template(
    gpt_dir: Path, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A gpt folder saved before tokenizers were per family holds the [CLS] ... [SEP] one."""
    old = tmp_path / "old"
    EgbertGPTForCausalLM.from_pretrained(gpt_dir).save_pretrained(old)
    load_tokenizer(tiny_tokenizer_dir).save_pretrained(old)
    assert AutoTokenizer.from_pretrained(old)(PROMPT)["input_ids"][0] == 2  # [CLS]
    expected = generate_text(gpt_dir, PROMPT, max_new_tokens=8, stream=False)
    assert generate_text(old, PROMPT, max_new_tokens=8, stream=False) == expected


def test_fill_mask_pipeline_predicts_the_models_top_token(
    tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    folder = build(
        EgbertBertForMaskedLM, EgbertBertConfig, TRANSFORMER, tiny_tokenizer_dir, tmp_path
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = f"the history of the {tokenizer.mask_token} is long ."
    candidates = pipeline("fill-mask", model=str(folder), device="cpu")(text, top_k=3)
    batch = tokenizer(text, return_tensors="pt")
    assert batch["input_ids"][0, 0] == tokenizer.cls_token_id
    assert batch["input_ids"][0, -1] == tokenizer.sep_token_id
    model = EgbertBertForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(**batch).logits[0]
    position = batch["input_ids"][0].tolist().index(tokenizer.mask_token_id)
    top = logits[position].topk(3).indices.tolist()
    assert [candidate["token"] for candidate in candidates] == top


FEATURE_MODELS = {
    "bert": (EgbertBertModel, EgbertBertConfig, TRANSFORMER),
    "gpt": (EgbertGPTModel, EgbertGPTConfig, TRANSFORMER),
    "elmo": (EgbertElmoModel, EgbertElmoConfig, ELMO),
}


@pytest.mark.parametrize("family", FEATURE_MODELS)
def test_feature_extraction_pipeline_returns_the_models_hidden_states(
    family: str, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    model_class, config_class, options = FEATURE_MODELS[family]
    folder = build(model_class, config_class, options, tiny_tokenizer_dir, tmp_path)
    extractor = pipeline("feature-extraction", model=str(folder), device="cpu")
    features = torch.tensor(extractor(PROMPT))[0]  # (tokens, hidden)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(PROMPT, return_tensors="pt")
    bert_template = family == "bert"
    assert (batch["input_ids"][0, 0] == tokenizer.cls_token_id) == bert_template
    assert ("token_type_ids" in batch) == bert_template
    model = model_class.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = model(**batch).last_hidden_state[0]
    torch.testing.assert_close(features, expected)


CLASSIFIERS = {
    "bert": (EgbertBertForSequenceClassification, EgbertBertConfig),
    "gpt": (EgbertGPTForSequenceClassification, EgbertGPTConfig),
}


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_text_classification_pipeline_scores_single_texts_and_pairs(
    family: str, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    model_class, config_class = CLASSIFIERS[family]
    labels = {"id2label": {0: "no", 1: "maybe", 2: "yes"}}
    folder = build(model_class, config_class, TRANSFORMER, tiny_tokenizer_dir, tmp_path, **labels)
    classifier = pipeline("text-classification", model=str(folder), device="cpu", top_k=None)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = model_class.from_pretrained(folder).eval()
    pair = {"text": PROMPT, "text_pair": "the city is old ."}
    for inputs, encoded in ((PROMPT, tokenizer(PROMPT)), (pair, tokenizer(*pair.values()))):
        scores = {result["label"]: result["score"] for result in classifier([inputs])[0]}
        with torch.no_grad():
            logits = model(**encoded.convert_to_tensors("pt", prepend_batch_axis=True)).logits
        expected = dict(zip(["no", "maybe", "yes"], logits[0].softmax(-1).tolist(), strict=True))
        assert scores == pytest.approx(expected, abs=1e-6)


def test_truncation_cuts_long_inputs_to_the_models_length(
    gpt_dir: Path, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    assert tokenizer.model_max_length == MAX_POSITIONS
    assert len(tokenizer(LONG_TEXT)["input_ids"]) > MAX_POSITIONS
    assert len(tokenizer(LONG_TEXT, truncation=True)["input_ids"]) == MAX_POSITIONS
    folder = build(
        EgbertBertForSequenceClassification,
        EgbertBertConfig,
        TRANSFORMER,
        tiny_tokenizer_dir,
        tmp_path,
        num_labels=2,
    )
    classifier = pipeline("text-classification", model=str(folder), device="cpu")
    assert classifier(LONG_TEXT, truncation=True)[0]["label"] in ("LABEL_0", "LABEL_1")
    extractor = pipeline("feature-extraction", model=str(folder), device="cpu")
    features = extractor(LONG_TEXT, tokenize_kwargs={"truncation": True})
    assert len(features[0]) == MAX_POSITIONS


@pytest.mark.usefixtures("one_thread_and_fresh_accelerate")
@pytest.mark.parametrize("family", ["bert", "gpt", "elmo"])
def test_pretraining_saves_the_tokenizer_of_its_family(
    family: str, tiny_tokenizer_dir: Path, wikitext_slice: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.tokens"
    lines = wikitext_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    corpus.write_text("".join(lines[:120]), encoding="utf-8")
    out = tmp_path / "run"
    pretrain_main(
        ["--model", family, "--preset", "tiny", "--tokenizer", str(tiny_tokenizer_dir),
         "--train-files", str(corpus), "--doc-boundary", "wikitext", "--output-dir", str(out),
         "--seq-len", "32", "--batch-size", "4", "--max-steps", "1"]
    )  # fmt: skip
    model_dir = out / "model" if (out / "model").is_dir() else out
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(PROMPT)["input_ids"])
    if family == "bert":
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert tokenizer.model_max_length == 512  # the tiny preset's positions
        assert "token_type_ids" in tokenizer(PROMPT)
    else:
        assert tokens == tokenizer.tokenize(PROMPT)
        assert tokenizer.model_max_length == (512 if family == "gpt" else RECURRENT_MAX_LENGTH)
        assert "token_type_ids" not in tokenizer(PROMPT)
