"""bert's and gpt's architecture options beyond BERT and GPT-2 (docs/models.md, "Architecture
options"): rotary positions, gated feed-forward layers, RMSNorm, LayerNorms without a bias, gpt's
norm after the embeddings, QK-norm, and linear layers without biases. Each test computes what the
option claims by hand from the model's own weights, or compares two models that differ only in
the option."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel

import egbert.models.layers as layers
from egbert.config import apply_config_overrides
from egbert.errors import CheckpointError, ConfigError
from egbert.models.bert import EgbertBertConfig, EgbertBertForPreTraining, EgbertBertModel
from egbert.models.convert import bert_config_to_transformers, gpt2_config_to_transformers
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.kernels import attention_from_scores
from egbert.models.layers import RotaryEmbedding, rotate

SIZES = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
GPT_TOKENS = dict(pad_token_id=0, eos_token_id=0, bos_token_id=0, initializer_range=0.2)
# every option away from its default, gpt's norm after the embeddings too
EVERY_OPTION = dict(
    gated_mlp=True,
    hidden_act="silu",
    norm_type="rmsnorm",
    qk_norm=True,
    attention_bias=False,
    mlp_bias=False,
    position_embedding_type="rotary",
    rope_theta=500.0,
)


def bert(**options) -> EgbertBertForPreTraining:
    torch.manual_seed(0)
    return EgbertBertForPreTraining(EgbertBertConfig(**{**SIZES, **options})).eval()


def gpt(**options) -> EgbertGPTForCausalLM:
    torch.manual_seed(0)
    return EgbertGPTForCausalLM(EgbertGPTConfig(**{**SIZES, **GPT_TOKENS, **options})).eval()


def random_ids(batch: int = 2, length: int = 10) -> torch.Tensor:
    return torch.randint(1, 100, (batch, length), generator=torch.Generator().manual_seed(0))


def weight_count(model: torch.nn.Module, part: str) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if part in name)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_a_gated_feed_forward_is_act_of_the_gate_times_the_value(activation: str) -> None:
    """GeGLU with gelu, SwiGLU with silu (Shazeer 2020), from the up projection's two halves."""
    model = gpt(gated_mlp=True, hidden_act=activation)
    feed_forward = model.gpt.layers[0].feed_forward
    hidden = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    width = 64  # two thirds of intermediate_size 96
    gate_weight, value_weight = feed_forward.up.weight[:width], feed_forward.up.weight[width:]
    gate_bias, value_bias = feed_forward.up.bias[:width], feed_forward.up.bias[width:]
    act = {"gelu": F.gelu, "silu": F.silu}[activation]
    gated = act(hidden @ gate_weight.T + gate_bias) * (hidden @ value_weight.T + value_bias)
    expected = gated @ feed_forward.down.weight.T + feed_forward.down.bias
    torch.testing.assert_close(feed_forward(hidden), expected)


def test_a_gated_feed_forward_holds_the_plain_ones_weights() -> None:
    """Three matrices of 2/3 the width hold as many weights as the plain MLP's two: 2 x 32 x 96
    a layer (Shazeer 2020's sizing)."""
    plain, gated = bert(), bert(gated_mlp=True)
    matrices = {name: p.shape for name, p in gated.named_parameters() if "feed_forward" in name}
    assert matrices["bert.layers.0.feed_forward.up.weight"] == (2 * 64, 32)
    assert matrices["bert.layers.0.feed_forward.down.weight"] == (32, 64)
    without_biases = [bert(mlp_bias=False), bert(gated_mlp=True, mlp_bias=False)]
    assert [weight_count(m, "feed_forward.") for m in without_biases] == [2 * 2 * 32 * 96] * 2
    # the biases: plain 96 + 32, gated 2 x 64 + 32 a layer
    assert weight_count(plain, "feed_forward.") == 2 * (2 * 32 * 96 + 96 + 32)
    assert weight_count(gated, "feed_forward.") == 2 * (2 * 32 * 96 + 128 + 32)


@pytest.mark.parametrize("family", [bert, gpt])
def test_rmsnorm_replaces_every_layernorm(family) -> None:
    model = family(norm_type="rmsnorm")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm)]
    layernorms = [m for m in family().modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == len(layernorms) and all(isinstance(m, torch.nn.RMSNorm) for m in norms)
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(2)) + 5.0
    rms = hidden.pow(2).mean(-1, keepdim=True).add(model.config.layer_norm_eps).sqrt()
    torch.testing.assert_close(norms[0](hidden), hidden / rms)  # no centring: the +5 stays


