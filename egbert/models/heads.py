"""Sequence classification and regression heads over the hidden states of any egbert backbone.

One implementation, `EgbertSequenceClassifier`, serves BERT, GPT and ELMo; the three registered
classes only say which backbone to build and how that family sums a sentence up in one vector.
The head's options are plain config attributes (defaults in `HEAD_DEFAULTS`):

- `classifier_features`: "cls" (BERT's pooled [CLS]; GPT's last real token; ELMo's forward state
  at the last real token next to its backward state at the first token), "last4-concat" or
  "last4-sum" (the last four `hidden_states` entries, top layer first; all of them when the model
  has fewer), or "scalar-mix" (ELMo's softmax-weighted sum of every entry, times a learned gamma).
- `classifier_pool`: how the layer features turn tokens into one vector: "cls" (the family's
  summary position, as above) or "mean" (the mean over real tokens).
- `classifier_layer_norm`: bring each pooled layer to zero mean and unit variance (no learned
  scale) before the layers are combined, ELMo's option for biLM layers of very different scales.
- `freeze_backbone`: feature-based training; the backbone gets no gradient and no dropout.
- `classifier_dropout`: dropout before the output layer (None: the backbone's hidden dropout).

A regression head (one output, or `problem_type="regression"`) predicts standardized targets:
its raw output is multiplied by the config's `regression_target_std` and shifted by
`regression_target_mean` (`egbert finetune` sets both from the training labels; 1 and 0 when
absent). Started at zero mean and unit scale, a head trained at fine-tuning's small learning
rate no longer spends its first few hundred steps pulling its output towards the labels' mean:
with the mean already there, what it learns is the variation around it.

They can be given as keyword arguments too, as transformers users expect:
`EgbertBertForSequenceClassification.from_pretrained(pretrained_dir, num_labels=3,
classifier_features="last4-concat")` loads the pretrained encoder and stores the options in the
config it saves.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import SequenceClassifierOutput

from .bert import EgbertBertConfig, EgbertBertModel
from .elmo import EgbertElmoConfig, EgbertElmoModel
from .gpt import EgbertGPTConfig, EgbertGPTModel
from .kernels import Dropout
from .layers import auto_map

try:
    from egbert.errors import ConfigError
except ImportError:  # a saved model folder's copy of this file, used where egbert is not installed
    ConfigError = ValueError

HEAD_DEFAULTS: dict[str, Any] = {
    "classifier_features": "cls",
    "classifier_pool": "cls",
    "classifier_layer_norm": False,
    "freeze_backbone": False,
    "classifier_dropout": None,
    "regression_target_mean": 0.0,
    "regression_target_std": 1.0,
}
# Layer features and pools: one vocabulary for these heads, `egbert probe` (--features, --pool)
# and `egbert embed`, whose `combine` names how each feature joins its layers. "last4-...": the
# last LAST_LAYERS hidden_states entries (all of them when there are fewer).
LAST_LAYERS = 4
LAST4_FEATURES = {"last4-concat": "concat", "last4-sum": "sum"}  # feature -> embed's combine
CLASSIFIER_FEATURES = ("cls", *LAST4_FEATURES, "scalar-mix")
CLASSIFIER_POOLS = ("cls", "mean")  # the family's summary position, or the mean over real tokens

TokenPool = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def head_option(config: PretrainedConfig, name: str) -> Any:
    """The config's value for a head option, or its default."""
    value = getattr(config, name, None)
    return HEAD_DEFAULTS[name] if value is None else value


def checked_choice(config: PretrainedConfig, name: str, choices: tuple[str, ...]) -> str:
    value = head_option(config, name)
    if value not in choices:
        raise ConfigError(
            f"{name}={value!r} is not a valid head option; set the model config's {name} "
            f"to one of: {', '.join(choices)}"
        )
    return value


def first_token(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, dim) -> (batch, dim): position 0, BERT's [CLS]."""
    return states[:, 0]


def last_real_token(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, dim) -> (batch, dim): the last position before the right padding."""
    last = attention_mask.sum(dim=1) - 1
    return states[torch.arange(states.size(0), device=states.device), last]


def elmo_sentence_ends(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, 2 * dim) -> (batch, 2 * dim): each direction where it has read the whole
    sentence, the forward half at the last real token and the backward half at the first."""
    forward, backward = states.chunk(2, dim=-1)
    return torch.cat(
        [last_real_token(forward, attention_mask), first_token(backward, attention_mask)], dim=-1
    )


