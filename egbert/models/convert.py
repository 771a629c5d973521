"""Convert stock transformers BERT / GPT-2 checkpoints to egbert models and back (`egbert convert`).

Stock -> egbert: BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification ->
the egbert-bert classes; GPT2Model, GPT2LMHeadModel, GPT2ForSequenceClassification -> the
egbert-gpt classes. egbert -> stock goes the other way and gives checkpoints that plain
transformers loads without egbert installed. Weights are only renamed, concatenated (BERT's
query/key/value into one projection) or transposed (GPT-2's Conv1D), so a round trip reproduces
the original state dict exactly.

Fine-tuned classifiers convert when their head is the one the stock class has: classifier_features
"cls" (BERT's pooled [CLS], GPT's last token) into one linear layer, no classifier_layer_norm. Two
folds keep the logits equal where egbert's head computes a little more: a regression head's label
statistics go into its linear layer ((W x + b) * std + mean), and, since GPT-2's score layer has
no bias, a gpt classifier's bias goes into the final LayerNorm's (only the score layer reads it).
The target folder gets the tokenizer made for the model's family (egbert.tokenizer).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    GPT2Model,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers import initialization as init

from egbert.errors import CheckpointError, first_line
from egbert.model_files import ALLOW_PICKLE_HELP, load_pretrained, read_model_config
from egbert.models.bert import (
    EgbertBertConfig,
    EgbertBertForMaskedLM,
    EgbertBertForPreTraining,
    EgbertBertModel,
)
from egbert.models.gpt import EgbertGPTConfig, EgbertGPTForCausalLM, EgbertGPTModel
from egbert.models.heads import (
    EgbertBertForSequenceClassification,
    EgbertGPTForSequenceClassification,
    head_option,
    is_regression,
    regression_target_stats,
)
from egbert.models.layers import ACTIVATIONS
from egbert.outputs import check_output_folder
from egbert.tokenizer import load_tokenizer, tokenizer_for_model

# The files egbert.tokenizer.load_tokenizer builds a tokenizer from; the vocabularies are also
# copied as they are beside the tokenizer the target gets (tools outside transformers read them).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")
VOCAB_FILES = ("vocab.txt", "vocab.json", "merges.txt")

# stock class <-> egbert class, and the prefix of the encoder/decoder weights in each
BERT_CLASSES = {
    BertModel: (EgbertBertModel, ""),
    BertForPreTraining: (EgbertBertForPreTraining, "bert."),
    BertForMaskedLM: (EgbertBertForMaskedLM, "bert."),
    BertForSequenceClassification: (EgbertBertForSequenceClassification, "bert."),
}
GPT2_CLASSES = {
    GPT2Model: (EgbertGPTModel, ""),
    GPT2LMHeadModel: (EgbertGPTForCausalLM, "transformer."),
    GPT2ForSequenceClassification: (EgbertGPTForSequenceClassification, "transformer."),
}
EGBERT_GPT_PREFIX = {
    EgbertGPTModel: "",
    EgbertGPTForCausalLM: "gpt.",
    EgbertGPTForSequenceClassification: "gpt.",
}

# One weight mapping: (stock names, egbert name, how). "copy" and "transpose" take one stock
# tensor; "concat" joins several along dim 0 (and splits them again on the way back).
Mapping = tuple[tuple[str, ...], str, str]


# ---------------------------------------------------------------- configs


# Fields that mean the same in transformers' BertConfig and EgbertBertConfig.
BERT_SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "initializer_range",
    "pad_token_id",
    "tie_word_embeddings",
)


def shared_bert_fields(config: BertConfig | EgbertBertConfig) -> dict:
    return {name: getattr(config, name) for name in BERT_SHARED_FIELDS}


# EgbertGPTConfig's fields under their GPT2Config names (the feed-forward width and GPT-2's
# embedding dropout are set apart: GPT-2 may leave the first None, and egbert has no second).
GPT2_CONFIG_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "hidden_act": "activation_function",
    "hidden_dropout_prob": "resid_pdrop",
    "attention_probs_dropout_prob": "attn_pdrop",
    "max_position_embeddings": "n_positions",
    "layer_norm_eps": "layer_norm_epsilon",
    "initializer_range": "initializer_range",
    "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "tie_word_embeddings": "tie_word_embeddings",
}


# egbert's architecture options that the stock classes have no weights or code for: a model
# converts to stock with each at its config class's default (which keeps BERT's or GPT-2's block)
ARCHITECTURE_OPTIONS = (
    "gated_mlp",
    "norm_type",
    "norm_bias",
    "embedding_norm",
    "qk_norm",
    "attention_bias",
    "mlp_bias",
    "residual_attention",
)


def check_stock_architecture(config: EgbertBertConfig | EgbertGPTConfig, stock: str) -> None:
    """CheckpointError naming the first architecture option set away from its default."""
    for name in ARCHITECTURE_OPTIONS:
        default = getattr(type(config), name, None)
        value = getattr(config, name, default)
        if value != default:
            raise CheckpointError(
                f"stock {stock} has no {name}: this model has {name}={value!r}, and only models "
                f"with {name}={default!r} convert to stock transformers classes"
            )


def bert_config_from_transformers(config: BertConfig) -> EgbertBertConfig:
    position_type = getattr(config, "position_embedding_type", "absolute")
    if position_type != "absolute" or config.is_decoder or config.add_cross_attention:
        raise CheckpointError(
            f"only encoder BERT checkpoints with absolute positions convert; this one has "
            f"position_embedding_type={position_type!r}, is_decoder={config.is_decoder}"
        )
    _check_activation(config.hidden_act)
    return EgbertBertConfig(**shared_bert_fields(config))


def bert_config_to_transformers(config: EgbertBertConfig) -> BertConfig:
    if (
        config.position_embedding_type != "learned"
        or config.pre_layernorm
        or config.type_vocab_size < 1
    ):
        raise CheckpointError(
            "stock BERT needs learned positions, post-LN blocks and segment embeddings; this model "
            f"has position_embedding_type={config.position_embedding_type!r}, "
            f"pre_layernorm={config.pre_layernorm}, type_vocab_size={config.type_vocab_size}"
        )
    check_stock_architecture(config, "BERT")
    return BertConfig(**shared_bert_fields(config))


def gpt2_config_from_transformers(config: GPT2Config) -> EgbertGPTConfig:
    if (
        not config.scale_attn_weights
        or config.scale_attn_by_inverse_layer_idx
        or config.add_cross_attention
    ):
        raise CheckpointError(
            "only GPT-2 checkpoints with standard 1/sqrt(head_dim) attention scaling and no "
            "cross-attention convert (check scale_attn_weights, scale_attn_by_inverse_layer_idx, "
            "add_cross_attention in config.json)"
        )
    _check_activation(config.activation_function)
    return EgbertGPTConfig(
        **{ours: getattr(config, theirs) for ours, theirs in GPT2_CONFIG_NAMES.items()},
        intermediate_size=config.n_inner or 4 * config.n_embd,
    )


def gpt2_config_to_transformers(config: EgbertGPTConfig) -> GPT2Config:
    if config.position_embedding_type != "learned":
        raise CheckpointError(
            "stock GPT-2 needs learned positions; this model has "
            f"position_embedding_type={config.position_embedding_type!r}"
        )
    check_stock_architecture(config, "GPT-2")
    return GPT2Config(
        **{theirs: getattr(config, ours) for ours, theirs in GPT2_CONFIG_NAMES.items()},
        n_inner=config.intermediate_size,
        embd_pdrop=config.hidden_dropout_prob,  # egbert has one dropout for both
    )


def _check_activation(name: str) -> None:
    if name not in ACTIVATIONS:
        raise CheckpointError(f"activation {name!r} has no egbert equivalent ({list(ACTIVATIONS)})")


def copy_labels(source: PretrainedConfig, target: PretrainedConfig) -> None:
    """A classifier's labels and problem type: transformers' own fields, the same in both."""
    target.id2label = dict(source.id2label)
    target.label2id = {label: index for index, label in source.id2label.items()}
    target.problem_type = source.problem_type


# ---------------------------------------------------------------- weight names


def bert_mappings(
    num_layers: int,
    stock_prefix: str,
    egbert_prefix: str,
    pooler: bool,
    mlm: bool,
    nsp: bool,
    classifier: bool = False,
) -> list[Mapping]:
    s, e = stock_prefix, egbert_prefix
    mappings: list[Mapping] = [
        ((f"{s}embeddings.{name}.weight",), f"{e}embeddings.{name}.weight", "copy")
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ]
    pairs = [("embeddings.LayerNorm", "embeddings.norm")]
    for i in range(num_layers):
        pairs += [
            (f"encoder.layer.{i}.attention.output.dense", f"layers.{i}.attention.out"),
            (f"encoder.layer.{i}.attention.output.LayerNorm", f"layers.{i}.attention_norm"),
            (f"encoder.layer.{i}.intermediate.dense", f"layers.{i}.feed_forward.up"),
            (f"encoder.layer.{i}.output.dense", f"layers.{i}.feed_forward.down"),
            (f"encoder.layer.{i}.output.LayerNorm", f"layers.{i}.feed_forward_norm"),
        ]
    if pooler:
        pairs.append(("pooler.dense", "pooler"))
    mappings += _weights_and_biases(pairs, s, e, "copy")
    for i in range(num_layers):
        for param in ("weight", "bias"):
            qkv = tuple(
                f"{s}encoder.layer.{i}.attention.self.{name}.{param}"
                for name in ("query", "key", "value")
            )
            mappings.append((qkv, f"{e}layers.{i}.attention.qkv.{param}", "concat"))
    if mlm:
        head = [
            ("cls.predictions.transform.dense", "mlm_head.dense"),
            ("cls.predictions.transform.LayerNorm", "mlm_head.norm"),
            ("cls.predictions.decoder", "mlm_head.decoder"),
        ]
        mappings += _weights_and_biases(head, "", "", "copy")
        # stock BERT keeps the decoder bias twice (tied): both names map to the one egbert bias
        mappings.append((("cls.predictions.bias",), "mlm_head.decoder.bias", "copy"))
    if nsp:
        mappings += _weights_and_biases([("cls.seq_relationship", "nsp_head")], "", "", "copy")
    if classifier:
        mappings += _weights_and_biases([("classifier", "classifier")], "", "", "copy")
    return mappings


def gpt2_mappings(
    num_layers: int, stock_prefix: str, egbert_prefix: str, lm_head: bool, score: bool = False
) -> list[Mapping]:
    s, e = stock_prefix, egbert_prefix
    mappings: list[Mapping] = [
        ((f"{s}wte.weight",), f"{e}embeddings.word_embeddings.weight", "copy"),
        ((f"{s}wpe.weight",), f"{e}embeddings.position_embeddings.weight", "copy"),
    ]
    norms = [("ln_f", "final_norm")]
    # GPT-2's Conv1D stores weights as (in, out), nn.Linear as (out, in)
    conv1ds = []
    for i in range(num_layers):
        norms += [(f"h.{i}.ln_1", f"layers.{i}.attention_norm")]
        norms += [(f"h.{i}.ln_2", f"layers.{i}.feed_forward_norm")]
        conv1ds += [
            (f"h.{i}.attn.c_attn", f"layers.{i}.attention.qkv"),
            (f"h.{i}.attn.c_proj", f"layers.{i}.attention.out"),
            (f"h.{i}.mlp.c_fc", f"layers.{i}.feed_forward.up"),
            (f"h.{i}.mlp.c_proj", f"layers.{i}.feed_forward.down"),
        ]
    mappings += _weights_and_biases(norms, s, e, "copy")
    for stock, egbert in conv1ds:
        mappings.append(((f"{s}{stock}.weight",), f"{e}{egbert}.weight", "transpose"))
        mappings.append(((f"{s}{stock}.bias",), f"{e}{egbert}.bias", "copy"))
    if lm_head:
        mappings.append((("lm_head.weight",), "lm_head.weight", "copy"))
    if score:  # its bias: fold_bias_into_final_norm, and zero on the way back
        mappings.append((("score.weight",), "classifier.weight", "copy"))
    return mappings


def _weights_and_biases(
    pairs: list[tuple[str, str]], stock_prefix: str, egbert_prefix: str, how: str
) -> list[Mapping]:
    return [
        ((f"{stock_prefix}{stock}.{param}",), f"{egbert_prefix}{egbert}.{param}", how)
        for stock, egbert in pairs
        for param in ("weight", "bias")
    ]


def stock_to_egbert_state(
    state: dict[str, torch.Tensor], mappings: list[Mapping]
) -> dict[str, torch.Tensor]:
    converted = {}
    for stock_names, egbert_name, how in mappings:
        tensors = [state[name] for name in stock_names]
        if how == "concat":
            converted[egbert_name] = torch.cat(tensors, dim=0)
        elif how == "transpose":
            converted[egbert_name] = tensors[0].t().contiguous()
        else:
            converted[egbert_name] = tensors[0]
    return converted


def egbert_to_stock_state(
    state: dict[str, torch.Tensor], mappings: list[Mapping]
) -> dict[str, torch.Tensor]:
    converted = {}
    for stock_names, egbert_name, how in mappings:
        tensor = state[egbert_name]
        if how == "concat":
            parts = tensor.chunk(len(stock_names), dim=0)
            converted.update(zip(stock_names, parts, strict=True))
        elif how == "transpose":
            converted[stock_names[0]] = tensor.t().contiguous()
        else:
            converted[stock_names[0]] = tensor
    return converted


# ---------------------------------------------------------------- models


def bert_from_transformers(
    model: BertModel | BertForPreTraining | BertForMaskedLM | BertForSequenceClassification,
):
    """A stock BERT model (BertModel, BertForPreTraining, BertForMaskedLM or
    BertForSequenceClassification) as its egbert twin."""
    egbert_class, prefix = _lookup(BERT_CLASSES, type(model))
    config = bert_config_from_transformers(model.config)
    if egbert_class is EgbertBertForSequenceClassification:
        copy_labels(model.config, config)
        config.classifier_dropout = model.config.classifier_dropout
    pooler = _bert_has_pooler(model)
    state = stock_to_egbert_state(
        model.state_dict(), _bert_mappings_for(egbert_class, config, prefix, pooler)
    )
    options = {"add_pooling_layer": pooler} if egbert_class is EgbertBertModel else {}
    return _build(egbert_class, config, state, model.dtype, **options)


def bert_to_transformers(
    model: EgbertBertModel
    | EgbertBertForPreTraining
    | EgbertBertForMaskedLM
    | EgbertBertForSequenceClassification,
):
    """An egbert BERT model as the stock transformers class of the same shape."""
    stock_class = next(
        stock for stock, (egbert, _) in BERT_CLASSES.items() if egbert is type(model)
    )
    prefix = BERT_CLASSES[stock_class][1]
    config = bert_config_to_transformers(model.config)
    state = model.state_dict()
    if stock_class is BertForSequenceClassification:
        check_stock_head(model.config)
        copy_labels(model.config, config)
        config.classifier_dropout = head_option(model.config, "classifier_dropout")
        state = classifier_in_label_units(state, model.config)
    pooler = _bert_has_pooler(model)
    state = egbert_to_stock_state(
        state, _bert_mappings_for(type(model), model.config, prefix, pooler)
    )
    options = {"add_pooling_layer": pooler} if stock_class is BertModel else {}
    return _build(stock_class, config, state, model.dtype, **options)


def gpt2_from_transformers(model: GPT2Model | GPT2LMHeadModel | GPT2ForSequenceClassification):
    """A stock GPT-2 model (GPT2Model, GPT2LMHeadModel or GPT2ForSequenceClassification) as its
    egbert twin."""
    egbert_class, prefix = _lookup(GPT2_CLASSES, type(model))
    config = gpt2_config_from_transformers(model.config)
    classifier = egbert_class is EgbertGPTForSequenceClassification
    mappings = gpt2_mappings(
        config.num_hidden_layers,
        prefix,
        EGBERT_GPT_PREFIX[egbert_class],
        lm_head=egbert_class is EgbertGPTForCausalLM,
        score=classifier,
    )
    state = stock_to_egbert_state(model.state_dict(), mappings)
    if classifier:
        copy_labels(model.config, config)
        score = state["classifier.weight"]
        state["classifier.bias"] = score.new_zeros(score.shape[0])
    return _build(egbert_class, config, state, model.dtype)


def gpt2_to_transformers(
    model: EgbertGPTModel | EgbertGPTForCausalLM | EgbertGPTForSequenceClassification,
):
    """An egbert GPT model as GPT2Model, GPT2LMHeadModel or GPT2ForSequenceClassification."""
    stock_class = next(
        stock for stock, (egbert, _) in GPT2_CLASSES.items() if egbert is type(model)
    )
    config = gpt2_config_to_transformers(model.config)
    prefix = EGBERT_GPT_PREFIX[type(model)]
    state = model.state_dict()
    if stock_class is GPT2ForSequenceClassification:
        check_stock_head(model.config)
        if model.config.pad_token_id is None:
            raise CheckpointError(
                "GPT2ForSequenceClassification finds each row's last token by pad_token_id, and "
                "this gpt classifier's config has none; set pad_token_id in its config.json to "
                "the tokenizer's pad token id"
            )
        copy_labels(model.config, config)
        state = fold_bias_into_final_norm(classifier_in_label_units(state, model.config), prefix)
    mappings = gpt2_mappings(
        model.config.num_hidden_layers,
        GPT2_CLASSES[stock_class][1],
        prefix,
        lm_head=stock_class is GPT2LMHeadModel,
        score=stock_class is GPT2ForSequenceClassification,
    )
    return _build(stock_class, config, egbert_to_stock_state(state, mappings), model.dtype)


# ---------------------------------------------------------------- classifier heads


def check_stock_head(config: PretrainedConfig) -> None:
    """CheckpointError unless the classifier computes what the stock class does: the family's
    summary of the top layer (BERT's pooled [CLS], GPT's last token) into one linear layer.
    (classifier_pool does not matter: it only pools the layers of the other features.)"""
    features = head_option(config, "classifier_features")
    if features != "cls":
        raise CheckpointError(
            f"this classifier reads classifier_features={features!r}, and the stock transformers "
            "classifiers read only the top layer's [CLS] (BERT) or last token (GPT-2); only "
            "classifier_features='cls' heads convert"
        )
    if head_option(config, "classifier_layer_norm"):
        raise CheckpointError(
            "this classifier normalizes its features (classifier_layer_norm=true), a step the "
            "stock transformers classifiers do not have; only heads without it convert"
        )


def classifier_in_label_units(
    state: dict[str, torch.Tensor], config: PretrainedConfig
) -> dict[str, torch.Tensor]:
    """The classifier's weights with a regression head's label statistics folded in:
    (W x + b) * std + mean = (std W) x + (std b + mean), what the stock head outputs as it is."""
    if not is_regression(config):
        return state
    mean, std = regression_target_stats(config)
    weight, bias = state["classifier.weight"], state["classifier.bias"]
    return {**state, "classifier.weight": weight * std, "classifier.bias": bias * std + mean}


def fold_bias_into_final_norm(
    state: dict[str, torch.Tensor], prefix: str
) -> dict[str, torch.Tensor]:
    """GPT-2's score layer has no bias. The final LayerNorm's output feeds only the score layer,
    so adding d with W d = b to that LayerNorm's bias adds b to the logits (d = pinv(W) b, the
    smallest such shift; exact while W's rows, one per label, are independent). The stock
    model's last hidden state moves by d; its logits are egbert's."""
    weight = state["classifier.weight"].double()  # (labels, hidden)
    bias = state["classifier.bias"].double()
    shift = torch.linalg.pinv(weight) @ bias
    if not torch.allclose(weight @ shift, bias, rtol=1e-6, atol=1e-7):
        raise CheckpointError(
            "the gpt classifier's weight rows are linearly dependent, so GPT-2's bias-free score "
            "layer cannot reproduce its bias; this head has no stock twin"
        )
    norm_bias = f"{prefix}final_norm.bias"
    folded = {name: tensor for name, tensor in state.items() if name != "classifier.bias"}
    folded[norm_bias] = (state[norm_bias].double() + shift).to(state[norm_bias].dtype)
    return folded


def _lookup(table: dict, model_class: type) -> tuple:
    if model_class not in table:
        accepted = ", ".join(cls.__name__ for cls in table)
        raise CheckpointError(f"cannot convert a {model_class.__name__}; accepted: {accepted}")
    return table[model_class]


def _bert_has_pooler(model: PreTrainedModel) -> bool:
    return getattr(model.base_model, "pooler", None) is not None


def _bert_mappings_for(egbert_class: type, config, prefix: str, pooler: bool) -> list[Mapping]:
    return bert_mappings(
        config.num_hidden_layers,
        stock_prefix=prefix,
        egbert_prefix=prefix,
        pooler=pooler,
        mlm=egbert_class in (EgbertBertForPreTraining, EgbertBertForMaskedLM),
        nsp=egbert_class is EgbertBertForPreTraining,
        classifier=egbert_class is EgbertBertForSequenceClassification,
    )


def _build(model_class: type, config, state: dict[str, torch.Tensor], dtype, **options):
    # every weight is about to be overwritten: skip the random initialisation (slow for big models)
    with init.no_init_weights():
        model = model_class(config, **options)
    # strict: every weight of the target must come from the source, or the mapping is wrong
    model.load_state_dict(state, strict=True)
    model.tie_weights()  # no_init_weights skipped the tying as well
    return model.to(dtype).eval()


# ---------------------------------------------------------------- checkpoints

STOCK_CLASSES = {cls.__name__: cls for cls in (*BERT_CLASSES, *GPT2_CLASSES)}
EGBERT_CLASSES = {
    cls.__name__: cls
    for cls in (
        EgbertBertModel,
        EgbertBertForPreTraining,
        EgbertBertForMaskedLM,
        EgbertBertForSequenceClassification,
        EgbertGPTModel,
        EgbertGPTForCausalLM,
        EgbertGPTForSequenceClassification,
    )
}
# Pretraining classes whose encoder alone has a stock counterpart: ELECTRA-style pretraining's
# generator and detection head have none, so its checkpoint converts as a BertModel.
ENCODER_OF = {"EgbertBertForReplacedTokenDetection": EgbertBertModel}
DEFAULT_ARCHITECTURE = {
    "bert": "BertModel",
    "gpt2": "GPT2LMHeadModel",
    "egbert-bert": "EgbertBertModel",
    "egbert-gpt": "EgbertGPTForCausalLM",
}


@dataclass
class ConvertArguments:
    """The options of `egbert convert`, the arguments of `convert_checkpoint`."""

    _argument_group_name = None  # among the parser's own options

    source: str = field(metadata={"option": "--from", "help": "model directory to read"})
    target: str = field(metadata={"option": "--to", "help": "directory to write"})
    to_transformers: bool = field(
        default=False,
        metadata={
            "help": "convert egbert -> stock transformers classes (default: stock -> egbert)"
        },
    )
    allow_pickle: bool = field(default=False, metadata={"help": ALLOW_PICKLE_HELP})


def convert_checkpoint(
    source: str | Path,
    target: str | Path,
    to_transformers: bool = ConvertArguments.to_transformers,
    allow_pickle: bool = ConvertArguments.allow_pickle,
) -> PreTrainedModel:
    """Convert the model saved in `source` and save it, with its tokenizer made for the model's
    family (egbert.tokenizer.tokenizer_for_model), to `target`.

    Stock BERT/GPT-2 -> egbert by default; egbert -> stock with to_transformers=True.
    A pickle checkpoint (pytorch_model.bin) is read only with `allow_pickle`, through
    torch.load(weights_only=True); the result is always written as safetensors, all at once:
    a failed conversion leaves no half-written `target`. Returns the converted model.
    """
    source, target = Path(source), Path(target)
    check_output_folder(target, "--to")
    architecture = read_architecture(source)
    if to_transformers:
        if architecture in ENCODER_OF:
            model = load_pretrained(
                ENCODER_OF[architecture], source, allow_pickle, add_pooling_layer=False
            )
        elif architecture in EGBERT_CLASSES:
            model = load_pretrained(EGBERT_CLASSES[architecture], source, allow_pickle)
        elif architecture.startswith("EgbertElmo"):
            raise CheckpointError(
                f"{source} holds an elmo model ({architecture}), and transformers has no ELMo "
                "class to convert it to; use it with egbert"
            )
        else:
            raise CheckpointError(
                f"{source} holds a {architecture}, not an egbert model: --to-transformers "
                f"converts egbert checkpoints ({', '.join([*EGBERT_CLASSES, *ENCODER_OF])}); "
                "drop the flag to convert to egbert"
            )
        is_bert = isinstance(model.config, EgbertBertConfig)
        converted = bert_to_transformers(model) if is_bert else gpt2_to_transformers(model)
    else:
        if architecture not in STOCK_CLASSES:
            hint = (
                "; add --to-transformers to convert it back to the stock class"
                if architecture in EGBERT_CLASSES
                else ""
            )
            raise CheckpointError(
                f"{source} holds a {architecture}; egbert convert accepts stock "
                f"{', '.join(STOCK_CLASSES)} checkpoints{hint}"
            )
        model = load_pretrained(STOCK_CLASSES[architecture], source, allow_pickle)
        is_bert = isinstance(model.config, BertConfig)
        converted = bert_from_transformers(model) if is_bert else gpt2_from_transformers(model)
    with staged_directory(target) as staging:
        converted.save_pretrained(staging)
        save_tokenizer_for(converted.config, source, staging)
    return converted


@contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """A temp folder beside `target` whose files move into `target` once the block succeeds
    (files already in `target` are only replaced then); removed whatever happens."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as error:
        raise CheckpointError(f"cannot write to {target}: {first_line(error)}") from None
    try:
        yield staging
        target.mkdir(exist_ok=True)
        for file in staging.iterdir():
            os.replace(file, target / file.name)
    except OSError as error:
        raise CheckpointError(
            f"cannot write the converted model to {target}: {first_line(error)}"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def read_architecture(directory: Path) -> str:
    """The model class named by a checkpoint's config.json (its first `architectures` entry)."""
    config = read_model_config(directory)
    architectures = config.get("architectures") or []
    if architectures:
        return architectures[0]
    model_type = config.get("model_type")
    if model_type not in DEFAULT_ARCHITECTURE:
        raise CheckpointError(
            f"{directory / 'config.json'} has model_type {model_type!r}; egbert convert "
            "accepts bert, gpt2, egbert-bert and egbert-gpt checkpoints"
        )
    return DEFAULT_ARCHITECTURE[model_type]


def save_tokenizer_for(config: PretrainedConfig, source: Path, target: Path) -> None:
    """The tokenizer in `source` (if any), made for the converted model's family and length."""
    if not any((source / name).is_file() for name in TOKENIZER_FILES):
        return
    tokenizer = tokenizer_for_model(load_tokenizer(source), config)
    tokenizer.save_pretrained(target)
    for name in VOCAB_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
