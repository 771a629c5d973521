"""ELMo-like bidirectional LSTM language model (Peters et al., 2018) as a Hugging Face model.

Tokens come from the shared tokenizer (no character CNN). A forward and a backward stack of LSTMs
with projection read the sentence left-to-right and right-to-left; one softmax, tied to the token
embedding, predicts the next token from the forward states and the previous token from the backward
states. Every layer's output is the concatenation [forward; backward], layer 0 being the token
embedding duplicated, so that downstream heads can mix layers as ELMo does.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from .kernels import Dropout, chunked_lm_loss_applies, linear_cross_entropy
from .layers import auto_map, training_flops_per_token

# torch tries oneDNN for every LSTM on a CPU and, as oneDNN has no LSTM with projections (ELMo's
# design), says so once per process and runs its own kernel: nothing to change on egbert's side.
warnings.filterwarnings(
    "ignore", message="LSTM with projections is not supported with oneDNN", category=UserWarning
)


class EgbertElmoConfig(PretrainedConfig):
    """Sizes of the biLM. `hidden_size` is both the token embedding size and the size each LSTM
    layer projects its `cell_size` state down to, so every layer's input and output have one width
    and residual connections need no extra projection."""

    model_type = "egbert-elmo"

    vocab_size: int = 30522
    hidden_size: int = 512
    cell_size: int = 2048
    num_hidden_layers: int = 2
    hidden_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    label_smoothing: float = 0.0
    tie_word_embeddings: bool = True
    # A training forward (model.train(), gradients on) with labels computes its loss chunk by chunk
    # without the (tokens, vocab) logits and returns None for them (kernels.py); False computes
    # the logits and F.cross_entropy.
    chunked_lm_loss: bool = True


@dataclass
class EgbertElmoBidirectionalLMOutput(ModelOutput):
    """Loss of the biLM (mean of both directions), each direction's loss and logits, and the
    per-layer [forward; backward] hidden states when asked for."""

    loss: torch.FloatTensor | None = None
    forward_loss: torch.FloatTensor | None = None
    backward_loss: torch.FloatTensor | None = None
    forward_logits: torch.FloatTensor | None = None
    backward_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


def sequence_lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Number of real tokens per sequence, padding being on the right."""
    if attention_mask is None:
        return input_ids.new_full((input_ids.size(0),), input_ids.size(1))
    return attention_mask.sum(dim=1)