@pytest.mark.parametrize("family", [bert, gpt])
def test_norm_bias_false_leaves_the_layernorms_without_a_bias(family) -> None:
    norms = [m for m in family(norm_bias=False).modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.bias is None for m in norms)
    assert all(m.bias is not None for m in family().modules() if isinstance(m, torch.nn.LayerNorm))


@pytest.mark.parametrize("family", [bert, gpt])
def test_attention_bias_and_mlp_bias_remove_the_biases_they_name(family) -> None:
    def biased(model) -> set[str]:
        return {name for name, _ in model.named_parameters() if name.endswith(".bias")}

    def layer_biases(module: str, parts: tuple[str, str]) -> set[str]:
        prefix = family().base_model_prefix
        return {f"{prefix}.layers.{i}.{module}.{part}.bias" for i in range(2) for part in parts}

    everything = biased(family())
    assert everything - biased(family(attention_bias=False)) == layer_biases(
        "attention", ("qkv", "out")
    )
    assert everything - biased(family(mlp_bias=False)) == layer_biases(
        "feed_forward", ("up", "down")
    )
    # the norms keep theirs
    assert any("norm" in name for name in biased(family(attention_bias=False, mlp_bias=False)))


@pytest.mark.parametrize("family", [bert, gpt])
def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys(family) -> None:
    """A norm over head_dim on each head's queries and keys: scaling the query and key rows of
    the qkv projection by 10 changes nothing with it, and the outputs without it."""
    ids = random_ids()
    for qk_norm, changes in ((True, False), (False, True)):
        model = family(qk_norm=qk_norm, norm_type="rmsnorm", attention_bias=False)
        before = model(ids).logits if family is gpt else model(ids).prediction_logits
        with torch.no_grad():
            for layer in model.base_model.layers:
                layer.attention.qkv.weight[: 2 * 32] *= 10
        after = model(ids).logits if family is gpt else model(ids).prediction_logits
        assert (not torch.allclose(before, after, atol=1e-4)) == changes, qk_norm


def test_gpt_embedding_norm_normalises_what_the_first_block_reads() -> None:
    model = gpt(embedding_norm=True, norm_type="rmsnorm")
    with torch.no_grad():
        model.gpt.embeddings.word_embeddings.weight.mul_(50)
    first = model.gpt(random_ids(), output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(first.pow(2).mean(-1), torch.ones(2, 10), atol=1e-4, rtol=0)
    assert gpt().gpt.embeddings.norm is None


def greedy_without_cache(model: EgbertGPTForCausalLM, ids: torch.Tensor, steps: int):
    for _ in range(steps):
        next_token = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_token], dim=1)
    return ids


def test_every_option_generates_with_the_kv_cache_as_without_and_left_padded_as_alone() -> None:
    """The cache holds the normed keys: decoding with it equals a full forward each step."""
    model = gpt(**EVERY_OPTION, embedding_norm=True)
    ids = random_ids(length=5)
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8)
    assert torch.equal(generated, greedy_without_cache(model, ids, 8))
    short = random_ids(batch=1, length=3)
    batch = torch.cat([random_ids(batch=1, length=6), F.pad(short, (3, 0), value=0)])
    mask = torch.tensor([[1] * 6, [0] * 3 + [1] * 3])
    padded = model.generate(batch, attention_mask=mask, max_new_tokens=6)
    alone = model.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=6)
    assert torch.equal(padded[1, -6:], alone[0, -6:])


@pytest.mark.parametrize("family", [bert, gpt])
def test_the_options_are_saved_in_config_json_and_load_back(family, tmp_path: Path) -> None:
    options = {**EVERY_OPTION, **({"embedding_norm": True} if family is gpt else {})}
    model = family(**options)
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert {name: getattr(loaded.config, name) for name in options} == options
    ids = random_ids()
    torch.testing.assert_close(loaded(ids).last_hidden_state, model.base_model(ids)[0])


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("gated_mlp", True),
        ("norm_type", "rmsnorm"),
        ("norm_bias", False),
        ("qk_norm", True),
        ("attention_bias", False),
        ("mlp_bias", False),
    ],
)
def test_stock_conversion_refuses_each_option_naming_it(option: str, value) -> None:
    for family, to_stock in (
        (bert, bert_config_to_transformers),
        (gpt, gpt2_config_to_transformers),
    ):
        with pytest.raises(CheckpointError, match=f"no {option}: this model has {option}="):
            to_stock(family(**{option: value}).config)
        to_stock(family().config)  # the defaults convert


