"""Stock transformers BERT / GPT-2 <-> egbert: same outputs, exact round trips, the CLI, the
fine-tuned classifiers that have a stock twin and the one-line refusal of those that have none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from option_coverage import proves
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
)

from egbert.cli import main as cli
from egbert.errors import CheckpointError
from egbert.models.bert import (
    EgbertBertConfig,
    EgbertBertForPreTraining,
    EgbertBertForReplacedTokenDetection,
    EgbertBertModel,
)
from egbert.models.convert import (
    bert_from_transformers,
    bert_to_transformers,
    convert_checkpoint,
    gpt2_from_transformers,
    gpt2_to_transformers,
)
from egbert.models.elmo import EgbertElmoConfig
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.heads import (
    EgbertBertForSequenceClassification,
    EgbertElmoForSequenceClassification,
    EgbertGPTForSequenceClassification,
)
from egbert.tokenizer import load_tokenizer

TOLERANCE = dict(atol=1e-5, rtol=0)
TINY_BERT = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
# initializer_range above GPT-2's 0.02 so that the context, not just the last token, decides
TINY_GPT2 = dict(
    vocab_size=120, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2
)


def padded_batch(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows: a full one and one with 4 positions of right padding."""
    ids = torch.randint(1, vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 7:] = 0
    ids[1, 7:] = 0
    return ids, attention_mask


def assert_close_where_real(actual, expected, attention_mask) -> None:
    real = attention_mask.bool()
    torch.testing.assert_close(actual[real], expected[real], **TOLERANCE)


def assert_same_state_dict(original: torch.nn.Module, round_trip: torch.nn.Module) -> None:
    expected, actual = original.state_dict(), round_trip.state_dict()
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def compare_bert(stock, egbert, ids, attention_mask) -> None:
    kwargs = dict(attention_mask=attention_mask, output_hidden_states=True)
    with torch.no_grad():
        expected, actual = stock(ids, **kwargs), egbert(ids, **kwargs)
    assert len(actual.hidden_states) == len(expected.hidden_states)
    for mine, theirs in zip(actual.hidden_states, expected.hidden_states, strict=True):
        assert_close_where_real(mine, theirs, attention_mask)
    return expected, actual


def compare_gpt2(stock, egbert, ids, attention_mask) -> None:
    kwargs = dict(attention_mask=attention_mask, output_hidden_states=True)
    with torch.no_grad():
        expected, actual = stock(ids, **kwargs), egbert(ids, **kwargs)
    assert len(actual.hidden_states) == len(expected.hidden_states)
    for mine, theirs in zip(actual.hidden_states, expected.hidden_states, strict=True):
        assert_close_where_real(mine, theirs, attention_mask)
    assert_close_where_real(actual.logits, expected.logits, attention_mask)


@pytest.mark.parametrize("padded", [False, True])
def test_random_bert_for_pretraining_matches_after_conversion(padded: bool) -> None:
    torch.manual_seed(0)
    stock = BertForPreTraining(BertConfig(**TINY_BERT)).eval()
    egbert = bert_from_transformers(stock)
    assert isinstance(egbert, EgbertBertForPreTraining)
    assert egbert.mlm_head.decoder.weight is egbert.bert.embeddings.word_embeddings.weight
    ids, attention_mask = padded_batch(120)
    if not padded:
        attention_mask = torch.ones_like(ids)
    expected, actual = compare_bert(stock, egbert, ids, attention_mask)
    assert_close_where_real(actual.prediction_logits, expected.prediction_logits, attention_mask)
    torch.testing.assert_close(
        actual.seq_relationship_logits, expected.seq_relationship_logits, **TOLERANCE
    )
    assert_same_state_dict(stock, bert_to_transformers(egbert))


def test_random_bert_for_masked_lm_round_trips() -> None:
    torch.manual_seed(0)
    stock = BertForMaskedLM(BertConfig(**TINY_BERT)).eval()
    egbert = bert_from_transformers(stock)
    ids, attention_mask = padded_batch(120)
    expected, actual = compare_bert(stock, egbert, ids, attention_mask)
    assert_close_where_real(actual.logits, expected.logits, attention_mask)
    round_trip = bert_to_transformers(egbert)
    assert isinstance(round_trip, BertForMaskedLM)
    assert_same_state_dict(stock, round_trip)


