"""The egbert GPT decoder: saving/loading, padding, KV cache, generate(), loss, text-generation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import torch_threads
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, pipeline

import egbert.models.gpt as gpt_module
from egbert.errors import ConfigError
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM, EgbertGPTModel

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


def test_inputs_embeds_stand_for_input_ids() -> None:
    """The token vectors given as inputs_embeds (as PEFT and transformers' callers pass them)
    give the logits of their ids; both or neither is refused."""
    model = tiny_model().eval()
    ids = random_ids()
    with torch.no_grad():
        by_ids = model(input_ids=ids).logits
        vectors = model.get_input_embeddings()(ids)
        torch.testing.assert_close(model(inputs_embeds=vectors).logits, by_ids)
        assert not torch.allclose(model(inputs_embeds=vectors.flip(1)).logits, by_ids)
    for given in ({"input_ids": ids, "inputs_embeds": vectors}, {}):
        with pytest.raises(ValueError, match="give one of input_ids and inputs_embeds"):
            model(**given)


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


def wide_and_narrow_weights(model: EgbertGPTForCausalLM) -> tuple[list, list]:
    """The Linear weights whose output is wider than their input, and the others."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    wide = [m.weight for m in linears if m.out_features > m.in_features]
    return wide, [m.weight for m in linears if m.out_features <= m.in_features]


def generate_rows(model: EgbertGPTForCausalLM, rows: int) -> torch.Tensor:
    ids = random_ids(batch=rows, length=4).to(model.device)
    # one new token: the prompt's step alone, so the layout is set by the first step
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1)


# On the CPU by nature: the decoding layout is a CPU one (cuBLAS needs none)
def test_one_row_decoding_stores_the_wide_weights_transposed_until_training(tmp_path) -> None:
    model = tiny_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with torch.inference_mode():
        generate_rows(model, rows=1)
        generate_rows(model, rows=1)  # already laid out: stays so
    wide, narrow = wide_and_narrow_weights(model)
    assert len(wide) == 2 * 2 + 1  # each layer's qkv and up, and the LM head
    assert all(w.t().is_contiguous() and not w.is_contiguous() for w in wide)
    assert all(w.is_contiguous() for w in narrow)
    assert model.lm_head.weight is model.gpt.embeddings.word_embeddings.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    # generated under inference_mode, the weights are still ones a backward can use
    model(random_ids(), labels=random_ids()).loss.backward()
    model.save_pretrained(tmp_path)
    reloaded = EgbertGPTForCausalLM.from_pretrained(tmp_path)
    assert all(w.is_contiguous() for w in sum(wide_and_narrow_weights(reloaded), []))
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, before[name]), name

    generate_rows(model, rows=2)
    assert all(w.is_contiguous() for w in wide_and_narrow_weights(model)[0])
    generate_rows(model, rows=1)
    model.train()
    assert all(w.is_contiguous() for w in wide_and_narrow_weights(model)[0])


def test_one_row_decoding_keeps_bf16_weights_row_major() -> None:
    model = tiny_model().to(torch.bfloat16)
    generate_rows(model, rows=1)
    assert all(w.is_contiguous() for w in wide_and_narrow_weights(model)[0])


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("sample", [False, True])
def test_the_cpu_decoding_paths_generate_the_tokens_the_plain_ones_do(
    monkeypatch, rows: int, sample: bool
) -> None:
    model = tiny_model(vocab_size=1000, hidden_size=64, intermediate_size=256)
    ids = random_ids(batch=rows, length=4)
    options = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=sample)
    with torch_threads(2):
        torch.manual_seed(3)
        fast = model.generate(ids, **options)
        assert model.lm_head.weight.is_contiguous() == (rows > 1)
        model.train().eval()
        monkeypatch.setattr(gpt_module, "lay_out_for_decoding", lambda model, rows: None)
        monkeypatch.setattr(gpt_module.LMHead, "forward", torch.nn.Linear.forward)
        torch.manual_seed(3)
        assert torch.equal(model.generate(ids, **options), fast)


def matrix_products(head: gpt_module.LMHead, hidden: torch.Tensor) -> list[list[int]]:
    """The operand shapes of each aten::mm the head's forward runs."""
    with torch.profiler.profile(record_shapes=True) as profile:
        head(hidden)
    return [event.input_shapes for event in profile.events() if event.name == "aten::mm"]


# On the CPU by nature: the product's order is a CPU (MKL) one
def test_the_lm_head_puts_its_weight_first_for_2_to_64_rows_without_gradients() -> None:
    head = tiny_model(vocab_size=1000).lm_head  # hidden size 32
    for rows in (1, 2, 64, 65):
        hidden = torch.randn(rows, 1, 32)
        with torch_threads(2), torch.no_grad():
            logits = head(hidden)
            weight_first = [[1000, 32], [32, rows]] in matrix_products(head, hidden)
        assert weight_first == (2 <= rows <= 64), rows
        assert logits.shape == (rows, 1, 1000) and logits.is_contiguous()
        torch.testing.assert_close(logits, F.linear(hidden, head.weight), rtol=1e-5, atol=1e-5)
    hidden = torch.randn(2, 3, 32)  # 6 rows in a (batch, seq) shape
    with torch_threads(2), torch.no_grad():
        logits = head(hidden)
        assert [[1000, 32], [32, 6]] in matrix_products(head, hidden)
    torch.testing.assert_close(logits, F.linear(hidden, head.weight), rtol=1e-5, atol=1e-5)
    hidden = torch.randn(8, 1, 32)
    with torch_threads(2):
        assert [[1000, 32], [32, 8]] not in matrix_products(head, hidden)  # gradients on
        with torch.no_grad():
            assert [[1000, 32], [32, 8]] not in matrix_products(head.bfloat16(), hidden.bfloat16())
    with torch.no_grad():
        assert [[1000, 32], [32, 8]] not in matrix_products(head.float(), hidden)  # one thread
    with torch_threads(2), torch.no_grad():  # compiled: one graph, nn.Linear's product
        torch._dynamo.reset()
        compiled = torch.compile(head, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(hidden), F.linear(hidden, head.weight))
    biased = gpt_module.LMHead(32, 1000, bias=True)
    head.weight.data = head.weight.data.t().contiguous().t()  # one row's decoding layout
    with torch_threads(2), torch.no_grad():
        assert [[1000, 32], [32, 8]] not in matrix_products(head, hidden)
        torch.testing.assert_close(biased(hidden), F.linear(hidden, biased.weight, biased.bias))


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


def test_the_forwards_label_smoothing_overrides_the_configs() -> None:
    model = tiny_model(label_smoothing=0.1).eval()
    ids = random_ids()
    logits = model(ids).logits[:, :-1].reshape(-1, 100)
    for smoothing in (0.0, 0.3):
        loss = model(ids, labels=ids, label_smoothing=smoothing).loss
        expected = F.cross_entropy(logits, ids[:, 1:].reshape(-1), label_smoothing=smoothing)
        torch.testing.assert_close(loss, expected)
    assert model.config.label_smoothing == 0.1


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
