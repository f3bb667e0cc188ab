""" BiGS: bidirectional gated SSM encoders for masked LM and sequence classification.

Paper: `Pretraining Without Attention` (Wang, Yan, Gu, Rush) - https://arxiv.org/abs/2212.10544 (§4, Fig. 2: the
gated bidirectional layer; §5: the BERT-large-sized setup; Table 6: FLOPs).
Official code and weights: github.com/jxiw/BiGS (``JunxiongWang/BiGS_{128,512,1024,4096}`` on the HF hub).

Every layer is :class:`mlp_vision.layers.BidirectionalGatedSSM` (:mod:`mlp_vision.layers.ssm`: the S4D kernel, its
float32 convolutions, Toeplitz GEMM or FFT); the embeddings, the MLM transform and the pooler are BERT's modules
(:mod:`mlp_vision.text.bert`): BiGS replaces only the layers (§4).

Model layout (``BiGSModel``)::

    input_ids (B, L), token_type_ids (B, L) -> BertEmbeddings: word (V x d) + absolute position (P x d)
        + token type (T x d) -> LayerNorm (eps 1e-12) -> dropout
        -> num_hidden_layers x BidirectionalGatedSSM(d, d_i, N)
        -> hidden states (B, L, d)          (pre-norm residual layers; no final LayerNorm, as the official model)

The classifier's pooler is the official BiGS one: the mean of the last hidden states over the real tokens, dense,
tanh (not BERT's [CLS] pooler, which only a next-sentence task would train).

``attention_mask`` (B, L), 1 = real token, right padding only: with ``config.mask_padding`` (default) the SSM
inputs are zeroed at padded positions, so real positions get the outputs of the unpadded sequence; without it the
layers mix pads like real tokens, as the official models were pretrained (to reproduce their outputs).

Parameter accounting of BiGS-large (346.7 M at 512 positions, paper 346 M; the official pooler is not in it):
docs/models.md §4.

Official checkpoints: :func:`convert_official_bigs_state_dict` maps their keys to ours, ``from_official`` builds
a model from their files (:func:`_from_official`).
"""
import math
import os
import pickle
from typing import ClassVar, Dict, List, Literal, Mapping, Optional, Union

import torch
import torch.nn as nn
from transformers import initialization as init

from mlp_vision.arguments import read_json_file
from mlp_vision.errors import UsageError
from ..layers import BidirectionalGatedSSM, S4DKernel, S4DLayer
from ..weights import load_backbone
from .bert import BertEmbeddings, EncoderForMaskedLM, EncoderForSequenceClassification, EncoderModel
from .modeling_utils import ClassifierPooling, TextConfig, TextPreTrainedModel

__all__ = [
    'BiGSConfig', 'BiGSPreTrainedModel', 'BiGSModel', 'BiGSForMaskedLM', 'BiGSForSequenceClassification',
    'convert_official_bigs_state_dict', 'load_official_bigs_state_dict', 'bigs_config_from_official',
    'from_official_folder', 'bigs_param_groups',
]


class BiGSConfig(TextConfig):
    """Configuration of the BiGS encoders (defaults: BiGS-large, §5; the official config's field names; the shared
    ones: :class:`~mlp_vision.text.modeling_utils.TextConfig`).

    Attributes:
        hidden_size, intermediate_size, num_ssm_states: d, d_i (value / gate width), N (complex states of each S4D
            kernel, the official ``num_ssm``).
        max_position_embeddings: P, absolute positions (128 / 512 / 1024 / 4096 for the official models).
        hidden_dropout_prob: dropout after the embedding LayerNorm (the layers have no dropout).
        mask_padding: zero the SSM inputs at padded positions when ``attention_mask`` is given (module docstring).
        dt_min, dt_max: range of the log-uniform init of the SSM step.
        gelu_approximate: GELU inside the BiGS layers, 'none' (exact erf; the official torch port) or 'tanh'
            (the official Flax code that pretrained the released weights uses ``flax.linen.gelu``, whose default is
            the tanh approximation). The MLM head's GELU is exact in both official versions and here.
    """
    vocab_size: int = 30522
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 23
    num_ssm_states: int = 64
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    pad_token_id: int = 0
    mask_padding: bool = True
    initializer_range: float = 0.02
    dt_min: float = 0.01
    dt_max: float = 1.0
    gelu_approximate: Literal['none', 'tanh'] = 'none'
    classifier_dropout: float = 0.1
    classifier_pooling: ClassifierPooling = 'mean'
    sparse_prediction: bool = False

    model_type = 'mlp_vision_bigs'  # config.json's key for transformers' AutoConfig
    tie_word_embeddings: ClassVar[bool] = True  # the MLM decoder is the word embedding (transformers reads this)

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f'need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}')


