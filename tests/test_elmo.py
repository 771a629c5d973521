"""The ELMo-like biLM: padding invariance both ways, the direction of each loss, layer outputs,
saving and loading through the Auto classes, and that a few optimizer steps learn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

from egbert.models.elmo import (
    EgbertElmoConfig,
    EgbertElmoForBidirectionalLM,
    EgbertElmoModel,
)

CONFIGS = Path(__file__).resolve().parents[1] / "egbert" / "configs"
VOCAB = 50


def tiny_config(**overrides) -> EgbertElmoConfig:
    sizes = dict(vocab_size=VOCAB, hidden_size=16, cell_size=32, num_hidden_layers=2)
    return EgbertElmoConfig(**{**sizes, **overrides})


def tiny_lm(seed: int = 0, **overrides) -> EgbertElmoForBidirectionalLM:
    torch.manual_seed(seed)
    return EgbertElmoForBidirectionalLM(tiny_config(**overrides)).eval()


def right_padded(sequences: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch with random junk (not the pad id) in the padding, so any leak shows."""
    longest = max(len(sequence) for sequence in sequences)
    input_ids = torch.randint(1, VOCAB, (len(sequences), longest))
    attention_mask = torch.zeros_like(input_ids)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = sequence
        attention_mask[row, : len(sequence)] = 1
    return input_ids, attention_mask


def test_hidden_states_alone_equal_hidden_states_in_a_padded_batch():
    model = tiny_lm().elmo
    torch.manual_seed(1)
    short, long = torch.randint(1, VOCAB, (5,)), torch.randint(1, VOCAB, (9,))
    input_ids, attention_mask = right_padded([short, long])

    with torch.no_grad():
        alone = model(short[None], output_hidden_states=True).hidden_states
        batched = model(input_ids, attention_mask, output_hidden_states=True).hidden_states
        long_alone = model(long[None], output_hidden_states=True).hidden_states

    for layer_alone, layer_batched, layer_long in zip(alone, batched, long_alone, strict=True):
        torch.testing.assert_close(layer_batched[0, :5], layer_alone[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(layer_batched[1], layer_long[0], atol=1e-5, rtol=0)


def test_backward_states_depend_only_on_later_tokens():
    model = tiny_lm().elmo
    torch.manual_seed(2)
    input_ids = torch.randint(1, VOCAB, (1, 8))
    changed = input_ids.clone()
    changed[0, 5] = (input_ids[0, 5] % (VOCAB - 1)) + 1
    hidden = 16
    with torch.no_grad():
        before = model(input_ids).last_hidden_state
        after = model(changed).last_hidden_state
    forward_moved = (before[0, :, :hidden] - after[0, :, :hidden]).abs().amax(-1) > 1e-6
    backward_moved = (before[0, :, hidden:] - after[0, :, hidden:]).abs().amax(-1) > 1e-6
    assert forward_moved.tolist() == [False] * 5 + [True] * 3
    assert backward_moved.tolist() == [True] * 6 + [False] * 2


def test_forward_loss_predicts_next_and_backward_loss_previous_token():
    model = tiny_lm()
    torch.manual_seed(3)
    input_ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        out = model(input_ids, labels=input_ids)

    by_hand_forward = F.cross_entropy(
        out.forward_logits[:, :-1].reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1)
    )
    by_hand_backward = F.cross_entropy(
        out.backward_logits[:, 1:].reshape(-1, VOCAB), input_ids[:, :-1].reshape(-1)
    )
    torch.testing.assert_close(out.forward_loss, by_hand_forward)
    torch.testing.assert_close(out.backward_loss, by_hand_backward)
    torch.testing.assert_close(out.loss, (by_hand_forward + by_hand_backward) / 2)


def test_mirrored_weights_make_the_backward_lm_read_the_reversed_sentence():
    """With the backward stack a copy of the forward one, the backward LM on a reversed sentence
    is the forward LM on the original: same loss and mirrored logits, padding included."""
    model = tiny_lm()
    model.elmo.backward_lstm.load_state_dict(model.elmo.forward_lstm.state_dict())
    torch.manual_seed(4)
    sequences = [torch.randint(1, VOCAB, (length,)) for length in (4, 7)]
    input_ids, attention_mask = right_padded(sequences)
    reversed_ids, _ = right_padded([sequence.flip(0) for sequence in sequences])
    reversed_ids[attention_mask == 0] = input_ids[attention_mask == 0]

    with torch.no_grad():
        original = model(input_ids, attention_mask, labels=input_ids)
        mirrored = model(reversed_ids, attention_mask, labels=reversed_ids)

    torch.testing.assert_close(mirrored.backward_loss, original.forward_loss)
    torch.testing.assert_close(mirrored.forward_loss, original.backward_loss)
    for row, sequence in enumerate(sequences):
        length = len(sequence)
        torch.testing.assert_close(
            mirrored.backward_logits[row, :length], original.forward_logits[row, :length].flip(0)
        )


def test_padding_is_never_a_target_nor_a_predictor():
    """Padding after a sequence changes neither loss; in particular the backward state at the
    first pad position must not be asked to predict the last real token."""
    model = tiny_lm()
    torch.manual_seed(5)
    sequence = torch.randint(1, VOCAB, (6,))
    input_ids, attention_mask = right_padded([sequence, torch.randint(1, VOCAB, (9,))])
    with torch.no_grad():
        alone = model(sequence[None], labels=sequence[None])
        padded = model(input_ids[:1], attention_mask[:1], labels=input_ids[:1])
    torch.testing.assert_close(padded.forward_loss, alone.forward_loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded.backward_loss, alone.backward_loss, atol=1e-5, rtol=0)


def test_labels_of_minus_100_are_ignored_in_both_directions():
    model = tiny_lm()
    torch.manual_seed(5)
    sequence = torch.randint(1, VOCAB, (6,))
    labels = sequence.clone()
    labels[2] = -100
    with torch.no_grad():
        out = model(sequence[None], labels=labels[None])
    # Token 2 is the target of forward position 1 and of backward position 3.
    expected_forward = F.cross_entropy(out.forward_logits[0, [0, 2, 3, 4]], sequence[[1, 3, 4, 5]])
    expected_backward = F.cross_entropy(
        out.backward_logits[0, [1, 2, 4, 5]], sequence[[0, 1, 3, 4]]
    )
    torch.testing.assert_close(out.forward_loss, expected_forward)
    torch.testing.assert_close(out.backward_loss, expected_backward)


def test_label_smoothing_comes_from_the_config():
    torch.manual_seed(6)
    input_ids = torch.randint(1, VOCAB, (2, 6))
    peaked_bias = torch.randn(VOCAB) * 3  # a near-uniform softmax would hide the smoothing
    plain, smoothed = tiny_lm(), tiny_lm(label_smoothing=0.2)
    with torch.no_grad():
        plain.lm_head.bias.copy_(peaked_bias)
        smoothed.lm_head.bias.copy_(peaked_bias)
        out = smoothed(input_ids, labels=input_ids)
        plain_loss = plain(input_ids, labels=input_ids).forward_loss
    expected = F.cross_entropy(
        out.forward_logits[:, :-1].reshape(-1, VOCAB),
        input_ids[:, 1:].reshape(-1),
        label_smoothing=0.2,
    )
    torch.testing.assert_close(out.forward_loss, expected)
    assert abs(out.forward_loss - plain_loss) > 1e-2
    with torch.no_grad():  # the forward's label_smoothing overrides the config's
        unsmoothed = smoothed(input_ids, labels=input_ids, label_smoothing=0.0).forward_loss
    torch.testing.assert_close(unsmoothed, plain_loss)
    assert smoothed.config.label_smoothing == 0.2


def test_hidden_states_are_the_duplicated_embedding_then_one_entry_per_layer():
    model = tiny_lm(num_hidden_layers=3).elmo
    input_ids = torch.randint(1, VOCAB, (2, 6))
    with torch.no_grad():
        out = model(input_ids, output_hidden_states=True)
        embeddings = model.embed_tokens(input_ids)

    assert len(out.hidden_states) == 4
    assert all(states.shape == (2, 6, 32) for states in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[0], torch.cat([embeddings, embeddings], -1))
    torch.testing.assert_close(out.last_hidden_state, out.hidden_states[-1])
    assert model(input_ids).hidden_states is None
    assert isinstance(model(input_ids, return_dict=False), tuple)


def test_softmax_is_tied_to_the_embedding():
    model = tiny_lm()
    assert model.lm_head.weight is model.elmo.embed_tokens.weight
    assert model.get_output_embeddings() is model.lm_head


def test_save_and_load_through_the_auto_classes(tmp_path):
    model = tiny_lm()
    model.save_pretrained(tmp_path)
    input_ids = torch.randint(1, VOCAB, (2, 6))

    assert isinstance(AutoConfig.from_pretrained(tmp_path), EgbertElmoConfig)
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, EgbertElmoForBidirectionalLM)
    assert isinstance(base, EgbertElmoModel)
    assert reloaded.lm_head.weight is reloaded.elmo.embed_tokens.weight
    with torch.no_grad():
        expected = model(input_ids, labels=input_ids, output_hidden_states=True)
        torch.testing.assert_close(reloaded(input_ids, labels=input_ids).loss, expected.loss)
        torch.testing.assert_close(base(input_ids).last_hidden_state, expected.hidden_states[-1])


