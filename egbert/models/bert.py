"""A BERT-like encoder as a Hugging Face model: config, encoder, MLM+NSP pretraining, masked LM.

Devlin et al. 2019: token + position + segment embeddings, a stack of post-LN transformer blocks
with bidirectional self-attention, a tanh pooler over [CLS], a masked-LM head tied to the input
embeddings and a next-sentence-prediction head over the pooled [CLS]. Options beyond BERT: fixed
sinusoidal positions, pre-LN blocks, MLM logits computed only where there is a label, heads
that start out attending to fixed neighbours (local_attention_init), and ELECTRA's pretraining
(Clark et al. 2020, replaced token detection): a small masked-LM generator fills the masked
positions with its samples and the encoder learns, at every position, whether the token is the
original one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling, MaskedLMOutput
from transformers.utils import ModelOutput

from .kernels import chunked_lm_loss_applies, linear_cross_entropy, sample_tokens
from .layers import (
    ACTIVATIONS,
    Embeddings,
    auto_map,
    check_sequence_length,
    check_transformer_config,
    init_local_attention,
    init_transformer_weights,
    norm_for,
    rotary_embedding,
    self_attention_mask,
    training_flops_per_token,
    transformer_block,
)

try:
    from egbert.errors import ConfigError
except ImportError:  # a saved model folder's copy of this file, used where egbert is not installed
    ConfigError = ValueError


class EgbertBertConfig(PretrainedConfig):
    model_type = "egbert-bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    position_embedding_type: str = "learned"  # or "sinusoidal", or "rotary" (RoPE)
    rope_theta: float = 10000.0  # rotary: the base of the rotation frequencies (RoFormer, Llama)
    pre_layernorm: bool = False  # True: LayerNorm before each sublayer, plus one at the end
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    sparse_mlm_logits: bool = False  # MLM logits only where labels != -100
    # With sparse_mlm_logits, a training forward (model.train(), gradients on) with labels computes
    # its MLM loss chunk by chunk without the logits and returns none (kernels.py); False
    # computes them and F.cross_entropy.
    chunked_lm_loss: bool = True
    local_attention_init: bool = False  # start each head on a fixed neighbour (layers.py)
    label_smoothing: float = 0.0
    tie_word_embeddings: bool = True
    # Replaced token detection only (EgbertBertForReplacedTokenDetection): the generator's width
    # and heads as a share of the encoder's (ELECTRA found 1/4 to 1/2 best), and the weight of
    # the detection loss next to the generator's MLM loss (ELECTRA's lambda)
    generator_size_ratio: float = 0.25
    rtd_loss_weight: float = 50.0
    # Architecture options beyond BERT, all off by default, named as transformers' Llama and
    # ModernBERT configs name them (docs/models.md, "Architecture options")
    gated_mlp: bool = False  # GLU feed-forward: GeGLU with gelu, SwiGLU with hidden_act="silu"
    norm_type: str = "layernorm"  # or "rmsnorm": every norm of the model
    norm_bias: bool = True  # False: LayerNorms without a bias
    qk_norm: bool = False  # a norm over head_dim on each head's queries and keys
    attention_bias: bool = True  # biases of the qkv and output projections
    mlp_bias: bool = True  # biases of the feed-forward's up and down projections
    # RealFormer (He et al. 2020): each layer's attention adds the raw scores of the layers below
    residual_attention: bool = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        check_transformer_config(self)
        if not 0 < self.generator_size_ratio <= 1:
            raise ConfigError(
                f"EgbertBertConfig: generator_size_ratio must be in (0, 1], got "
                f"{self.generator_size_ratio}; ELECTRA uses 0.25 to 0.5"
            )


class EgbertBertPreTrainedModel(PreTrainedModel):
    config_class = EgbertBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Embeddings", "TransformerBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        init_transformer_weights(module, self.config.initializer_range)
        if self.config.local_attention_init:
            head_dim = self.config.hidden_size // self.config.num_attention_heads
            init_local_attention(module, head_dim, self.config.initializer_range)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """transformers' save_pretrained, with config.json's auto_map (layers.auto_map)."""
        self.config.auto_map = auto_map(self, AUTO_CLASSES)
        super().save_pretrained(save_directory, *args, **kwargs)


class EgbertBertModel(EgbertBertPreTrainedModel):
    """The encoder: returns every position's hidden state and the pooled [CLS]."""

    def __init__(self, config: EgbertBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        norm = norm_for(config)
        self.embeddings = Embeddings(
            config.vocab_size,
            config.hidden_size,
            config.max_position_embeddings,
            config.position_embedding_type,
            config.type_vocab_size,
            norm(config.hidden_size),
            config.hidden_dropout_prob,
        )
        self.layers = nn.ModuleList(
            transformer_block(
                config,
                index,
                pre_layernorm=config.pre_layernorm,
                residual_attention=config.residual_attention,
            )
            for index in range(config.num_hidden_layers)
        )
        self.rotary = rotary_embedding(config)
        # pre-LN leaves the residual stream unnormalised: normalise the output once
        self.final_norm = norm(config.hidden_size) if config.pre_layernorm else None
        self.pooler = (
            nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutputWithPooling | tuple:
        output_hidden_states = _default(output_hidden_states, self.config.output_hidden_states)
        output_attentions = _default(output_attentions, self.config.output_attentions)
        check_sequence_length(input_ids.shape[1], self.config.max_position_embeddings)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        hidden = self.embeddings(input_ids, position_ids, token_type_ids)  # (batch, seq, hidden)
        mask = self_attention_mask(
            attention_mask, input_ids.shape[1], 0, is_causal=False, device=input_ids.device
        )
        rotary = self.rotary(position_ids) if self.rotary is not None else None
        all_hidden, all_attentions, scores = (hidden,), (), None
        for layer in self.layers:
            hidden, weights, scores = layer(
                hidden,
                mask,
                output_attentions=output_attentions,
                rotary=rotary,
                previous_scores=scores,
            )
            all_hidden += (hidden,)
            all_attentions += (weights,)
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
            all_hidden = all_hidden[:-1] + (hidden,)
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None
        output = BaseModelOutputWithPooling(
            last_hidden_state=hidden,
            pooler_output=pooled,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if _default(return_dict, self.config.return_dict) else output.to_tuple()


class MaskedLMHead(nn.Module):
    """BERT's MLM head: dense + GELU + norm, then a decoder tied to the input embeddings."""

    def __init__(self, config: EgbertBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.norm = norm_for(config)(config.hidden_size)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))

    def transform(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What the decoder reads: dense, activation, norm."""
        return self.norm(self.activation(self.dense(hidden_states)))


def masked_lm_logits_and_loss(
    head: MaskedLMHead,
    sequence_output: torch.Tensor,
    labels: torch.Tensor | None,
    config: EgbertBertConfig,
    label_smoothing: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """MLM logits and the cross-entropy over positions whose label is not -100.

    With config.sparse_mlm_logits and labels, only the labelled positions go through the head
    (about 15% of them in BERT pretraining), so the logits are (labelled positions, vocab). When
    training (kernels.chunked_lm_loss_applies), the decoder and the loss go through
    linear_cross_entropy instead, which never holds the logits (no logits are returned then).
    """
    if labels is None:
        return head(sequence_output), None
    if config.sparse_mlm_logits:
        selected = labels != -100
        sequence_output, labels = sequence_output[selected], labels[selected]
        if chunked_lm_loss_applies(config, head.training):
            decoder = head.decoder
            loss = linear_cross_entropy(
                head.transform(sequence_output),
                decoder.weight,
                labels,
                decoder.bias,
                label_smoothing=label_smoothing,
            )
            return None, loss
    logits = head(sequence_output)
    loss = F.cross_entropy(
        logits.reshape(-1, config.vocab_size),
        labels.reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )
    return logits, loss


class EgbertBertWithMaskedLMHead(EgbertBertPreTrainedModel):
    """What bert's two masked-LM models share (ForPreTraining adds NSP over the pooled [CLS],
    ForMaskedLM is the MLM alone): the encoder, the MLM head tied to its input embeddings, their
    accessors and FLOP count, and the forward up to the MLM loss."""

    _tied_weights_keys = {"mlm_head.decoder.weight": "bert.embeddings.word_embeddings.weight"}

    def __init__(self, config: EgbertBertConfig, add_pooling_layer: bool):
        super().__init__(config)
        self.bert = EgbertBertModel(config, add_pooling_layer=add_pooling_layer)
        self.mlm_head = MaskedLMHead(config)

    def get_output_embeddings(self) -> nn.Linear:
        return self.mlm_head.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.mlm_head.decoder = value

    def flops_per_token(self, seq_len: int, mlm_probability: float = 0.15) -> float:
        """Training FLOPs per input token (layers.training_flops_per_token); with sparse MLM
        logits the softmax runs at the masked share of the tokens only."""
        predictions = mlm_probability if self.config.sparse_mlm_logits else 1.0
        layers = self.config.num_hidden_layers
        return training_flops_per_token(self, seq_len, predictions, layers)

    def encode_and_predict(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        labels: torch.Tensor | None,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
        label_smoothing: float | None,
    ) -> tuple[BaseModelOutputWithPooling, torch.Tensor | None, torch.Tensor | None]:
        """The encoder's output, the MLM logits and the MLM loss (with `label_smoothing`, None:
        the config's) of one forward."""
        encoded = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        if label_smoothing is None:
            label_smoothing = self.config.label_smoothing
        logits, loss = masked_lm_logits_and_loss(
            self.mlm_head, encoded.last_hidden_state, labels, self.config, label_smoothing
        )
        return encoded, logits, loss


@dataclass
class EgbertBertForPreTrainingOutput(ModelOutput):
    """loss = mlm_loss + nsp_loss (each part present only when its labels were given)."""

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class EgbertBertForPreTraining(EgbertBertWithMaskedLMHead):
    """BERT pretraining: masked LM over the tokens plus next-sentence prediction over [CLS]."""

    also_loads_as = ("AutoModelForMaskedLM",)  # its folder holds a whole masked LM: fill-mask

    def __init__(self, config: EgbertBertConfig):
        super().__init__(config, add_pooling_layer=True)
        self.nsp_head = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        label_smoothing: float | None = None,
    ) -> EgbertBertForPreTrainingOutput | tuple:
        """label_smoothing: of the MLM loss (None: config.label_smoothing); NSP's is unsmoothed."""
        encoded, prediction_logits, mlm_loss = self.encode_and_predict(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            labels,
            output_hidden_states,
            output_attentions,
            label_smoothing,
        )
        seq_relationship_logits = self.nsp_head(encoded.pooler_output)  # (batch, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(seq_relationship_logits, next_sentence_label.reshape(-1))
        losses = [loss for loss in (mlm_loss, nsp_loss) if loss is not None]
        output = EgbertBertForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )
        return output if _default(return_dict, self.config.return_dict) else output.to_tuple()


