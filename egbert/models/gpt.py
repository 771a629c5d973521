"""A GPT-like decoder as a Hugging Face model: config, decoder, causal LM with generate().

Radford et al. 2019 (GPT-2): token + learned position embeddings, a stack of pre-LN transformer
blocks with causal self-attention, a final LayerNorm and an LM head tied to the input embeddings.
GenerationMixin supplies generate() (greedy, sampling, top-k, top-p), fed by a KV cache.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from .kernels import chunked_lm_loss_applies, linear_cross_entropy
from .layers import (
    Embeddings,
    auto_map,
    check_sequence_length,
    check_transformer_config,
    init_transformer_weights,
    norm_for,
    rotary_embedding,
    self_attention_mask,
    training_flops_per_token,
    transformer_block,
)


class EgbertGPTConfig(PretrainedConfig):
    model_type = "egbert-gpt"

    vocab_size: int = 50257
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 1024
    position_embedding_type: str = "learned"  # or "sinusoidal", or "rotary" (RoPE)
    rope_theta: float = 10000.0  # rotary: the base of the rotation frequencies (RoFormer, Llama)
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    label_smoothing: float = 0.0
    use_cache: bool = True
    tie_word_embeddings: bool = True
    # A training forward (model.train(), gradients on) with labels computes its loss chunk by chunk
    # without the (tokens, vocab) logits and returns logits=None (kernels.py); False computes
    # the logits and F.cross_entropy.
    chunked_lm_loss: bool = True
    # Architecture options beyond GPT-2, all off by default, named as transformers' Llama and
    # ModernBERT configs name them (docs/models.md, "Architecture options")
    gated_mlp: bool = False  # GLU feed-forward: GeGLU with gelu, SwiGLU with hidden_act="silu"
    norm_type: str = "layernorm"  # or "rmsnorm": every norm of the model
    norm_bias: bool = True  # False: LayerNorms without a bias
    embedding_norm: bool = False  # a norm after the embeddings, before the first block
    qk_norm: bool = False  # a norm over head_dim on each head's queries and keys
    attention_bias: bool = True  # biases of the qkv and output projections
    mlp_bias: bool = True  # biases of the feed-forward's up and down projections

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        check_transformer_config(self)


class EgbertGPTPreTrainedModel(PreTrainedModel):
    config_class = EgbertGPTConfig
    base_model_prefix = "gpt"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransformerBlock"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        init_transformer_weights(module, self.config.initializer_range)
        if getattr(module, "writes_residual", False):
            # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2 * layers)
            # so the variance of the stream does not grow with depth
            std = self.config.initializer_range / math.sqrt(2 * self.config.num_hidden_layers)
            init.normal_(module.weight, mean=0.0, std=std)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """transformers' save_pretrained, with config.json's auto_map (layers.auto_map), from
        the row-major weights it can write (lay_out_for_decoding)."""
        self.config.auto_map = auto_map(self, AUTO_CLASSES)
        lay_out_for_decoding(self, rows=0)
        super().save_pretrained(save_directory, *args, **kwargs)


class EgbertGPTModel(EgbertGPTPreTrainedModel):
    """The decoder: causal pre-LN blocks and a final LayerNorm; keeps a KV cache when asked."""

    def __init__(self, config: EgbertGPTConfig):
        super().__init__(config)
        norm = norm_for(config)
        self.embeddings = Embeddings(
            config.vocab_size,
            config.hidden_size,
            config.max_position_embeddings,
            config.position_embedding_type,
            norm=norm(config.hidden_size) if config.embedding_norm else None,
            dropout=config.hidden_dropout_prob,
        )
        self.layers = nn.ModuleList(
            transformer_block(config, index, pre_layernorm=True, is_causal=True)
            for index in range(config.num_hidden_layers)
        )
        self.rotary = rotary_embedding(config)
        self.final_norm = norm(config.hidden_size)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    # transformers 5.24 renamed past_key_values to cache; callers of the old name still work
    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPast | tuple:
        """token_type_ids is accepted and ignored (GPT has no segments), so that the output of any
        egbert tokenizer can be passed in as **inputs. inputs_embeds (batch, seq, hidden): the
        token vectors in place of input_ids (give one of the two), as transformers' models take
        them (PEFT passes it, None)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give one of input_ids and inputs_embeds")
        output_hidden_states = _default(output_hidden_states, self.config.output_hidden_states)
        output_attentions = _default(output_attentions, self.config.output_attentions)
        # a cache is only worth building when decoding, not for a training step
        use_cache = _default(use_cache, self.config.use_cache and not self.training)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_length = cache.get_seq_length() if cache is not None else 0
        tokens = input_ids if input_ids is not None else inputs_embeds
        length, device = tokens.shape[1], tokens.device
        check_sequence_length(past_length + length, self.config.max_position_embeddings)
        if position_ids is None:
            position_ids = torch.arange(past_length, past_length + length, device=device)
            position_ids = position_ids[None, :]
        hidden = self.embeddings(input_ids, position_ids, inputs_embeds=inputs_embeds)
        mask = self_attention_mask(
            attention_mask, length, past_length, is_causal=True, device=device
        )
        rotary = self.rotary(position_ids) if self.rotary is not None else None
        all_hidden, all_attentions = (hidden,), ()
        for layer in self.layers:
            hidden, weights, _ = layer(
                hidden,
                mask,
                cache=cache if use_cache else None,
                output_attentions=output_attentions,
                rotary=rotary,
            )
            all_hidden += (hidden,)
            all_attentions += (weights,)
        hidden = self.final_norm(hidden)
        # as GPT-2 in transformers: the last hidden state is reported after the final LayerNorm
        all_hidden = all_hidden[:-1] + (hidden,)
        output = BaseModelOutputWithPast(
            last_hidden_state=hidden,
            cache=cache if use_cache else None,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if _default(return_dict, self.config.return_dict) else output.to_tuple()


class LMHead(nn.Linear):
    """The LM head: nn.Linear, its product computed as (weight @ hidden^T)^T for 2 to 64 rows
    without gradients in fp32 on a CPU with more than one thread. For so few rows MKL multiplies
    hidden by weight^T on one thread; the other way round it splits the vocabulary among the
    threads, about 2x faster on 2 cores at 8 rows (docs/performance.md, run E)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[:-1].numel()
        if not self.weight_first_pays(rows):
            return super().forward(hidden)
        logits = self.weight @ hidden.reshape(rows, self.in_features).T
        return logits.T.contiguous().view(*hidden.shape[:-1], self.out_features)

    def weight_first_pays(self, rows: int) -> bool:
        # compiled, a graph chooses its own kernels; with gradients, training keeps nn.Linear's
        if torch.compiler.is_compiling() or torch.is_grad_enabled():
            return False
        return (
            2 <= rows <= 64
            and self.bias is None
            and fp32_on_the_cpu(self.weight)
            and self.weight.is_contiguous()
            and torch.get_num_threads() > 1
        )


class EgbertGPTForCausalLM(EgbertGPTPreTrainedModel, GenerationMixin):
    """The decoder with a tied LM head: next-token loss for training, generate() for text."""

    _tied_weights_keys = {"lm_head.weight": "gpt.embeddings.word_embeddings.weight"}

    def __init__(self, config: EgbertGPTConfig):
        super().__init__(config)
        self.gpt = EgbertGPTModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per input token (layers.training_flops_per_token)."""
        return training_flops_per_token(self, seq_len, 1.0, self.config.num_hidden_layers)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, *args, **kwargs) -> dict:
        """GenerationMixin's; its first call (the prompt's, is_first_iteration) first lays the
        weights out for the number of rows decoded (lay_out_for_decoding)."""
        if kwargs.get("is_first_iteration"):
            lay_out_for_decoding(self, rows=input_ids.shape[0])
        return super().prepare_inputs_for_generation(input_ids, *args, **kwargs)

    def train(self, mode: bool = True) -> EgbertGPTForCausalLM:
        """nn.Module's, back in the row-major layout a training step is fastest in."""
        if mode:
            lay_out_for_decoding(self, rows=0)
        return super().train(mode)

    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        labels: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        label_smoothing: float | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> CausalLMOutputWithPast | tuple:
        """labels may simply be input_ids: they are shifted here; -100 marks positions to ignore.
        logits_to_keep > 0 computes logits for the last that many positions only (generate uses 1).
        A training forward with labels returns logits=None unless config.chunked_lm_loss is off.
        label_smoothing: of the loss (None: config.label_smoothing; the trainer passes its
        --label-smoothing when training and 0 when evaluating).
        """
        if label_smoothing is None:
            label_smoothing = self.config.label_smoothing
        decoded = self.gpt(
            input_ids,
            attention_mask,
            position_ids,
            cache,
            use_cache,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
            inputs_embeds=inputs_embeds,
        )
        hidden = decoded.last_hidden_state
        logits = loss = None
        if labels is not None:
            # position t predicts token t + 1, the last position nothing; shifting the labels
            # rather than the logits keeps the (batch, seq, vocab) logits uncopied
            next_tokens = F.pad(labels[:, 1:], (0, 1), value=-100)
        if labels is not None and chunked_lm_loss_applies(self.config, self.training):
            loss = linear_cross_entropy(
                hidden,
                self.lm_head.weight,
                next_tokens,
                label_smoothing=label_smoothing,
            )
        else:
            logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
            if labels is not None:
                loss = F.cross_entropy(
                    logits.flatten(0, 1),
                    next_tokens.flatten(),
                    ignore_index=-100,
                    label_smoothing=label_smoothing,
                )
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=decoded.cache,
            hidden_states=decoded.hidden_states,
            attentions=decoded.attentions,
        )
        return output if _default(return_dict, self.config.return_dict) else output.to_tuple()


