"""The egbert BERT encoder: saving/loading, padding, heads, losses, config checks, fill-mask."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoTokenizer,
    pipeline,
)

from egbert.errors import ConfigError, DataError
from egbert.models.bert import (
    EgbertBertConfig,
    EgbertBertForMaskedLM,
    EgbertBertForPreTraining,
    EgbertBertForReplacedTokenDetection,
    EgbertBertModel,
    generator_config,
)
from egbert.models.heads import EgbertBertForSequenceClassification
from egbert.models.layers import local_attention_offsets

CONFIGS = Path(__file__).resolve().parents[1] / "egbert" / "configs"
VARIANTS = [
    {},
    {"position_embedding_type": "sinusoidal"},
    {"pre_layernorm": True},
]


def tiny_config(**overrides) -> EgbertBertConfig:
    settings = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return EgbertBertConfig(**{**settings, **overrides})


def random_batch(batch: int = 3, length: int = 12, vocab: int = 100) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, vocab, (batch, length), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, length // 2 :] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids}


def mlm_labels(input_ids: torch.Tensor) -> torch.Tensor:
    labels = torch.full_like(input_ids, -100)
    labels[:, 1::4] = input_ids[:, 1::4]
    return labels


@pytest.mark.parametrize("overrides", VARIANTS)
def test_save_load_round_trip_and_auto_classes(tmp_path: Path, overrides: dict) -> None:
    torch.manual_seed(0)
    model = EgbertBertForPreTraining(tiny_config(**overrides)).eval()
    batch = random_batch()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()

    assert isinstance(AutoConfig.from_pretrained(tmp_path), EgbertBertConfig)
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, EgbertBertForPreTraining)
    expected, actual = model(**batch), loaded(**batch)
    torch.testing.assert_close(actual.prediction_logits, expected.prediction_logits)
    torch.testing.assert_close(actual.seq_relationship_logits, expected.seq_relationship_logits)
    assert loaded.mlm_head.decoder.weight is loaded.bert.embeddings.word_embeddings.weight

    encoder = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(encoder, EgbertBertModel)
    torch.testing.assert_close(
        encoder(**batch).last_hidden_state, model.bert(**batch).last_hidden_state
    )
    masked_lm = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert isinstance(masked_lm, EgbertBertForMaskedLM)
    torch.testing.assert_close(masked_lm(**batch).logits, expected.prediction_logits)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_outputs_do_not_change_with_extra_right_padding(overrides: dict) -> None:
    torch.manual_seed(0)
    model = EgbertBertForPreTraining(tiny_config(**overrides)).eval()
    batch = random_batch(batch=2, length=9)
    alone = model(**batch, output_hidden_states=True)
    padded_ids = F.pad(batch["input_ids"], (0, 5), value=0)
    padded_types = F.pad(batch["token_type_ids"], (0, 5), value=0)
    attention_mask = (torch.arange(14) < 9).long().expand(2, -1)
    padded = model(
        padded_ids, attention_mask, padded_types, output_hidden_states=True, output_attentions=True
    )
    for expected, actual in zip(alone.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(actual[:, :9], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        padded.prediction_logits[:, :9], alone.prediction_logits, atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        padded.seq_relationship_logits, alone.seq_relationship_logits, atol=1e-5, rtol=0
    )
    for weights in padded.attentions:
        assert weights[..., 9:].abs().max() == 0  # padded keys get no attention


def test_hidden_states_and_attentions_follow_the_transformers_convention() -> None:
    torch.manual_seed(0)
    model = EgbertBertModel(tiny_config()).eval()
    batch = random_batch()
    output = model(**batch, output_hidden_states=True, output_attentions=True)
    assert len(output.hidden_states) == 3  # embeddings + one per layer
    position_ids = torch.arange(12)[None]
    embeddings = model.embeddings(batch["input_ids"], position_ids, batch["token_type_ids"])
    torch.testing.assert_close(output.hidden_states[0], embeddings)
    assert output.hidden_states[-1] is output.last_hidden_state
    assert len(output.attentions) == 2 and output.attentions[0].shape == (3, 4, 12, 12)
    torch.testing.assert_close(output.attentions[0].sum(-1), torch.ones(3, 4, 12))
    plain = model(**batch)
    assert plain.hidden_states is None and plain.attentions is None
    torch.testing.assert_close(plain.last_hidden_state, output.last_hidden_state)
    assert isinstance(model(**batch, return_dict=False), tuple)


def test_mlm_loss_uses_label_smoothing_and_ignores_unlabelled_positions() -> None:
    torch.manual_seed(0)
    model = EgbertBertForMaskedLM(tiny_config(label_smoothing=0.1)).eval()
    batch = random_batch()
    labels = mlm_labels(batch["input_ids"])
    output = model(**batch, labels=labels)
    selected = labels != -100
    expected = F.cross_entropy(output.logits[selected], labels[selected], label_smoothing=0.1)
    torch.testing.assert_close(output.loss, expected)
    unsmoothed = F.cross_entropy(output.logits[selected], labels[selected])
    assert not torch.allclose(output.loss, unsmoothed)


@pytest.mark.parametrize("model_class", [EgbertBertForMaskedLM, EgbertBertForPreTraining])
def test_the_forwards_label_smoothing_overrides_the_configs(model_class) -> None:
    """The trainer's --label-smoothing reaches the loss as the forward's argument (None: the
    config's value); the config is left as it is."""
    torch.manual_seed(0)
    model = model_class(tiny_config(label_smoothing=0.1)).eval()
    batch = random_batch()
    labels = mlm_labels(batch["input_ids"])
    selected = labels != -100
    for smoothing, expected_smoothing in ((None, 0.1), (0.3, 0.3), (0.0, 0.0)):
        output = model(**batch, labels=labels, label_smoothing=smoothing)
        masked_lm = model_class is EgbertBertForMaskedLM
        logits = output.logits if masked_lm else output.prediction_logits
        expected = F.cross_entropy(
            logits[selected], labels[selected], label_smoothing=expected_smoothing
        )
        mlm_loss = output.loss if masked_lm else output.mlm_loss
        torch.testing.assert_close(mlm_loss, expected)
    assert model.config.label_smoothing == 0.1


def test_the_rtd_generators_loss_takes_the_forwards_label_smoothing() -> None:
    model = EgbertBertForReplacedTokenDetection(tiny_config()).eval()
    batch = random_batch(length=16)
    labels = mlm_labels(batch["input_ids"])
    masked = batch["input_ids"].masked_fill(labels != -100, 4)
    losses = {}
    for smoothing in (None, 0.0, 0.3):
        torch.manual_seed(0)  # the same samples each time
        losses[smoothing] = model(masked, labels=labels, label_smoothing=smoothing).generator_loss
    torch.testing.assert_close(losses[None], losses[0.0])  # the config's 0.0
    assert not torch.allclose(losses[0.3], losses[0.0])


def test_pretraining_loss_is_the_sum_of_mlm_and_nsp() -> None:
    torch.manual_seed(0)
    model = EgbertBertForPreTraining(tiny_config()).eval()
    batch = random_batch()
    labels = mlm_labels(batch["input_ids"])
    next_sentence = torch.tensor([0, 1, 0])
    output = model(**batch, labels=labels, next_sentence_label=next_sentence)
    nsp = F.cross_entropy(output.seq_relationship_logits, next_sentence)
    mlm = F.cross_entropy(output.prediction_logits.reshape(-1, 100), labels.reshape(-1))
    torch.testing.assert_close(output.nsp_loss, nsp)
    torch.testing.assert_close(output.mlm_loss, mlm)
    torch.testing.assert_close(output.loss, mlm + nsp)
    only_mlm = model(**batch, labels=labels)
    assert only_mlm.nsp_loss is None
    torch.testing.assert_close(only_mlm.loss, mlm)


def corrupted_input(model: EgbertBertForReplacedTokenDetection) -> list[torch.Tensor]:
    """Records the ids the encoder reads in the model's next forward passes."""
    seen: list[torch.Tensor] = []
    model.bert.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    return seen


def test_replaced_token_detection_targets_the_generators_replacements() -> None:
    torch.manual_seed(0)
    model = EgbertBertForReplacedTokenDetection(tiny_config(rtd_loss_weight=7.0))
    batch = random_batch(length=16)
    original = batch["input_ids"]
    labels = mlm_labels(original)
    masked = original.masked_fill(labels != -100, 4)  # the collator's [MASK]
    attention_mask = torch.ones_like(original)
    attention_mask[0, 12:] = 0
    encoder_input = corrupted_input(model)
    output = model(masked, attention_mask, batch["token_type_ids"], labels=labels)

    corrupted = encoder_input[0]
    unlabelled = labels == -100
    assert torch.equal(corrupted[unlabelled], original[unlabelled])
    assert torch.equal(output.replaced, corrupted != original)
    assert not output.replaced[unlabelled].any()
    # an untrained generator samples nearly uniformly: it replaces most masked positions
    assert output.replaced[~unlabelled].float().mean() > 0.8
    real = attention_mask.bool()
    expected = F.binary_cross_entropy_with_logits(
        output.logits[real], output.replaced[real].float()
    )
    torch.testing.assert_close(output.rtd_loss, expected)
    torch.testing.assert_close(output.loss, output.generator_loss + 7.0 * output.rtd_loss)

    output.rtd_loss.backward()  # the samples carry no gradient back to the generator
    assert model.bert.layers[0].attention.qkv.weight.grad.abs().sum() > 0
    assert all(parameter.grad is None for parameter in model.generator.parameters())
    output.generator_loss.backward()
    assert model.generator.bert.layers[0].attention.qkv.weight.grad.abs().sum() > 0


def test_replaced_token_detection_checkpoint_fine_tunes_its_encoder(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = EgbertBertForReplacedTokenDetection(tiny_config(local_attention_init=True))
    model.save_pretrained(tmp_path)
    reloaded = EgbertBertForReplacedTokenDetection.from_pretrained(tmp_path)
    generator = reloaded.generator
    assert generator.mlm_head.decoder.weight is generator.bert.embeddings.word_embeddings.weight
    for name, saved in model.state_dict().items():
        assert torch.equal(saved, reloaded.state_dict()[name]), name
    classifier = EgbertBertForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    encoder = classifier.bert.state_dict()
    for name, saved in model.bert.state_dict().items():
        assert torch.equal(saved, encoder[name]), name
    no_labels = reloaded(**random_batch())
    assert no_labels.loss is None and no_labels.logits.shape == (3, 12)


@pytest.mark.parametrize(
    ("size", "ratio", "generator"),
    [((256, 4, 1024), 0.25, (64, 1, 256)), ((768, 12, 3072), 0.25, (192, 3, 768)),
     ((128, 2, 512), 0.25, (64, 1, 256)), ((256, 4, 1024), 0.5, (128, 2, 512))],
)  # fmt: skip
def test_the_generator_keeps_the_head_size_at_a_share_of_the_heads(size, ratio, generator) -> None:
    hidden, heads, intermediate = size
    config = tiny_config(
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        generator_size_ratio=ratio,
    )
    small = generator_config(config)
    assert (small.hidden_size, small.num_attention_heads, small.intermediate_size) == generator
    assert small.vocab_size == config.vocab_size and small.num_hidden_layers == 2
    with pytest.raises(ConfigError, match="generator_size_ratio must be in"):
        tiny_config(generator_size_ratio=0.0)


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    batch = random_batch()
    labels = mlm_labels(batch["input_ids"])
    gradients = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = EgbertBertForPreTraining(tiny_config()).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.bert.layers[0].gradient_checkpointing
        model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 1])).loss.backward()
        gradients.append(model.bert.layers[0].attention.qkv.weight.grad)
    torch.testing.assert_close(gradients[1], gradients[0])


