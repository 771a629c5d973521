"""Sequence classification heads over bert, gpt and elmo: every feature/pool setting, the
features computed by hand, frozen backbones, regression, pretrained weights and Auto classes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from egbert.errors import ConfigError
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.heads import (
    CLASSIFIER_FEATURES,
    CLASSIFIER_POOLS,
    EgbertBertForSequenceClassification,
    EgbertElmoForSequenceClassification,
    EgbertGPTForSequenceClassification,
)

VOCAB = 100
FAMILIES = ("bert", "gpt", "elmo")
CLASSIFIERS = {
    "bert": EgbertBertForSequenceClassification,
    "gpt": EgbertGPTForSequenceClassification,
    "elmo": EgbertElmoForSequenceClassification,
}
PRETRAINING_MODELS = {
    "bert": EgbertBertForPreTraining,
    "gpt": EgbertGPTForCausalLM,
    "elmo": EgbertElmoForBidirectionalLM,
}
ENTRY_SIZE = {"bert": 32, "gpt": 32, "elmo": 2 * 16}  # width of one hidden_states entry


def tiny_config(family: str, num_hidden_layers: int = 3, **head_options):
    if family == "elmo":
        return EgbertElmoConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            cell_size=32,
            num_hidden_layers=num_hidden_layers,
            **head_options,
        )
    config_class = EgbertBertConfig if family == "bert" else EgbertGPTConfig
    return config_class(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        **head_options,
    )


def tiny_classifier(family: str, seed: int = 0, **head_options):
    torch.manual_seed(seed)
    return CLASSIFIERS[family](tiny_config(family, **head_options)).eval()


def padded_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sentences of 7 and 4 tokens, the second right-padded with junk ids."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (2, 7), generator=generator)
    attention_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    return input_ids, attention_mask


def pooled_by_hand(family: str, pool: str, states: torch.Tensor, lengths: list[int]):
    """One vector per row, written out position by position."""
    rows = []
    for row, length in enumerate(lengths):
        tokens = states[row, :length]
        if pool == "mean":
            rows.append(tokens.mean(dim=0))
        elif family == "bert":
            rows.append(tokens[0])
        elif family == "gpt":
            rows.append(tokens[-1])
        else:
            half = tokens.size(-1) // 2
            rows.append(torch.cat([tokens[-1, :half], tokens[0, half:]]))
    return torch.stack(rows)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("features", CLASSIFIER_FEATURES)
@pytest.mark.parametrize("pool", CLASSIFIER_POOLS)
def test_every_feature_and_pool_gives_one_logit_row_per_sentence(family, features, pool):
    model = tiny_classifier(
        family, num_labels=3, classifier_features=features, classifier_pool=pool
    )
    input_ids, attention_mask = padded_batch()
    out = model(input_ids, attention_mask, labels=torch.tensor([0, 2]))

    expected_width = ENTRY_SIZE[family] * (4 if features == "last4-concat" else 1)
    assert model.classifier.in_features == expected_width
    assert out.logits.shape == (2, 3)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pool", CLASSIFIER_POOLS)
def test_last4_concat_is_the_pooled_last_four_layers_top_first(family, pool):
    model = tiny_classifier(family, classifier_features="last4-concat", classifier_pool=pool)
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        logits = model(input_ids, attention_mask).logits
        hidden_states = model.base_model(
            input_ids, attention_mask=attention_mask, output_hidden_states=True
        ).hidden_states
        by_hand = torch.cat(
            [pooled_by_hand(family, pool, hidden_states[-k], [7, 4]) for k in (1, 2, 3, 4)], -1
        )
        torch.testing.assert_close(logits, model.classifier(by_hand))


@pytest.mark.parametrize("family", FAMILIES)
def test_cls_features_are_each_familys_sentence_summary(family):
    model = tiny_classifier(family)
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        out = model.base_model(input_ids, attention_mask=attention_mask)
        if family == "bert":
            expected = out.pooler_output
        else:
            expected = pooled_by_hand(family, "cls", out.last_hidden_state, [7, 4])
        torch.testing.assert_close(
            model(input_ids, attention_mask).logits, model.classifier(expected)
        )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("features", CLASSIFIER_FEATURES)
@pytest.mark.parametrize("pool", CLASSIFIER_POOLS)
def test_a_sentence_gets_the_same_logits_alone_and_padded(family, features, pool):
    model = tiny_classifier(family, classifier_features=features, classifier_pool=pool)
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        batched = model(input_ids, attention_mask).logits
        alone = model(input_ids[1:, :4]).logits
    torch.testing.assert_close(batched[1:], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_scalar_mix_weights_layers_by_softmax_times_gamma(family):
    model = tiny_classifier(family, classifier_features="scalar-mix", classifier_pool="mean")
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        hidden_states = model.base_model(
            input_ids, attention_mask=attention_mask, output_hidden_states=True
        ).hidden_states
        pooled = [pooled_by_hand(family, "mean", states, [7, 4]) for states in hidden_states]
        average = torch.stack(pooled).mean(dim=0)
        torch.testing.assert_close(
            model(input_ids, attention_mask).logits, model.classifier(average)
        )

        model.scalar_mix.layer_weights.copy_(torch.tensor([0.0, 1.0, 2.0, 3.0]))
        model.scalar_mix.gamma.fill_(2.5)
        weights = torch.tensor([0.0, 1.0, 2.0, 3.0]).softmax(0)
        mixed = 2.5 * sum(w * p for w, p in zip(weights, pooled, strict=True))
        torch.testing.assert_close(model(input_ids, attention_mask).logits, model.classifier(mixed))


def standardized(features: torch.Tensor) -> torch.Tensor:
    centered = features - features.mean(dim=-1, keepdim=True)
    return centered / centered.pow(2).mean(dim=-1, keepdim=True).sqrt()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("features", ["scalar-mix", "last4-sum", "cls"])
def test_layer_norm_standardizes_each_pooled_layer_before_combining(family, features):
    model = tiny_classifier(
        family, classifier_features=features, classifier_pool="mean", classifier_layer_norm=True
    )
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        out = model.base_model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        pooled = [
            standardized(pooled_by_hand(family, "mean", states, [7, 4]))
            for states in out.hidden_states
        ]
        if features == "scalar-mix":
            expected = torch.stack(pooled).mean(dim=0)
        elif features == "last4-sum":
            expected = sum(pooled[-4:])
        elif family == "bert":
            expected = standardized(out.pooler_output)
        else:
            expected = standardized(pooled_by_hand(family, "cls", out.last_hidden_state, [7, 4]))
        torch.testing.assert_close(
            model(input_ids, attention_mask).logits, model.classifier(expected)
        )


@pytest.mark.parametrize("layer_norm", [True, False])
def test_layer_norm_makes_the_mix_blind_to_a_layers_scale(layer_norm):
    """ELMo's reason for it: a biLM layer far larger than the others no longer drowns them."""
    model = tiny_classifier(
        "elmo",
        classifier_features="scalar-mix",
        classifier_pool="mean",
        classifier_layer_norm=layer_norm,
    )
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        states = model.base_model(
            input_ids, attention_mask=attention_mask, output_hidden_states=True
        ).hidden_states
        scaled = (states[0], 100.0 * states[1], *states[2:])
        features = model.sentence_features(SimpleNamespace(hidden_states=states), attention_mask)
        features_scaled = model.sentence_features(
            SimpleNamespace(hidden_states=scaled), attention_mask
        )
    assert torch.allclose(features, features_scaled, atol=1e-4) == layer_norm


