"""Building blocks shared by egbert's models: embeddings, attention, MLP, block, LM-head loss.

BERT and GPT are stacks of the same block; they differ in where the LayerNorms sit (after each
residual sum in BERT, before each sublayer in GPT), in whether attention is causal, and in the
GELU variant (exact in BERT, the tanh approximation in GPT-2). The CPU-specific kernels the
blocks call (dropout masks, bfloat16 attention) live in kernels.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .kernels import (
    Dropout,
    attention_from_scores,
    attention_scores,
    explicit_attention,
    prefers_written_out_attention,
)

try:
    from egbert.errors import ConfigError, DataError
except ImportError:  # a saved model folder's copy of this file, used where egbert is not installed
    ConfigError = DataError = ValueError

# config.hidden_act -> activation; "gelu_new" is GPT-2's name for the tanh approximation, "silu"
# (swish) the activation of Llama's gated feed-forward (SwiGLU)
ACTIVATIONS = {"gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh"), "silu": F.silu}
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rotary")
NORM_TYPES = ("layernorm", "rmsnorm")


def sinusoidal_position_table(
    num_positions: int, dim: int, frequencies: torch.Tensor | None = None
) -> torch.Tensor:
    """The fixed position encodings of "Attention is all you need": sin on even, cos on odd dims,
    at that paper's geometric frequencies unless `frequencies` (one per pair) are given."""
    positions = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)
    if frequencies is None:
        frequencies = torch.exp(
            torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim)
        )
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(positions * frequencies)
    table[:, 1::2] = torch.cos(positions * frequencies[: dim // 2])
    return table  # (positions, dim)


def norm_for(config) -> Callable[[int], nn.Module]:
    """What every norm of a bert or gpt is, from its config: a function of the size normalised.

    norm_type "layernorm" (with its bias unless norm_bias=False, as ModernBERT) or "rmsnorm"
    (Zhang & Sennrich 2019: a scale, no centring and no bias), both at layer_norm_eps.
    """
    if config.norm_type == "rmsnorm":
        return partial(nn.RMSNorm, eps=config.layer_norm_eps)
    return partial(nn.LayerNorm, eps=config.layer_norm_eps, bias=config.norm_bias)


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings (RoFormer, Su et al. 2021): each head's queries and keys are
    rotated, pair of dimensions by pair, by the angle position * theta**(-2i / head_dim), so that
    a query's dot product with a key depends on their positions' difference only. Llama's layout:
    dimension i pairs with i + head_dim / 2. The model computes the angles' cosines and sines once
    a forward (from its position_ids, which generation derives from the attention mask, so a
    left-padded prompt is rotated as the same prompt alone) and every layer applies them."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        # fixed, so not saved: rebuilt from the config (init_transformer_weights)
        self.register_buffer("inverse_frequencies", self.frequencies(), persistent=False)

    def frequencies(self) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        return self.theta**-exponents  # (head_dim / 2,)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (batch or 1, 1, seq, head_dim) in float32."""
        angles = position_ids[..., None].float() * self.inverse_frequencies.float()
        angles = torch.cat([angles, angles], dim=-1)[:, None]
        return angles.cos(), angles.sin()


def rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Queries or keys (batch, heads, seq, head_dim) rotated by RotaryEmbedding's angles."""
    first, second = states.chunk(2, dim=-1)
    turned = torch.cat([-second, first], dim=-1)
    return states * cos.to(states.dtype) + turned * sin.to(states.dtype)


class Embeddings(nn.Module):
    """Token + position (+ segment) embeddings, then an optional norm and dropout. Rotary
    positions are not added here: the attention rotates its queries and keys (RotaryEmbedding)."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        position_embedding_type: str = "learned",
        type_vocab_size: int = 0,
        norm: nn.Module | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embedding_type = position_embedding_type
        if position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
            self.position_embeddings.holds_positions = True  # see init_local_attention
        elif position_embedding_type == "sinusoidal":
            # fixed, so not saved: it is rebuilt from the config when the model is created
            table = sinusoidal_position_table(max_position_embeddings, hidden_size)
            self.register_buffer("position_table", table, persistent=False)
        self.token_type_embeddings = (
            nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size > 0 else None
        )
        self.norm = norm
        self.dropout = Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """inputs_embeds: the token vectors themselves, in place of input_ids' rows."""
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if self.position_embedding_type == "learned":
            embeddings = embeddings + self.position_embeddings(position_ids)
        elif self.position_embedding_type == "sinusoidal":
            embeddings = embeddings + self.position_table[position_ids].to(embeddings.dtype)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.norm is not None:
            embeddings = self.norm(embeddings)
        return self.dropout(embeddings)


def training_flops_per_token(
    model: PreTrainedModel, seq_len: int, lm_predictions: float, attention_layers: int
) -> float:
    """Model FLOPs of one training step (forward + backward, 3x the forward, as nanoGPT and PaLM
    count) per input token: 6 per dense weight, the attention scores and values of each of
    `attention_layers` layers over `seq_len` keys, and the tied output softmax at
    `lm_predictions` predictions per token (its weight is the embedding's, which the dense count
    leaves out). The same count as scripts/bench.py's, so that MFU means one thing."""
    config = model.config
    dense = 6 * model.num_parameters(exclude_embeddings=True)
    attention = 12 * attention_layers * config.hidden_size * seq_len
    softmax = 6 * config.vocab_size * config.hidden_size * lm_predictions
    return float(dense + attention + softmax)


def self_attention_mask(
    padding_mask: torch.Tensor | None,
    query_length: int,
    past_length: int,
    is_causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """The boolean mask (True = may attend) for SDPA, or None where no mask or `is_causal` suffices.

    padding_mask is (batch, past_length + query_length) with 1 for real tokens and 0 for padding:
    with a KV cache the keys are the `past_length` cached tokens followed by the new ones. Given,
    it is used as it is: asking the device whether it holds any 0 would stall it and break a
    compiled graph, so callers whose batch has no padding pass None (egbert's collators do), and
    get SDPA's unmasked or `is_causal` kernels.
    """
    has_padding = padding_mask is not None
    if not is_causal:
        # (batch, 1, 1, keys) broadcasts over heads and queries
        return padding_mask.bool()[:, None, None, :] if has_padding else None
    if not has_padding and (past_length == 0 or query_length == 1):
        return None
    key_length = past_length + query_length
    query_positions = torch.arange(past_length, key_length, device=device)[:, None]
    key_positions = torch.arange(key_length, device=device)[None, :]
    mask = (key_positions <= query_positions)[None, None]  # (1, 1, queries, keys)
    if has_padding:
        mask = mask & padding_mask.bool()[:, None, None, :]
        # a left-padded query would see no key at all (a NaN softmax row): let it see itself
        mask = mask | (key_positions == query_positions)
    return mask


class SelfAttention(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention (or, where that is
    slower or the weights are wanted, kernels.explicit_attention), one fused qkv matrix.

    bias: of the qkv and output projections. qk_norm: a norm (size -> module, norm_for) for
    each head's queries and keys, over head_dim, before the scores (OLMo 2, Qwen3): it bounds
    the attention logits, which otherwise grow with the weights; the KV cache holds normed keys.

    residual_scores (RealFormer, He et al. 2020: "keep" or "last"): each layer adds the previous
    layer's raw scores (QK^T / sqrt(d), summed over the layers below, before the mask) to its
    own. "keep" returns this layer's sum for the next layer, written out; "last", the top layer,
    keeps nothing and goes through SDPA with the sum below as an additive mask.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float = 0.0,
        is_causal: bool = False,
        layer_idx: int = 0,
        bias: bool = True,
        qk_norm: Callable[[int], nn.Module] | None = None,
        residual_scores: str | None = None,
    ):
        super().__init__()
        self.residual_scores = residual_scores
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        # held by an nn.Dropout for its p only (SDPA applies the dropout), so that code setting
        # every nn.Dropout's p to 0, as TRL's disable_dropout does, reaches it too
        self.attention_dropout = nn.Dropout(dropout)
        self.is_causal = is_causal
        self.layer_idx = layer_idx  # where this layer's keys and values live in a KV cache
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.qkv.attention_heads = num_heads  # see init_local_attention
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.out.writes_residual = True  # see EgbertGPTPreTrainedModel._init_weights
        self.query_norm = qk_norm(self.head_dim) if qk_norm else None
        self.key_norm = qk_norm(self.head_dim) if qk_norm else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        previous_scores: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(output, the weights if output_attentions, the scores the next layer adds if
        residual_scores is "keep"). rotary: RotaryEmbedding's (cos, sin) for these positions.
        previous_scores: the layer below's residual scores, or None."""
        batch, length, hidden = hidden_states.shape
        qkv = self.qkv(hidden_states).view(batch, length, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq, head_dim)
        if self.query_norm is not None:  # in float32: autocast leaves bf16 heads to a slow norm
            query = self.query_norm(query.float()).to(value.dtype)
            key = self.key_norm(key.float()).to(value.dtype)
        if rotary is not None:  # before the cache: it holds the keys rotated at their positions
            query, key = rotate(query, *rotary), rotate(key, *rotary)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (.., past+seq, ..)
        dropout = self.attention_dropout.p if self.training else 0.0
        # SDPA's is_causal aligns the mask top-left, which is only right without cached keys
        is_causal = self.is_causal and attention_mask is None and key.shape[2] == length
        scores = None
        if self.residual_scores == "keep" or (self.residual_scores and output_attentions):
            scores = attention_scores(query, key)
            if previous_scores is not None:
                scores = scores + previous_scores
            context, weights = attention_from_scores(
                scores, value, attention_mask, is_causal, dropout
            )
            weights = weights if output_attentions else None
        elif previous_scores is not None:  # the top residual layer: the sum below as a mask
            prior = previous_scores.to(query.dtype)
            if attention_mask is not None:
                prior = prior.masked_fill(~attention_mask, torch.finfo(prior.dtype).min)
            context = F.scaled_dot_product_attention(
                query, key, value, attn_mask=prior, dropout_p=dropout, is_causal=is_causal
            )
            weights = None
        elif output_attentions or prefers_written_out_attention(query, key):
            context, weights = explicit_attention(
                query, key, value, attention_mask, is_causal, dropout
            )
            weights = weights if output_attentions else None
        else:
            context = F.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=is_causal
            )
            weights = None
        context = context.transpose(1, 2).reshape(batch, length, hidden)
        return self.out(context), weights, scores


def gated_mlp_width(intermediate_size: int) -> int:
    """The width of a gated feed-forward that holds as many weights as the plain one of
    `intermediate_size`: 2/3 of it, for its three matrices in place of two (Shazeer 2020)."""
    return max(1, round(2 * intermediate_size / 3))


class FeedForward(nn.Module):
    """The position-wise MLP: hidden -> intermediate -> activation -> hidden.

    gated (GLU variants, Shazeer 2020; GeGLU with gelu, SwiGLU with silu): one fused up
    projection gives a gate and a value of gated_mlp_width each, and act(gate) * value goes down.
    bias: of both projections.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        gated: bool = False,
        bias: bool = True,
    ):
        super().__init__()
        self.gated = gated
        width = gated_mlp_width(intermediate_size) if gated else intermediate_size
        # gated: the gate's rows, then the value's
        self.up = nn.Linear(hidden_size, 2 * width if gated else width, bias=bias)
        self.activation = ACTIVATIONS[hidden_act]
        self.down = nn.Linear(width, hidden_size, bias=bias)
        self.down.writes_residual = True  # see EgbertGPTPreTrainedModel._init_weights

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        up = self.up(hidden_states)  # (batch, seq, width), or (.., 2 * width) when gated
        if self.gated:
            gate, value = up.chunk(2, dim=-1)
            return self.down(self.activation(gate) * value)
        return self.down(self.activation(up))

    def extra_repr(self) -> str:
        return f"gated={self.gated}"


class TransformerBlock(GradientCheckpointingLayer):
    """Self-attention and feed-forward, each with dropout and a residual; post-LN or pre-LN.

    post-LN (BERT): x = LN(x + Attn(x)); x = LN(x + FF(x))
    pre-LN (GPT-2): x = x + Attn(LN(x)); x = x + FF(LN(x))
    """

    def __init__(
        self,
        attention: SelfAttention,
        attention_norm: nn.Module,
        feed_forward: FeedForward,
        feed_forward_norm: nn.Module,
        hidden_dropout: float,
        pre_layernorm: bool,
    ):
        super().__init__()
        self.pre_layernorm = pre_layernorm
        self.attention = attention
        self.attention_norm = attention_norm
        self.feed_forward = feed_forward
        self.feed_forward_norm = feed_forward_norm
        self.dropout = Dropout(hidden_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        previous_scores: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(hidden states, attention weights or None, residual scores or None: SelfAttention)"""
        if self.pre_layernorm:
            attended, weights, scores = self.attention(
                self.attention_norm(hidden_states),
                attention_mask,
                cache,
                output_attentions,
                rotary,
                previous_scores,
            )
            hidden_states = hidden_states + self.dropout(attended)
            fed = self.feed_forward(self.feed_forward_norm(hidden_states))
            hidden_states = hidden_states + self.dropout(fed)
        else:
            attended, weights, scores = self.attention(
                hidden_states, attention_mask, cache, output_attentions, rotary, previous_scores
            )
            hidden_states = self.attention_norm(hidden_states + self.dropout(attended))
            fed = self.feed_forward(hidden_states)
            hidden_states = self.feed_forward_norm(hidden_states + self.dropout(fed))
        return hidden_states, weights, scores


def rotary_embedding(config) -> RotaryEmbedding | None:
    """The RotaryEmbedding of a bert or gpt whose position_embedding_type is rotary, else None."""
    if config.position_embedding_type != "rotary":
        return None
    return RotaryEmbedding(config.hidden_size // config.num_attention_heads, config.rope_theta)


def transformer_block(
    config,
    layer_idx: int,
    pre_layernorm: bool,
    is_causal: bool = False,
    residual_attention: bool = False,
) -> TransformerBlock:
    """Block `layer_idx` of a bert or gpt stack as its config describes it (both configs name
    the fields alike): sizes, activation, dropouts, norms, biases, gated feed-forward, qk_norm;
    with residual_attention, RealFormer's scores (SelfAttention's residual_scores)."""
    top = layer_idx == config.num_hidden_layers - 1
    norm = norm_for(config)
    attention = SelfAttention(
        config.hidden_size,
        config.num_attention_heads,
        config.attention_probs_dropout_prob,
        is_causal,
        layer_idx,
        bias=config.attention_bias,
        qk_norm=norm if config.qk_norm else None,
        residual_scores=("last" if top else "keep") if residual_attention else None,
    )
    feed_forward = FeedForward(
        config.hidden_size,
        config.intermediate_size,
        config.hidden_act,
        gated=config.gated_mlp,
        bias=config.mlp_bias,
    )
    return TransformerBlock(
        attention,
        norm(config.hidden_size),
        feed_forward,
        norm(config.hidden_size),
        config.hidden_dropout_prob,
        pre_layernorm,
    )


def check_transformer_config(config) -> None:
    """Raise ConfigError for the invariants every egbert transformer config must hold."""
    name = type(config).__name__
    if config.hidden_size % config.num_attention_heads != 0:
        raise ConfigError(
            f"{name}: hidden_size ({config.hidden_size}) must be divisible by "
            f"num_attention_heads ({config.num_attention_heads}); change one of them"
        )
    if config.hidden_act not in ACTIVATIONS:
        raise ConfigError(
            f"{name}: hidden_act {config.hidden_act!r} is not supported; "
            f"use one of {list(ACTIVATIONS)}"
        )
    if config.position_embedding_type not in POSITION_EMBEDDING_TYPES:
        raise ConfigError(
            f"{name}: position_embedding_type {config.position_embedding_type!r} is not supported; "
            f"use one of {list(POSITION_EMBEDDING_TYPES)}"
        )
    if config.norm_type not in NORM_TYPES:
        raise ConfigError(
            f"{name}: norm_type {config.norm_type!r} is not supported; "
            f"use one of {list(NORM_TYPES)}"
        )
    head_dim = config.hidden_size // config.num_attention_heads
    if getattr(config, "local_attention_init", False) and config.qk_norm:
        raise ConfigError(
            f"{name}: local_attention_init sets the query and key scale that qk_norm normalises "
            "away; set local_attention_init=false or qk_norm=false"
        )
    if config.position_embedding_type == "rotary" and (head_dim % 2 or not config.rope_theta > 0):
        raise ConfigError(
            f"{name}: rotary positions need an even head size and rope_theta > 0; this config has "
            f"head size {head_dim} and rope_theta={config.rope_theta}"
        )
    if getattr(config, "local_attention_init", False) and (
        config.position_embedding_type != "learned" or head_dim % 2
    ):
        raise ConfigError(
            f"{name}: local_attention_init needs learned positions and an even head size; this "
            f"config has position_embedding_type={config.position_embedding_type!r} and head size "
            f"{head_dim}; set local_attention_init=false"
        )


def check_sequence_length(length: int, max_position_embeddings: int) -> None:
    """Raise DataError for an input longer than the model has positions for."""
    if length > max_position_embeddings:
        raise DataError(
            f"a sequence of {length} tokens is longer than the model's max_position_embeddings "
            f"({max_position_embeddings}); truncate the input (e.g. tokenizer truncation=True, "
            f"max_length={max_position_embeddings})"
        )


@torch.no_grad()
def init_transformer_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: normal(0, std) weights, zero biases, unit norms (LayerNorm or
    RMSNorm, with a bias or without).

    Uses transformers.initialization so that weights loaded by from_pretrained are left alone.
    """
    if isinstance(module, nn.Linear):
        init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight, mean=0.0, std=std)
    elif isinstance(module, nn.LayerNorm | nn.RMSNorm):
        init.ones_(module.weight)
        if getattr(module, "bias", None) is not None:  # RMSNorm has none
            init.zeros_(module.bias)
    elif isinstance(module, Embeddings) and module.position_embedding_type == "sinusoidal":
        table = module.position_table
        init.copy_(table, sinusoidal_position_table(*table.shape).to(table.device))
    elif isinstance(module, RotaryEmbedding):
        frequencies = module.inverse_frequencies
        init.copy_(frequencies, module.frequencies().to(frequencies.device))


# Local attention initialisation. A freshly initialised encoder attends almost uniformly, so its
# MLM predictions stay a bag of words (the "unigram plateau") until attention patterns form,
# which on a CPU budget they never do. Starting each head on a fixed neighbour (the previous
# token, the next one, two back, ...) gives the model local context from the first step; training
# is free to move the heads afterwards.
LOCAL_ATTENTION_GAIN = 1.5  # query/key gain: 0.97 of a 64-dim head's weight on its neighbour
LOCAL_FREQUENCY_RANGE = (0.3, 2.8)  # radians per position: high enough that neighbours differ


def local_attention_offsets(num_heads: int) -> list[int]:
    """Which neighbour each head starts on: -1, +1, -2, +2, -3, ..."""
    return [(head // 2 + 1) * (-1 if head % 2 == 0 else 1) for head in range(num_heads)]


def position_subspace_frequencies(head_dim: int) -> torch.Tensor:
    return torch.linspace(*LOCAL_FREQUENCY_RANGE, head_dim // 2)  # one per (sin, cos) pair


def position_shift(frequencies: torch.Tensor, shift: int) -> torch.Tensor:
    """R with R p_j = p_(j + shift) for the (sin, cos) pair encodings of the position subspace."""
    cos, sin = torch.cos(frequencies * shift), torch.sin(frequencies * shift)
    size = 2 * len(frequencies)
    rotation = torch.zeros(size, size)
    even = torch.arange(0, size, 2)
    rotation[even, even], rotation[even, even + 1] = cos, sin
    rotation[even + 1, even + 1], rotation[even + 1, even] = cos, -sin
    return rotation


@torch.no_grad()
def init_local_attention(module: nn.Module, head_dim: int, std: float) -> None:
    """Give positions the first head_dim dims to themselves and point every head at a neighbour.

    Run after init_transformer_weights (it overwrites parts of that init). transformers
    initialises module by module, leaves only, so this recognises the leaves: the learned
    position table becomes sinusoids of LOCAL_FREQUENCY_RANGE in dims [0, head_dim), which the
    token and segment embeddings leave at zero; in every attention's qkv projection each head's
    query reads p_i and its key reads p_j shifted by the head's offset o: scores peak at j = i + o.
    """
    if isinstance(module, nn.Embedding) and getattr(module, "holds_positions", False):
        subspace = sinusoidal_position_table(
            module.num_embeddings, head_dim, position_subspace_frequencies(head_dim)
        )
        encodings = torch.zeros(module.weight.shape)
        encodings[:, :head_dim] = subspace * (std / subspace.std())
        init.copy_(module.weight, encodings.to(module.weight.dtype))
    elif isinstance(module, nn.Embedding):
        weight = module.weight.clone()
        weight[:, :head_dim] = 0
        init.copy_(module.weight, weight)
    elif isinstance(module, nn.Linear) and hasattr(module, "attention_heads"):
        weight = module.weight.clone()  # (3 * hidden, hidden): query, key, value rows
        hidden = weight.shape[1]
        read_positions = LOCAL_ATTENTION_GAIN * torch.eye(head_dim, hidden)
        frequencies = position_subspace_frequencies(head_dim)
        for head, offset in enumerate(local_attention_offsets(module.attention_heads)):
            weight[head * head_dim : (head + 1) * head_dim] = read_positions
            key_rows = slice(hidden + head * head_dim, hidden + (head + 1) * head_dim)
            weight[key_rows] = position_shift(frequencies, -offset) @ read_positions
        init.copy_(module.weight, weight.to(module.weight.dtype))


def auto_map(model: PreTrainedModel, auto_classes: dict[str, type]) -> dict[str, str]:
    """config.json's auto_map for a folder `model` is saved in: of its family's `auto_classes`
    (Auto class name -> egbert class), the config, the base model, the sequence classifier (every
    folder fine-tunes), the classes `model` is an instance of and those it names in
    `also_loads_as`, each as "file.Class", where transformers finds the class (in the folder's
    copy of the file that defines it) when it loads the folder in a Python without egbert.
    isinstance, not type(model): under FSDP2 a model's class is one torch derives at run time.

    The import of heads.py (which imports this file) is also what puts heads.py, and the files
    it imports, in every folder: the config's save copies the relative imports of its file."""
    from .heads import CLASSIFIERS

    config_class = auto_classes["AutoConfig"]
    classifier = next(cls for cls in CLASSIFIERS if cls.config_class is config_class)
    auto_classes = {**auto_classes, "AutoModelForSequenceClassification": classifier}
    return {
        name: f"{cls.__module__.rpartition('.')[2]}.{cls.__name__}"
        for name, cls in auto_classes.items()
        if name in ("AutoConfig", "AutoModel", "AutoModelForSequenceClassification")
        or isinstance(model, cls)
        or name in getattr(model, "also_loads_as", ())
    }