class BiGSPreTrainedModel(TextPreTrainedModel):
    """Base of the BiGS models: their config, and the encoder's attribute (``bigs``)."""
    config_class = BiGSConfig
    base_model_prefix = 'bigs'

    def _init_weights(self, module: nn.Module) -> None:
        """Also the S4D parameters, as :meth:`~mlp_vision.layers.ssm.S4DKernel.init_weights` and
        :meth:`~mlp_vision.layers.ssm.S4DLayer.init_weights` draw them: ``log_step`` ~ U[log dt_min, log dt_max],
        ``A_re = -0.5``, ``A_im = pi n`` (S4D-Lin), ``C`` ~ N(0, 1/2), ``D = 1``."""
        super()._init_weights(module)
        if isinstance(module, S4DKernel):
            init.uniform_(module.log_step, math.log(module.dt_min), math.log(module.dt_max))
            init.constant_(module.A_re, -0.5)
            init.copy_(module.A_im, math.pi * torch.arange(module.num_states, dtype=torch.float64))
            init.normal_(module.C, 0.0, math.sqrt(0.5))
            module.clear_cache()
        elif isinstance(module, S4DLayer):
            init.ones_(module.D)


class BiGSModel(BiGSPreTrainedModel, EncoderModel):
    """BiGS encoder: BERT embeddings -> ``num_hidden_layers`` x :class:`~mlp_vision.layers.BidirectionalGatedSSM`
    (shapes: :class:`~mlp_vision.text.bert.EncoderModel`; the mask's effect: ``config.mask_padding``)."""

    def __init__(self, config: BiGSConfig, device=None, dtype=None):
        super().__init__(config)
        dd = {'device': device, 'dtype': dtype}
        c = config
        self.embeddings = BertEmbeddings(c, **dd)
        self.layers = nn.ModuleList([
            BidirectionalGatedSSM(
                c.hidden_size, c.intermediate_size, num_states=c.num_ssm_states, norm_eps=c.layer_norm_eps,
                dt_min=c.dt_min, dt_max=c.dt_max, gelu_approximate=c.gelu_approximate, **dd)
            for _ in range(c.num_hidden_layers)
        ])
        self.post_init()


def _from_official(cls, path_or_state_dict: Union[str, os.PathLike, Mapping[str, torch.Tensor]], device: str = 'cpu',
                   dtype: Optional[torch.dtype] = None, allow_regex: bool = False, **config_overrides):
    """``cls.from_official`` (offline): a model from an official BiGS checkpoint -- a ``pytorch_model.bin`` /
    ``*.safetensors`` file, a folder in the official layout (the weights file, ``config.json``, ``vocab.txt`` /
    ``tokenizer.json``), or a state dict in the official key layout.

    The sizes are read from the tensor shapes, the other fields of :data:`_OFFICIAL_CONFIG_FIELDS` from the folder's
    ``config.json`` when it has them (sizes there that disagree with the tensors are an error), any other (e.g.
    ``mask_padding=False`` to reproduce the official outputs on padded batches) from ``config_overrides``. A
    classifier loads the official pooler and a fine-tuned ``classifier.*`` when present, else its head is new.
    ``model.tokenizer`` is the folder's tokenizer, or None; ``allow_regex``: accept a ``tokenizer.json`` with a
    regular expression (:mod:`mlp_vision.text.tokenizer`).
    """
    from .tokenizer import find_tokenizer
    directory = None
    if isinstance(path_or_state_dict, (str, os.PathLike)):
        path = os.fspath(path_or_state_dict)
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        sd = load_official_bigs_state_dict(path)
    else:
        sd = dict(path_or_state_dict)
    task = 'masked_lm' if issubclass(cls, EncoderForMaskedLM) else 'sequence_classification'
    fields = bigs_config_from_official(sd).text_fields()
    if directory is not None:
        fields.update(_official_config_fields(directory, fields))
    config = BiGSConfig.from_dict({**fields, **config_overrides})
    ours = convert_official_bigs_state_dict(sd, task=task)
    model = cls(config, device=device, dtype=dtype)
    allowed = cls.head_prefixes if task == 'sequence_classification' else ()
    # load_backbone: the official tensors pass the same value checks as every other weights file
    report = load_backbone(model, ours, allowed, 'official BiGS weights' if directory is None else
                           f'the official BiGS weights in {path}')
    if report.missing or report.unused:
        raise ValueError(f'official BiGS weights do not fit {cls.__name__}: missing {report.missing}, unexpected '
                         f'{report.unused}')
    tokenizer = find_tokenizer(directory, allow_regex) if directory is not None else None
    if tokenizer is not None and len(tokenizer) > config.vocab_size:
        raise ValueError(f'the tokenizer in {directory} has {len(tokenizer)} tokens, more than the model\'s '
                         f'{config.vocab_size} embeddings: it does not belong to these weights')
    model.tokenizer = tokenizer
    return model