def test_stock_gpt2_refuses_the_embedding_norm() -> None:
    with pytest.raises(CheckpointError, match="no embedding_norm"):
        gpt2_config_to_transformers(gpt(embedding_norm=True).config)


def test_bad_norm_type_and_qk_norm_with_local_attention_init_are_refused() -> None:
    with pytest.raises(ConfigError, match="norm_type 'batchnorm' is not supported"):
        EgbertBertModel(EgbertBertConfig(**SIZES, norm_type="batchnorm"))
    with pytest.raises(ConfigError, match="local_attention_init=false or qk_norm=false"):
        EgbertBertModel(EgbertBertConfig(**SIZES, qk_norm=True, local_attention_init=True))


def test_pretrain_s_config_overrides_set_every_option() -> None:
    """`egbert pretrain --config-overrides` spells them as config.json does."""
    config = EgbertGPTConfig(**SIZES, **GPT_TOKENS)
    apply_config_overrides(
        config,
        "gated_mlp=true,hidden_act=silu,norm_type=rmsnorm,qk_norm=true,attention_bias=false,"
        "mlp_bias=false,embedding_norm=true,norm_bias=false,position_embedding_type=rotary,"
        "rope_theta=500",
    )
    assert {name: getattr(config, name) for name in EVERY_OPTION} == EVERY_OPTION
    assert config.embedding_norm is True and config.norm_bias is False
    with pytest.raises(ConfigError, match="norm_type 'layer' is not supported"):
        apply_config_overrides(config, "norm_type=layer")


