"""egbert/models/kernels.py: each kernel computes what torch's own operation computes, the models
use it where they should, and each switch brings back torch's operation.

The kernels are CPU-specific (dropout masks, bfloat16 attention) or chosen for the CPU, so these
tests pin the CPU on purpose.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from egbert.models import kernels, layers
from egbert.models.bert import EgbertBertConfig, EgbertBertForMaskedLM
from egbert.models.elmo import EgbertElmoConfig, EgbertElmoForBidirectionalLM
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM
from egbert.models.kernels import (
    Dropout,
    default_chunk_rows,
    linear_cross_entropy,
    prefers_written_out_attention,
    sample_tokens,
)
from egbert.models.layers import SelfAttention, self_attention_mask

TRANSFORMER = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_gpt(**overrides) -> EgbertGPTForCausalLM:
    torch.manual_seed(0)
    # an initializer range above GPT-2's 0.02 so that the context, not just the last token, counts
    config = EgbertGPTConfig(
        **TRANSFORMER, **NO_DROPOUT, intermediate_size=128, initializer_range=0.2, **overrides
    )
    return EgbertGPTForCausalLM(config).eval()


def tiny_bert(**overrides) -> EgbertBertForMaskedLM:
    torch.manual_seed(0)
    config = EgbertBertConfig(**TRANSFORMER, **NO_DROPOUT, intermediate_size=64, **overrides)
    return EgbertBertForMaskedLM(config)


def random_ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(1, 100, (batch, length), generator=torch.Generator().manual_seed(0))


def loss_and_gradients(model, ids, labels, **forward) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    output = model(ids, labels=labels, **forward)
    output.loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    return output, gradients


# bf16 training on a CPU goes through explicit_attention, float32 and inference through SDPA:
# they must agree
@pytest.mark.parametrize("is_causal", [True, False])
def test_bf16_attention_on_a_cpu_is_written_out_and_matches_sdpa(
    is_causal: bool, monkeypatch
) -> None:
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].dtype)
        return kernels.explicit_attention(*args, **kwargs)

    monkeypatch.setattr(layers, "explicit_attention", counted)
    torch.manual_seed(0)
    attention = SelfAttention(16, 2, is_causal=is_causal).train()
    hidden = torch.randn(2, 6, 16)
    padding = torch.ones(2, 6, dtype=torch.long)
    padding[1, 4:] = 0
    mask = self_attention_mask(padding, 6, 0, is_causal, torch.device("cpu"))
    sdpa, _, _ = attention(hidden, mask)
    assert calls == []  # float32 went through SDPA
    with torch.autocast("cpu", dtype=torch.bfloat16):
        written_out, _, _ = attention(hidden, mask)
    assert calls == [torch.bfloat16]  # bf16 through the written-out attention
    torch.testing.assert_close(written_out.float(), sdpa, atol=3e-2, rtol=0)
    keys = torch.zeros(1, 1, 512, 8, dtype=torch.bfloat16)
    assert prefers_written_out_attention(keys, keys)
    assert not prefers_written_out_attention(keys.float(), keys.float())
    longer = torch.zeros(1, 1, 513, 8, dtype=torch.bfloat16)
    assert not prefers_written_out_attention(longer, longer)
    with torch.inference_mode():  # no backward to save: SDPA's forward is the faster one
        assert not prefers_written_out_attention(keys, keys)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inferred, _, _ = attention.eval()(hidden, mask)
    assert calls == [torch.bfloat16]  # no second call: inference went through SDPA
    torch.testing.assert_close(inferred.float(), sdpa, atol=3e-2, rtol=0)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_drops_at_rate_p_and_scales_what_it_keeps(p: float) -> None:
    torch.manual_seed(0)
    hidden = torch.ones(64, 4097, requires_grad=True)  # an odd size: the bits come 4 per draw
    out = Dropout(p).train()(hidden)
    kept = out != 0
    for lane in range(4):  # each 16-bit quarter of a 64-bit draw is uniform, the sign bit too
        rate = 1 - kept.flatten()[lane::4].float().mean().item()
        assert abs(rate - p) < 0.01, (lane, rate)
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    out.sum().backward()
    torch.testing.assert_close(hidden.grad, kept.float() / (1 - p))
    torch.manual_seed(0)
    torch.testing.assert_close(Dropout(p).train()(hidden), out)  # seeded by torch's generator
    assert torch.equal(Dropout(p).eval()(hidden), hidden)


def test_sampled_tokens_follow_the_softmax_of_the_logits() -> None:
    torch.manual_seed(0)
    probabilities = torch.tensor([[0.7, 0.2, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    logits = probabilities.log().repeat_interleave(20000, dim=0)  # 0 -> -inf: never drawn
    samples = sample_tokens(logits).reshape(2, 20000)
    for row, expected in enumerate(probabilities):
        frequencies = torch.bincount(samples[row], minlength=5) / 20000
        torch.testing.assert_close(frequencies, expected, atol=0.01, rtol=0)


def test_each_switch_brings_back_torchs_own_operation(monkeypatch) -> None:
    hidden = torch.randn(8, 100)
    monkeypatch.setattr(kernels, "CPU_DROPOUT_MASKS", False)
    torch.manual_seed(0)
    switched_off = Dropout(0.3).train()(hidden)
    torch.manual_seed(0)
    assert torch.equal(switched_off, F.dropout(hidden, 0.3, training=True))

    keys = torch.zeros(1, 1, 128, 8, dtype=torch.bfloat16)
    assert prefers_written_out_attention(keys, keys)
    monkeypatch.setattr(kernels, "WRITTEN_OUT_BF16_ATTENTION", False)
    assert not prefers_written_out_attention(keys, keys)

    logits = torch.randn(50, 7)
    monkeypatch.setattr(kernels, "INVERSE_CDF_SAMPLING", False)
    torch.manual_seed(0)
    samples = sample_tokens(logits)
    torch.manual_seed(0)
    assert torch.equal(samples, torch.multinomial(logits.softmax(dim=-1), 1).squeeze(-1))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_training_loss_without_logits_equals_the_dense_loss_and_gradients(label_smoothing) -> None:
    model = tiny_gpt(label_smoothing=label_smoothing).train()  # dropout 0: deterministic
    ids = random_ids(batch=3, length=12)
    labels = ids.clone()
    labels[0, 4:7] = -100
    labels[2, -2:] = -100
    chunked, chunked_grads = loss_and_gradients(model, ids, labels)
    model.config.chunked_lm_loss = False
    dense, dense_grads = loss_and_gradients(model, ids, labels)
    assert chunked.logits is None and dense.logits is not None
    torch.testing.assert_close(chunked.loss, dense.loss, atol=1e-5, rtol=0)
    for name, gradient in dense_grads.items():
        torch.testing.assert_close(chunked_grads[name], gradient, atol=1e-5, rtol=1e-5, msg=name)


def test_training_loss_without_logits_follows_bf16_autocast() -> None:
    model = tiny_gpt().train()
    ids = random_ids(batch=3, length=12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked, chunked_grads = loss_and_gradients(model, ids, ids)
        model.config.chunked_lm_loss = False
        dense, dense_grads = loss_and_gradients(model, ids, ids)
    torch.testing.assert_close(chunked.loss, dense.loss, atol=1e-3, rtol=0)
    for name, gradient in dense_grads.items():
        torch.testing.assert_close(chunked_grads[name], gradient, atol=2e-3, rtol=2e-2, msg=name)


def test_eval_and_no_grad_forwards_keep_their_logits() -> None:
    model = tiny_gpt()
    ids = random_ids(batch=2, length=10)
    assert model(ids, labels=ids).logits is not None  # eval mode
    with torch.no_grad():
        assert model.train()(ids, labels=ids).logits is not None


def test_elmo_training_loss_without_logits_equals_the_dense_loss_and_gradients():
    torch.manual_seed(0)
    config = EgbertElmoConfig(
        vocab_size=50, hidden_size=16, cell_size=32, hidden_dropout_prob=0.0, label_smoothing=0.1
    )
    model = EgbertElmoForBidirectionalLM(config).train()
    input_ids = torch.randint(1, 50, (3, 7))
    attention_mask = (torch.arange(7) < torch.tensor([[7], [4], [6]])).long()
    labels = input_ids.clone()
    labels[0, 2] = -100

    def loss_and_gradients():
        model.zero_grad()
        out = model(input_ids, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        return out, {name: p.grad.clone() for name, p in model.named_parameters()}

    chunked, chunked_grads = loss_and_gradients()
    model.config.chunked_lm_loss = False
    dense, dense_grads = loss_and_gradients()
    assert chunked.forward_logits is None and dense.forward_logits is not None
    for name in ("loss", "forward_loss", "backward_loss"):
        torch.testing.assert_close(getattr(chunked, name), getattr(dense, name))
    for name, gradient in dense_grads.items():
        torch.testing.assert_close(chunked_grads[name], gradient, atol=1e-5, rtol=1e-5, msg=name)


def bert_batch() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Three sequences of 12 with two segments, and MLM labels at every fourth position."""
    input_ids = random_ids(batch=3, length=12)
    batch = {"input_ids": input_ids, "token_type_ids": (torch.arange(12) >= 6).long().expand(3, -1)}
    labels = torch.full_like(input_ids, -100)
    labels[:, 1::4] = input_ids[:, 1::4]
    return batch, labels


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_sparse_mlm_logits_give_the_dense_loss_and_gradients(label_smoothing: float) -> None:
    batch, labels = bert_batch()
    losses, gradients = [], []
    for sparse in (False, True):
        model = tiny_bert(sparse_mlm_logits=sparse, label_smoothing=label_smoothing)
        output = model(**batch, labels=labels)
        output.loss.backward()
        losses.append(output.loss)
        gradients.append(model.mlm_head.dense.weight.grad)
        if sparse:
            assert output.logits is None  # training: the loss straight from the head's input
            with torch.no_grad():
                logits = model(**batch, labels=labels).logits
            assert logits.shape == (int((labels != -100).sum()), 100)
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(gradients[1], gradients[0], atol=1e-6, rtol=0)