def test_last4_uses_every_entry_when_the_model_has_fewer():
    model = CLASSIFIERS["elmo"](
        tiny_config("elmo", num_hidden_layers=2, classifier_features="last4-concat")
    )
    assert model.classifier.in_features == 3 * ENTRY_SIZE["elmo"]


def one_adam_step(model, input_ids, attention_mask) -> None:
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = model(input_ids, attention_mask, labels=torch.tensor([0, 1])).loss
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("frozen", [True, False])
def test_freeze_backbone_trains_the_head_alone(family, frozen):
    model = tiny_classifier(family, classifier_features="scalar-mix", freeze_backbone=frozen)
    model.train()
    backbone_before = {k: v.clone() for k, v in model.base_model.state_dict().items()}
    head_before = model.classifier.weight.clone()
    mix_before = model.scalar_mix.layer_weights.clone()

    one_adam_step(model, *padded_batch())

    backbone_same = all(
        torch.equal(value, backbone_before[key])
        for key, value in model.base_model.state_dict().items()
    )
    assert backbone_same is frozen
    assert model.base_model.training is not frozen  # no dropout in a frozen backbone
    assert all(p.requires_grad is not frozen for p in model.base_model.parameters())
    assert not torch.equal(model.classifier.weight, head_before)
    assert not torch.equal(model.scalar_mix.layer_weights, mix_before)


def test_regression_with_one_label_uses_mean_squared_error():
    model = tiny_classifier("bert", num_labels=1)
    input_ids, attention_mask = padded_batch()
    labels = torch.tensor([0.5, 3.0])
    with torch.no_grad():
        out = model(input_ids, attention_mask, labels=labels)
    assert out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits[:, 0], labels))