class BiGSForMaskedLM(BiGSPreTrainedModel, EncoderForMaskedLM):
    """BiGS masked LM: :class:`~mlp_vision.text.bert.EncoderForMaskedLM` (BERT's MLM head) on :class:`BiGSModel`."""
    encoder_class = BiGSModel
    from_official = classmethod(_from_official)


class BiGSForSequenceClassification(BiGSPreTrainedModel, EncoderForSequenceClassification):
    """BiGS classifier: :class:`~mlp_vision.text.bert.EncoderForSequenceClassification` on :class:`BiGSModel`, with
    the official pooler (masked mean, dense, tanh) by default."""
    encoder_class = BiGSModel
    from_official = classmethod(_from_official)


def bigs_param_groups(model: nn.Module, weight_decay: float = 0.05) -> List[dict]:
    """AdamW parameter groups as the official pretraining script builds its decay mask: no weight decay on biases
    (``output_bias`` included) and LayerNorm weights, ``weight_decay`` on everything else -- Linear and embedding
    weights and the SSM parameters (``log_step, A_re, A_im, C, D``; the official script decays them too).
    The official pretraining command (github.com/jxiw/BiGS ``pretrain.sh``: weight decay 0.05, lr 6e-4, Adam betas
    (0.9, 0.98); cosine decay after warmup, arXiv 2212.10544 §5; Adam eps 1e-6 as Izsak et al., arXiv 2104.07705,
    whose other hyperparameters §5 follows) is
    ``torch.optim.AdamW(bigs_param_groups(model, 0.05), lr=6e-4, betas=(0.9, 0.98), eps=1e-6)``.
    """
    norm_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if id(p) in norm_params or name.endswith('bias') else decay).append(p)
    return [{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay, 'weight_decay': 0.0}]


# ------------------------------------------------------------------------------------ official checkpoints

# per-layer official name -> ours (attributes of the official BiGSLayer, github.com/jxiw/BiGS BiGS/modeling_bigs.py)
_LAYER_KEYS = {
    'LayerNorm.weight': 'norm.weight', 'LayerNorm.bias': 'norm.bias',
    **{f'{theirs}.{p}': f'ssm_{ours}.{p}' for theirs, ours in (('fs4', 'forward'), ('bs4', 'backward'))
       for p in ('D', 'kernel.log_step', 'kernel.A_re', 'kernel.A_im', 'kernel.C')},
    **{f'{theirs}.{p}': f'{ours}.{p}' for theirs, ours in (
        ('dv', 'value_proj'), ('du_forward', 'forward_in_proj'), ('du_backward', 'backward_in_proj'),
        ('duc_forward', 'forward_out_proj'), ('duc_backward', 'backward_out_proj'), ('dol', 'gate_proj'),
        ('do', 'out_proj')) for p in ('weight', 'bias')},
}
_EMBEDDING_KEYS = {f'bigs.embeddings.{k}': f'bigs.embeddings.{k.replace("LayerNorm", "norm")}' for k in (
    'word_embeddings.weight', 'position_embeddings.weight', 'token_type_embeddings.weight', 'LayerNorm.weight',
    'LayerNorm.bias')}