def test_sparse_mlm_logits_without_the_chunked_loss_keep_their_logits_in_training() -> None:
    batch, labels = bert_batch()
    chunked = tiny_bert(sparse_mlm_logits=True)(**batch, labels=labels)
    model = tiny_bert(sparse_mlm_logits=True, chunked_lm_loss=False)
    dense = model(**batch, labels=labels)
    assert chunked.logits is None
    assert dense.logits.shape == (int((labels != -100).sum()), 100)
    expected = F.cross_entropy(dense.logits, labels[labels != -100])
    torch.testing.assert_close(dense.loss, expected)
    torch.testing.assert_close(chunked.loss, dense.loss, atol=1e-6, rtol=0)


# a vocabulary of 30 is padded to 32 inside (its logits rows aligned to 8), one of 32 is not
@pytest.mark.parametrize(("chunk_rows", "vocab"), [(1, 30), (4, 30), (64, 30), (4, 32)])
def test_linear_cross_entropy_matches_linear_then_cross_entropy(
    chunk_rows: int, vocab: int
) -> None:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 8, generator=generator, requires_grad=True)
    weight = torch.randn(vocab, 8, generator=generator, requires_grad=True)
    bias = torch.randn(vocab, generator=generator, requires_grad=True)
    targets = torch.randint(0, vocab, (2, 9), generator=generator)
    targets[1, :3] = -100
    chunked = linear_cross_entropy(hidden, weight, targets, bias, 0.2, chunk_rows=chunk_rows)
    dense = F.cross_entropy(
        F.linear(hidden, weight, bias).flatten(0, 1), targets.flatten(), label_smoothing=0.2
    )
    (2 * chunked).backward()
    chunked_grads = [tensor.grad.clone() for tensor in (hidden, weight, bias)]
    for tensor in (hidden, weight, bias):
        tensor.grad = None
    (2 * dense).backward()
    torch.testing.assert_close(chunked, dense)
    for chunked_grad, tensor in zip(chunked_grads, (hidden, weight, bias), strict=True):
        torch.testing.assert_close(chunked_grad, tensor.grad)
    assert torch.isnan(linear_cross_entropy(hidden, weight, torch.full((2, 9), -100)))


def test_linear_cross_entropy_chunks_are_cache_sized_on_cpu_and_memory_bounded_on_gpu() -> None:
    assert default_chunk_rows(torch.device("cpu"), 30522) == 512
    gpu_rows = default_chunk_rows(torch.device("cuda"), 30522)
    assert gpu_rows > 4096  # a mini gpt's whole 32 x 128 batch in one chunk: few launches
    assert gpu_rows * 30522 <= 2**27  # but never more than 512 MiB of float32 logits
    assert default_chunk_rows(torch.device("cuda"), 10**6) == 256
