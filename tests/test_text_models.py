""" Tests of mlp_vision.text: gMLP / aMLP masked LM, causal gMLP LM, MLP-Attention GPT and its SDPA baseline.

Covers: the one registry (every config's max_position_embeddings, tasks, architectures); parameter counts vs the
papers (big configs built on device='meta'); the text models' SGU, gMLP block and tiny attention ARE the classes of
mlp_vision.layers; Toeplitz W; no future leakage in causal models; MLP-Attention at every length 1..T_max and
generate() from a 1-token prompt; save/load round trips (tokenizer included, legacy configs); Hugging Face output
and label conventions; exact padding for every family (a padded batch equals each sequence run alone); a short
char-level training run on Tiny Shakespeare that must reduce the loss.
"""
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

import mlp_vision.layers as layers
import mlp_vision.layers.gating as gating
import mlp_vision.text as mt
from mlp_vision.errors import UsageError
from mlp_vision.text import gmlp as text_gmlp
from mlp_vision.text.gpt import MLPAttention
from mlp_vision.text.registry import model_entry

from _helpers import n_params

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(REPO_ROOT, '..', 'shared', 'data', 'tinyshakespeare', 'input.txt')

# gMLP paper (arXiv 2105.08050) Tables 4-5, millions; ours must be within 0.5 %
GMLP_PARAMS_M = {
    'gmlp_base': 130, 'amlp_base': 109, 'gmlp_large': 365, 'amlp_large': 316, 'gmlp_xlarge': 941,
    'gmlp_18l_seq128': 59, 'gmlp_36l_seq128': 102, 'gmlp_72l_seq128': 187, 'gmlp_144l_seq128': 357,
}
# MLP-Attention paper: "6 million" vs "5.5 million"; the reference code's exact counts (its recorded
# results/Final/hyper_params.json: 5.468993 M / 6.061121 M) are pinned exactly.
GPT_PARAMS = {'gpt_mlp_attention': (6_061_121, 6.0, 0), 'gpt_sdpa': (5_468_993, 5.5, 1)}








def small_gmlp(task='masked_lm', **kw):
    cfg = dict(vocab_size=50, max_position_embeddings=16, hidden_size=32, num_hidden_layers=2, intermediate_size=64)
    cfg.update(kw)
    return mt.create_model('gmlp_base', task=task, **cfg)


