""" Tests of mlp_vision.text: gMLP / aMLP masked LM, causal gMLP LM, MLP-Attention GPT and its SDPA baseline.

Covers: registry; parameter counts vs SPEC §2 (big configs built on device='meta'); the text models' SGU, gMLP
block and tiny attention ARE the classes of mlp_vision.layers; Toeplitz W; no future leakage in causal
models; MLP-Attention at every length 1..T_max and generate() from a 1-token prompt; save/load round trips;
padding-mask semantics (tiny attention masked, SGU documented as unmasked); tokenizers; a short char-level
training run on Tiny Shakespeare that must reduce the loss.
"""
import os

import pytest
import torch

import mlp_vision.layers as layers
import mlp_vision.layers.gating as gating
import mlp_vision.text as mt
from mlp_vision.text import gmlp as text_gmlp
from mlp_vision.text.gpt import MLPAttention

from _helpers import n_params

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(REPO_ROOT, '..', 'shared', 'data', 'tinyshakespeare', 'input.txt')

# SPEC §2 (gMLP paper Tables 4-5), millions; ours must be within 0.5 %
GMLP_PARAMS_M = {
    'gmlp_base': 130, 'amlp_base': 109, 'gmlp_large': 365, 'amlp_large': 316, 'gmlp_xlarge': 941,
    'gmlp_18l_seq128': 59, 'gmlp_36l_seq128': 102, 'gmlp_72l_seq128': 187, 'gmlp_144l_seq128': 357,
}
# MLP-Attention paper: "6 million" vs "5.5 million"; the reference code's exact counts (its recorded
# results/Final/hyper_params.json: 5.468993 M / 6.061121 M) are pinned exactly.
GPT_PARAMS = {'gpt_mlp_attention': (6_061_121, 6.0, 0), 'gpt_sdpa': (5_468_993, 5.5, 1)}








def small_gmlp(task='masked_lm', **kw):
    cfg = dict(vocab_size=50, max_seq_len=16, dim=32, depth=2, ffn_dim=64)
    cfg.update(kw)
    return mt.create_model('gmlp_base', task=task, **cfg)


def small_gpt(attention='mlp', **kw):
    cfg = dict(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32, mlp_attn_hidden=24, dropout=0.0)
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
    d, f, n, a, V = c.dim, c.ffn_dim, c.max_seq_len, c.attn_dim, c.vocab_size
    block = 2 * d + (d + 1) * f + f + (2 * n - 1) + n + (f // 2 + 1) * d
    if a:
        block += (d + 1) * 3 * a + (a + 1) * (f // 2)
    return c.depth * block + V * d + 2 * d + V


@pytest.mark.parametrize('name', ['gmlp_base', 'amlp_large', 'gmlp_18l_seq128'])
def test_gmlp_param_accounting(name):
    model = mt.create_model(name, device='meta')
    assert n_params(model) == _gmlp_formula(model.config)
    # tied decoder: no separate output matrix
    assert model.output_weight() is model.gmlp.embed.weight


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
        small_gmlp(), small_gmlp(attn_dim=8), small_gmlp('sequence_classification', attn_dim=8),
        small_gmlp('causal_lm', spatial_mode='causal', attn_dim=8),
        mt.create_model('amlp_base', device='meta'),
    ]
    for model in models:
        blocks = model.gmlp.blocks
        for block in blocks:
            assert isinstance(block, layers.GatedMLPBlock) and type(block) is layers.GatedMLPBlock
            assert type(block.sgu) is layers.SpatialGatingUnit is gating.SpatialGatingUnit
            if model.config.attn_dim:
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
    model = small_gmlp(attn_dim=8)
    for block in model.gmlp.blocks:
        assert block.sgu.weight.abs().max() < 1e-4  # W ~ 0 (std 1e-6)
        assert torch.equal(block.sgu.bias, torch.ones_like(block.sgu.bias))  # b = 1


def test_toeplitz_weight():
    n = 16
    model = small_gmlp(max_seq_len=n)
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
    'amlp_causal': lambda: small_gmlp('causal_lm', spatial_mode='causal', attn_dim=8),
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
    V, T = model.config.vocab_size, model.max_seq_len
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
    model = small_gpt('mlp', block_size=T_max, n_embd=16, mlp_attn_hidden=8, n_layer=1).eval()
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
    out = model.generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=5, top_k=10)
    assert out.shape == (1, 6) and out[0, 0] == 0 and int(out.max()) < 65


