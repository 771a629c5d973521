"""The kernels egbert's models use where torch's own operation measured slower, each with a switch.

All of them compute what the stock operation computes (up to rounding and the random stream);
the numbers below were measured on a 2-core AMD EPYC with avx512_bf16 (no AMX, no Intel MKL
paths) unless another machine is named, at the mini preset (4 layers, hidden 256, 128 tokens).

- `dropout` / `Dropout`: dropout whose mask comes from 16 random bits per element on a CPU.
  Why: torch's CPU dropout draws its mask with `bernoulli_`, outside Intel's MKL a serial
  Mersenne Twister loop of one draw per element: 4.6 ms per million elements, a quarter of a
  bf16 bert step; 64-bit draws split four ways take 0.7 ms (on 2 Intel Xeon cores with AMX, a
  4M-element mask 2.0 ms instead of 6.1: bf16 bert 11,678 -> 13,865 tokens/s, +19%). The drop
  probability is rounded to a multiple of 1/65536 (0.1 -> 0.100006). GPUs keep `F.dropout`.
  Used by: layers' embeddings, transformer blocks and attention weights, elmo's LSTM stacks
  and biLM, the heads' classifier dropout. Off: `CPU_DROPOUT_MASKS = False` (`F.dropout` on
  every device).
- `explicit_attention` / `prefers_written_out_attention`: softmax(QK^T / sqrt(d)) V as bf16
  matmuls and a softmax, on a CPU up to 512 keys, where gradients are computed. Why: SDPA's CPU
  kernels compute bf16 attention in float32, and their backward is the slow part. One layer's
  attention, forward and backward, at 32 x 4 heads x 128 x 64:
  SDPA's flash kernel 23.8 ms, its math path 16.9, written out 5.4 (causal: 22.3, 16.2, 7.3);
  at 512 keys 40.9 against 27.2 (causal level: 39.1 and 38.7); in float32 the flash kernel is
  level at 128 keys and 2.2x faster at 512, and on a GPU SDPA's fused kernels win. bf16 bert's
  step went from 296 to 243 ms (364 to 340 with dropout 0.1), gpt's from 688 to 635. Used by:
  `layers.SelfAttention`, which also calls `explicit_attention` whenever the attention weights
  are asked for. Without gradients (inference: embedding, generation, evaluation) SDPA's forward
  is the faster one (2-core Intel Xeon with AMX, bf16, inference mode: 64 x 12 heads x 24 x 32
  3.1 ms against 4.9 written out, 32 x 4 x 128 x 64 2.6 against 8.0, one query over 40 keys
  29 us against 162; forward and backward at 32 x 4 x 128 x 64: written out 20 ms, SDPA 50), so
  it is used there. Off: `WRITTEN_OUT_BF16_ATTENTION = False` (SDPA for every forward that does
  not return the weights).
- `linear_cross_entropy`: the cross-entropy of a linear LM head without the (tokens, vocab)
  logits: rows labelled -100 are dropped, the rest go through the head a chunk at a time
  (`default_chunk_rows`) and each chunk's gradients are formed at once from its softmax. Why: at
  a 30k vocabulary the logits, their float32 log-softmax, its gradient and their copies cost
  about as much as the transformer (`GPT2LMHeadModel` spends 20-25% of a step on them); mini
  bf16 gpt went from 4,950 to 6,159 tokens/s with the one-softmax-per-chunk version, and bf16
  sparse-MLM bert gained 11-13% (8,256 and 8,697 -> 9,307 and 9,644 tokens/s). 512-row chunks
  were the fastest on a CPU (gpt's step 688 ms, 714 at 256 rows, 758 at 1,024); on a GPU a chunk
  costs several launches (256-row chunks made the mini gpt 0.88x `GPT2LMHeadModel` on an H100,
  1.08x with chunks of up to 512 MiB of logits), and padding the head to a multiple of 8 rows
  gave compiled base gpt +5.1% tokens/s on an H100. Used by: gpt's and elmo's LM losses and
  bert's MLM loss with `sparse_mlm_logits`, in a training forward (`chunked_lm_loss_applies`).
  Off: the model config's `chunked_lm_loss=False` (logits and `F.cross_entropy`; a training
  forward then returns its logits too).
- `sample_tokens`: one token per row drawn from the softmax of logits by inverting its
  cumulative sum at one uniform draw a row. Why: `torch.multinomial` draws one random number per
  vocabulary entry on a CPU: 80 ms of a 237 ms ELECTRA-style (replaced token detection) step,
  a third of it. Used by: bert's replaced token detection, to fill the masks with the
  generator's samples. Off: `INVERSE_CDF_SAMPLING = False` (`torch.multinomial`).

The three module-level switches change speed and the random stream only, so they are read at
every call and hold for the whole process (`egbert.models.kernels.CPU_DROPOUT_MASKS = False`).
The chunked loss changes what a training forward returns (no logits), so it is a model option
saved with the model's config.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

CPU_DROPOUT_MASKS = True
WRITTEN_OUT_BF16_ATTENTION = True
INVERSE_CDF_SAMPLING = True


def dropout(hidden: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout, with the mask drawn from 16 random bits per element on a CPU (see above); in
    a compiled graph F.dropout too (inductor generates its own masks, and the in-place draw
    would break the graph)."""
    eager_cpu = hidden.device.type == "cpu" and not torch.compiler.is_compiling()
    if not CPU_DROPOUT_MASKS or not training or not 0.0 < p < 1.0 or not eager_cpu:
        return F.dropout(hidden, p, training)  # which also rejects a p outside [0, 1]
    draws = torch.empty(-(-hidden.numel() // 4), dtype=torch.int64).random_(-(2**63), None)
    bits = draws.view(torch.int16)[: hidden.numel()].view(hidden.shape)
    kept = bits >= round(p * 65536) - 32768  # int16 bits are uniform on [-32768, 32767]
    return hidden * kept.to(hidden.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout` above."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return dropout(hidden, self.p, self.training)


def prefers_written_out_attention(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether explicit_attention beats SDPA here: bfloat16 on a CPU up to 512 keys with
    gradients on (see above), unless WRITTEN_OUT_BF16_ATTENTION is off."""
    return (
        WRITTEN_OUT_BF16_ATTENTION
        and torch.is_grad_enabled()
        and query.device.type == "cpu"
        and query.dtype == torch.bfloat16
        and key.shape[-2] <= 512
    )


def explicit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QK^T / sqrt(d)) V written out: for when the caller wants the attention weights,
    and where it is faster than SDPA (prefers_written_out_attention)."""
    return attention_from_scores(attention_scores(query, key), value, mask, is_causal, dropout_p)


def attention_scores(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """QK^T / sqrt(d): (batch, heads, queries, keys), before any mask."""
    return query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])


def attention_from_scores(
    scores: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The context and the weights of scores: masked, softmaxed, dropped out, times value."""
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    context = dropout(weights, dropout_p) @ value
    return context, weights


def chunked_lm_loss_applies(config: PretrainedConfig, training: bool) -> bool:
    """Whether a forward with labels takes its LM loss from linear_cross_entropy, and so returns
    no logits: the config's `chunked_lm_loss` is on and this is a training forward, where a
    backward will use the gradients linear_cross_entropy computes on the way. Not in a compiled
    graph: its rows and chunks depend on the labels (a graph break), while the dense logits and
    F.cross_entropy are one graph that inductor fuses."""
    compiling = torch.compiler.is_compiling()
    return config.chunked_lm_loss and training and torch.is_grad_enabled() and not compiling


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

    Rows whose target is -100 are dropped first, and the rest go through the head `chunk_rows`
    at a time (default: `default_chunk_rows`): each chunk's logits are turned into its loss and,
    before the next chunk's exist, into the gradients of hidden, weight and bias (softmax minus
    the smoothed one-hot, times the head). backward() only scales those by the incoming gradient.
    The matmuls, the softmax and the gradients run in the autocast dtype (the softmax
    accumulating in float32), the loss's sums in float32; under bfloat16 the loss differs from
    the dense F.linear + F.cross_entropy's by the rounding of one probability per row
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
    """Rows per chunk of linear_cross_entropy: 512 on a CPU (the fastest size measured), and on a
    GPU, where each chunk costs several kernel launches, as many as 2**27 float32 logits
    (512 MiB) allow."""
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


def sample_tokens(logits: torch.Tensor) -> torch.Tensor:
    """One token id per row of (rows, vocab) logits, drawn from their softmax by inverting its
    cumulative sum at a uniform draw: one random number a row, where torch.multinomial draws one
    per vocabulary entry (see above). The samples are data, not a path for gradients."""
    if not INVERSE_CDF_SAMPLING:
        return torch.multinomial(logits.softmax(dim=-1), 1).squeeze(-1)
    cumulative = logits.softmax(dim=-1).cumsum(dim=-1)  # (rows, vocab)
    draws = torch.rand(logits.shape[0], 1, device=logits.device) * cumulative[:, -1:]
    return torch.searchsorted(cumulative, draws).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