def test_rotary_turns_each_pair_of_dimensions_by_position_times_its_frequency() -> None:
    """head_dim 4, theta 100: dimension 0 pairs with 2 at 1 radian a position, 1 with 3 at
    100**-0.5 = 0.1 radian (Llama's layout)."""
    cos, sin = RotaryEmbedding(4, 100.0)(torch.tensor([[0, 3]]))
    states = torch.eye(4)[None, None, [0, 1]]  # e0 at position 0, e1 at 3
    turned = rotate(states, cos, sin)[0, 0]
    torch.testing.assert_close(turned[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(turned[1], torch.tensor([0.0, math.cos(0.3), 0.0, math.sin(0.3)]))


def test_the_models_rotary_frequencies_come_from_rope_theta() -> None:
    model = gpt(position_embedding_type="rotary", rope_theta=100.0)
    head_dim = 32 // 4
    expected = torch.tensor([100.0 ** (-i / head_dim) for i in range(0, head_dim, 2)])
    torch.testing.assert_close(model.gpt.rotary.inverse_frequencies, expected)
    assert not hasattr(model.gpt.embeddings, "position_embeddings")


@pytest.mark.parametrize("family", [bert, gpt])
def test_rotary_attention_sees_only_the_positions_difference(family) -> None:
    """Shifting every position by 7 changes nothing; reversing them changes the outputs (they
    are used); learned positions change with the shift."""
    ids = random_ids()
    positions = torch.arange(10)[None]

    def outputs(model, position_ids):
        return model.base_model(ids, position_ids=position_ids).last_hidden_state

    sharp = dict(initializer_range=0.2)  # gpt's already: attention far from uniform
    rotary = family(position_embedding_type="rotary", **sharp)
    base = outputs(rotary, positions)
    torch.testing.assert_close(outputs(rotary, positions + 7), base, atol=1e-5, rtol=0)
    assert not torch.allclose(outputs(rotary, positions.flip(-1)), base, atol=1e-3)
    learned = family(**sharp)
    assert not torch.allclose(outputs(learned, positions + 7), outputs(learned, positions))


def test_rotary_gpt_decodes_with_the_cache_as_a_full_forward() -> None:
    model = gpt(position_embedding_type="rotary")
    ids = random_ids(length=12)
    full = model(ids, use_cache=False).logits
    prefix = model(ids[:, :8], use_cache=True)
    rest = model(ids[:, 8:], cache=prefix.cache, use_cache=True)
    torch.testing.assert_close(rest.logits, full[:, 8:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", [bert, gpt])
def test_stock_conversion_refuses_rotary_positions(family) -> None:
    to_stock = bert_config_to_transformers if family is bert else gpt2_config_to_transformers
    with pytest.raises(CheckpointError, match="position_embedding_type='rotary'"):
        to_stock(family(position_embedding_type="rotary").config)


def test_rotary_needs_an_even_head_size() -> None:
    with pytest.raises(ConfigError, match="rotary positions need an even head size"):
        EgbertGPTConfig(**{**SIZES, "hidden_size": 36, "num_attention_heads": 4},
                        position_embedding_type="rotary")  # fmt: skip


def attention_inputs(model) -> list[torch.Tensor]:
    """A hook's list of what each layer's attention reads, filled by the next forward."""
    seen = []
    for layer in model.base_model.layers:
        layer.attention.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    return seen


def raw_scores(attention, hidden: torch.Tensor) -> torch.Tensor:
    """QK^T / sqrt(head_dim) of one layer, from its qkv weights by hand."""
    batch, length, _ = hidden.shape
    qkv = (hidden @ attention.qkv.weight.T + attention.qkv.bias).view(batch, length, 3, 4, 8)
    query, key = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    return query @ key.transpose(-1, -2) / math.sqrt(8)


@pytest.mark.parametrize("pre_layernorm", [False, True])
def test_realformer_adds_the_scores_of_the_layers_below_before_the_mask(pre_layernorm) -> None:
    """He et al. 2020: layer l's weights are softmax(S_0 + ... + S_l) over the real keys, where
    S_i are each layer's raw scores; pre-LN is allowed as well as the paper's post-LN."""
    model = bert(residual_attention=True, pre_layernorm=pre_layernorm, initializer_range=0.2)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    seen = attention_inputs(model)
    weights = model.bert(random_ids(), attention_mask=mask, output_attentions=True).attentions
    summed = torch.zeros(2, 4, 10, 10)
    for layer, hidden, layer_weights in zip(model.bert.layers, seen, weights, strict=True):
        summed = summed + raw_scores(layer.attention, hidden)
        expected = summed.masked_fill(mask[:, None, None, :] == 0, -torch.inf).softmax(-1)
        torch.testing.assert_close(layer_weights, expected, atol=1e-5, rtol=0)
    plain = bert(pre_layernorm=pre_layernorm, initializer_range=0.2)
    without = plain.bert(random_ids(), attention_mask=mask, output_attentions=True).attentions
    assert not torch.allclose(without[1], weights[1], atol=1e-3)


def test_realformer_s_top_layer_through_sdpa_equals_the_written_out_one(monkeypatch) -> None:
    """Asked for no weights, the top layer keeps no scores: it takes SDPA with the sum below as
    its mask, and only the two layers under it write their attention out."""
    model = bert(residual_attention=True, initializer_range=0.2, num_hidden_layers=3)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, 6:] = 0
    written_out = []

    def counted(*args, **kwargs):
        written_out.append(args[0].shape)
        return attention_from_scores(*args, **kwargs)

    monkeypatch.setattr(layers, "attention_from_scores", counted)
    fast = model.bert(random_ids(), attention_mask=mask).last_hidden_state
    assert len(written_out) == 2
    written = model.bert(random_ids(), attention_mask=mask, output_attentions=True)
    torch.testing.assert_close(fast, written.last_hidden_state, atol=1e-5, rtol=0)


def test_realformer_trains_with_gradient_checkpointing_to_the_same_gradients() -> None:
    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = bert(residual_attention=True).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        ids = random_ids()
        model(ids, labels=ids, next_sentence_label=torch.tensor([0, 1])).loss.backward()
        return {name: p.grad for name, p in model.named_parameters()}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain["bert.layers.0.attention.qkv.weight"].abs().sum() > 0
    for name, gradient in plain.items():
        torch.testing.assert_close(checkpointed[name], gradient, atol=1e-6, rtol=0, msg=name)


def test_stock_bert_refuses_realformer() -> None:
    with pytest.raises(CheckpointError, match="no residual_attention"):
        bert_config_to_transformers(bert(residual_attention=True).config)