@pytest.mark.parametrize('name', ['gpt_mlp_attention', 'gpt_sdpa', 'gmlp_causal'])
def test_generate_from_one_token(name):
    torch.manual_seed(0)
    if name == 'gmlp_causal':
        model = CAUSAL_MODELS[name]()
    else:
        model = small_gpt('mlp' if name == 'gpt_mlp_attention' else 'sdpa', dropout=0.2)
    model.train()  # generate() must switch dropout off itself and restore the mode
    prompt = torch.tensor([[3], [7]])
    n_new = model.max_seq_len + 5  # runs past the context: cropping to the last max_seq_len tokens
    out = model.generate(prompt, n_new, temperature=0.8, top_k=5)
    assert out.shape == (2, 1 + n_new) and torch.equal(out[:, :1], prompt)
    assert model.training  # mode restored
    g1 = model.generate(prompt, 8, temperature=0)
    g2 = model.generate(prompt, 8, temperature=0)
    assert torch.equal(g1, g2)  # greedy is deterministic (dropout off during sampling)
    gen = torch.Generator().manual_seed(1)
    s1 = model.generate(prompt, 8, generator=gen)
    s2 = model.generate(prompt, 8, generator=gen.manual_seed(1))
    assert torch.equal(s1, s2)


# ------------------------------------------------------------------------------------------ save / load

ROUNDTRIP = {
    'amlp_mlm': lambda: small_gmlp(attn_dim=8),
    'gmlp_cls': lambda: small_gmlp('sequence_classification', num_labels=3),
    'gmlp_causal': CAUSAL_MODELS['gmlp_causal'],
    'gpt_mlp_attention': lambda: small_gpt('mlp'),
    'gpt_sdpa': lambda: small_gpt('sdpa'),
}