def test_a_regression_head_learns_standardized_targets_and_predicts_in_label_units():
    stats = {"regression_target_mean": 3.0, "regression_target_std": 2.0}
    model = tiny_classifier("bert", num_labels=1, **stats)
    plain = tiny_classifier("bert", num_labels=1)  # the same weights, no label statistics
    input_ids, attention_mask = padded_batch()
    labels = torch.tensor([0.5, 4.0])
    with torch.no_grad():
        out = model(input_ids, attention_mask, labels=labels)
        raw = plain(input_ids, attention_mask).logits
    torch.testing.assert_close(out.logits, raw * 2.0 + 3.0)
    torch.testing.assert_close(out.loss, F.mse_loss(raw[:, 0], (labels - 3.0) / 2.0))

    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        started = model(input_ids, attention_mask).logits
    torch.testing.assert_close(started, torch.full((2, 1), 3.0))  # a fresh head starts at the mean


def test_label_statistics_leave_classifiers_unchanged():
    stats = {"regression_target_mean": 3.0, "regression_target_std": 2.0}
    model = tiny_classifier("gpt", num_labels=3, **stats)
    plain = tiny_classifier("gpt", num_labels=3)
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids, attention_mask).logits, plain(input_ids, attention_mask).logits
        )


def test_classification_loss_uses_the_configs_label_smoothing():
    model = tiny_classifier("gpt", num_labels=3, label_smoothing=0.1)
    input_ids, attention_mask = padded_batch()
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        out = model(input_ids, attention_mask, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels, label_smoothing=0.1))
    assert not torch.allclose(out.loss, F.cross_entropy(out.logits, labels))
    with torch.no_grad():  # the forward's label_smoothing overrides the config's
        loss = model(input_ids, attention_mask, labels=labels, label_smoothing=0.3).loss
    torch.testing.assert_close(loss, F.cross_entropy(out.logits, labels, label_smoothing=0.3))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("source", ["pretraining", "base"])
def test_a_classifier_loads_the_backbone_of_a_saved_pretrained_model(family, source, tmp_path):
    torch.manual_seed(3)
    config = tiny_config(family)
    pretrained = PRETRAINING_MODELS[family](config)
    backbone = pretrained.base_model
    (backbone if source == "base" else pretrained).save_pretrained(tmp_path)

    model = CLASSIFIERS[family].from_pretrained(
        tmp_path, num_labels=3, classifier_features="last4-concat", freeze_backbone=True
    )
    loaded = model.base_model.state_dict()
    assert loaded.keys() == backbone.state_dict().keys()
    for name, tensor in backbone.state_dict().items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0, msg=name)
    assert model.config.num_labels == 3
    assert model.config.classifier_features == "last4-concat"
    assert not any(p.requires_grad for p in model.base_model.parameters())
    assert model.classifier.weight.requires_grad


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_class_dispatches_from_config_and_from_a_saved_classifier(family, tmp_path):
    config = tiny_config(family, num_labels=4, classifier_features="scalar-mix")
    model = AutoModelForSequenceClassification.from_config(config)
    assert type(model) is CLASSIFIERS[family]
    with torch.no_grad():
        model.scalar_mix.layer_weights.copy_(torch.tensor([0.3, -1.0, 2.0, 0.5]))
    model.save_pretrained(tmp_path)

    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert type(reloaded) is CLASSIFIERS[family]
    assert reloaded.config.classifier_features == "scalar-mix"
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids, attention_mask).logits,
            model.eval()(input_ids, attention_mask).logits,
        )


@pytest.mark.parametrize(
    ("option", "valid"),
    [
        ("classifier_features", "cls, last4-concat, last4-sum, scalar-mix"),
        ("classifier_pool", "cls, mean"),
    ],
)
def test_unknown_head_options_raise_a_config_error_naming_the_valid_ones(option, valid):
    with pytest.raises(ConfigError, match=f"{option}='last5'.*{valid}"):
        tiny_classifier("elmo", **{option: "last5"})


def test_an_unknown_keyword_argument_is_refused():
    with pytest.raises(TypeError, match="classifier_feature"):
        EgbertElmoForSequenceClassification(tiny_config("elmo"), classifier_feature="cls")


# ---------------------------------------------------------------- breaks mutation testing found
# (docs/testing.md, models/heads): each expectation from torch's own functions or written out.


def test_a_one_token_sentence_pools_to_its_token():
    from egbert.models.heads import masked_mean

    states = torch.arange(12.0).reshape(2, 3, 2)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    torch.testing.assert_close(masked_mean(states, mask), torch.tensor([[0.0, 1.0], [7.0, 8.0]]))
    assert masked_mean(states.bfloat16(), mask).dtype == torch.bfloat16  # a bf16 model's own


