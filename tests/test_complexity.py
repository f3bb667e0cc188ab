""" mlp_vision.complexity: fvcore handles, paper rows within tolerance, committed report up to date.

Default run (cheap): handle unit tests, CLI errors, and the paper rows of one or more models per family --
gMLP-Ti, sMLPNet-T*, Mixer-B/16 (vision, traced on CPU with zero weights), every registered gMLP/aMLP/GPT text
model, BiGS-large and the BERT-large baseline at all four lengths (meta device; the deep ones counted from their 1-
and 2-layer versions, exact by test_counts_are_linear_in_the_layer_count). The other vision models and the full
regeneration of ``results/complexity.md`` are ``slow``.
"""
import csv
import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from fvcore.nn import FlopCountAnalysis

import mlp_vision.text as mt
from mlp_vision import complexity as cx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'results'

# the cheap representative(s) of each family; every other model's rows are slow
CHEAP_VISION = ('gmlp_ti', 'smlpnet_t_a2', 'mixer_b16')


def _is_cheap(model: str) -> bool:
    fam = cx.family(model)
    if fam == 'vision':
        return model in CHEAP_VISION
    return True  # text, BiGS and BERT are counted on the meta device


def _text_args(name):
    """(registered text model, sequence length, config overrides) that ``cx.count`` counts ``name`` with."""
    if cx.family(name) == 'bert':
        seq_len = int(name.rsplit('_', 1)[1])
        return 'bert_large', seq_len, dict(max_position_embeddings=seq_len)
    return name, None, {}


def _by_layers(name, layers, seq_len=None, **overrides):
    """``cx.count_text`` of ``name`` with ``layers`` layers, from its 1- and 2-layer counts: the layers are
    identical, so every count is linear in their number (exact: test_counts_are_linear_in_the_layer_count)."""
    one, two = (cx.count_text(name, seq_len, num_hidden_layers=n, **overrides) for n in (1, 2))

    def at(a, b):
        return None if a is None else a + (layers - 1) * (b - a)
    by_op, uncounted = ({k: at(d1.get(k, 0), d2[k]) for k in d2} for d1, d2 in (
        (one.by_operator, two.by_operator), (one.uncounted, two.uncounted)))
    return cx.Count(name, one.input, at(one.params, two.params), at(one.macs, two.macs), by_op, uncounted,
                    encoder_macs=at(one.encoder_macs, two.encoder_macs))


class _LayerCounts(cx.CountCache):
    """The report's counts, text models deeper than two layers from their 1- and 2-layer versions (a full trace of
    gMLP-xlarge or BiGS-large takes 20-40 s; the full counts: test_committed_report_is_current, slow)."""

    def get(self, name, size=None):
        text, seq_len, overrides = _text_args(name)
        layers = None if cx.family(name) == 'vision' else mt.model_config(text, **overrides)['num_hidden_layers']
        if (name, size) not in self.cache and layers is not None and layers > 2:
            count = _by_layers(text, layers, seq_len if size is None else size, **overrides)
            self.cache[name, size] = dataclasses.replace(count, name=name)
        return super().get(name, size)


@pytest.fixture(scope='module')
def counter():
    return _LayerCounts()


@pytest.mark.parametrize('name', ['gmlp_base', 'amlp_base', 'gmlp_causal_char', 'bigs_large_512', 'bert_large_128'])
def test_counts_are_linear_in_the_layer_count(name):
    """What :class:`_LayerCounts` relies on, one model of each kind of layer: the full count of a 4-layer version
    equals the one extrapolated from 1 and 2 layers, in every field."""
    text, seq_len, overrides = _text_args(name)
    full = cx.count_text(text, seq_len, num_hidden_layers=4, **overrides)
    assert full == _by_layers(text, 4, seq_len, **overrides)