def test_minilm_matches_after_conversion(minilm_dir: Path) -> None:
    stock = BertModel.from_pretrained(minilm_dir).eval()
    egbert = bert_from_transformers(stock)
    assert isinstance(egbert, EgbertBertModel)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    batch = tokenizer(
        ["A man is playing a guitar on the stage.", "Hello!"], padding=True, return_tensors="pt"
    )
    assert not batch["attention_mask"].all()  # the second sentence is padded
    with torch.no_grad():
        expected = stock(**batch, output_hidden_states=True)
        actual = egbert(**batch, output_hidden_states=True)
    for mine, theirs in zip(actual.hidden_states, expected.hidden_states, strict=True):
        assert_close_where_real(mine, theirs, batch["attention_mask"])
    torch.testing.assert_close(actual.pooler_output, expected.pooler_output, **TOLERANCE)
    assert_same_state_dict(stock, bert_to_transformers(egbert))


@pytest.mark.parametrize("padded", [False, True])
def test_random_gpt2_matches_after_conversion(padded: bool) -> None:
    torch.manual_seed(0)
    stock = GPT2LMHeadModel(GPT2Config(**TINY_GPT2, bos_token_id=0, eos_token_id=0)).eval()
    egbert = gpt2_from_transformers(stock)
    assert isinstance(egbert, EgbertGPTForCausalLM)
    assert egbert.lm_head.weight is egbert.gpt.embeddings.word_embeddings.weight
    ids, attention_mask = padded_batch(120)
    if not padded:
        attention_mask = torch.ones_like(ids)
    compare_gpt2(stock, egbert, ids, attention_mask)
    assert_same_state_dict(stock, gpt2_to_transformers(egbert))


def test_tiny_gpt2_matches_and_generates_the_same_tokens(tiny_gpt2_dir: Path) -> None:
    stock = GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir).eval()
    egbert = gpt2_from_transformers(stock)
    ids, attention_mask = padded_batch(50257)
    compare_gpt2(stock, egbert, ids, attention_mask)
    assert_same_state_dict(stock, gpt2_to_transformers(egbert))
    prompt = ids[:1, :5]
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert torch.equal(egbert.generate(prompt, **options), stock.generate(prompt, **options))


def test_random_gpt2_greedy_generate_matches_on_a_left_padded_batch() -> None:
    torch.manual_seed(0)
    stock = GPT2LMHeadModel(GPT2Config(**TINY_GPT2, bos_token_id=0, eos_token_id=0)).eval()
    egbert = gpt2_from_transformers(stock)
    ids = torch.randint(1, 120, (2, 6), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :2] = 0
    options = dict(attention_mask=attention_mask, max_new_tokens=12, do_sample=False)
    options["pad_token_id"] = 0
    assert torch.equal(egbert.generate(ids, **options), stock.generate(ids, **options))


@proves("convert", "--from", "--to", "--to-transformers")
def test_cli_converts_a_checkpoint_and_back(minilm_dir: Path, tmp_path: Path) -> None:
    egbert_dir, stock_dir = tmp_path / "egbert", tmp_path / "stock"
    cli(["convert", "--from", str(minilm_dir), "--to", str(egbert_dir)])
    assert json.loads((egbert_dir / "config.json").read_text())["model_type"] == "egbert-bert"
    assert (egbert_dir / "vocab.txt").is_file()
    assert AutoTokenizer.from_pretrained(egbert_dir).mask_token == "[MASK]"

    cli(["convert", "--from", str(egbert_dir), "--to", str(stock_dir), "--to-transformers"])
    stock_config = (stock_dir / "config.json").read_text()
    assert "egbert" not in stock_config and json.loads(stock_config)["model_type"] == "bert"
    assert_same_state_dict(
        BertModel.from_pretrained(minilm_dir), BertModel.from_pretrained(stock_dir)
    )


@proves("convert", "--config", "--print-config")
def test_the_options_come_back_from_the_printed_config(tmp_path: Path, capsys) -> None:
    """--print-config prints the options and converts nothing; that file given to --config is
    the same conversion."""
    BertModel(BertConfig(**TINY_BERT)).save_pretrained(tmp_path / "stock")
    out = tmp_path / "egbert"
    with pytest.raises(SystemExit) as exit_info:
        cli(["convert", "--from", str(tmp_path / "stock"), "--to", str(out), "--print-config"])
    assert exit_info.value.code == 0 and not out.exists()
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed) == {
        "source": str(tmp_path / "stock"), "target": str(out), "to_transformers": False,
        "allow_pickle": False,
    }  # fmt: skip
    (tmp_path / "convert.yaml").write_text(printed, encoding="utf-8")
    cli(["convert", "--config", str(tmp_path / "convert.yaml")])
    assert json.loads((out / "config.json").read_text())["model_type"] == "egbert-bert"