def test_weights_are_initialised_as_bert() -> None:
    torch.manual_seed(0)
    model = EgbertBertForPreTraining(tiny_config(hidden_size=256, intermediate_size=512))
    layer = model.bert.layers[0]
    assert abs(layer.feed_forward.up.weight.std().item() - 0.02) < 0.002
    assert layer.feed_forward.up.bias.abs().max() == 0
    assert torch.equal(layer.attention_norm.weight, torch.ones(256))
    assert model.mlm_head.decoder.bias.abs().max() == 0


@pytest.mark.parametrize("pre_layernorm", [False, True])
def test_local_attention_init_points_every_head_at_its_neighbour(pre_layernorm: bool) -> None:
    torch.manual_seed(0)
    config = tiny_config(hidden_size=128, pre_layernorm=pre_layernorm, local_attention_init=True)
    model = EgbertBertModel(config).eval()
    length = 40
    attentions = model(**random_batch(length=length), output_attentions=True).attentions
    inner = torch.arange(4, length - 4)
    for layer in attentions:  # (batch, heads, queries, keys)
        for head, offset in enumerate(local_attention_offsets(config.num_attention_heads)):
            on_neighbour = layer[:, head, inner, inner + offset].mean().item()
            assert on_neighbour > 0.8, (head, offset, on_neighbour)