_MLM_KEYS = {
    'cls.predictions.transform.dense.weight': 'mlm_head.dense.weight',
    'cls.predictions.transform.dense.bias': 'mlm_head.dense.bias',
    'cls.predictions.transform.LayerNorm.weight': 'mlm_head.norm.weight',
    'cls.predictions.transform.LayerNorm.bias': 'mlm_head.norm.bias',
    'cls.predictions.bias': 'output_bias',
}
_POOLER_KEYS = {
    'bigs.pooler.dense.weight': 'pooler.dense.weight',
    'bigs.pooler.dense.bias': 'pooler.dense.bias',
}
_CLASSIFIER_KEYS = {'classifier.weight': 'classifier.weight', 'classifier.bias': 'classifier.bias'}
# buffers of the official embeddings (position_ids is persistent there); nothing to load
_IGNORED_KEYS = ('bigs.embeddings.position_ids', 'bigs.embeddings.token_type_ids')
_TASKS = ('masked_lm', 'sequence_classification', 'base')


def _num_official_layers(state_dict: Mapping[str, torch.Tensor]) -> int:
    prefix = 'bigs.encoder.layer.'
    idx = {int(k[len(prefix):].split('.', 1)[0]) for k in state_dict
           if k.startswith(prefix) and k[len(prefix):].split('.', 1)[0].isdigit()}
    return max(idx) + 1 if idx else 0


def convert_official_bigs_state_dict(state_dict: Mapping[str, torch.Tensor], task: str = 'masked_lm'
                                     ) -> Dict[str, torch.Tensor]:
    """Map an official BiGS state dict (github.com/jxiw/BiGS ``BiGS/modeling_bigs.py``, HF hub
    ``JunxiongWang/BiGS_*``; keys and shapes: docs/models.md §4; a DDP ``module.`` prefix is stripped) to our keys for
    ``task``: 'masked_lm' (:class:`BiGSForMaskedLM`), 'sequence_classification' (:class:`BiGSForSequenceClassification`;
    ``classifier.*`` optional) or 'base' (:class:`BiGSModel`, no ``bigs.`` prefix); keys of the heads the task lacks
    are dropped. A ``ValueError`` lists the official keys missing and the keys that are not official BiGS keys, or
    names an untied decoder (ours is always tied to the word embedding).
    """
    if task not in _TASKS:
        raise ValueError(f'task must be one of {_TASKS}, got {task!r}')
    sd = {k.removeprefix('module.'): v for k, v in state_dict.items()}
    num_layers = _num_official_layers(sd)

    required: Dict[str, str] = dict(_EMBEDDING_KEYS)
    for i in range(num_layers):
        for theirs, ours in _LAYER_KEYS.items():
            required[f'bigs.encoder.layer.{i}.{theirs}'] = f'bigs.layers.{i}.{ours}'
    tied = ('cls.predictions.decoder.weight', 'cls.predictions.decoder.bias')
    # keys of the heads the task does not have are dropped (None); the classifier's are loaded when present
    optional: Dict[str, Optional[str]] = {
        k: None for k in (*_MLM_KEYS, *_POOLER_KEYS, *_CLASSIFIER_KEYS, *tied, *_IGNORED_KEYS)}
    if task == 'masked_lm':
        required.update(_MLM_KEYS)
    elif task == 'sequence_classification':
        optional.update({**_POOLER_KEYS, **_CLASSIFIER_KEYS})

    missing = sorted(k for k in required if k not in sd)
    unexpected = sorted(k for k in sd if k not in required and k not in optional)
    if num_layers == 0:
        missing.insert(0, 'bigs.encoder.layer.0.* (no layers found)')
    if missing or unexpected:
        raise ValueError(
            f'not an official BiGS state dict for task {task!r}: missing keys {missing}; unexpected keys '
            f'{unexpected}')

    # the official decoder is tied to the word embedding and its bias is cls.predictions.bias; ours always is
    word = sd['bigs.embeddings.word_embeddings.weight']
    if tied[0] in sd and not torch.equal(sd[tied[0]], word):
        raise ValueError('cls.predictions.decoder.weight differs from bigs.embeddings.word_embeddings.weight: an '
                         'untied decoder is not supported (BiGS ties them)')
    if task == 'masked_lm' and tied[1] in sd and not torch.equal(sd[tied[1]], sd['cls.predictions.bias']):
        raise ValueError('cls.predictions.decoder.bias differs from cls.predictions.bias (they are one tensor in '
                         'the official model)')

    out = {ours: sd[theirs] for theirs, ours in {**optional, **required}.items() if ours is not None and theirs in sd}
    if task == 'masked_lm':
        out['decoder.weight'] = word  # our decoder Linear shares the word embedding's parameter
    if task == 'base':
        out = {k[len('bigs.'):]: v for k, v in out.items()}
    return out


