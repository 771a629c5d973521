"""Building blocks shared by egbert's models: embeddings, attention, MLP, block, LM-head loss.

BERT and GPT are stacks of the same block; they differ in where the LayerNorms sit (after each
residual sum in BERT, before each sublayer in GPT), in whether attention is causal, and in the
GELU variant (exact in BERT, the tanh approximation in GPT-2). GPT and ELMo train their LM heads
through `linear_cross_entropy`, which never holds the (tokens, vocab) logits.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from egbert.errors import ConfigError, DataError

# config.hidden_act -> activation; "gelu_new" is GPT-2's name for the tanh approximation
ACTIVATIONS = {"gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh")}
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")


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


def dropout(hidden: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout, with the mask drawn from 16 random bits per element on a CPU.

    torch's CPU dropout draws its mask with bernoulli_, which outside Intel's MKL is a serial loop
    of one Mersenne Twister draw per element: 4.6 ms per million elements on this project's AMD
    CPU, a quarter of a bfloat16 bert step. Splitting 64-bit draws from the same generator four
    ways takes 0.7 ms. The drop probability is rounded to a multiple of 1/65536 (0.1 -> 0.100006).
    """
    if not training or not 0.0 < p < 1.0 or hidden.device.type != "cpu":
        return F.dropout(hidden, p, training)  # which also rejects a p outside [0, 1]
    draws = torch.empty(-(-hidden.numel() // 4), dtype=torch.int64).random_(-(2**63), None)
    bits = draws.view(torch.int16)[: hidden.numel()].view(hidden.shape)
    kept = bits >= round(p * 65536) - 32768  # int16 bits are uniform on [-32768, 32767]
    return hidden * kept.to(hidden.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout` above."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return dropout(hidden, self.p, self.training)


class Embeddings(nn.Module):
    """Token + position (+ segment) embeddings, then an optional LayerNorm and dropout."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        position_embedding_type: str = "learned",
        type_vocab_size: int = 0,
        layer_norm_eps: float | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embedding_type = position_embedding_type
        if position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
            self.position_embeddings.holds_positions = True  # see init_local_attention
        else:
            # fixed, so not saved: it is rebuilt from the config when the model is created
            table = sinusoidal_position_table(max_position_embeddings, hidden_size)
            self.register_buffer("position_table", table, persistent=False)
        self.token_type_embeddings = (
            nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size > 0 else None
        )
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps) if layer_norm_eps else None
        self.dropout = Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        embeddings = self.word_embeddings(input_ids)  # (batch, seq, hidden)
        if self.position_embedding_type == "learned":
            embeddings = embeddings + self.position_embeddings(position_ids)
        else:
            embeddings = embeddings + self.position_table[position_ids].to(embeddings.dtype)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.norm is not None:
            embeddings = self.norm(embeddings)
        return self.dropout(embeddings)


def self_attention_mask(
    padding_mask: torch.Tensor | None,
    query_length: int,
    past_length: int,
    is_causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """The boolean mask (True = may attend) for SDPA, or None where no mask or `is_causal` suffices.

    padding_mask is (batch, past_length + query_length) with 1 for real tokens and 0 for padding:
    with a KV cache the keys are the `past_length` cached tokens followed by the new ones.
    """
    has_padding = padding_mask is not None and not bool(padding_mask.all())
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
    slower or the weights are wanted, explicit_attention), one fused qkv matrix."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float = 0.0,
        is_causal: bool = False,
        layer_idx: int = 0,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.dropout = dropout
        self.is_causal = is_causal
        self.layer_idx = layer_idx  # where this layer's keys and values live in a KV cache
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.qkv.attention_heads = num_heads  # see init_local_attention
        self.out = nn.Linear(hidden_size, hidden_size)
        self.out.writes_residual = True  # see EgbertGPTPreTrainedModel._init_weights

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length, hidden = hidden_states.shape
        qkv = self.qkv(hidden_states).view(batch, length, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq, head_dim)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (.., past+seq, ..)
        dropout = self.dropout if self.training else 0.0
        # SDPA's is_causal aligns the mask top-left, which is only right without cached keys
        is_causal = self.is_causal and attention_mask is None and key.shape[2] == length
        if output_attentions or written_out_is_faster(query, key):
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
        return self.out(context), weights


def written_out_is_faster(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether explicit_attention beats SDPA here. SDPA's CPU kernels compute bfloat16 attention
    in float32: the written-out bfloat16 matmuls and softmax ran a training step's attention
    (forward and backward) 4.4x faster at 128 keys, 1.4-1.8x at 256 and up to 1.5x at 512 (level
    when causal), while in float32 SDPA's flash kernel was level or faster, and on a GPU SDPA's
    fused kernels win."""
    return query.device.type == "cpu" and query.dtype == torch.bfloat16 and key.shape[-2] <= 512


def explicit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QK^T / sqrt(d)) V written out: for when the caller wants the attention weights,
    and where it is faster than SDPA (written_out_is_faster)."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (batch, heads, q, k)
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    context = dropout(weights, dropout_p) @ value
    return context, weights


class FeedForward(nn.Module):
    """The position-wise MLP: hidden -> intermediate -> GELU -> hidden."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.activation = ACTIVATIONS[hidden_act]
        self.down = nn.Linear(intermediate_size, hidden_size)
        self.down.writes_residual = True  # see EgbertGPTPreTrainedModel._init_weights

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(hidden_states)))


class TransformerBlock(GradientCheckpointingLayer):
    """Self-attention and feed-forward, each with dropout and a residual; post-LN or pre-LN.

    post-LN (BERT): x = LN(x + Attn(x)); x = LN(x + FF(x))
    pre-LN (GPT-2): x = x + Attn(LN(x)); x = x + FF(LN(x))
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        intermediate_size: int,
        hidden_act: str,
        hidden_dropout: float,
        attention_dropout: float,
        layer_norm_eps: float,
        pre_layernorm: bool,
        is_causal: bool = False,
        layer_idx: int = 0,
    ):
        super().__init__()
        self.pre_layernorm = pre_layernorm
        self.attention = SelfAttention(
            hidden_size, num_heads, attention_dropout, is_causal, layer_idx
        )
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.feed_forward = FeedForward(hidden_size, intermediate_size, hidden_act)
        self.feed_forward_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(hidden_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pre_layernorm:
            attended, weights = self.attention(
                self.attention_norm(hidden_states),
                attention_mask,
                cache,
                output_attentions,
            )
            hidden_states = hidden_states + self.dropout(attended)
            fed = self.feed_forward(self.feed_forward_norm(hidden_states))
            hidden_states = hidden_states + self.dropout(fed)
        else:
            attended, weights = self.attention(
                hidden_states, attention_mask, cache, output_attentions
            )
            hidden_states = self.attention_norm(hidden_states + self.dropout(attended))
            fed = self.feed_forward(hidden_states)
            hidden_states = self.feed_forward_norm(hidden_states + self.dropout(fed))
        return hidden_states, weights


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=-100,
    label_smoothing=...) for a training step, without ever holding the (rows, vocab) logits.

    At a vocabulary of 30k the LM head's logits dwarf the rest of a small model: materialising
    them in float32, the log-softmax, its gradient and their copies cost as much time as the
    transformer itself. Here rows whose target is -100 are dropped first, and the rest go through
    the head `chunk_rows` at a time (default: `default_chunk_rows`): each chunk's logits are
    turned into its loss and, before the next chunk's exist, into the gradients of hidden, weight
    and bias (softmax minus the smoothed one-hot, times the head). backward() only scales those by
    the incoming gradient. The matmuls, the softmax and the gradients run in the autocast dtype
    (the softmax accumulating in float32), the loss's sums in float32; under bfloat16 the loss
    differs from the dense F.linear + F.cross_entropy's by the rounding of one probability per row
    (< 0.002 nats), and the gradients are the dense path's rounded to bfloat16, as its backward
    would round them. The gradients are computed in the forward pass, so call it only when a
    backward will follow (use the dense path under torch.no_grad).
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (rows, hidden)
    targets = targets.reshape(-1)
    kept = targets != -100
    device = hidden.device.type
    autocast = torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if autocast else weight.dtype
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(hidden.device, weight.shape[0])
    return _LinearCrossEntropy.apply(
        hidden[kept], weight, bias, targets[kept], dtype, label_smoothing, chunk_rows
    )


def default_chunk_rows(device: torch.device, vocab: int) -> int:
    """Rows per chunk of linear_cross_entropy. On a CPU 512 rows were the fastest size measured
    (a mini gpt's bf16 step: 688 ms, against 714 at 256 rows and 758 at 1024; fp32 level). On a
    GPU every chunk costs several kernel launches, which dominated a gpt step at 256 rows (an H100
    ran the mini gpt at 0.88x GPT2LMHeadModel), so chunks there are as large as 2**27 float32
    logits (512 MiB) allow."""
    return 512 if device.type == "cpu" else max(256, 2**27 // vocab)


def _padded_rows(tensor: torch.Tensor, padding: int, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` in `dtype` with `padding` zero rows after it, cast and padded in one copy (a
    cast and then F.pad would copy the LM head twice every step)."""
    if not padding:
        return tensor.to(dtype)
    padded = tensor.new_empty((tensor.shape[0] + padding, *tensor.shape[1:]), dtype=dtype)
    padded[: tensor.shape[0]] = tensor
    padded[tensor.shape[0] :] = 0
    return padded


class _LinearCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of a linear head over rows that all have a target; see
    linear_cross_entropy. The gradients are computed chunk by chunk in forward()."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype, label_smoothing, chunk_rows):
        rows, vocab = hidden.shape[0], weight.shape[0]
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        # A vocabulary that is not a multiple of 8 (BERT's 30,522) leaves every logits row off the
        # 16-byte alignment that vectorised loads and Hopper's matmul kernels need (an H100 ran
        # one of the three head matmuls on an older, slower kernel). Zero rows pad the head, and
        # their logits are set to -inf so that they take no probability and get no gradient.
        padding = -vocab % 8
        # the casts are spelled out here, so autocast must not add its own
        with torch.autocast(hidden.device.type, enabled=False):
            inputs, head = hidden.to(dtype), _padded_rows(weight, padding, dtype)
            head_bias = None if bias is None else _padded_rows(bias, padding, dtype)
            grad_hidden = torch.empty_like(hidden) if needs_hidden else None
            grad_weight = None  # the first chunk's product starts it (zero-filling it costs more)
            grad_bias = torch.zeros_like(head_bias, dtype=torch.float32) if needs_bias else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, rows, chunk_rows):
                chunk = slice(start, start + chunk_rows)
                logits = F.linear(inputs[chunk], head, head_bias)  # (chunk, padded vocab)
                if padding:
                    logits[:, vocab:] = -math.inf
                # d loss / d logits of a row: softmax - (1 - eps) * one_hot(target) - eps / vocab.
                # The softmax is written once, in the matmul dtype the gradient needs anyway; a
                # float32 log-softmax, its exp and the casts cost as much as the matmuls on a CPU.
                grad_logits = logits.softmax(dim=-1)
                # log-sum-exp from the largest logit and its probability, which is at least 1/vocab,
                # so it never underflows (in bfloat16 it carries 2**-9 relative error: < 0.002 nats)
                top_logit = logits.amax(dim=-1).float()
                log_normalizer = top_logit - grad_logits.amax(dim=-1).float().log()
                target = targets[chunk]
                picked = torch.arange(len(target), device=target.device)
                target_logit = logits[picked, target].float()
                total += (1 - label_smoothing) * (log_normalizer - target_logit).sum()
                if label_smoothing:
                    logits_sum = logits[:, :vocab].sum(dim=-1, dtype=torch.float32)
                    total += label_smoothing * (log_normalizer - logits_sum / vocab).sum()
                # indexing, not scatter_add_: a bfloat16 scatter_add_ is a slow serial loop on a CPU
                grad_logits[picked, target] -= 1 - label_smoothing
                if label_smoothing:
                    grad_logits[:, :vocab].sub_(label_smoothing / vocab)
                if needs_bias:  # summed in the matmul dtype, as the weight's gradient is
                    grad_bias += grad_logits.sum(dim=0)
                if needs_hidden:
                    grad_hidden[chunk] = grad_logits @ head
                if needs_weight:
                    product = grad_logits.T @ inputs[chunk]  # (padded vocab, hidden)
                    if grad_weight is None:
                        grad_weight = product.float()
                    else:
                        grad_weight += product
        if needs_weight:
            grad_weight = torch.zeros_like(weight) if grad_weight is None else grad_weight[:vocab]
        if needs_bias:
            grad_bias = grad_bias[:vocab]
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.rows = rows
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total / rows  # NaN without any target, as F.cross_entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        scale = grad_loss / max(ctx.rows, 1)
        grads = [
            None if grad is None else (grad * scale).to(dtype)
            for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes, strict=True)
        ]
        return (*grads, None, None, None, None)


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
    head_dim = config.hidden_size // config.num_attention_heads
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
    """BERT's initialisation: normal(0, std) weights, zero biases, unit LayerNorms.

    Uses transformers.initialization so that weights loaded by from_pretrained are left alone.
    """
    if isinstance(module, nn.Linear):
        init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight, mean=0.0, std=std)
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)
    elif isinstance(module, Embeddings) and module.position_embedding_type == "sinusoidal":
        table = module.position_table
        init.copy_(table, sinusoidal_position_table(*table.shape).to(table.device))


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