def test_egbert_pretraining_checkpoint_converts_to_stock(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = EgbertBertConfig(**TINY_BERT, hidden_dropout_prob=0.0)
    egbert = EgbertBertForPreTraining(config).eval()
    egbert.save_pretrained(tmp_path / "egbert")
    stock = convert_checkpoint(tmp_path / "egbert", tmp_path / "stock", to_transformers=True)
    assert isinstance(stock, BertForPreTraining)
    loaded = BertForPreTraining.from_pretrained(tmp_path / "stock").eval()
    # the same predictions: every weight mapped (MLM head and NSP head included), none random
    input_ids, attention_mask = padded_batch(config.vocab_size)
    with torch.no_grad():
        expected = egbert(input_ids, attention_mask)
        actual = loaded(input_ids, attention_mask)
    assert_close_where_real(actual.prediction_logits, expected.prediction_logits, attention_mask)
    torch.testing.assert_close(
        actual.seq_relationship_logits, expected.seq_relationship_logits, atol=1e-5, rtol=0
    )


def test_replaced_token_detection_checkpoint_converts_its_encoder(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = EgbertBertConfig(**TINY_BERT, hidden_dropout_prob=0.0)
    electra = EgbertBertForReplacedTokenDetection(config).eval()
    electra.save_pretrained(tmp_path / "egbert")
    convert_checkpoint(tmp_path / "egbert", tmp_path / "stock", to_transformers=True)
    stock = BertModel.from_pretrained(tmp_path / "stock", add_pooling_layer=False).eval()
    input_ids, attention_mask = padded_batch(config.vocab_size)
    with torch.no_grad():
        expected = electra.bert(input_ids, attention_mask).last_hidden_state
        actual = stock(input_ids, attention_mask).last_hidden_state
    assert_close_where_real(actual, expected, attention_mask)


def test_pre_layernorm_bert_cannot_become_stock_bert(tmp_path: Path) -> None:
    config = EgbertBertConfig(**TINY_BERT, pre_layernorm=True)
    EgbertBertModel(config).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="pre_layernorm"):
        convert_checkpoint(tmp_path, tmp_path / "out", to_transformers=True)


def test_a_directory_that_is_neither_gets_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no config.json"):
        convert_checkpoint(tmp_path, tmp_path / "out")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(CheckpointError, match="'t5'.*accepts"):
        convert_checkpoint(tmp_path, tmp_path / "out")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["RobertaModel"]}))
    with pytest.raises(CheckpointError, match="RobertaModel.*BertForPreTraining"):
        convert_checkpoint(tmp_path, tmp_path / "out")


def test_egbert_checkpoint_without_the_flag_gets_a_hint(tmp_path: Path) -> None:
    EgbertBertModel(EgbertBertConfig(**TINY_BERT)).save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match="--to-transformers"):
        cli(["convert", "--from", str(tmp_path), "--to", str(tmp_path / "out")])


# ---------------------------------------------------------------- fine-tuned classifiers

# initializer_range as TINY_GPT2's; pad_token_id 0: padded_batch pads with 0
TINY_EGBERT_GPT = dict(TINY_BERT, initializer_range=0.2, pad_token_id=0)
CLASSIFIERS = {
    "bert": (EgbertBertForSequenceClassification, EgbertBertConfig, TINY_BERT),
    "gpt": (EgbertGPTForSequenceClassification, EgbertGPTConfig, TINY_EGBERT_GPT),
}
LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}


def trained_looking_classifier(family: str, **options):
    """An egbert classifier whose output layer has a bias far from 0, as after fine-tuning."""
    model_class, config_class, sizes = CLASSIFIERS[family]
    torch.manual_seed(0)
    model = model_class(config_class(**{**sizes, **options})).eval()
    with torch.no_grad():
        model.classifier.bias.normal_(std=0.5)
    return model


def classifier_logits(model, ids, attention_mask) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, attention_mask=attention_mask).logits


CLASSIFIER_CASES = [
    ("bert", dict(id2label=LABELS), BertForSequenceClassification),
    ("gpt", dict(id2label=LABELS), GPT2ForSequenceClassification),
    # a regression head that learned label statistics (STS-B's are about 2.7 and 1.5)
    ("bert", dict(num_labels=1, regression_target_mean=2.7, regression_target_std=1.5), None),
    ("gpt", dict(num_labels=1, regression_target_mean=2.7, regression_target_std=1.5), None),
]


