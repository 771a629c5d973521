"""The egbert GPT decoder: saving/loading, padding, KV cache, generate(), loss, text-generation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, pipeline

from egbert.errors import ConfigError
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM, EgbertGPTModel
from egbert.models.layers import (
    Dropout,
    SelfAttention,
    default_chunk_rows,
    linear_cross_entropy,
    self_attention_mask,
    written_out_is_faster,
)

CONFIGS = Path(__file__).resolve().parents[1] / "egbert" / "configs"


def tiny_config(**overrides) -> EgbertGPTConfig:
    settings = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
        eos_token_id=0,
        bos_token_id=0,
        # larger than GPT-2's 0.02 so that the context, not just the last token, decides the output
        initializer_range=0.2,
    )
    return EgbertGPTConfig(**{**settings, **overrides})


def tiny_model(**overrides) -> EgbertGPTForCausalLM:
    torch.manual_seed(0)
    return EgbertGPTForCausalLM(tiny_config(**overrides)).eval()


def random_ids(batch: int = 2, length: int = 10) -> torch.Tensor:
    return torch.randint(1, 100, (batch, length), generator=torch.Generator().manual_seed(0))


def greedy_without_cache(
    model: EgbertGPTForCausalLM, ids: torch.Tensor, steps: int
) -> torch.Tensor:
    for _ in range(steps):
        next_token = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_token], dim=1)
    return ids


@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal"])
def test_save_load_round_trip_and_auto_classes(tmp_path: Path, position_embedding_type) -> None:
    model = tiny_model(position_embedding_type=position_embedding_type)
    ids = random_ids()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert isinstance(AutoConfig.from_pretrained(tmp_path), EgbertGPTConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, EgbertGPTForCausalLM)
    assert loaded.lm_head.weight is loaded.gpt.embeddings.word_embeddings.weight
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    decoder = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(decoder, EgbertGPTModel)
    torch.testing.assert_close(decoder(ids).last_hidden_state, model.gpt(ids).last_hidden_state)


def test_outputs_do_not_change_with_extra_right_padding() -> None:
    model = tiny_model()
    ids = random_ids(length=7)
    alone = model(ids, output_hidden_states=True)
    padded_ids = F.pad(ids, (0, 4), value=0)
    attention_mask = (torch.arange(11) < 7).long().expand(2, -1)
    padded = model(padded_ids, attention_mask, output_hidden_states=True)
    for expected, actual in zip(alone.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(actual[:, :7], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded.logits[:, :7], alone.logits, atol=1e-5, rtol=0)


def test_attention_is_causal() -> None:
    model = tiny_model()
    ids = random_ids()
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 100
    torch.testing.assert_close(model(changed).logits[:, :6], model(ids).logits[:, :6])
    weights = model(ids, output_attentions=True).attentions[0]
    assert weights.triu(diagonal=1).abs().max() == 0
    torch.testing.assert_close(
        model(ids, output_attentions=True).logits, model(ids).logits, atol=1e-5, rtol=0
    )


# bf16 on a CPU goes through explicit_attention, float32 through SDPA: the two must agree
@pytest.mark.parametrize("is_causal", [True, False])
def test_bf16_attention_on_a_cpu_is_written_out_and_matches_sdpa(is_causal: bool) -> None:
    torch.manual_seed(0)
    attention = SelfAttention(16, 2, is_causal=is_causal).train()
    hidden = torch.randn(2, 6, 16)
    padding = torch.ones(2, 6, dtype=torch.long)
    padding[1, 4:] = 0
    mask = self_attention_mask(padding, 6, 0, is_causal, torch.device("cpu"))
    sdpa, _ = attention(hidden, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        written_out, _ = attention(hidden, mask)
    torch.testing.assert_close(written_out.float(), sdpa, atol=3e-2, rtol=0)
    keys = torch.zeros(1, 1, 512, 8, dtype=torch.bfloat16)
    assert written_out_is_faster(keys, keys)
    assert not written_out_is_faster(keys.float(), keys.float())
    longer = torch.zeros(1, 1, 513, 8, dtype=torch.bfloat16)
    assert not written_out_is_faster(longer, longer)


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


def test_hidden_states_follow_the_gpt2_convention() -> None:
    model = tiny_model()
    output = model.gpt(random_ids(), output_hidden_states=True)
    assert len(output.hidden_states) == 3  # embeddings + one per layer
    # as GPT2Model: the last entry is after the final LayerNorm
    assert output.hidden_states[-1] is output.last_hidden_state


def test_kv_cache_matches_a_full_forward() -> None:
    model = tiny_model()
    ids = random_ids(length=12)
    full = model(ids, use_cache=False).logits
    prefix = model(ids[:, :8], use_cache=True)
    rest = model(ids[:, 8:], cache=prefix.cache, use_cache=True)
    torch.testing.assert_close(rest.logits, full[:, 8:], atol=1e-5, rtol=0)
    step = model(ids[:, :11], use_cache=True)
    last = model(ids[:, 11:], cache=step.cache, use_cache=True)
    torch.testing.assert_close(last.logits[:, 0], full[:, 11], atol=1e-5, rtol=0)


def test_the_pre_5_24_cache_name_still_works() -> None:
    model = tiny_model()
    ids = random_ids(length=12)
    full = model(ids, use_cache=False).logits
    prefix = model(ids[:, :8], use_cache=True)
    with pytest.warns(FutureWarning, match="past_key_values"):
        rest = model(ids[:, 8:], past_key_values=prefix.cache, use_cache=True)
    torch.testing.assert_close(rest.logits, full[:, 8:], atol=1e-5, rtol=0)


def test_greedy_generate_with_cache_equals_a_loop_without() -> None:
    model = tiny_model()
    ids = random_ids(length=5)
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10)
    assert torch.equal(generated, greedy_without_cache(model, ids, 10))


def test_left_padded_batch_generates_as_each_prompt_alone() -> None:
    model = tiny_model()
    long_prompt, short_prompt = (
        random_ids(batch=1, length=6),
        random_ids(batch=1, length=3) % 99 + 1,
    )
    batch = torch.cat([long_prompt, F.pad(short_prompt, (3, 0), value=0)])
    attention_mask = torch.tensor([[1] * 6, [0] * 3 + [1] * 3])
    generated = model.generate(batch, attention_mask=attention_mask, max_new_tokens=6)
    for row, prompt in ((0, long_prompt), (1, short_prompt)):
        alone = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6)
        assert torch.equal(generated[row, -6:], alone[0, -6:])


def test_sampling_is_reproducible_with_a_seed() -> None:
    model = tiny_model()
    ids = random_ids(batch=1, length=4)
    options = dict(attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=True)
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(model.generate(ids, temperature=2.0, top_k=50, top_p=0.95, **options))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_loss_shifts_labels_and_ignores_minus_100() -> None:
    model = tiny_model(label_smoothing=0.1)
    ids = random_ids()
    labels = ids.clone()
    labels[:, -3:] = -100
    output = model(ids, labels=labels)
    expected = F.cross_entropy(
        output.logits[:, :-4].reshape(-1, 100), ids[:, 1:-3].reshape(-1), label_smoothing=0.1
    )
    torch.testing.assert_close(output.loss, expected)


def test_residual_projections_get_the_scaled_gpt2_init() -> None:
    model = tiny_model(
        hidden_size=256, intermediate_size=1024, num_hidden_layers=8, initializer_range=0.02
    )
    layer = model.gpt.layers[0]
    scaled = 0.02 / math.sqrt(2 * 8)
    assert abs(layer.attention.out.weight.std().item() - scaled) < 0.1 * scaled
    assert abs(layer.feed_forward.down.weight.std().item() - scaled) < 0.1 * scaled
    assert abs(layer.attention.qkv.weight.std().item() - 0.02) < 0.002


def test_hidden_size_must_divide_into_heads() -> None:
    with pytest.raises(ConfigError, match="num_attention_heads"):
        tiny_config(hidden_size=30)


@pytest.mark.parametrize("preset", ["tiny", "mini", "small", "base"])
def test_presets_are_valid_configs(preset: str) -> None:
    settings = yaml.safe_load((CONFIGS / f"gpt-{preset}.yaml").read_text())
    assert "vocab_size" not in settings
    config = EgbertGPTConfig(vocab_size=1000, **settings)
    expected = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "base": (12, 768)}[preset]
    assert (config.num_hidden_layers, config.hidden_size) == expected
    assert config.intermediate_size == 4 * config.hidden_size


def test_text_generation_pipeline_runs_on_a_saved_model(tiny_gpt2_dir: Path, tmp_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    model = tiny_model(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path))
    result = generator("Hello world", max_new_tokens=5, do_sample=False)
    assert result[0]["generated_text"].startswith("Hello world")


def loss_and_gradients(model, ids, labels, **forward) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    output = model(ids, labels=labels, **forward)
    output.loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    return output, gradients


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_training_loss_without_logits_equals_the_dense_loss_and_gradients(label_smoothing) -> None:
    model = tiny_model(label_smoothing=label_smoothing).train()  # dropout 0: deterministic
    ids = random_ids(batch=3, length=12)
    labels = ids.clone()
    labels[0, 4:7] = -100
    labels[2, -2:] = -100
    chunked, chunked_grads = loss_and_gradients(model, ids, labels)
    model.config.logits_in_training = True
    dense, dense_grads = loss_and_gradients(model, ids, labels)
    assert chunked.logits is None and dense.logits is not None
    torch.testing.assert_close(chunked.loss, dense.loss, atol=1e-5, rtol=0)
    for name, gradient in dense_grads.items():
        torch.testing.assert_close(chunked_grads[name], gradient, atol=1e-5, rtol=1e-5, msg=name)


def test_training_loss_without_logits_follows_bf16_autocast() -> None:
    model = tiny_model().train()
    ids = random_ids(batch=3, length=12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked, chunked_grads = loss_and_gradients(model, ids, ids)
        model.config.logits_in_training = True
        dense, dense_grads = loss_and_gradients(model, ids, ids)
    torch.testing.assert_close(chunked.loss, dense.loss, atol=1e-3, rtol=0)
    for name, gradient in dense_grads.items():
        torch.testing.assert_close(chunked_grads[name], gradient, atol=2e-3, rtol=2e-2, msg=name)


def test_eval_and_no_grad_forwards_keep_their_logits() -> None:
    model = tiny_model()
    ids = random_ids()
    assert model(ids, labels=ids).logits is not None  # eval mode
    with torch.no_grad():
        assert model.train()(ids, labels=ids).logits is not None


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