def test_a_few_adam_steps_on_a_repeated_corpus_lower_both_losses():
    model = tiny_lm(hidden_dropout_prob=0.0).train()
    torch.manual_seed(7)
    input_ids = torch.randint(1, VOCAB, (1, 12)).repeat(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = model(input_ids, labels=input_ids)
    for _ in range(40):
        out = model(input_ids, labels=input_ids)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    last = model(input_ids, labels=input_ids)
    assert last.forward_loss < 0.5 * first.forward_loss
    assert last.backward_loss < 0.5 * first.backward_loss


@pytest.mark.parametrize(
    ("preset", "hidden_size", "cell_size"),
    [("tiny", 128, 512), ("mini", 256, 1024), ("small", 512, 2048), ("base", 512, 4096)],
)
def test_presets_build_a_model(preset, hidden_size, cell_size):
    kwargs = yaml.safe_load((CONFIGS / f"elmo-{preset}.yaml").read_text())
    assert "vocab_size" not in kwargs
    config = EgbertElmoConfig(vocab_size=VOCAB, **kwargs)
    assert (config.hidden_size, config.cell_size, config.num_hidden_layers) == (
        hidden_size,
        cell_size,
        2,
    )
    model = EgbertElmoForBidirectionalLM(config)
    # Per direction and layer: 4 gates over [input; projected state] plus 2 biases, and the
    # projection; the softmax adds only its bias since its weight is the embedding.
    lstm = 4 * cell_size * (2 * hidden_size) + 2 * 4 * cell_size + cell_size * hidden_size
    expected = VOCAB * hidden_size + 2 * 2 * lstm + VOCAB
    assert model.num_parameters() == expected