def reversal_index(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Positions that reverse each sequence within its own length and leave its padding in place.

    Reversing the whole padded row would put the padding first, so the backward LSTM would read
    padding before the real tokens. The permutation is its own inverse: applying it twice restores
    the original order.
    """
    positions = torch.arange(seq_len, device=lengths.device).unsqueeze(0)  # (1, seq)
    lengths = lengths.unsqueeze(1)  # (batch, 1)
    return torch.where(positions < lengths, lengths - 1 - positions, positions)  # (batch, seq)


def permute_positions(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """states[b, index[b, t]] for every batch row b and position t."""
    return states.gather(1, index.unsqueeze(-1).expand_as(states))


class ElmoLstmStack(GradientCheckpointingLayer):
    """One direction of the biLM: LSTM layers with projection, reading left to right.

    As in ELMo, layers from the second on add their input to their output (a residual
    connection); the first layer's output stays free of the context-independent embedding.
    With gradient checkpointing the stack is recomputed in the backward pass: its layers'
    outputs are kept (the model returns them), the LSTMs' gates and cell states are not.
    """

    def __init__(self, config: EgbertElmoConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.LSTM(
                config.hidden_size, config.cell_size, proj_size=config.hidden_size, batch_first=True
            )
            for _ in range(config.num_hidden_layers)
        )
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, embeddings: torch.Tensor) -> list[torch.Tensor]:
        """(batch, seq, hidden) -> one (batch, seq, hidden) output per layer."""
        outputs = []
        states = embeddings
        for index, lstm in enumerate(self.layers):
            layer_output, _ = lstm(self.dropout(states))
            if index > 0:
                layer_output = layer_output + states
            outputs.append(layer_output)
            states = layer_output
        return outputs


class EgbertElmoPreTrainedModel(PreTrainedModel):
    config_class = EgbertElmoConfig
    base_model_prefix = "elmo"
    supports_gradient_checkpointing = True
    main_input_name = "input_ids"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, nn.LSTM):
            # A forget-gate bias of 1 keeps the cell memory flowing early in training
            # (Jozefowicz et al., 2015). PyTorch orders the gates input, forget, cell, output.
            for name, bias in module.named_parameters():
                if name.startswith("bias_ih") and not getattr(bias, "_is_hf_initialized", False):
                    bias[module.hidden_size : 2 * module.hidden_size].fill_(1.0)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """transformers' save_pretrained, with config.json's auto_map (layers.auto_map)."""
        self.config.auto_map = auto_map(self, AUTO_CLASSES)
        super().save_pretrained(save_directory, *args, **kwargs)


class EgbertElmoModel(EgbertElmoPreTrainedModel):
    """Token embedding and the forward and backward LSTM stacks; returns [forward; backward]."""

    def __init__(self, config: EgbertElmoConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.forward_lstm = ElmoLstmStack(config)
        self.backward_lstm = ElmoLstmStack(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutput | tuple:
        """Right padding only (attention_mask 1 for real tokens, then 0s). `token_type_ids` is
        accepted so that `model(**tokenizer(text))` works; ELMo has no segment embeddings."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if return_dict is None:
            return_dict = self.config.return_dict

        embeddings = self.embed_tokens(input_ids)  # (batch, seq, hidden)
        forward_layers = self.forward_lstm(embeddings)
        reversal = reversal_index(sequence_lengths(input_ids, attention_mask), input_ids.size(1))
        backward_layers = [
            permute_positions(layer, reversal)
            for layer in self.backward_lstm(permute_positions(embeddings, reversal))
        ]

        hidden_states = [torch.cat([embeddings, embeddings], dim=-1)]
        hidden_states += [
            torch.cat([forward, backward], dim=-1)  # (batch, seq, 2 * hidden)
            for forward, backward in zip(forward_layers, backward_layers, strict=True)
        ]
        output = BaseModelOutput(
            last_hidden_state=hidden_states[-1],
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
        )
        return output if return_dict else output.to_tuple()


class EgbertElmoForBidirectionalLM(EgbertElmoPreTrainedModel):
    """The biLM objective: the forward states predict the next token and the backward states the
    previous one, through one softmax tied to the token embedding."""

    _tied_weights_keys = {"lm_head.weight": "elmo.embed_tokens.weight"}

    def __init__(self, config: EgbertElmoConfig) -> None:
        super().__init__(config)
        self.elmo = EgbertElmoModel(config)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per input token (layers.training_flops_per_token): the LSTMs' weights
        and the softmax of both directions; no attention."""
        return training_flops_per_token(self, seq_len, 2.0, attention_layers=0)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        label_smoothing: float | None = None,
    ) -> EgbertElmoBidirectionalLMOutput | tuple:
        """`labels` are the input ids themselves (-100 to ignore a position); the model shifts
        them each way. Padding (attention_mask 0) is never a target. A training forward with
        labels returns no logits unless config.chunked_lm_loss is off. label_smoothing: of the
        loss (None: config.label_smoothing)."""
        if return_dict is None:
            return_dict = self.config.return_dict
        if label_smoothing is None:
            label_smoothing = self.config.label_smoothing
        outputs = self.elmo(
            input_ids,
            attention_mask=attention_mask,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        forward_states, backward_states = outputs.last_hidden_state.chunk(2, dim=-1)
        forward_states, backward_states = (
            self.dropout(forward_states),
            self.dropout(backward_states),
        )

        forward_logits = backward_logits = loss = forward_loss = backward_loss = None
        if labels is not None:
            next_tokens, previous_tokens = bidirectional_targets(labels, attention_mask)
        if labels is not None and chunked_lm_loss_applies(self.config, self.training):
            forward_loss = self._chunked_token_loss(forward_states, next_tokens, label_smoothing)
            backward_loss = self._chunked_token_loss(
                backward_states, previous_tokens, label_smoothing
            )
        else:
            forward_logits = self.lm_head(forward_states)  # (batch, seq, vocab)
            backward_logits = self.lm_head(backward_states)
            if labels is not None:
                forward_loss = self._token_loss(forward_logits, next_tokens, label_smoothing)
                backward_loss = self._token_loss(backward_logits, previous_tokens, label_smoothing)
        if labels is not None:
            loss = (forward_loss + backward_loss) / 2

        output = EgbertElmoBidirectionalLMOutput(
            loss=loss,
            forward_loss=forward_loss,
            backward_loss=backward_loss,
            forward_logits=forward_logits,
            backward_logits=backward_logits,
            hidden_states=outputs.hidden_states,
        )
        return output if return_dict else output.to_tuple()

    def _token_loss(
        self, logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float
    ) -> torch.Tensor:
        return F.cross_entropy(
            logits.flatten(0, 1),
            targets.flatten(),
            ignore_index=-100,
            label_smoothing=label_smoothing,
        )

    def _chunked_token_loss(
        self, states: torch.Tensor, targets: torch.Tensor, label_smoothing: float
    ) -> torch.Tensor:
        return linear_cross_entropy(
            states,
            self.lm_head.weight,
            targets,
            bias=self.lm_head.bias,
            label_smoothing=label_smoothing,
        )


def bidirectional_targets(
    labels: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What each position predicts: the next token in the forward LM, the previous one in the
    backward LM; each (batch, seq), -100 where there is nothing to predict.

    Shifting the labels rather than the logits keeps the (batch, seq, vocab) logits uncopied.
    """
    next_tokens, previous_tokens = labels[:, 1:], labels[:, :-1]
    if attention_mask is not None:
        # A pair counts only when both the predicting position and its target are real:
        # the backward state at the first pad would otherwise predict the last token.
        real_pairs = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()
        next_tokens = next_tokens.masked_fill(~real_pairs, -100)
        previous_tokens = previous_tokens.masked_fill(~real_pairs, -100)
    return F.pad(next_tokens, (0, 1), value=-100), F.pad(previous_tokens, (1, 0), value=-100)


# The Auto classes elmo's classes load through: egbert/models/__init__.py registers them, and a
# saved folder's config.json names those it loads as (layers.auto_map)
AUTO_CLASSES = {
    "AutoConfig": EgbertElmoConfig,
    "AutoModel": EgbertElmoModel,
    "AutoModelForPreTraining": EgbertElmoForBidirectionalLM,
}