def lay_out_for_decoding(model: nn.Module, rows: int) -> None:
    """Stores each nn.Linear weight whose output is wider than its input (the fused qkv, the
    feed-forward's up, the LM head with its tied embedding) transposed in memory while one row is
    decoded in fp32 on the CPU, and row-major otherwise. Values, shapes, the tie and what
    state_dict and save_pretrained write stay as they are: only the strides change.

    Why: decoding one row multiplies a vector by each weight, and on the CPU MKL does that up to
    2.4x faster when the weight's long side is contiguous (docs/performance.md, run E); with 8
    rows the row-major layout is as fast or faster, and training wants it too.
    """
    # normal tensors even under the caller's inference_mode, so the weights can still be trained
    with torch.inference_mode(False), torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear) or module.out_features <= module.in_features:
                continue
            weight = module.weight
            transposed = rows == 1 and fp32_on_the_cpu(weight)
            if transposed and weight.is_contiguous():
                weight.data = weight.data.t().contiguous().t()
            elif not transposed and not weight.is_contiguous():
                weight.data = weight.data.contiguous()


def fp32_on_the_cpu(weight: torch.Tensor) -> bool:
    """Where MKL multiplies the weight, the library both decoding paths are tuned for (bf16 goes
    through oneDNN, a GPU through cuBLAS: the plain layout and product there)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32


def _default(value: bool | None, config_value: bool | None) -> bool:
    return bool(config_value) if value is None else value


# The Auto classes gpt's classes load through: egbert/models/__init__.py registers them, and a
# saved folder's config.json names those it loads as (layers.auto_map)
AUTO_CLASSES = {
    "AutoConfig": EgbertGPTConfig,
    "AutoModel": EgbertGPTModel,
    "AutoModelForCausalLM": EgbertGPTForCausalLM,
}