def test_scalar_mix_runs_on_bf16_layers_outside_autocast():
    from egbert.models.heads import ScalarMix

    mix = ScalarMix(3)
    layers = torch.randn(3, 2, 4).to(torch.bfloat16)
    with torch.no_grad():
        mix.layer_weights.copy_(torch.tensor([0.0, 1.0, 2.0]))
    weights = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), dim=0).to(torch.bfloat16)
    expected = sum(w * layer for w, layer in zip(weights, layers, strict=True))
    torch.testing.assert_close(mix(layers).float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_problem_type_decides_regression_over_the_label_count():
    from egbert.models.heads import is_regression

    assert is_regression(tiny_config("bert", num_labels=2, problem_type="regression"))
    one = tiny_config("bert", num_labels=1, problem_type="multi_label_classification")
    assert not is_regression(one)
    assert is_regression(tiny_config("bert", num_labels=1))


def test_the_losses_of_multi_output_regression_and_multi_label_problems():
    from egbert.models.heads import classification_loss

    logits = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]])
    regression = tiny_config("bert", num_labels=3, problem_type="regression")
    targets = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    loss = classification_loss(logits, targets, regression)
    assert loss.dtype == torch.float32  # the head's precision, whatever the labels'
    torch.testing.assert_close(loss, F.mse_loss(logits, targets.float()))
    # float multi-hot labels and no problem_type: multi-label, a sigmoid per label
    multi_hot = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    loss = classification_loss(logits, multi_hot, tiny_config("bert", num_labels=3))
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.binary_cross_entropy_with_logits(logits, multi_hot.float()))
    # the config's problem_type wins over integer labels' single-label guess
    multi_label = tiny_config("bert", num_labels=3, problem_type="multi_label_classification")
    as_ints = multi_hot.long()
    torch.testing.assert_close(
        classification_loss(logits, as_ints, multi_label),
        F.binary_cross_entropy_with_logits(logits, multi_hot.float()),
    )


def test_the_unknown_keyword_message_names_the_class():
    with pytest.raises(TypeError) as raised:
        EgbertElmoForSequenceClassification(tiny_config("elmo"), classifier_feature="cls")
    assert str(raised.value) == (
        "EgbertElmoForSequenceClassification got an unknown keyword argument 'classifier_feature'"
    )


def test_the_head_holds_what_its_options_say():
    cls_head = tiny_classifier("bert")
    assert cls_head.scalar_mix is None
    assert not any(name.startswith("scalar_mix") for name in cls_head.state_dict())
    assert cls_head.dropout.p == cls_head.config.hidden_dropout_prob == 0.1
    assert tiny_classifier("bert", classifier_dropout=0.3).dropout.p == 0.3


def test_save_pretrained_writes_the_backbones_auto_map_and_passes_its_options_on(tmp_path):
    import json

    model = tiny_classifier("gpt")
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModel"].endswith(".EgbertGPTModel")
    assert auto_map["AutoModelForSequenceClassification"].endswith(
        ".EgbertGPTForSequenceClassification"
    )
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1  # sharded as asked


def test_forward_outputs_follow_the_config_and_the_arguments():
    input_ids, attention_mask = padded_batch()
    model = tiny_classifier("bert", classifier_features="scalar-mix")
    with torch.no_grad():
        plain = model(input_ids, attention_mask)
        # the mix reads every layer, but hands them back only when asked
        assert plain.hidden_states is None and plain.loss is None
        asked = model(input_ids, attention_mask, output_hidden_states=True)
        backbone = model.base_model(input_ids, attention_mask, output_hidden_states=True)
        assert len(asked.hidden_states) == len(backbone.hidden_states) == 4
        torch.testing.assert_close(asked.hidden_states[-1], backbone.hidden_states[-1])
        as_tuple = model(input_ids, attention_mask, return_dict=False)
        assert isinstance(as_tuple, tuple)
        torch.testing.assert_close(as_tuple[0], plain.logits)
        # token types reach BERT's embeddings
        types = torch.ones_like(input_ids)
        typed = model(input_ids, attention_mask, token_type_ids=types).logits
        assert not torch.allclose(typed, plain.logits)
    configured = tiny_classifier("bert", output_hidden_states=True)
    configured.config.return_dict = False
    with torch.no_grad():
        found = configured(input_ids, attention_mask)
    assert isinstance(found, tuple) and len(found[1]) == 4  # (logits, hidden_states)