@pytest.fixture(autouse=True, scope='module')
def _one_thread():
    """Counting traces real CPU compute for the vision models; on a busy 2-core machine one thread is faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------------------
# handles
# ---------------------------------------------------------------------------------------------------------------
class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _macs(fn, *inputs) -> float:
    return cx.count_module(_Fn(fn), tuple(inputs))[0]


@pytest.mark.parametrize('device', ['cpu', 'meta'])
def test_fft_handle_rfft_known_size(device):
    # 2 x 8 transforms of length 256 (input 128 zero-padded by n=256) along dim -2
    u = torch.zeros(2, 128, 8, device=device)
    per = 2.5 * 256 * math.log2(256)  # FLOPs of one real transform
    assert _macs(lambda x: torch.fft.rfft(x, n=256, dim=-2), u) == pytest.approx(16 * per / 2)
    # no n: the transform length is the input length; dim -1
    assert _macs(lambda x: torch.fft.rfft(x), u) == pytest.approx(2 * 128 * 2.5 * 8 * math.log2(8) / 2)
    # irfft back to 256 points (the output's length)
    spec = torch.zeros(2, 129, 8, dtype=torch.complex64, device=device)
    assert _macs(lambda z: torch.fft.irfft(z, n=256, dim=-2), spec) == pytest.approx(16 * per / 2)
    # odd length: N = 255
    assert _macs(lambda x: torch.fft.rfft(x, n=255, dim=-2), u) == pytest.approx(
        16 * 2.5 * 255 * math.log2(255) / 2, abs=1)  # totals are rounded to whole MACs
    # complex transform: 5 N log2 N
    assert _macs(lambda z: torch.fft.fft(z, dim=-2), spec) == pytest.approx(
        16 * 5 * 129 * math.log2(129) / 2, abs=1)


def test_fft_handle_causal_conv_pattern():
    """The BiGS pattern: rfft(u), rfft(k), irfft(product) at n = 2L; 2 x C + 1 transforms of 2L points."""
    L, C = 64, 16

    def conv(u, k):
        n = 2 * L
        return torch.fft.irfft(torch.fft.rfft(u, n=n, dim=-2) * torch.fft.rfft(k, n=n, dim=0), n=n, dim=-2)

    macs, by_op, uncounted, _ = cx.count_module(_Fn(conv), (torch.zeros(1, L, C), torch.zeros(L, 1)))
    one = 2.5 * 2 * L * math.log2(2 * L) / 2
    assert by_op['fft_rfft'] == pytest.approx((C + 1) * one, rel=1e-6)
    assert by_op['fft_irfft'] == pytest.approx(C * one, rel=1e-6)
    assert not any('fft' in op for op in uncounted)
    assert cx.fft_macs(C, 2 * L) == pytest.approx(C * one)


@pytest.mark.parametrize('shapes', [
    ((2, 3, 10, 16), (2, 3, 12, 16), (2, 3, 12, 8)),  # cross-attention, E != E_v
    ((1, 4, 32, 64), (1, 4, 32, 64), (1, 4, 32, 64)),
    ((5, 7, 24), (5, 9, 24), (5, 9, 24)),  # no head dim
])
@pytest.mark.parametrize('causal', [False, True])
def test_sdpa_handle_equals_explicit_matmuls(shapes, causal):
    q, k, v = (torch.zeros(s) for s in shapes)
    is_causal = causal and shapes[0][-2] == shapes[1][-2]

    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    def explicit(q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.matmul(scores.softmax(-1), v)

    fused_macs, by_op, _, _ = cx.count_module(_Fn(fused), (q, k, v))
    explicit_macs = _macs(explicit, q, k, v)
    assert fused_macs == explicit_macs > 0
    assert set(by_op) == {'scaled_dot_product_attention'}


def test_matmul_handle_counts_broadcast_batch_dims():
    w = torch.zeros(14, 14)
    x = torch.zeros(2, 80, 14, 14)  # sMLP's W_h @ x over (B, C, H, W)
    fn = _Fn(lambda w, x: torch.matmul(w, x))
    stock = FlopCountAnalysis(fn, (w, x))
    stock.unsupported_ops_warnings(False)
    assert stock.total() == 14 * 14 * 14  # fvcore's handle: first operand x last output dim, batch dropped
    assert _macs(lambda w, x: torch.matmul(w, x), w, x) == 2 * 80 * 14 * 14 * 14
    # without broadcasting, both agree
    a, b = torch.zeros(3, 5, 7), torch.zeros(3, 7, 4)
    stock = FlopCountAnalysis(_Fn(torch.matmul), (a, b))
    assert stock.total() == _macs(torch.matmul, a, b) == 3 * 5 * 7 * 4
    # vector cases
    assert _macs(torch.matmul, torch.zeros(7), torch.zeros(7, 4)) == 28
    assert _macs(torch.matmul, torch.zeros(5, 7), torch.zeros(7)) == 35


def test_bert_baseline_counts_attention(counter):
    c = counter.get('bert_large_128')
    d, L, layers = 1024, 128, 24
    per_layer = 4 * L * d * d + 2 * L * d * 4096 + 2 * L * L * d  # projections, FFN, QK^T + AV
    assert c.by_operator['scaled_dot_product_attention'] == layers * 2 * L * L * d  # fused SDPA, counted
    assert c.encoder_macs == pytest.approx(layers * per_layer, rel=0.002)  # + LayerNorms
    assert not c.flagged


# ---------------------------------------------------------------------------------------------------------------
# paper rows
# ---------------------------------------------------------------------------------------------------------------
def _row_id(row):
    return f'{row.source}|{row.model}|{row.quantity}'.replace(' ', '_')


ROW_PARAMS = [pytest.param(r, id=_row_id(r), marks=() if _is_cheap(r.model) else pytest.mark.slow)
              for r in cx.PAPER_ROWS]


def test_paper_rows_name_known_models():
    known = set(cx.known_models())
    assert {r.model for r in cx.PAPER_ROWS} <= known
    assert len({_row_id(r) for r in cx.PAPER_ROWS}) == len(cx.PAPER_ROWS)
    for fam in ('vision', 'text', 'bert'):
        assert any(_is_cheap(r.model) and cx.family(r.model) == fam for r in cx.PAPER_ROWS), fam


@pytest.mark.parametrize('row', ROW_PARAMS)
def test_paper_row(row, counter):
    count = counter.get(row.model)
    assert count is not None, counter.problem(row.model)[1]
    assert not count.flagged, f'{row.model}: uncounted ops that are not element-wise: {count.flagged}'
    c = cx.compare(row, count)
    if row.known:  # documented mismatch: keep the documentation honest
        assert c.status == 'KNOWN', f'{row.model} {row.quantity} now matches the paper: drop the KNOWN reason'
    else:
        assert c.status == 'PASS', (f'{row.source} {row.model} {row.quantity}: paper {row.paper}, ours '
                                    f'{c.ours:.4g} ({100 * c.rel_diff:+.2f} %, tolerance {100 * row.tolerance:g} %)')


def test_compare_precision_and_tolerance_rules():
    count = cx.Count('m', '', params=59_110_000, macs=1, by_operator={}, uncounted={}, params_no_head=59_110_000)
    row = cx.PaperRow('t', 'm', 'params', '59')
    c = cx.compare(row, count)
    assert c.status == 'PASS' and c.how == 'tolerance'
    assert cx.compare(cx.PaperRow('t', 'm', 'params', '59.6'), count).status == 'FAIL'  # -0.8 %, 59.11 != 59.6
    count.params = 5_867_000
    c = cx.compare(cx.PaperRow('t', 'm', 'params', '5.9'), count)  # -0.56 %, but rounds to 5.9
    assert (c.status, c.how) == ('PASS', 'precision')
    assert cx.compare(cx.PaperRow('t', 'm', 'params', '5.9', known='x'), count).status == 'PASS'
    assert cx.compare(cx.PaperRow('t', 'm', 'params', '6.1', known='why'), count).status == 'KNOWN'
    assert cx.PaperRow('t', 'm', 'encoder_flops_raw', '8.1e10').resolution == pytest.approx(1e9)


def test_a_model_that_cannot_be_counted_is_an_error_row():
    """Counting that raises (here: sMLPNet at a size its total stride does not divide) leaves no count and an
    ERROR with the model's own message and where it was raised; its paper rows become ERROR rows."""
    cache = cx.CountCache()
    assert cache.get('smlpnet_t', 100) is None
    status, note = cache.problem('smlpnet_t', 100)
    assert status == 'ERROR'
    assert note.startswith('error counting smlpnet_t: ValueError: sMLPNet needs H and W divisible by 32')
    assert re.search(r' at /layers/input_checks\.py:\d+$', note)  # the line of ours that raised
    c = cx.compare(cx.PaperRow('t', 'smlpnet_t', 'macs', '5.0'), None, cache.problem('smlpnet_t', 100))
    assert (c.status, c.ours, c.note) == ('ERROR', None, note)