def masked_mean(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, dim) -> (batch, dim): the mean over real tokens, so padding changes nothing."""
    weights = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(w)_j * h_j over the layers (Peters et al., 2018, eq. 1)."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.layer_weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        """(layers, batch, dim) -> (batch, dim)."""
        weights = self.layer_weights.softmax(dim=0).to(layers.dtype)
        return self.gamma * torch.einsum("l,lbd->bd", weights, layers)


def is_regression(config: PretrainedConfig) -> bool:
    """transformers' rule: the config's problem_type, else one output means regression."""
    if config.problem_type is not None:
        return config.problem_type == "regression"
    return config.num_labels == 1


def regression_target_stats(config: PretrainedConfig) -> tuple[float, float]:
    """(mean, standard deviation) of the training labels, (0, 1) where the config has none."""
    mean = head_option(config, "regression_target_mean")
    return mean, head_option(config, "regression_target_std")


def in_label_units(head_output: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
    """A regression head's standardized output in the units of its labels (a classifier's
    logits unchanged)."""
    if not is_regression(config):
        return head_output
    mean, std = regression_target_stats(config)
    return head_output * std + mean


def classification_loss(
    head_output: torch.Tensor,
    labels: torch.Tensor,
    config: PretrainedConfig,
    label_smoothing: float | None = None,
) -> torch.Tensor:
    """The loss transformers' sequence classifiers use, with `label_smoothing` (None: the
    config's) for single-label classification. A
    regression head's output is taken as it comes, in standardized units, against standardized
    labels: the same loss for every label range."""
    if is_regression(config):
        mean, std = regression_target_stats(config)
        targets = (labels.to(head_output.dtype) - mean) / std
        if config.num_labels == 1:
            return F.mse_loss(head_output.squeeze(-1), targets.reshape(-1))
        return F.mse_loss(head_output, targets)
    problem_type = config.problem_type
    if problem_type is None:
        if labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "single_label_classification":
        return F.cross_entropy(
            head_output.reshape(-1, config.num_labels),
            labels.reshape(-1),
            label_smoothing=config.label_smoothing if label_smoothing is None else label_smoothing,
        )
    return F.binary_cross_entropy_with_logits(head_output, labels.to(head_output.dtype))


class EgbertSequenceClassifier(PreTrainedModel):
    """A backbone (stored under the family's `base_model_prefix`, so pretraining checkpoints
    load into it) and a dropout + linear head over the features the config chooses."""

    backbone_class: type[PreTrainedModel]
    summary_pool: TokenPool  # the family's one-position summary of a sentence
    state_size_multiplier = 1  # width of a hidden_states entry in units of hidden_size
    backbone_options: dict[str, Any] = {}
    supports_gradient_checkpointing = True  # the backbone's layers (egbert's families) do

    def __init__(self, config: PretrainedConfig, **head_options: Any) -> None:
        for name, value in head_options.items():
            if name not in HEAD_DEFAULTS:
                raise TypeError(f"{type(self).__name__} got an unknown keyword argument {name!r}")
            setattr(config, name, value)
        super().__init__(config)
        self.features = checked_choice(config, "classifier_features", CLASSIFIER_FEATURES)
        self.pool = checked_choice(config, "classifier_pool", CLASSIFIER_POOLS)
        self.layer_norm = bool(head_option(config, "classifier_layer_norm"))
        self.freeze_backbone = bool(head_option(config, "freeze_backbone"))
        setattr(self, self.base_model_prefix, self.backbone_class(config))

        num_entries = config.num_hidden_layers + 1  # embeddings, then one per layer
        self.num_last_layers = min(LAST_LAYERS, num_entries)
        entry_size = self.state_size_multiplier * config.hidden_size
        feature_size = entry_size * (self.num_last_layers if self.features == "last4-concat" else 1)
        self.scalar_mix = ScalarMix(num_entries) if self.features == "scalar-mix" else None
        dropout = head_option(config, "classifier_dropout")
        self.dropout = Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.classifier = nn.Linear(feature_size, config.num_labels)

        self.post_init()
        self._freeze_backbone_parameters()

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> EgbertSequenceClassifier:
        model = super().from_pretrained(*args, **kwargs)
        # The loader puts fresh, trainable Parameters in place of the ones __init__ froze.
        model._freeze_backbone_parameters()
        return model

    def save_pretrained(
        self, save_directory: str | os.PathLike, is_main_process: bool = True, **kwargs: Any
    ) -> None:
        """transformers' save_pretrained, with config.json's auto_map (layers.auto_map)."""
        auto_classes = {"AutoConfig": self.config_class, "AutoModel": self.backbone_class}
        self.config.auto_map = auto_map(self, auto_classes)
        super().save_pretrained(save_directory, is_main_process, **kwargs)

    def _freeze_backbone_parameters(self) -> None:
        if self.freeze_backbone:
            self.base_model.requires_grad_(False)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, ScalarMix):
            init.zeros_(module.layer_weights)  # start from the plain average of the layers
            init.ones_(module.gamma)
        else:
            super()._init_weights(module)

    def train(self, mode: bool = True) -> EgbertSequenceClassifier:
        super().train(mode)
        if self.freeze_backbone:
            self.base_model.eval()  # feature-based: the frozen backbone never applies dropout
        return self

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        label_smoothing: float | None = None,
        use_cache: bool | None = None,
    ) -> SequenceClassifierOutput | tuple:
        """Right padding only. `labels`: class ids, floats for regression (num_labels == 1), or
        multi-hot floats for multi-label problems. label_smoothing: of a classification loss
        (None: config.label_smoothing). `use_cache` is accepted as transformers' classifiers
        accept it (TRL's RewardTrainer passes False); a classifier keeps no cache."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if return_dict is None:
            return_dict = self.config.return_dict

        no_grad = torch.no_grad() if self.freeze_backbone else contextlib.nullcontext()
        with no_grad:
            outputs = self.base_model(
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                output_hidden_states=output_hidden_states or self.features != "cls",
                return_dict=True,
                **self.backbone_options,
            )
        head_output = self.classifier(self.dropout(self.sentence_features(outputs, attention_mask)))
        loss = None
        if labels is not None:
            loss = classification_loss(head_output, labels, self.config, label_smoothing)
        logits = in_label_units(head_output, self.config)
        output = SequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states if output_hidden_states else None,
            attentions=getattr(outputs, "attentions", None),
        )
        return output if return_dict else output.to_tuple()

    def sentence_features(self, outputs: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        """The backbone outputs -> (batch, feature_size), as `classifier_features` says."""
        if self.features == "cls":
            return self.normalized(self.cls_features(outputs, attention_mask))
        # Pooling is linear, so pooling each layer first equals pooling the mixed layers,
        # and keeps ELMo's forward and backward halves apart for its summary pool.
        pool = masked_mean if self.pool == "mean" else self.summary_pool
        layers = outputs.hidden_states
        if self.features != "scalar-mix":
            layers = layers[::-1][: self.num_last_layers]  # top first
        pooled = [self.normalized(pool(states, attention_mask)) for states in layers]
        if self.features == "scalar-mix":
            return self.scalar_mix(torch.stack(pooled))
        if self.features == "last4-concat":
            return torch.cat(pooled, dim=-1)
        return torch.stack(pooled).sum(dim=0)

    def cls_features(self, outputs: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.summary_pool(outputs.last_hidden_state, attention_mask)

    def normalized(self, features: torch.Tensor) -> torch.Tensor:
        """(batch, dim) features at zero mean and unit variance over dim when
        `classifier_layer_norm` is on (unchanged otherwise)."""
        if not self.layer_norm:
            return features
        # An untrained biLM's states are tiny (variance ~1e-6), below LayerNorm's usual eps.
        return F.layer_norm(features, features.shape[-1:], eps=1e-12)


class EgbertBertForSequenceClassification(EgbertSequenceClassifier):
    config_class = EgbertBertConfig
    base_model_prefix = EgbertBertModel.base_model_prefix
    backbone_class = EgbertBertModel
    summary_pool = staticmethod(first_token)

    def cls_features(self, outputs: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        return outputs.pooler_output  # BERT's tanh layer over [CLS], trained by NSP


class EgbertGPTForSequenceClassification(EgbertSequenceClassifier):
    config_class = EgbertGPTConfig
    base_model_prefix = EgbertGPTModel.base_model_prefix
    backbone_class = EgbertGPTModel
    summary_pool = staticmethod(last_real_token)  # the only position that has seen every token
    backbone_options = {"use_cache": False}


class EgbertElmoForSequenceClassification(EgbertSequenceClassifier):
    config_class = EgbertElmoConfig
    base_model_prefix = EgbertElmoModel.base_model_prefix
    backbone_class = EgbertElmoModel
    summary_pool = staticmethod(elmo_sentence_ends)
    state_size_multiplier = 2  # every entry is [forward; backward]


CLASSIFIERS = (
    EgbertBertForSequenceClassification,
    EgbertGPTForSequenceClassification,
    EgbertElmoForSequenceClassification,
)