def small_gpt(attention='mlp', **kw):
    cfg = dict(vocab_size=40, max_position_embeddings=16, num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
               mlp_attention_hidden_size=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg.update(kw)
    return mt.create_model('gpt_mlp_attention' if attention == 'mlp' else 'gpt_sdpa', **cfg)


# --------------------------------------------------------------------------------------------------- registry

def test_list_models():
    expected = set(GMLP_PARAMS_M) | set(GPT_PARAMS) | {'gmlp_causal_char'}
    assert expected <= set(mt.list_models())
    assert mt.list_models('amlp_*') == ['amlp_base', 'amlp_large']
    with pytest.raises(KeyError):
        mt.create_model('no_such_model')
    with pytest.raises(TypeError):
        mt.create_model('gmlp_base', no_such_field=1, device='meta')


# ------------------------------------------------------------------------------------------ parameter counts

@pytest.mark.parametrize('name', sorted(GMLP_PARAMS_M))
def test_gmlp_param_counts(name):
    model = mt.create_model(name, device='meta')
    got = n_params(model) / 1e6
    target = GMLP_PARAMS_M[name]
    assert abs(got / target - 1) <= 0.005, f'{name}: {got:.3f} M vs paper {target} M'
    assert round(got) == target  # the paper rounds to whole millions


def _gmlp_formula(c: mt.GMLPConfig) -> int:
    """The accounting documented in mlp_vision/text/gmlp.py."""
    d, f, n, a, V = c.hidden_size, c.intermediate_size, c.max_position_embeddings, c.tiny_attention_size, c.vocab_size
    block = 2 * d + (d + 1) * f + f + (2 * n - 1) + n + (f // 2 + 1) * d
    if a:
        block += (d + 1) * 3 * a + (a + 1) * (f // 2)
    return c.num_hidden_layers * block + V * d + 2 * d + V


@pytest.mark.parametrize('name', ['gmlp_base', 'amlp_large', 'gmlp_18l_seq128'])
def test_gmlp_param_accounting(name):
    model = mt.create_model(name, device='meta')
    assert n_params(model) == _gmlp_formula(model.config)
    # tied decoder: the decoder Linear's weight is the embedding's parameter, counted once
    assert model.decoder.weight is model.gmlp.embed.weight


@pytest.mark.parametrize('name', sorted(GPT_PARAMS))
def test_gpt_param_counts(name):
    exact, paper_m, decimals = GPT_PARAMS[name]
    got = n_params(mt.create_model(name, device='meta'))
    assert got == exact
    assert round(got / 1e6, decimals) == paper_m


# ------------------------------------------------------------------------------------ shared block identity

def test_text_models_use_shared_block_classes():
    # the text module imports the very class objects of mlp_vision.layers (no copies)
    assert text_gmlp.GatedMLPBlock is gating.GatedMLPBlock is layers.GatedMLPBlock
    models = [
        small_gmlp(), small_gmlp(tiny_attention_size=8), small_gmlp('sequence_classification', tiny_attention_size=8),
        small_gmlp('causal_lm', spatial_mode='causal', tiny_attention_size=8),
        mt.create_model('amlp_base', device='meta'),
    ]
    for model in models:
        blocks = model.gmlp.blocks
        for block in blocks:
            assert isinstance(block, layers.GatedMLPBlock) and type(block) is layers.GatedMLPBlock
            assert type(block.sgu) is layers.SpatialGatingUnit is gating.SpatialGatingUnit
            if model.config.tiny_attention_size:
                assert type(block.attn) is layers.TinyAttention is gating.TinyAttention
            else:
                assert block.attn is None
        # every module is a torch / timm / mlp_vision.layers class, or one of the text wrappers themselves
        for m in model.modules():
            mod = type(m).__module__
            assert not mod.startswith('mlp_vision.') or mod.startswith('mlp_vision.layers') or \
                type(m) in (mt.GMLPModel, mt.GMLPForMaskedLM, mt.GMLPForSequenceClassification,
                            mt.GMLPForCausalLM), type(m)
    # aMLP_base: 64-d tiny attention -> d_ffn / 2; aMLP_large: 128-d
    amlp = mt.create_model('amlp_large', device='meta')
    assert amlp.gmlp.blocks[0].attn.attn_dim == 128
    assert amlp.gmlp.blocks[0].attn.proj.out_features == 3072 // 2


def test_sgu_init_survives_model_init():
    model = small_gmlp(tiny_attention_size=8)
    for block in model.gmlp.blocks:
        assert block.sgu.weight.abs().max() < 1e-4  # W ~ 0 (std 1e-6)
        assert torch.equal(block.sgu.bias, torch.ones_like(block.sgu.bias))  # b = 1


def test_toeplitz_weight():
    n = 16
    model = small_gmlp(max_position_embeddings=n)
    for block in model.gmlp.blocks:
        sgu = block.sgu
        assert sgu.spatial_mode == 'toeplitz'
        assert tuple(sgu.weight.shape) == (2 * n - 1,)
        with torch.no_grad():
            sgu.weight.copy_(torch.randn(2 * n - 1))
        W = sgu.spatial_weight(n)
        i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing='ij')
        assert torch.equal(W, sgu.weight[i - j + n - 1])
        assert torch.equal(W[1:, 1:], W[:-1, :-1])  # constant along diagonals
        assert torch.equal(sgu.spatial_weight(5), W[:5, :5])  # shorter inputs: leading block, still Toeplitz


# ------------------------------------------------------------------------------------------------ causality

CAUSAL_MODELS = {
    'gmlp_causal': lambda: small_gmlp('causal_lm', spatial_mode='causal', tie_word_embeddings=False),
    'amlp_causal': lambda: small_gmlp('causal_lm', spatial_mode='causal', tiny_attention_size=8),
    'gpt_mlp_attention': lambda: small_gpt('mlp'),
    'gpt_sdpa': lambda: small_gpt('sdpa'),
}


def _randomize_sgu(model):
    # W ~ 1e-6 at init would hide a leak through the spatial projection: make it O(1)
    for m in model.modules():
        if isinstance(m, layers.SpatialGatingUnit):
            with torch.no_grad():
                m.weight.normal_(std=0.5)


@pytest.mark.parametrize('name', sorted(CAUSAL_MODELS))
def test_causal_models_leak_no_future(name):
    torch.manual_seed(0)
    model = CAUSAL_MODELS[name]().eval()
    _randomize_sgu(model)
    V, T = model.config.vocab_size, model.config.max_position_embeddings
    x = torch.randint(V, (2, T))
    with torch.no_grad():
        ref = model(x).logits
        for t in (0, 3, T - 2):
            y = x.clone()
            y[:, t + 1] = (y[:, t + 1] + 1 + torch.arange(2)) % V  # change token t + 1
            y[:, t + 2:] = torch.randint(V, (2, T - t - 2))        # and everything after it
            out = model(y).logits
            torch.testing.assert_close(out[:, :t + 1], ref[:, :t + 1], rtol=0, atol=1e-5)
            assert not torch.allclose(out[:, t + 1], ref[:, t + 1])  # the changed token is seen from t + 1 on


# ----------------------------------------------------------------------------------------- MLP-Attention

def test_mlp_attention_every_length(single_thread):
    torch.manual_seed(0)
    T_max = 256  # the paper's context, narrow model
    model = small_gpt('mlp', max_position_embeddings=T_max, hidden_size=16, mlp_attention_hidden_size=8,
                      num_hidden_layers=1).eval()
    x = torch.randint(model.config.vocab_size, (2, T_max))
    with torch.no_grad():
        full = model(x).logits
        for T in range(1, T_max + 1):
            out = model(x[:, :T]).logits
            assert out.shape == (2, T, model.config.vocab_size)
            # a prefix sees exactly what it sees inside the full sequence (slicing of the logit MLP is right)
            torch.testing.assert_close(out, full[:, :T], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        model(torch.zeros(1, T_max + 1, dtype=torch.long))


def test_mlp_attention_paper_config_lengths_and_generate():
    torch.manual_seed(0)
    model = mt.create_model('gpt_mlp_attention').eval()
    assert isinstance(model.blocks[0].attn, MLPAttention)
    with torch.no_grad():
        for T in (1, 2, 100, 255, 256):
            assert model(torch.randint(65, (1, T))).logits.shape == (1, T, 65)
    out = model.generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=5, do_sample=True, top_k=10)
    assert out.shape == (1, 6) and out[0, 0] == 0 and int(out.max()) < 65


@pytest.mark.parametrize('name', ['gpt_mlp_attention', 'gpt_sdpa', 'gmlp_causal'])
def test_generate_from_one_token(name):
    torch.manual_seed(0)
    if name == 'gmlp_causal':
        model = CAUSAL_MODELS[name]()
    else:
        model = small_gpt('mlp' if name == 'gpt_mlp_attention' else 'sdpa', hidden_dropout_prob=0.2,
                          attention_probs_dropout_prob=0.2)
    model.train()  # generate() must switch dropout off itself and restore the mode
    prompt = torch.tensor([[3], [7]])
    n_new = model.config.max_position_embeddings + 5  # runs past the context: cropped to its last tokens
    out = model.generate(prompt, max_new_tokens=n_new, do_sample=True, temperature=0.8, top_k=5)
    assert out.shape == (2, 1 + n_new) and torch.equal(out[:, :1], prompt)
    assert model.training  # mode restored
    g1 = model.generate(prompt, max_new_tokens=8, do_sample=False)
    g2 = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(g1, g2)  # greedy is deterministic (dropout off during sampling)
    # greedy decoding is the argmax of our forward on the (cropped) prefix, step by step
    model.eval()
    ids = prompt
    with torch.no_grad():
        for _ in range(8):
            ids = torch.cat([ids, model(ids[:, -model.config.max_position_embeddings:]).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(g1, ids)
    torch.manual_seed(1)
    s1 = model.generate(prompt, max_new_tokens=8, do_sample=True)
    torch.manual_seed(1)
    s2 = model.generate(prompt, max_new_tokens=8, do_sample=True)
    assert torch.equal(s1, s2)


# ------------------------------------------------------------------------------------------ save / load

ROUNDTRIP = {
    'amlp_mlm': lambda: small_gmlp(tiny_attention_size=8),
    'gmlp_cls': lambda: small_gmlp('sequence_classification', num_labels=3),
    'gmlp_causal': CAUSAL_MODELS['gmlp_causal'],
    'gpt_mlp_attention': lambda: small_gpt('mlp'),
    'gpt_sdpa': lambda: small_gpt('sdpa'),
    'bert_mlm': lambda: _bert(),
    'bigs_cls': lambda: _bigs(task='sequence_classification', num_labels=3),
}


@pytest.mark.parametrize('name', sorted(ROUNDTRIP))
def test_save_load_roundtrip(name, tmp_path):
    torch.manual_seed(0)
    model = ROUNDTRIP[name]().eval()
    _randomize_sgu(model)
    x = torch.randint(model.config.vocab_size, (2, 12))
    model.save_pretrained(str(tmp_path))
    generates = isinstance(model, (mt.GMLPForCausalLM, mt.GPTLanguageModel))
    assert sorted(os.listdir(tmp_path)) == ['config.json'] + ['generation_config.json'] * generates + \
        ['model.safetensors']
    for loaded in (type(model).from_pretrained(str(tmp_path)), mt.from_pretrained(str(tmp_path))):
        assert type(loaded) is type(model) and loaded.config.text_fields() == model.config.text_fields()
        loaded.eval()
        with torch.no_grad():
            assert torch.equal(loaded(x).logits, model(x).logits)
        sd, sd2 = model.state_dict(), loaded.state_dict()
        assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    if isinstance(model, mt.GMLPForMaskedLM):  # tying survives the round trip
        assert loaded.decoder.weight is loaded.gmlp.embed.weight


def test_masked_lm_checkpoint_into_classifier(tmp_path):
    torch.manual_seed(0)
    mlm = small_gmlp(tiny_attention_size=8)
    mlm.save_pretrained(str(tmp_path))
    clf = mt.GMLPForSequenceClassification.from_pretrained(str(tmp_path), num_labels=4)
    assert clf.config.num_labels == 4
    for k, v in mlm.gmlp.state_dict().items():
        assert torch.equal(clf.gmlp.state_dict()[k], v)
    small_gpt().save_pretrained(str(tmp_path / 'gpt'))
    with pytest.raises(TypeError):  # a GPT checkpoint is not a gMLP
        mt.GMLPForMaskedLM.from_pretrained(str(tmp_path / 'gpt'))


# ---------------------------------------------------------------- initialisation: transformers' _init_weights path

def test_text_models_override_no_transformers_internals():
    """Our classes redefine only what transformers' own modeling files set or extend -- ``_init_weights``, the class
    attributes (``_tied_weights_keys``, ``_input_embed_layer``, ``config_class``, ...), ``forward`` -- and the public
    ``post_init`` / ``from_pretrained`` / ``save_pretrained`` / ``from_dict``; no internal such as
    ``get_init_context`` or ``_move_missing_keys_from_meta_to_device``, which may change in any release."""
    from transformers import PreTrainedConfig, PreTrainedModel
    allowed = {PreTrainedModel: {'_init_weights', '_tied_weights_keys', '_input_embed_layer', 'base_model_prefix',
                                 'config_class', 'main_input_name', 'forward', 'post_init', 'from_pretrained',
                                 'save_pretrained'},
               PreTrainedConfig: {'model_type', 'from_dict', 'from_pretrained'}}
    for name in mt.list_architectures():
        cls = mt.architecture_class(name)
        for base, theirs in ((cls, PreTrainedModel), (cls.config_class, PreTrainedConfig)):
            redefined = {k for c in base.__mro__ if c.__module__.startswith('mlp_vision') for k in vars(c)
                         if hasattr(theirs, k) and not (k.startswith('__') and k.endswith('__'))}
            assert redefined <= allowed[theirs], (base.__name__, sorted(redefined - allowed[theirs]))


def _index_buffers(model):
    """(name, buffer, its value recomputed from its definition) for every non-persistent buffer of ``model``."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, layers.SpatialGatingUnit) and m.toeplitz_index is not None:
            i, j = torch.meshgrid(torch.arange(m.seq_len), torch.arange(m.seq_len), indexing='ij')
            found.append((f'{name}.toeplitz_index', m.toeplitz_index, i - j + m.seq_len - 1))
        elif isinstance(m, MLPAttention):
            n = m.seq_len
            found.append((f'{name}.causal_mask', m.causal_mask,
                          torch.tensor([[j <= i for j in range(n)] for i in range(n)])))
    return found


@pytest.mark.parametrize('name', sorted(ROUNDTRIP))
def test_from_pretrained_gives_the_non_persistent_buffers_their_values(name, tmp_path):
    """from_pretrained builds on the meta device and fills what the weights file does not hold in _init_weights:
    the index buffers equal their definitions (and their values in the saved model)."""
    torch.manual_seed(0)
    model = ROUNDTRIP[name]()
    model.save_pretrained(str(tmp_path))
    loaded = mt.from_pretrained(str(tmp_path))
    expected = {'amlp_mlm': 2, 'gmlp_cls': 2, 'gmlp_causal': 0, 'gpt_mlp_attention': 2, 'gpt_sdpa': 0,
                'bert_mlm': 0, 'bigs_cls': 0}[name]
    assert len(_index_buffers(loaded)) == expected
    assert dict(loaded.named_buffers()).keys() == dict(model.named_buffers()).keys()
    for buf_name, buf, definition in _index_buffers(loaded):
        assert buf.device.type == 'cpu' and torch.equal(buf, definition), buf_name
        assert torch.equal(buf, model.get_buffer(buf_name)), buf_name


@pytest.mark.parametrize('family, source_task, task, head', [
    ('gmlp', 'masked_lm', 'sequence_classification', ('classifier',)),
    ('bert', 'masked_lm', 'sequence_classification', ('pooler.dense', 'classifier')),
    ('bigs', 'masked_lm', 'sequence_classification', ('pooler.dense', 'classifier')),
    ('gmlp', 'base', 'masked_lm', ()),
    ('bigs', 'base', 'masked_lm', ('mlm_head.dense',)),
])
def test_a_head_the_folder_lacks_is_initialised_by_the_config(family, source_task, task, head, tmp_path):
    """A folder of another task of the family loads its backbone and gets a new head drawn as a direct build draws
    it (Linear ~ N(0, initializer_range), biases 0, LayerNorm 1 / 0, output bias 0): an initializer_range of 0.17
    given to from_pretrained (a std no other init uses) shows the head came from _init_weights on that config."""
    make = {'gmlp': lambda t: small_gmlp(t), 'bert': lambda t: _bert(task=t), 'bigs': lambda t: _bigs(task=t)}[family]
    torch.manual_seed(0)
    source = make(source_task)
    source.save_pretrained(str(tmp_path))
    model = mt.model_class(family, task).from_pretrained(str(tmp_path), initializer_range=0.17, num_labels=3)
    loaded = model.base_model.state_dict()
    for k, v in source.base_model.state_dict().items():  # the backbone is the folder's
        assert torch.equal(loaded[k], v), k
    for prefix in head:
        linear = model.get_submodule(prefix)
        std = linear.weight.std().item()
        assert 0.17 * 0.85 < std < 0.17 * 1.15 and abs(linear.weight.mean().item()) < 0.05, (prefix, std)
        assert torch.equal(linear.bias, torch.zeros_like(linear.bias)), prefix
    if task == 'masked_lm':
        assert torch.equal(model.output_bias, torch.zeros_like(model.output_bias))
        assert model.decoder.weight is model.get_input_embeddings().weight  # tied to the loaded embedding
        if hasattr(model, 'mlm_head'):
            assert torch.equal(model.mlm_head.norm.weight, torch.ones_like(model.mlm_head.norm.weight))
            assert torch.equal(model.mlm_head.norm.bias, torch.zeros_like(model.mlm_head.norm.bias))


def test_init_weights_draws_our_layers_as_their_own_init():
    """_init_weights (re)draws the tensors our layers make themselves -- the SGU's W, b and Toeplitz index, the S4D
    kernel and D, MLP-Attention's second layers and causal mask -- exactly as the layers' own init does from the
    same random state, so a model built directly keeps the init it had when only the layers drew them."""
    from mlp_vision.layers import S4DKernel, S4DLayer
    cases = [(small_gmlp(), layers.SpatialGatingUnit, lambda m, model: m.init_weights()),
             (_bigs(), S4DKernel, lambda m, model: m.init_weights()),
             (_bigs(), S4DLayer, lambda m, model: m.init_weights()),
             (small_gpt(), MLPAttention, lambda m, model: m.init_weights(model.config.initializer_range))]
    for model, kind, own_init in cases:
        module = next(m for m in model.modules() if isinstance(m, kind))

        def own_tensors():  # the module's own parameters and buffers (its children are transformers' to init)
            return dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
        expected_keys = {'SpatialGatingUnit': {'weight', 'bias', 'toeplitz_index'}, 'S4DLayer': {'D'},
                         'S4DKernel': {'log_step', 'A_re', 'A_im', 'C'}, 'MLPAttention': {'fc2_weight', 'causal_mask'}}
        assert set(own_tensors()) == expected_keys[kind.__name__]
        torch.manual_seed(7)
        own_init(module, model)
        expected = {k: v.clone() for k, v in own_tensors().items()}
        with torch.no_grad():
            for t in own_tensors().values():
                t.fill_(float('nan') if t.is_floating_point() else 0)
            torch.manual_seed(7)
            model._init_weights(module)
        got = own_tensors()
        assert all(torch.equal(got[k], expected[k]) for k in got), kind.__name__


def test_a_seeded_direct_build_is_reproducible_and_keeps_the_layer_inits():
    from mlp_vision.layers import S4DKernel, S4DLayer
    for make in (small_gmlp, _bigs, small_gpt, _bert):
        torch.manual_seed(3)
        a = make().state_dict()
        torch.manual_seed(3)
        b = make().state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for m in _bigs().modules():
        if isinstance(m, S4DKernel):
            assert torch.all(m.A_re == -0.5) and torch.equal(m.A_im, math.pi * torch.arange(4.))
            assert math.log(m.dt_min) <= m.log_step.item() <= math.log(m.dt_max)
        elif isinstance(m, S4DLayer):
            assert m.D.item() == 1.0


# ------------------------------------------------------------------------------------ Hugging Face conventions

def test_masked_lm_and_classification_heads():
    torch.manual_seed(0)
    tok = mt.byte_tokenizer()
    mlm = small_gmlp(vocab_size=tok.vocab_size, tiny_attention_size=8)
    enc = tok('hello world', max_length=16, padding='max_length', return_tensors='pt')
    ids, mask = enc['input_ids'], enc['attention_mask']
    labels = torch.full_like(ids, -100)
    labels[0, 3] = ids[0, 3]
    masked = ids.clone()
    masked[0, 3] = tok.mask_token_id
    out = mlm(masked, attention_mask=mask, labels=labels)
    assert out.logits.shape == (1, 16, tok.vocab_size) and torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[0, 3:4], ids[0, 3:4]))  # only scored position
    clf = small_gmlp('sequence_classification', vocab_size=tok.vocab_size, num_labels=3).eval()
    out = clf(ids, attention_mask=mask, labels=torch.tensor([2]))
    assert out.logits.shape == (1, 3) and torch.isfinite(out.loss)
    with torch.no_grad():  # the prediction is read at <cls> (position 0) of the last layer
        h = clf.gmlp(ids, mask).last_hidden_state[:, 0]
        torch.testing.assert_close(out.logits, clf.classifier(h))
    with pytest.raises(ValueError, match='sequence length 17'):
        mlm(torch.zeros(1, 17, dtype=torch.long))  # longer than max_position_embeddings


def test_output_is_indexed_like_transformers_model_output():
    """loss first when labels are given (out[0] is what transformers' Trainer reads), logits otherwise."""
    torch.manual_seed(0)
    model = small_gmlp().eval()
    x = torch.randint(50, (2, 9))
    with torch.no_grad():
        out = model(x)
        assert list(out.keys()) == ['logits'] and 'loss' not in out and out.loss is None
        assert out[0] is out.logits is out['logits'] and out.to_tuple() == (out.logits,)
        out = model(x, labels=x)
    assert list(out.keys()) == ['loss', 'logits'] and out[0] is out.loss and out[1] is out.logits
    assert out.to_tuple() == (out.loss, out.logits) and out[1:] == (out.logits,)
    with pytest.raises(KeyError):
        out['hidden_states']
    # a pytree node: torch.utils._pytree sees the tensors (torch.compile, torch.export, DDP)
    import torch.utils._pytree as pytree
    leaves, spec = pytree.tree_flatten(out)
    assert len(leaves) == 2 and leaves[0] is out.loss
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert type(rebuilt) is type(out) and rebuilt.logits is out.logits
    import copy
    import pickle
    for clone in (copy.deepcopy(out), pickle.loads(pickle.dumps(out))):
        assert list(clone.keys()) == ['loss', 'logits'] and torch.equal(clone.logits, out.logits)


@pytest.mark.parametrize('name', ['gmlp_causal', 'gpt_mlp_attention', 'gpt_sdpa'])
def test_causal_lm_labels_are_shifted_inside(name):
    """transformers' convention: labels = input_ids; position t is scored on token t + 1."""
    torch.manual_seed(0)
    model = CAUSAL_MODELS[name]().eval()
    x = torch.randint(model.config.vocab_size, (2, 12))
    labels = x.clone()
    labels[1, 5] = -100  # not scored: the prediction made at position 4
    with torch.no_grad():
        out = model(x, labels=labels)
    logits = out.logits[:, :-1]
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_bad_attention_masks_stop_with_one_line():
    model = small_gmlp().eval()
    x = torch.randint(50, (2, 8))
    left = torch.ones(2, 8, dtype=torch.long)
    left[0, :2] = 0
    with pytest.raises(ValueError, match='right padding'):
        model(x, attention_mask=left)
    with pytest.raises(ValueError, match='1 \\(real token\\) or 0'):
        model(x, attention_mask=x)  # token ids where the mask goes
    with pytest.raises(ValueError, match='attention_mask shape'):
        model(x, attention_mask=torch.ones(2, 7))
    bigs = mt.create_model('bigs_small', num_hidden_layers=1, hidden_size=16, intermediate_size=24, num_ssm_states=4)
    with pytest.raises(ValueError, match='token_type_ids shape'):
        bigs(x, token_type_ids=torch.zeros(2, 9, dtype=torch.long))


# ------------------------------------------------------------------------------------------------- padding

def _bigs(**kw):
    cfg = dict(vocab_size=50, pad_token_id=0, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
               num_ssm_states=4, max_position_embeddings=16, hidden_dropout_prob=0.0, initializer_range=0.3)
    return mt.create_model('bigs_small', **{**cfg, **kw})


def _bert(**kw):
    cfg = dict(vocab_size=50, pad_token_id=0, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=2, max_position_embeddings=16, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, initializer_range=0.3)
    return mt.create_model('bert_small', **{**cfg, **kw})


# one small model of every family and head; what each returns for a sequence is compared with and without padding
PADDING_MODELS = {
    'gmlp_mlm': lambda: small_gmlp(),
    'amlp_mlm': lambda: small_gmlp(tiny_attention_size=8),
    'amlp_cls': lambda: small_gmlp('sequence_classification', tiny_attention_size=8),
    'gmlp_causal': lambda: small_gmlp('causal_lm', spatial_mode='causal', tiny_attention_size=8),
    'gpt_mlp_attention': lambda: small_gpt('mlp'),
    'gpt_sdpa': lambda: small_gpt('sdpa'),
    'bigs_mlm': lambda: _bigs(),
    'bigs_cls': lambda: _bigs(task='sequence_classification'),
    'bert_mlm': lambda: _bert(),
    'bert_cls': lambda: _bert(task='sequence_classification'),
    # the other classifier_pooling of each family
    'gmlp_cls_mean': lambda: small_gmlp('sequence_classification', classifier_pooling='mean'),
    'bigs_cls_cls': lambda: _bigs(task='sequence_classification', classifier_pooling='cls'),
    'bert_cls_mean': lambda: _bert(task='sequence_classification', classifier_pooling='mean'),
}


@pytest.mark.parametrize('name', sorted(PADDING_MODELS))
def test_padding_never_changes_real_outputs(name):
    """A right-padded batch gives every sequence exactly the outputs it gets alone; pads are random tokens (not
    just the pad id) so that any leak would show."""
    torch.manual_seed(0)
    model = PADDING_MODELS[name]().double().eval()
    _randomize_sgu(model)
    g = torch.Generator().manual_seed(1)
    lengths, total = (5, 11, 16), 16
    rows = [torch.randint(1, 50 if 'gpt' not in name else 40, (n,), generator=g) for n in lengths]
    ids = torch.randint(1, 40, (len(rows), total), generator=g)
    mask = torch.zeros(len(rows), total, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        for i, r in enumerate(rows):
            alone = model(r[None]).logits[0]
            got = batch[i] if batch.dim() == 2 else batch[i, :len(r)]
            torch.testing.assert_close(got, alone, rtol=1e-9, atol=1e-9)
        if 'causal' not in name and 'gpt' not in name:  # control: without the mask the pads do reach real tokens
            unmasked = model(ids).logits
            assert not torch.allclose(unmasked[0], batch[0], atol=1e-6)


CLASSIFIERS = {  # family -> (small classifier with the given pooling, its encoder attribute, its pooler dense or None)
    'gmlp': (lambda **kw: small_gmlp('sequence_classification', **kw), 'gmlp', None),
    'bigs': (lambda **kw: _bigs(task='sequence_classification', **kw), 'bigs', 'pooler'),
    'bert': (lambda **kw: _bert(task='sequence_classification', **kw), 'bert', 'pooler'),
}


@pytest.mark.parametrize('pooling', ['cls', 'mean'])
@pytest.mark.parametrize('family', sorted(CLASSIFIERS))
def test_classifier_pooling_reads_the_cls_state_or_the_mean_of_real_tokens(family, pooling):
    """classifier_pooling: the logits are the head applied to the encoder's state at position 0 ('cls') or to the
    average of the real tokens' states ('mean'), computed here from the encoder's own output row by row."""
    build, encoder_name, pooler = CLASSIFIERS[family]
    torch.manual_seed(0)
    model = build(classifier_pooling=pooling).double().eval()
    assert model.config.classifier_pooling == pooling
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 50, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    with torch.no_grad():
        hidden = getattr(model, encoder_name)(ids, mask).last_hidden_state
        want = []
        for i in range(3):
            n = int(mask[i].sum())
            vec = hidden[i, 0] if pooling == 'cls' else hidden[i, :n].sum(0) / n
            if pooler is not None:
                vec = torch.tanh(getattr(model, pooler).dense(vec))
            want.append(model.classifier(vec))
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, torch.stack(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('family', sorted(CLASSIFIERS))
def test_classifier_pooling_unknown_value_stops(family):
    with pytest.raises(ValueError, match=r"classifier_pooling must be one of \('cls', 'mean'\), got 'max'"):
        CLASSIFIERS[family][0](classifier_pooling='max')


def test_gmlp_mask_padding_false_is_the_papers_unmasked_sgu():
    """mask_padding=False: the SGU mixes pads into real positions, as the paper (§4); only the tiny attention masks."""
    torch.manual_seed(0)
    n_real, L = 10, 16
    ids = torch.randint(4, 50, (1, L))
    mask = (torch.arange(L) < n_real).long()[None]
    other = ids.clone()
    other[:, n_real:] = 3  # different content in the padded slots
    for size in (0, 8):
        model = small_gmlp(tiny_attention_size=size, mask_padding=False).eval()
        _randomize_sgu(model)
        with torch.no_grad():
            a, b = model(ids, attention_mask=mask).logits, model(other, attention_mask=mask).logits
        assert not torch.allclose(a[:, :n_real], b[:, :n_real], atol=1e-4)


# ------------------------------------------------------------------------------ configs: one naming scheme

def test_every_registered_config_names_its_maximum_length():
    for name in mt.list_models():
        entry = mt.model_config(name)
        model = mt.create_model(name, device='meta')
        assert model.config.max_position_embeddings == entry['max_position_embeddings'] > 0
        for field in ('vocab_size', 'hidden_size', 'num_hidden_layers', 'intermediate_size', 'initializer_range'):
            assert hasattr(model.config, field), (name, field)
        assert type(model) is mt.model_class(entry['family'], entry['task'])
    assert mt.model_config('bigs_large_4096')['max_position_embeddings'] == 4096
    assert mt.model_config('gpt_sdpa', max_position_embeddings=64)['max_position_embeddings'] == 64
    with pytest.raises(ValueError, match="family 'gpt' has no task 'masked_lm'"):
        mt.create_model('gpt_sdpa', task='masked_lm')
    assert set(mt.list_architectures()) >= {'GMLPForMaskedLM', 'BiGSForSequenceClassification', 'BertModel',
                                            'GPTLanguageModel'}


def test_unknown_config_fields_are_one_clear_line(tmp_path):
    """A field name a config does not have (a misspelling, or a name no release ever had) stops with one line naming
    it and the fields there are, from a command line's keywords and from a config.json alike."""
    with pytest.raises(TypeError, match="GMLPConfig has no field 'no_such_field'; its fields are .*hidden_size"):
        mt.create_model('gmlp_base', no_such_field=1, device='meta')
    for name, field in (('gmlp_base', 'dim'), ('gpt_sdpa', 'n_embd'), ('bigs_small', 'num_ssm')):
        with pytest.raises(TypeError, match=f"has no field '{field}'"):
            mt.create_model(name, **{field: 32}, device='meta')
    model = small_gmlp()
    model.save_pretrained(str(tmp_path))
    cfg_path = tmp_path / 'config.json'
    payload = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**payload, 'dim': payload['hidden_size']}))
    with pytest.raises(UsageError, match=r"config\.json: GMLPConfig has no field 'dim'") as e:
        mt.from_pretrained(str(tmp_path))
    assert '\n' not in str(e.value)
    # a config.json of another layout (not transformers' flat one) is not ours
    cfg_path.write_text(json.dumps({'architecture': 'GMLPForMaskedLM', 'config': {}, 'format_version': 1}))
    with pytest.raises(ValueError, match='is not a config written by save_pretrained'):
        mt.from_pretrained(str(tmp_path))


def test_save_pretrained_keeps_the_tokenizer(tmp_path):
    torch.manual_seed(0)
    tok = mt.char_tokenizer('abcdefgh ', special_tokens=['<pad>', '<cls>', '<sep>', '<mask>'])
    model = small_gmlp(vocab_size=tok.vocab_size).eval()
    assert model.tokenizer is None
    model.save_pretrained(str(tmp_path), tokenizer=tok)
    loaded = mt.from_pretrained(str(tmp_path))
    assert loaded.tokenizer.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    loaded.save_pretrained(str(tmp_path / 'again'))  # the attached tokenizer goes along
    assert mt.load_tokenizer(str(tmp_path / 'again')).backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    small_gmlp().save_pretrained(str(tmp_path / 'bare'))
    assert mt.from_pretrained(str(tmp_path / 'bare')).tokenizer is None
    with pytest.raises(TypeError, match='pass the tokenizer as tokenizer='):  # not transformers' is_main_process
        model.save_pretrained(str(tmp_path / 'positional'), tok)


# ------------------------------------------------------------------------------------- training on real text

def _shakespeare():
    if not os.path.exists(SHAKESPEARE):
        pytest.skip(f'Tiny Shakespeare not found at {os.path.normpath(SHAKESPEARE)} '
                    '(../shared/data/tinyshakespeare/input.txt relative to the repo root)')
    with open(SHAKESPEARE, encoding='utf-8') as f:
        return f.read()


@pytest.mark.parametrize('name', ['gpt_mlp_attention', 'gmlp_causal_char'])
def test_char_lm_training_reduces_loss(name, single_thread):
    text = _shakespeare()
    tok = mt.char_tokenizer(text)
    assert tok.vocab_size == 65  # the paper's / nanoGPT's vocabulary
    data = torch.tensor(tok.encode(text, add_special_tokens=False), dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    torch.manual_seed(0)
    T, B, steps = 32, 16, 100  # ~15 ms per step on one thread
    if name == 'gpt_mlp_attention':
        model = mt.create_model(name, max_position_embeddings=T, num_hidden_layers=2, num_attention_heads=2,
                                hidden_size=64, mlp_attention_hidden_size=32, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0)
    else:
        model = mt.create_model(name, max_position_embeddings=T, num_hidden_layers=2, hidden_size=64,
                                intermediate_size=256)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)

    def batch(split):
        ix = torch.randint(len(split) - T, (B,), generator=g)
        return torch.stack([split[i:i + T] for i in ix])

    vx = batch(val)  # fixed held-out batch; labels = inputs (shifted inside the model)
    with torch.no_grad():
        model.eval()
        val0 = model(vx, labels=vx).loss.item()
    model.train()
    for _ in range(steps):
        x = batch(train)
        loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        model.eval()
        val1 = model(vx, labels=vx).loss.item()
    # start near ln(65) = 4.17; 100 steps (~2.5 measured) must bring the held-out loss well below the unigram
    # level of this text (~3.3 nats)
    assert val0 > 3.9, val0
    assert val1 < 3.0, (val0, val1)


def test_bert_baseline_layer_is_post_ln_multihead_attention():
    """The BERT baseline of the BiGS comparisons computes the textbook post-LN layer (explicit softmax attention)."""
    import math
    import torch.nn.functional as F
    from mlp_vision.text.bert import BertLayer
    torch.manual_seed(0)
    layer = BertLayer(dim=32, num_heads=4, ffn_dim=48).eval()
    x = torch.randn(2, 7, 32)
    a = layer.attn
    q, k, v = (p(x).view(2, 7, 4, 8).transpose(1, 2) for p in (a.query, a.key, a.value))
    ctx = (q @ k.transpose(-1, -2) / math.sqrt(8)).softmax(-1) @ v
    h = layer.norm1(x + a.out(ctx.transpose(1, 2).reshape(2, 7, 32)))
    expected = layer.norm2(h + layer.fc2(F.gelu(layer.fc1(h))))
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def _bert_to_transformers(ours: dict, num_layers: int) -> dict:
    """Our BERT state dict under ``transformers``' BertForMaskedLM / BertForSequenceClassification names."""
    names = {'bert.embeddings.norm.': 'bert.embeddings.LayerNorm.', 'mlm_head.dense.': 'cls.predictions.transform.dense.',
             'mlm_head.norm.': 'cls.predictions.transform.LayerNorm.', 'pooler.dense.': 'bert.pooler.dense.'}
    for i in range(num_layers):
        ours_layer, theirs = f'bert.layers.{i}.', f'bert.encoder.layer.{i}.'
        names.update({ours_layer + a: theirs + b for a, b in [
            ('attn.query.', 'attention.self.query.'), ('attn.key.', 'attention.self.key.'),
            ('attn.value.', 'attention.self.value.'), ('attn.out.', 'attention.output.dense.'),
            ('norm1.', 'attention.output.LayerNorm.'), ('fc1.', 'intermediate.dense.'), ('fc2.', 'output.dense.'),
            ('norm2.', 'output.LayerNorm.')]})
    out = {}
    for key, value in ours.items():
        if key == 'decoder.weight':  # tied: the word embedding (transformers ties it the same way)
            assert value is ours['bert.embeddings.word_embeddings.weight'] or torch.equal(
                value, ours['bert.embeddings.word_embeddings.weight'])
            continue
        if key == 'output_bias':
            out['cls.predictions.bias'] = value
            continue
        prefix = next((p for p in names if key.startswith(p)), None)
        out[names[prefix] + key[len(prefix):] if prefix else key] = value
    return out


@pytest.mark.parametrize('task', ['masked_lm', 'sequence_classification'])
def test_bert_baseline_equals_transformers_bert(task, single_thread):
    """The study's BERT baseline (``bert_small``) is BERT: given the same weights, ``transformers``' BertForMaskedLM /
    BertForSequenceClassification give the same logits, with right padding and two segments."""
    transformers = pytest.importorskip('transformers', reason='transformers is not installed (test-only dependency)')
    small = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=16, hidden_dropout_prob=0., attention_probs_dropout_prob=0., pad_token_id=0)
    torch.manual_seed(0)
    ours = mt.create_model('bert_small', task=task, **small, **({'num_labels': 3} if task != 'masked_lm' else {}))
    with torch.no_grad():  # LayerNorms and biases away from their init, so a swapped or missing one shows
        for name, p in ours.named_parameters():
            if name.endswith('bias') or 'norm' in name:
                p.add_(0.1 * torch.randn_like(p))
    ours.eval()
    hf_config = transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=16, type_vocab_size=2, hidden_act='gelu', layer_norm_eps=1e-12, pad_token_id=0,
        hidden_dropout_prob=0., attention_probs_dropout_prob=0., num_labels=3, classifier_dropout=0.)
    hf_class = transformers.BertForMaskedLM if task == 'masked_lm' else transformers.BertForSequenceClassification
    theirs = hf_class(hf_config).eval()
    state = _bert_to_transformers(ours.state_dict(), 2)
    if task == 'masked_lm':
        state['cls.predictions.decoder.weight'] = state['bert.embeddings.word_embeddings.weight']
        state['cls.predictions.decoder.bias'] = state['cls.predictions.bias']
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all('position_ids' in k for k in missing), (missing, unexpected)
    ids = torch.randint(1, 60, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    segments = (torch.arange(12) >= 6).long().expand(3, 12).contiguous()
    with torch.no_grad():
        got = ours(ids, attention_mask=mask, token_type_ids=segments).logits
        want = theirs(input_ids=ids, attention_mask=mask, token_type_ids=segments).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('name', ['gmlp_base', 'amlp_base', 'bigs_small', 'bert_small'])
def test_sparse_prediction_decodes_scored_positions_only(name, single_thread):
    """``sparse_prediction``: the logits are the dense model's rows at the scored positions, and the loss and every
    gradient equal the dense model's (the head is per-token, so skipping unscored positions changes nothing)."""
    small = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=16)
    if name in ('bigs_small', 'bert_small'):
        small['pad_token_id'] = 0
    if name == 'amlp_base':
        small['tiny_attention_size'] = 8
    if name == 'bigs_small':
        small['num_ssm_states'] = 4
    if name == 'bert_small':
        small['num_attention_heads'] = 2
    torch.manual_seed(0)
    dense = mt.create_model(name, task='masked_lm', **small).eval()
    sparse = mt.create_model(name, task='masked_lm', sparse_prediction=True, **small).eval()
    sparse.load_state_dict(dense.state_dict())
    x = torch.randint(1, 50, (3, 16))
    labels = torch.full_like(x, -100)
    scored = torch.rand(x.shape) < 0.2
    scored[0, 3] = True
    labels[scored] = x[scored]
    out_d, out_s = dense(input_ids=x, labels=labels), sparse(input_ids=x, labels=labels)
    assert out_s.logits.shape == (int(scored.sum()), 50)
    torch.testing.assert_close(out_s.logits, out_d.logits[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_s.loss, out_d.loss, rtol=1e-5, atol=1e-6)
    out_d.loss.backward()
    out_s.loss.backward()
    for (n, p_d), p_s in zip(dense.named_parameters(), sparse.parameters()):
        torch.testing.assert_close(p_s.grad, p_d.grad, rtol=1e-4, atol=1e-6, msg=n)
    # without labels (inference, fill-mask) the sparse model returns every position's logits
    torch.testing.assert_close(sparse(input_ids=x).logits, out_d.logits, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize('name', ['gmlp_base', 'amlp_base', 'bigs_small', 'bert_small', 'gpt_sdpa',
                                  'gpt_mlp_attention'])
def test_get_input_embeddings_is_the_embedding_input_ids_index(name):
    """get_input_embeddings() (transformers' name) returns the nn.Embedding that input_ids go through, for every
    family and task: a forward hook on it sees exactly the model's input_ids."""
    small = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, vocab_size=300, max_position_embeddings=16)
    if name.startswith(('bert', 'gpt')):
        small['num_attention_heads'] = 2
    for task in model_entry(name).tasks:
        causal_gmlp = {'spatial_mode': 'causal'} if task == 'causal_lm' and name.startswith(('gmlp', 'amlp')) else {}
        model = mt.create_model(name, task=task, **small, **causal_gmlp).eval()
        emb = model.get_input_embeddings()
        assert isinstance(emb, torch.nn.Embedding) and emb.num_embeddings == 300, (name, task)
        seen = []
        handle = emb.register_forward_hook(lambda m, args, out: seen.append(args[0]))
        ids = torch.randint(5, 300, (2, 8))
        with torch.no_grad():
            model(input_ids=ids)
        handle.remove()
        assert len(seen) == 1 and torch.equal(seen[0], ids), (name, task)