def test_text_count_with_config_overrides():
    """BiGS-large with a position table of L entries: a different parameter count, the same MACs as BiGS-large-512
    on L tokens (positions are a lookup)."""
    resized = cx.count_text('bigs_large_512', 256, max_position_embeddings=256, num_hidden_layers=1)
    plain = cx.count_text('bigs_large_512', 256, num_hidden_layers=1)
    assert resized.input == '1x256 tokens'
    assert plain.params - resized.params == 256 * 1024  # 256 fewer rows of width 1024
    assert (resized.macs, resized.encoder_macs) == (plain.macs, plain.encoder_macs)
    with pytest.raises(ValueError, match=r'must be in \[1, 256\]'):
        cx.count_text('bigs_large_512', 300, max_position_embeddings=256)


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------
def test_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit) as e:
        cx.main(['--models', 'no_such_model*'])
    assert e.value.code == 2
    err = capsys.readouterr().err  # one line, as every command's (tests/test_commands.py), before any counting
    assert err.startswith("python -m mlp_vision.complexity: error: --models: pattern 'no_such_model*' matches no "
                          "model") and 'smlpnet_t' in err and len(err.splitlines()) == 1
    for bad in (['--img-size', '100'], ['--img-size', 'big'], ['--img-size', '0'], ['--seq-len', '-3'],
                ['--format', 'xml']):
        with pytest.raises(SystemExit) as e:
            cx.main(bad)
        assert e.value.code == 2
    for bad in (['--format', 'md', '--output', 'a.md', 'b.csv'], ['--output', 'a.md', 'noext'],
                ['--output', '/no/such/folder/a.md'], ['--output', str(Path(__file__).parent)]):
        with pytest.raises(SystemExit) as e:
            cx.main(bad)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'multiple of 32' in err and 'positive integer' in err
    assert '--format applies to a single --output' in err and "cannot tell the format" in err
    assert '(/no/such/folder does not exist)' in err and '(it is a folder)' in err  # before any counting
    with pytest.raises(ValueError, match='--seq-len must be in'):
        cx.count_text('gpt_sdpa', 300)