@pytest.mark.parametrize(("family", "options", "stock_class"), CLASSIFIER_CASES)
def test_cls_head_classifier_converts_to_the_stock_class_with_equal_logits(
    family: str, options: dict, stock_class, tmp_path: Path
) -> None:
    egbert = trained_looking_classifier(family, **options)
    egbert.save_pretrained(tmp_path / "egbert")
    convert_checkpoint(tmp_path / "egbert", tmp_path / "stock", to_transformers=True)
    stock = AutoModelForSequenceClassification.from_pretrained(tmp_path / "stock").eval()
    if stock_class is not None:
        assert type(stock) is stock_class
    assert stock.config.id2label == egbert.config.id2label
    assert "egbert" not in (tmp_path / "stock" / "config.json").read_text()
    ids, attention_mask = padded_batch(120)  # right padding with 0, the gpt's pad_token_id
    expected = classifier_logits(egbert, ids, attention_mask)
    torch.testing.assert_close(classifier_logits(stock, ids, attention_mask), expected, **TOLERANCE)
    # and back: the stock classifier as an egbert one gives the same logits
    back = (bert_from_transformers if family == "bert" else gpt2_from_transformers)(stock)
    assert isinstance(back, type(egbert))
    torch.testing.assert_close(classifier_logits(back, ids, attention_mask), expected, **TOLERANCE)


def test_stock_classifiers_round_trip_exactly() -> None:
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(**TINY_BERT, num_labels=3)).eval()
    gpt2 = GPT2ForSequenceClassification(
        GPT2Config(**TINY_GPT2, num_labels=3, pad_token_id=0)
    ).eval()
    ids, attention_mask = padded_batch(120)
    for stock, to_egbert, to_stock in (
        (bert, bert_from_transformers, bert_to_transformers),
        (gpt2, gpt2_from_transformers, gpt2_to_transformers),
    ):
        egbert = to_egbert(stock)
        torch.testing.assert_close(
            classifier_logits(egbert, ids, attention_mask),
            classifier_logits(stock, ids, attention_mask),
            **TOLERANCE,
        )
        assert_same_state_dict(stock, to_stock(egbert))


@pytest.mark.parametrize(
    ("family", "options", "reason"),
    [
        ("bert", dict(classifier_features="last4-concat"), "classifier_features='last4-concat'"),
        ("bert", dict(classifier_features="last4-sum"), "classifier_features='last4-sum'"),
        ("gpt", dict(classifier_features="scalar-mix"), "classifier_features='scalar-mix'"),
        (
            "gpt",
            dict(classifier_features="last4-concat", classifier_pool="mean"),
            "classifier_features='last4-concat'",
        ),
        ("bert", dict(classifier_layer_norm=True), "classifier_layer_norm"),
        ("gpt", dict(pad_token_id=None), "pad_token_id"),
    ],
)
def test_heads_without_a_stock_twin_are_refused_in_one_line(
    family: str, options: dict, reason: str, tmp_path: Path, capsys
) -> None:
    trained_looking_classifier(family, **options).save_pretrained(tmp_path / "egbert")
    with pytest.raises(SystemExit) as exit_info:
        cli(["convert", "--from", str(tmp_path / "egbert"), "--to", str(tmp_path / "stock")]
            + ["--to-transformers"])  # fmt: skip
    message = str(exit_info.value)
    assert reason in message and "\n" not in message
    assert not (tmp_path / "stock").exists()


def test_an_elmo_classifier_is_refused_naming_elmo(tmp_path: Path) -> None:
    config = EgbertElmoConfig(vocab_size=50, hidden_size=8, cell_size=16, num_hidden_layers=1)
    EgbertElmoForSequenceClassification(config).save_pretrained(tmp_path / "elmo")
    with pytest.raises(CheckpointError, match="transformers has no ELMo"):
        convert_checkpoint(tmp_path / "elmo", tmp_path / "stock", to_transformers=True)


def test_converted_gpt_gets_the_gpt_tokenizer(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    """An egbert gpt folder saved with the shared tokenizer's [CLS] ... [SEP] template becomes a
    stock GPT-2 whose tokenizer gives the text's tokens only, and no token_type_ids (GPT-2 would
    add those as word embeddings)."""
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    sizes = dict(TINY_EGBERT_GPT, vocab_size=len(tokenizer))
    EgbertGPTForCausalLM(EgbertGPTConfig(**sizes)).save_pretrained(tmp_path / "egbert")
    tokenizer.save_pretrained(tmp_path / "egbert")
    convert_checkpoint(tmp_path / "egbert", tmp_path / "stock", to_transformers=True)
    stock_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "stock")
    encoded = stock_tokenizer("the history of")
    assert (
        encoded["input_ids"] == tokenizer("the history of", add_special_tokens=False)["input_ids"]
    )
    assert "token_type_ids" not in encoded
    assert stock_tokenizer.model_max_length == sizes["max_position_embeddings"]