def test_local_attention_init_leaves_loaded_weights_alone(tmp_path: Path) -> None:
    model = EgbertBertForMaskedLM(tiny_config(local_attention_init=True))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_()
    model.save_pretrained(tmp_path)
    reloaded = EgbertBertForMaskedLM.from_pretrained(tmp_path).state_dict()
    for name, saved in model.state_dict().items():
        assert torch.equal(saved, reloaded[name]), name


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hidden_size": 30, "num_attention_heads": 4}, "num_attention_heads"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"position_embedding_type": "alibi"}, "position_embedding_type"),
        (
            {"local_attention_init": True, "position_embedding_type": "sinusoidal"},
            "local_attention_init",
        ),
    ],
)
def test_invalid_configs_raise_config_error(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        tiny_config(**overrides)


def test_input_longer_than_the_positions_raises_data_error() -> None:
    model = EgbertBertModel(tiny_config(max_position_embeddings=8)).eval()
    with pytest.raises(DataError, match="max_position_embeddings"):
        model(torch.ones(1, 9, dtype=torch.long))


@pytest.mark.parametrize("preset", ["tiny", "mini", "small", "base"])
def test_presets_are_valid_configs(preset: str) -> None:
    settings = yaml.safe_load((CONFIGS / f"bert-{preset}.yaml").read_text())
    assert "vocab_size" not in settings
    config = EgbertBertConfig(vocab_size=1000, **settings)
    expected = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "base": (12, 768)}[preset]
    assert (config.num_hidden_layers, config.hidden_size) == expected
    assert config.intermediate_size == 4 * config.hidden_size
    assert config.hidden_size // config.num_attention_heads == 64


def test_fill_mask_pipeline_runs_on_a_saved_model(minilm_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    EgbertBertForMaskedLM(tiny_config(vocab_size=len(tokenizer))).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fill_mask = pipeline("fill-mask", model=str(tmp_path))
    predictions = fill_mask(f"Paris is the {tokenizer.mask_token} of France.")
    assert len(predictions) == 5
    assert all(isinstance(prediction["token_str"], str) for prediction in predictions)