def test_cli_small_selection(tmp_path, capsys):
    out, md = tmp_path / 'gpt.csv', tmp_path / 'gpt.md'
    assert cx.main(['--models', 'gpt_*', '--output', str(out), str(md)]) == 0
    err = capsys.readouterr().err  # progress: a line per model, then where each output went
    assert '[1/2] counting gpt_mlp_attention' in err and '[2/2] counting gpt_sdpa' in err
    assert f'wrote {out}' in err and f'wrote {md}' in err
    assert md.read_text().startswith('# Model complexity') and f"--models 'gpt_*' --output {out} {md}" in md.read_text()
    rows = list(csv.DictReader(out.open()))
    paper = [r for r in rows if r['section'] == 'paper']
    assert {r['model'] for r in paper} == {'gpt_mlp_attention', 'gpt_sdpa'}
    assert all(r['status'] == 'PASS' for r in paper)
    params = {r['model']: int(r['ours']) for r in rows if r['section'] == 'model' and r['quantity'] == 'params'}
    assert params == {'gpt_mlp_attention': 6_061_121, 'gpt_sdpa': 5_468_993}  # gpt.py docstring
    assert cx.main(['--models', 'gpt_sdpa', '--seq-len', '64', '--format', 'json']) == 0
    assert '"1x64 tokens"' in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# committed report
# ---------------------------------------------------------------------------------------------------------------
def _committed_model_rows():
    with (RESULTS / 'complexity.csv').open() as f:
        return [r for r in csv.DictReader(f) if r['section'] == 'model' and r['ours']]


def test_committed_csv_matches_cheap_counts(counter):
    """The committed CSV's numbers for the cheap models equal a fresh count (full check: the slow test below)."""
    rows = _committed_model_rows()
    checked = 0
    for r in rows:
        if not _is_cheap(r['model']):
            continue
        count = counter.get(r['model'])
        assert count is not None
        assert int(r['ours']) == getattr(count, r['quantity']), (
            f"{r['model']} {r['quantity']}: committed {r['ours']}, counted now {getattr(count, r['quantity'])}; "
            f'the model changed: regenerate the report with `{cx.COMMAND}`')
        checked += 1
    assert checked >= 40
    committed_macs = {r['model']: int(r['ours']) for r in rows if r['quantity'] == 'macs'}
    assert cx.model_macs('gpt_sdpa') == committed_macs['gpt_sdpa']  # the number a stock fvcore is held against
    md = (RESULTS / 'complexity.md').read_text()
    assert f'`{cx.COMMAND}`' in md and 'MACs' in md.split('## Conventions')[1]


@pytest.mark.slow
def test_committed_report_is_current():
    """Regenerate the whole report (what ``COMMAND`` prints) and compare with the committed files."""
    report = cx.build_report()
    stale = f'results/complexity.* are stale: regenerate with `{cx.COMMAND}`'
    assert cx.render_markdown(report) == (RESULTS / 'complexity.md').read_text(), stale
    assert cx.render_csv(report) == (RESULTS / 'complexity.csv').read_text(), stale


def test_fused_multiply_add_handles():
    bias, a, b = torch.zeros(4, 5, 6), torch.zeros(4, 5, 7), torch.zeros(4, 7, 6)
    assert _macs(lambda c, x, y: torch.baddbmm(c, x, y), bias, a, b) == _macs(torch.bmm, a, b) == 4 * 5 * 7 * 6
    assert _macs(lambda c, x, y: c.clone().baddbmm_(x, y), bias, a, b) == 4 * 5 * 7 * 6  # in place
    assert _macs(lambda c, x, y: torch.addbmm(c, x, y), torch.zeros(5, 6), a, b) == 4 * 5 * 7 * 6
    assert _macs(lambda c, x, y: c.clone().addmm_(x, y), torch.zeros(5, 6), a[0], b[0]) == 5 * 7 * 6
    assert _macs(lambda c, m, v: torch.addmv(c, m, v), torch.zeros(5), torch.zeros(5, 7), torch.zeros(7)) == 35
    assert _macs(torch.mv, torch.zeros(5, 7), torch.zeros(7)) == 35
    assert _macs(torch.dot, torch.zeros(7), torch.zeros(7)) == 7