@pytest.mark.parametrize('name', sorted(ROUNDTRIP))
def test_save_load_roundtrip(name, tmp_path):
    torch.manual_seed(0)
    model = ROUNDTRIP[name]().eval()
    _randomize_sgu(model)
    x = torch.randint(model.config.vocab_size, (2, 12))
    model.save_pretrained(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ['config.json', 'model.safetensors']
    for loaded in (type(model).from_pretrained(str(tmp_path)), mt.from_pretrained(str(tmp_path))):
        assert type(loaded) is type(model) and loaded.config == model.config
        loaded.eval()
        with torch.no_grad():
            assert torch.equal(loaded(x).logits, model(x).logits)
        sd, sd2 = model.state_dict(), loaded.state_dict()
        assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    if isinstance(model, mt.GMLPForMaskedLM):  # tying survives the round trip
        assert loaded.output_weight() is loaded.gmlp.embed.weight


def test_masked_lm_checkpoint_into_classifier(tmp_path):
    torch.manual_seed(0)
    mlm = small_gmlp(attn_dim=8)
    mlm.save_pretrained(str(tmp_path))
    clf = mt.GMLPForSequenceClassification.from_pretrained(str(tmp_path), num_labels=4)
    assert clf.config.num_labels == 4
    for k, v in mlm.gmlp.state_dict().items():
        assert torch.equal(clf.gmlp.state_dict()[k], v)
    small_gpt().save_pretrained(str(tmp_path / 'gpt'))
    with pytest.raises(TypeError):  # a GPT checkpoint is not a gMLP
        mt.GMLPForMaskedLM.from_pretrained(str(tmp_path / 'gpt'))


# ------------------------------------------------------------------------------------------ heads / masking

def test_masked_lm_and_classification_heads():
    torch.manual_seed(0)
    tok = mt.ByteTokenizer()
    mlm = small_gmlp(vocab_size=tok.vocab_size, attn_dim=8)
    ids = torch.tensor([[tok.cls_id] + tok.encode('hello world') + [tok.sep_id] + [tok.pad_id] * 3])
    mask = ids != tok.pad_id
    labels = torch.full_like(ids, -100)
    labels[0, 3] = ids[0, 3]
    masked = ids.clone()
    masked[0, 3] = tok.mask_id
    logits, loss = mlm(masked, mask, labels)
    assert logits.shape == (1, ids.shape[1], tok.vocab_size) and torch.isfinite(loss)
    clf = small_gmlp('sequence_classification', vocab_size=tok.vocab_size, num_labels=3).eval()
    logits, loss = clf(ids, mask, torch.tensor([2]))
    assert logits.shape == (1, 3) and torch.isfinite(loss)
    with torch.no_grad():  # the prediction is read at <cls> (position 0) of the last layer
        h = clf.gmlp(ids, mask)[:, 0]
        torch.testing.assert_close(logits, clf.classifier(h))
    with pytest.raises(ValueError):
        mlm(torch.zeros(1, 17, dtype=torch.long))  # longer than max_seq_len


def _perturb_pad_kv(pad_from: int):
    """Forward hook on TinyAttention.qkv: replace keys and values at positions >= pad_from with noise."""
    def hook(module, inputs, out):
        q, k, v = out.chunk(3, dim=-1)
        k, v = k.clone(), v.clone()
        g = torch.Generator().manual_seed(123)
        k[:, pad_from:] = torch.randn(k[:, pad_from:].shape, generator=g) * 10
        v[:, pad_from:] = torch.randn(v[:, pad_from:].shape, generator=g) * 10
        return torch.cat([q, k, v], dim=-1)
    return hook


def test_amlp_padding_mask_hides_padded_attention_keys():
    """With attention_mask, what the tiny attention reads at padded positions (keys, values) cannot reach any
    output; without it, it does (control). The SGU path is untouched by this perturbation."""
    torch.manual_seed(0)
    model = small_gmlp(attn_dim=8).eval()
    _randomize_sgu(model)
    n_real, L = 10, 16
    ids = torch.randint(4, 50, (2, L))
    ids[:, n_real:] = 0
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[:, :n_real] = True
    with torch.no_grad():
        ref_masked = model(ids, mask).logits
        ref_unmasked = model(ids).logits
        handles = [b.attn.qkv.register_forward_hook(_perturb_pad_kv(n_real)) for b in model.gmlp.blocks]
        try:
            out_masked = model(ids, mask).logits
            out_unmasked = model(ids).logits
        finally:
            for h in handles:
                h.remove()
    torch.testing.assert_close(out_masked[:, :n_real], ref_masked[:, :n_real], rtol=0, atol=1e-5)
    assert not torch.allclose(out_unmasked[:, :n_real], ref_unmasked[:, :n_real], atol=1e-3)


def test_sgu_mixes_padding_as_documented():
    """Documented (paper §4): the Toeplitz SGU is not masked, so padded tokens reach real positions through W
    even with attention_mask; a causal SGU never sees trailing pads."""
    torch.manual_seed(0)
    n_real, L = 10, 16
    ids = torch.randint(4, 50, (1, L))
    ids[:, n_real:] = 0
    mask = torch.arange(L)[None] < n_real
    other = ids.clone()
    other[:, n_real:] = 3  # different content in the padded slots
    for attn_dim in (0, 8):
        model = small_gmlp(attn_dim=attn_dim).eval()
        _randomize_sgu(model)
        with torch.no_grad():
            a, b = model(ids, mask).logits, model(other, mask).logits
        assert not torch.allclose(a[:, :n_real], b[:, :n_real], atol=1e-4)
    causal = CAUSAL_MODELS['amlp_causal']().eval()
    _randomize_sgu(causal)
    with torch.no_grad():
        torch.testing.assert_close(causal(ids).logits[:, :n_real], causal(other).logits[:, :n_real],
                                   rtol=0, atol=1e-5)


# --------------------------------------------------------------------------------------------- tokenizers

def test_tokenizers(tmp_path):
    tok = mt.ByteTokenizer()
    text = 'Thou art — naïve, 東京!'
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.vocab_size == 260 and tok.special_ids == [256, 257, 258, 259]
    assert tok.decode([tok.cls_id] + ids + [tok.pad_id]) == text

    ct = mt.CharTokenizer.from_text('hello world', special_tokens=['<pad>', '<mask>'])
    assert ct.vocab_size == 8 + 2 and ct.chars == sorted(set('hello world'))
    assert ct.decode(ct.encode('low hello')) == 'low hello'
    with pytest.raises(KeyError):
        ct.encode('z')
    ct.save(str(tmp_path))
    ct2 = mt.CharTokenizer.load(str(tmp_path))
    assert ct2.chars == ct.chars and ct2.special_tokens == ct.special_tokens
    cu = mt.CharTokenizer.from_text('abc', unk='<unk>')
    assert cu.encode('abz') == [0, 1, cu.token_to_id('<unk>')]


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
    tok = mt.CharTokenizer.from_text(text)
    assert tok.vocab_size == 65  # the paper's / nanoGPT's vocabulary
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    torch.manual_seed(0)
    T, B, steps = 32, 16, 100  # ~15 ms per step on one thread
    if name == 'gpt_mlp_attention':
        model = mt.create_model(name, block_size=T, n_layer=2, n_head=2, n_embd=64, mlp_attn_hidden=32, dropout=0.0)
    else:
        model = mt.create_model(name, max_seq_len=T, depth=2, dim=64, ffn_dim=256)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)

    def batch(split):
        ix = torch.randint(len(split) - T - 1, (B,), generator=g)
        x = torch.stack([split[i:i + T] for i in ix])
        y = torch.stack([split[i + 1:i + T + 1] for i in ix])
        return x, y

    vx, vy = batch(val)  # fixed held-out batch
    with torch.no_grad():
        model.eval()
        val0 = model(vx, vy).loss.item()
    model.train()
    for _ in range(steps):
        x, y = batch(train)
        loss = model(x, y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        model.eval()
        val1 = model(vx, vy).loss.item()
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