class EgbertBertForMaskedLM(EgbertBertWithMaskedLMHead):
    """The encoder with the masked-LM head alone (no pooler, no NSP), e.g. for fill-mask."""

    def __init__(self, config: EgbertBertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        label_smoothing: float | None = None,
    ) -> MaskedLMOutput | tuple:
        """label_smoothing: of the MLM loss (None: config.label_smoothing)."""
        encoded, logits, loss = self.encode_and_predict(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            labels,
            output_hidden_states,
            output_attentions,
            label_smoothing,
        )
        output = MaskedLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )
        return output if _default(return_dict, self.config.return_dict) else output.to_tuple()


def generator_config(config: EgbertBertConfig) -> EgbertBertConfig:
    """Replaced token detection's generator: the encoder's config with generator_size_ratio of
    its heads (of the same size), so of its width and feed-forward size too."""
    head_size = config.hidden_size // config.num_attention_heads
    heads = max(1, round(config.num_attention_heads * config.generator_size_ratio))
    scale = heads / config.num_attention_heads
    return EgbertBertConfig.from_dict(
        config.to_dict()
        | {
            "hidden_size": heads * head_size,
            "num_attention_heads": heads,
            "intermediate_size": max(1, round(config.intermediate_size * scale)),
        }
    )


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation, then one logit per position."""

    def __init__(self, config: EgbertBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, seq, hidden) -> (batch, seq) logits of "this token was replaced"."""
        return self.prediction(self.activation(self.dense(hidden_states))).squeeze(-1)