def from_official_folder(cls, directory: str, what: str, **kwargs) -> 'BiGSPreTrainedModel':
    """``cls.from_official(directory, **kwargs)`` for a command that was given ``directory`` as ``what`` (a flag and
    the path): a folder that is not an official one (files missing, damaged or holding code) is one
    :class:`UsageError` line naming it."""
    try:
        return cls.from_official(directory, **kwargs)
    except (ValueError, KeyError, RuntimeError, OSError, pickle.UnpicklingError) as e:  # what the folder lacks
        if isinstance(e, UsageError):
            raise
        raise UsageError(f'{what} is neither a save_pretrained folder nor an official BiGS folder: '
                         f'{str(e).splitlines()[0] if str(e) else type(e).__name__}') from None


def bigs_config_from_official(state_dict: Mapping[str, torch.Tensor]) -> BiGSConfig:
    """A :class:`BiGSConfig` whose sizes are read from an official state dict's tensor shapes."""
    sd = {k.removeprefix('module.'): v for k, v in state_dict.items()}
    try:
        vocab, dim = sd['bigs.embeddings.word_embeddings.weight'].shape
        fields = dict(
            vocab_size=vocab, hidden_size=dim, num_hidden_layers=_num_official_layers(sd),
            max_position_embeddings=sd['bigs.embeddings.position_embeddings.weight'].shape[0],
            type_vocab_size=sd['bigs.embeddings.token_type_embeddings.weight'].shape[0],
            intermediate_size=sd['bigs.encoder.layer.0.dv.weight'].shape[0],
            num_ssm_states=sd['bigs.encoder.layer.0.fs4.kernel.A_re'].shape[0])
    except KeyError as e:
        raise ValueError(f'not an official BiGS state dict: no {e.args[0]!r}') from None
    if 'classifier.weight' in sd:
        fields['num_labels'] = sd['classifier.weight'].shape[0]
    return BiGSConfig.from_dict(fields)


def load_official_bigs_state_dict(path: Union[str, os.PathLike]) -> Dict[str, torch.Tensor]:
    """Read official BiGS weights from a ``.bin`` / ``.pt`` (torch pickle, loaded with ``weights_only=True``) or
    ``.safetensors`` file, or from a folder holding ``model.safetensors`` or ``pytorch_model.bin``."""
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in ('model.safetensors', 'pytorch_model.bin'):
            if os.path.exists(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise FileNotFoundError(f'{path} holds neither model.safetensors nor pytorch_model.bin')
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path, device='cpu')
    return torch.load(path, map_location='cpu', weights_only=True)


# official config.json fields that are not tensor shapes, read when the folder has them
_OFFICIAL_CONFIG_FIELDS = ('pad_token_id', 'layer_norm_eps', 'hidden_dropout_prob', 'initializer_range',
                           'classifier_dropout')


def _official_config_fields(directory: str, shapes: Dict[str, int]) -> dict:
    """The non-shape fields of an official folder's ``config.json``; its sizes must match the tensors."""
    path = os.path.join(directory, 'config.json')
    if not os.path.isfile(path):
        return {}
    official = read_json_file(path)
    if not isinstance(official, dict):
        raise UsageError(f'{path} holds a JSON {type(official).__name__}, not a config object')
    for name in ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'max_position_embeddings',
                 'type_vocab_size'):
        if name in official and official[name] != shapes[name]:
            raise ValueError(f'{path} says {name}={official[name]} but the weights have {shapes[name]}: the config '
                             f'does not belong to these weights')
    return {k: official[k] for k in _OFFICIAL_CONFIG_FIELDS if official.get(k) is not None}