@dataclass
class EgbertBertForReplacedTokenDetectionOutput(ModelOutput):
    """loss = generator_loss + rtd_loss_weight * rtd_loss; `replaced` is the detection target
    (where the generator's sample differs from the original token)."""

    loss: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    rtd_loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    replaced: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class EgbertBertForReplacedTokenDetection(EgbertBertPreTrainedModel):
    """ELECTRA's pretraining: a small masked-LM generator (generator_config) predicts the masked
    positions, its samples take their place, and the encoder tells apart, at every real position,
    the original tokens from the replaced ones. Learning from every position instead of the
    masked share makes it more sample-efficient than MLM. Fine-tuning reads the encoder (`bert.`);
    the generator and the detection head are for pretraining only."""

    _tied_weights_keys = {
        "generator.mlm_head.decoder.weight": "generator.bert.embeddings.word_embeddings.weight"
    }

    def __init__(self, config: EgbertBertConfig):
        super().__init__(config)
        self.bert = EgbertBertModel(config, add_pooling_layer=False)
        self.rtd_head = ReplacedTokenHead(config)
        self.generator = EgbertBertForMaskedLM(generator_config(config))
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        label_smoothing: float | None = None,
    ) -> EgbertBertForReplacedTokenDetectionOutput | tuple:
        """With MLM `labels` (the collator's masks), the generator fills the masked positions
        first and the losses are computed; without, the encoder reads `input_ids` as they are.
        label_smoothing: of the generator's MLM loss (None: config.label_smoothing)."""
        corrupted, replaced, generator_loss = input_ids, None, None
        if labels is not None:
            if label_smoothing is None:
                label_smoothing = self.config.label_smoothing
            corrupted, replaced, generator_loss = self.replace_masked_tokens(
                input_ids, attention_mask, token_type_ids, position_ids, labels, label_smoothing
            )
        encoded = self.bert(
            corrupted,
            attention_mask,
            token_type_ids,
            position_ids,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        logits = self.rtd_head(encoded.last_hidden_state)  # (batch, seq)
        loss = rtd_loss = None
        if replaced is not None:
            real = torch.ones_like(replaced) if attention_mask is None else attention_mask.bool()
            rtd_loss = F.binary_cross_entropy_with_logits(
                logits[real].float(), replaced[real].float()
            )
            loss = generator_loss + self.config.rtd_loss_weight * rtd_loss
        output = EgbertBertForReplacedTokenDetectionOutput(
            loss=loss,
            generator_loss=generator_loss,
            rtd_loss=rtd_loss,
            logits=logits,
            replaced=replaced,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )
        return output if _default(return_dict, self.config.return_dict) else output.to_tuple()

    def replace_masked_tokens(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        labels: torch.Tensor,
        label_smoothing: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The original tokens with each labelled position replaced by a sample of the
        generator's prediction there, where that sample differs from the original (both
        (batch, seq)), and the generator's MLM loss."""
        selected = labels != -100
        generator = self.generator
        hidden = generator.bert(input_ids, attention_mask, token_type_ids, position_ids)[0]
        logits = generator.mlm_head(hidden[selected]).float()  # (masked positions, vocab)
        generator_loss = F.cross_entropy(logits, labels[selected], label_smoothing=label_smoothing)
        samples = sample_tokens(logits.detach())
        original = torch.where(selected, labels, input_ids)
        corrupted = original.masked_scatter(selected, samples)
        return corrupted, corrupted != original, generator_loss


def _default(value: bool | None, config_value: bool | None) -> bool:
    return bool(config_value) if value is None else value


# The Auto classes bert's classes load through: egbert/models/__init__.py registers them, and a
# saved folder's config.json names those it loads as (layers.auto_map)
AUTO_CLASSES = {
    "AutoConfig": EgbertBertConfig,
    "AutoModel": EgbertBertModel,
    "AutoModelForPreTraining": EgbertBertForPreTraining,
    "AutoModelForMaskedLM": EgbertBertForMaskedLM,
}
