""" The Triton bidirectional long convolution (mlp_vision.layers.longconv_triton), checked on the CPU.

CPU tensors run the kernels' source in Triton's interpreter (no GPU needed, no TRITON_INTERPRET: the module binds
an interpreted copy of each kernel for CPU tensors), against a direct dense-Toeplitz convolution in float64.
The compiled CUDA path is checked by compiling the same kernels for an H100 (sm_90) without running them.
"""
import ast
import inspect

import pytest
import torch
import torch.nn.functional as F

from mlp_vision.layers import BidirectionalGatedSSM, causal_toeplitz
from mlp_vision.layers.longconv_triton import _launch_options, bidirectional_gelu_long_conv, bidirectional_long_conv, \
    has_triton, lag_block_table
from reference.longconv import bidirectional_long_conv_reference

pytestmark = pytest.mark.skipif(not has_triton('cpu'), reason='triton with its interpreter is not installed')


def _inputs(batch, length, channels, dtype=torch.float32, seed=0):
    """u (B, L, 2, C), decaying kernels (2, L) with a lag-0 tap like a folded D, bias (2, C)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, length, 2, channels, generator=g).to(dtype)
    decay = torch.exp(-0.05 * torch.arange(length))
    kernels = torch.randn(2, length, generator=g) * decay
    kernels[:, 0] += 1.0
    bias = torch.randn(2, channels, generator=g)
    return u, kernels, bias


def _rel_err(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def _run_both(u, kernels, bias, gated, upstream, **blocks):
    """Outputs and (u, kernels, bias) gradients of the Triton route and of the float64 reference."""
    results = []
    for fn, cast in ((bidirectional_long_conv, lambda t: t), (bidirectional_long_conv_reference, torch.Tensor.double)):
        inputs = [cast(t.detach()).requires_grad_() for t in (u, kernels, bias)]
        kwargs = blocks if fn is bidirectional_long_conv else {}
        out = fn(*inputs, gated=gated, **kwargs)
        (out.double() * upstream.double()).sum().backward()
        results.append((out, [t.grad for t in inputs]))
    return results


@pytest.mark.parametrize('length', [5, 32, 37])
@pytest.mark.parametrize('block_l', [16, 32])
def test_lag_block_table_rebuilds_the_toeplitz_matrices(length, block_l):
    """Tiled back together (tile (i, j) = table[|i - j|], transposed for the anti-causal direction, zero on the
    other side of the diagonal), the table is the dense causal / anti-causal Toeplitz matrix."""
    _, kernels, _ = _inputs(1, length, 1)
    table = lag_block_table(kernels, block_l)
    n_blocks = table.shape[1]
    assert table.shape == (2, -(-length // block_l), block_l, block_l)
    dense = torch.zeros(2, n_blocks * block_l, n_blocks * block_l)
    for i in range(n_blocks):
        for j in range(n_blocks):
            rows, cols = slice(i * block_l, (i + 1) * block_l), slice(j * block_l, (j + 1) * block_l)
            if j <= i:
                dense[0, rows, cols] = table[0, i - j]
            if j >= i:
                dense[1, rows, cols] = table[1, j - i]
    torch.testing.assert_close(dense[0, :length, :length], causal_toeplitz(kernels[0]), rtol=0, atol=0)
    torch.testing.assert_close(dense[1, :length, :length], causal_toeplitz(kernels[1], anticausal=True),
                               rtol=0, atol=0)


@pytest.mark.parametrize('batch,length,channels,block_l,block_c', [
    (2, 37, 20, 16, 16),  # L and C not multiples of the tiles
    (1, 1, 5, 16, 16),  # one position: only the lag-0 taps
    (1, 64, 16, 32, 16),  # whole tiles
    (2, 50, 33, 16, 32),
])
@pytest.mark.parametrize('gated', [False, True])
def test_float32_forward_and_backward_equal_float64_reference(batch, length, channels, block_l, block_c, gated):
    u, kernels, bias = _inputs(batch, length, channels)
    upstream = torch.randn((batch, length) + ((channels,) if gated else (2, channels)))
    (out, grads), (ref, ref_grads) = _run_both(u, kernels, bias, gated, upstream, block_l=block_l, block_c=block_c)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert _rel_err(out, ref) < 1e-5
    for name, grad, ref_grad in zip(('u', 'kernels', 'bias'), grads, ref_grads):
        assert grad.dtype == torch.float32, name
        assert _rel_err(grad, ref_grad) < 1e-5, name


@pytest.mark.parametrize('dtype,tol', [(torch.bfloat16, 2e-2), (torch.float16, 3e-3)])
@pytest.mark.parametrize('gated', [False, True])
def test_half_precision_within_its_rounding(dtype, tol, gated):
    """Half-precision inputs (and taps rounded to the input dtype), float32 accumulation: within a few roundings
    of the float64 result on the same (rounded) inputs; kernel and bias gradients come back in float32."""
    u, kernels, bias = _inputs(2, 45, 20, dtype=dtype)
    upstream = torch.randn((2, 45) + ((20,) if gated else (2, 20)))
    (out, grads), (ref, ref_grads) = _run_both(u, kernels, bias, gated, upstream, block_l=16, block_c=16)
    assert out.dtype == dtype and grads[0].dtype == dtype
    assert grads[1].dtype == grads[2].dtype == torch.float32
    assert _rel_err(out, ref) < tol
    for name, grad, ref_grad in zip(('u', 'kernels', 'bias'), grads, ref_grads):
        assert _rel_err(grad, ref_grad) < tol, name


def test_gradcheck_gated_with_bias():
    """Finite differences of the gated output (quadratic in each input, so central differences are exact up to
    float32 rounding) agree with the Function's backward."""
    u, kernels, bias = _inputs(1, 20, 3)
    inputs = [t.requires_grad_() for t in (u, kernels, bias)]

    def fn(u, kernels, bias):
        return bidirectional_long_conv(u, kernels, bias, gated=True, block_l=16, block_c=16)

    with pytest.warns(UserWarning, match='double precision'):  # float32 inputs: the Triton route has no float64
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=1e-3, rtol=1e-3, fast_mode=True)


# --- the input GELUs and the padding mask in the convolution's op (the layer's Triton route) -----------------------

def _unfused_gelu_conv(a_f, a_b, kernels, approximate, mask):
    """The PyTorch route the fused op replaces: u = mask * GELU(a), stacked, then the dense float64 convolution."""
    u = torch.stack([F.gelu(a_f, approximate=approximate), F.gelu(a_b, approximate=approximate)], 2)
    if mask is not None:
        u = u * mask[:, :, None, None].to(u.dtype)
    return bidirectional_long_conv_reference(u, kernels).unbind(2)


def _fused_and_unfused(a_f, a_b, kernels, approximate, mask, upstream, only_forward_output=False):
    """Outputs and (a_f, a_b, kernels) gradients of the fused Triton route (inputs as given) and of the unfused
    route in float64."""
    results = []
    for fn, cast in ((bidirectional_gelu_long_conv, lambda t: t), (_unfused_gelu_conv, torch.Tensor.double)):
        inputs = [cast(t.detach()).requires_grad_() for t in (a_f, a_b, kernels)]
        kwargs = dict(block_l=16, block_c=16) if fn is bidirectional_gelu_long_conv else {}
        outs = fn(*inputs, approximate=approximate, mask=mask, **kwargs)
        used = outs[:1] if only_forward_output else outs
        sum((o.double() * g.double()).sum() for o, g in zip(used, upstream)).backward()
        results.append((outs, [t.grad for t in inputs]))
    return results


def _gelu_inputs(batch, length, channels, dtype=torch.float32, masked=False, seed=0):
    u, kernels, _ = _inputs(batch, length, channels, seed=seed)
    a_f, a_b = (2 * u).unbind(2)  # pre-activations reaching well into GELU's curved part
    mask = None
    if masked:
        mask = torch.rand(batch, length, generator=torch.Generator().manual_seed(seed + 1)) > 0.3
    upstream = torch.randn(2, batch, length, channels, generator=torch.Generator().manual_seed(seed + 2))
    return a_f.to(dtype), a_b.to(dtype), kernels, mask, upstream


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
@pytest.mark.parametrize('masked', [False, True])
@pytest.mark.parametrize('batch,length,channels', [(2, 37, 20), (1, 33, 16)])
def test_fused_gelu_conv_equals_the_unfused_route(approximate, masked, batch, length, channels):
    """Values and gradients of the fused route (GELU and mask applied inside the op, their derivative in the
    adjoint kernel's epilogue) equal those of GELU -> mask -> convolution in PyTorch (float64), L and C off the
    tiles."""
    a_f, a_b, kernels, mask, upstream = _gelu_inputs(batch, length, channels, masked=masked)
    (outs, grads), (refs, ref_grads) = _fused_and_unfused(a_f, a_b, kernels, approximate, mask, upstream)
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape == a_f.shape and out.dtype == torch.float32 and out.is_contiguous()
        assert _rel_err(out, ref) < 1e-5
    for name, grad, ref_grad in zip(('a_f', 'a_b', 'kernels'), grads, ref_grads):
        assert _rel_err(grad, ref_grad) < 1e-5, name
    if masked:  # padded positions take no part: their pre-activations get exactly zero gradient
        assert (grads[0][~mask] == 0).all() and (grads[1][~mask] == 0).all()


def test_fused_gelu_conv_with_one_output_unused():
    """Only y_f in the loss: autograd hands the Function no gradient for y_b; a_b's gradient is zero and the rest
    matches the unfused route."""
    a_f, a_b, kernels, _, upstream = _gelu_inputs(1, 20, 16)
    (_, grads), (_, ref_grads) = _fused_and_unfused(a_f, a_b, kernels, 'none', None, upstream,
                                                    only_forward_output=True)
    assert torch.equal(grads[1], torch.zeros_like(a_b))
    assert _rel_err(grads[0], ref_grads[0]) < 1e-5 and _rel_err(grads[2], ref_grads[2]) < 1e-5


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_fused_gelu_conv_bf16_within_its_rounding(approximate):
    """bf16: the op rounds GELU(a) to bf16 as F.gelu does (float32 accumulation), so the outputs are bit-equal to
    the unfused Triton route on F.gelu's bf16 output, and outputs and gradients are within bf16 rounding of the
    float64 unfused route."""
    a_f, a_b, kernels, mask, upstream = _gelu_inputs(2, 45, 20, dtype=torch.bfloat16, masked=True)
    u = torch.stack([F.gelu(a_f, approximate=approximate), F.gelu(a_b, approximate=approximate)], 2)
    unfused = bidirectional_long_conv(u * mask[:, :, None, None], kernels, block_l=16, block_c=16).unbind(2)
    (outs, grads), (refs, ref_grads) = _fused_and_unfused(a_f, a_b, kernels, approximate, mask, upstream)
    for out, same, ref in zip(outs, unfused, refs):
        assert out.dtype == torch.bfloat16
        assert torch.equal(out, same) and _rel_err(out, ref) < 2e-2
    assert grads[0].dtype == grads[1].dtype == torch.bfloat16 and grads[2].dtype == torch.float32
    for name, grad, ref_grad in zip(('a_f', 'a_b', 'kernels'), grads, ref_grads):
        assert _rel_err(grad, ref_grad) < 2e-2, name


# (batch, length, channels) of the compiled fused route's tests: lengths and channels that do not fill their last
# 16 x 16 tile, activations larger than the lag table (2, 3, 16, 16); the same shapes (and inputs that need
# gradients) in each, so that they share one inductor compile (~10 s here)
COMPILED_GELU_SHAPE = (2, 40, 36)


@pytest.fixture(scope='module')
def compiled_gelu_conv():
    return torch.compile(bidirectional_gelu_long_conv, fullgraph=True)


@pytest.mark.parametrize('compiled', [False, True])
def test_fused_gelu_conv_keeps_only_the_pre_activations(compiled, request):
    """For the backward pass the fused route keeps a_f and a_b themselves (the caller's tensors, no GELU output, no
    stacked copy) plus the small lag table; compiled too (the partitioner sees the custom op, not the kernel)."""
    a_f, a_b, kernels, mask, _ = _gelu_inputs(*COMPILED_GELU_SHAPE, masked=True)
    assert lag_block_table(kernels, 16).numel() < a_f.numel()
    for t in (a_f, a_b, kernels):
        t.requires_grad_()
    conv = request.getfixturevalue('compiled_gelu_conv') if compiled else bidirectional_gelu_long_conv
    conv(a_f, a_b, kernels, mask=mask, block_l=16, block_c=16)  # compiles outside the hooks
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        conv(a_f, a_b, kernels, mask=mask, block_l=16, block_c=16)
    activations = [t for t in saved if t.numel() >= a_f.numel()]
    assert len(activations) == 2
    assert {t.data_ptr() for t in activations} == {a_f.data_ptr(), a_b.data_ptr()}


SPECIAL_FUNCTIONS = {'erf', 'exp', 'exp2', 'log', 'log2', 'tanh', 'sigmoid', 'math', 'libdevice'}


def _tile_loop_offences(source):
    """What a kernel (its source) computes inside its loops over GEMM tiles that it should compute once per element:
    special functions (``tl.erf``, ``tl.exp``, ``tl.math.*``, ...) and any use of ``mask_ptr``. The tile loops are
    the runtime loops (every ``for`` but the unrolled ``tl.static_range`` over the two directions, which holds the
    once-per-output-element epilogue); every ``tl.dot`` must lie in one, so the check cannot pass vacuously."""
    tree = ast.parse(source)
    loops = [node for node in ast.walk(tree) if isinstance(node, ast.For)
             and not (isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Attribute)
                      and node.iter.func.attr == 'static_range')]
    in_loops = [node for loop in loops for stmt in loop.body for node in ast.walk(stmt)]
    dots = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == 'dot']
    assert dots and all(any(dot is node for node in in_loops) for dot in dots), 'a tl.dot outside the tile loops'
    return sorted({f'line {node.lineno}: {node.attr if isinstance(node, ast.Attribute) else node.id}'
                   for node in in_loops if isinstance(node, ast.Attribute) and node.attr in SPECIAL_FUNCTIONS
                   or isinstance(node, ast.Name) and node.id == 'mask_ptr'})


@pytest.mark.parametrize('kernel', ['_toeplitz_conv_kernel', '_table_grad_kernel'])
def test_no_special_function_or_mask_load_inside_the_tile_loops(kernel):
    """The kernels read each input tile once per output block row (or table tile) that needs it: a GELU or mask
    applied there is recomputed ~L / (2 block_l) times per element and starves the tensor cores on the special
    function unit. The GELU and mask are applied once per element before the launch; the adjoint's GELU'
    epilogue runs once per output tile, after the loop."""
    from mlp_vision.layers import _longconv_kernels
    assert _tile_loop_offences(inspect.getsource(getattr(_longconv_kernels, kernel))) == []


@pytest.mark.parametrize('make_args,match', [
    (lambda a, m: (a, a[:, :-1]), r'a_f and a_b must be \(B, L, C\) tensors of one shape and dtype'),
    (lambda a, m: (a, a.bfloat16()), 'a_f and a_b must be'),
    (lambda a, m: (a, a, {'mask': m.float()}), r'mask must be a bool \(B, L\) = \(1, 12\) tensor'),
    (lambda a, m: (a, a, {'mask': m[:, :-1]}), 'mask must be a bool'),
    (lambda a, m: (a, a, {'approximate': 'sigmoid'}), "approximate must be 'none' or 'tanh'"),
])
def test_fused_gelu_conv_bad_inputs_stop_with_one_clear_line(make_args, match):
    a, kernels, _, mask, _ = _gelu_inputs(1, 12, 4, masked=True)
    args = make_args(a, mask)
    kwargs = args[2] if len(args) == 3 else {}
    with pytest.raises(ValueError, match=match):
        bidirectional_gelu_long_conv(args[0], args[1], kernels, **kwargs)


def test_strided_input_view():
    """The input may be a strided view (the layer's u is part of a wider projection output): same result as
    the contiguous copy, read in place."""
    u, kernels, _ = _inputs(2, 33, 16)
    wide = torch.randn(2, 33, 2 * 16 + 7)
    wide[..., :32] = u.flatten(2)
    view = wide[..., :32].unflatten(-1, (2, 16))
    assert not view.is_contiguous()
    expected = bidirectional_long_conv(u, kernels, block_l=16, block_c=16)
    torch.testing.assert_close(bidirectional_long_conv(view, kernels, block_l=16, block_c=16), expected,
                               rtol=0, atol=0)


def _layer_and_input(length=40, dim=8):
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(dim, 2 * dim, num_states=4, conv_impl='direct')
    u = torch.randn(2, length, 2, dim)
    with torch.no_grad():  # non-trivial D and biases
        layer.ssm_forward.D.fill_(0.7)
        layer.ssm_backward.D.fill_(-0.4)
        layer.forward_out_proj.bias.normal_()
        layer.backward_out_proj.bias.normal_()
    kernels = torch.stack([ssm.kernel(length) + F.pad(ssm.D, (0, length - 1))  # D folded into lag 0
                           for ssm in (layer.ssm_forward, layer.ssm_backward)]).detach()
    return layer, u, kernels


@torch.no_grad()
def test_drop_in_for_the_layers_ssm_convolution():
    """With D folded into lag 0, the route computes what BidirectionalGatedSSM._bidirectional_ssm does."""
    layer, u, kernels = _layer_and_input()
    expected = layer._bidirectional_ssm(u)
    assert _rel_err(bidirectional_long_conv(u, kernels, block_l=16, block_c=16), expected) < 1e-5


@pytest.mark.parametrize('gelu', ['none', 'tanh'])
@pytest.mark.parametrize('masked', [False, True])
def test_layer_conv_impl_triton_equals_direct(gelu, masked):
    """BidirectionalGatedSSM(conv_impl='triton') (input GELUs and mask in the convolution's op) computes the layer of
    the direct route (GELU, mask, then the Toeplitz GEMM in PyTorch), forward and backward, from one state dict."""
    torch.manual_seed(0)
    direct = BidirectionalGatedSSM(8, 16, num_states=4, gelu_approximate=gelu, conv_impl='direct')
    triton_layer = BidirectionalGatedSSM(8, 16, num_states=4, gelu_approximate=gelu, conv_impl='triton')
    triton_layer.load_state_dict(direct.state_dict())
    assert triton_layer.state_dict().keys() == direct.state_dict().keys()
    x = torch.randn(2, 40, 8)
    mask = torch.arange(40) < torch.tensor([[40], [29]]) if masked else None  # right padding in the second row
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = direct(xa, mask), triton_layer(xb, mask)
    assert _rel_err(yb, ya) < 1e-5
    g = torch.randn(ya.shape)
    ya.backward(g)
    yb.backward(g)
    assert _rel_err(xb.grad, xa.grad) < 1e-5
    for (name, pa), pb in zip(direct.named_parameters(), triton_layer.parameters()):
        assert _rel_err(pb.grad, pa.grad) < 1e-4, name


@torch.no_grad()
def test_gated_form_equals_the_layers_projected_gate():
    """The layer gates (s_f W_cf + b_cf) * (s_b W_cb + b_cb) with s = SSM(u). One kernel is shared by all
    channels (BiGS §4), so the convolution commutes with the channel projections: projecting first (no bias)
    and running the gated route with the projection biases gives the same gate."""
    layer, u, kernels = _layer_and_input()
    s_f, s_b = layer._bidirectional_ssm(u).unbind(2)
    expected = layer.forward_out_proj(s_f) * layer.backward_out_proj(s_b)
    projected = torch.stack([u[:, :, 0] @ layer.forward_out_proj.weight.T,
                             u[:, :, 1] @ layer.backward_out_proj.weight.T], 2)
    bias = torch.stack([layer.forward_out_proj.bias, layer.backward_out_proj.bias])
    out = bidirectional_long_conv(projected, kernels, bias, gated=True, block_l=16, block_c=16)
    assert _rel_err(out, expected) < 1e-5


@pytest.mark.parametrize('make_args,match', [
    (lambda u, k, b: (u[:, :, 0], k, None), r'u must be \(B, L, 2, C\)'),
    (lambda u, k, b: (u.double(), k, None), 'u must be one of'),
    (lambda u, k, b: (u, k[:, :-1], None), r'kernels must be a float \(2, L\) = \(2, 12\)'),
    (lambda u, k, b: (u, k.long(), None), 'kernels must be a float'),
    (lambda u, k, b: (u, k, b[:, :-1]), r'bias must be a float \(2, C\) = \(2, 4\)'),
])
def test_bad_inputs_stop_with_one_clear_line(make_args, match):
    u, kernels, bias = _inputs(1, 12, 4)
    with pytest.raises(ValueError, match=match):
        bidirectional_long_conv(*make_args(u, kernels, bias))


def test_device_without_triton_stops_with_one_clear_line():
    u, kernels, _ = _inputs(1, 12, 4)
    with pytest.raises(RuntimeError, match='needs triton on a CUDA device .* not available for a meta tensor'):
        bidirectional_long_conv(u.to('meta'), kernels.to('meta'))


@pytest.mark.parametrize('blocks,match', [({'block_l': 24}, 'block_l must be a power of two >= 16'),
                                          ({'block_c': 8}, 'block_c must be a power of two >= 16')])
def test_bad_tile_sizes(blocks, match):
    u, kernels, _ = _inputs(1, 12, 4)
    with pytest.raises(ValueError, match=match):
        bidirectional_long_conv(u, kernels, **blocks)


# --- the custom ops: opaque to torch.compile -------------------------------------------------------------------

@pytest.mark.parametrize('gated', [False, True])
def test_custom_ops_pass_opcheck(gated):
    """torch.library.opcheck of the forward op (the layer's case: GELU fused, masked; and the gated case with a
    bias and saved factors) and of the backward op: schema, fake tensors (shapes, dtypes and strides of the real
    outputs), autograd registration, and AOTAutograd tracing them with dynamic shapes (the backward op included)."""
    a_f, a_b, kernels, mask, _ = _gelu_inputs(2, 20, 16, masked=True)
    table = lag_block_table(kernels, 16).requires_grad_()
    bias = torch.randn(2, 16, requires_grad=True) if gated else None
    u_f, u_b = a_f.requires_grad_(), a_b.requires_grad_()
    mask = None if gated else mask.to(torch.int8)
    act = 'identity' if gated else 'none'
    forward_args = (u_f, u_b, table, bias, mask, act, gated, gated, 16)
    torch.library.opcheck(torch.ops.mlp_vision.bidirectional_long_conv.default, forward_args)
    grads = torch.randn(2, 2, 20, 16).unbind(0)
    backward_args = (*grads, u_f.detach(), u_b.detach(), table.detach(), mask, act, 16, True, True)
    torch.library.opcheck(torch.ops.mlp_vision.bidirectional_long_conv_backward.default, backward_args)


def test_compiled_fused_gelu_conv_equals_eager(compiled_gelu_conv):
    """torch.compile(fullgraph=True) of the fused route: one graph with the convolution as an extern call (dynamo
    does not trace into the Triton launch), outputs and gradients bit-identical to eager's."""
    a_f, a_b, kernels, mask, upstream = _gelu_inputs(*COMPILED_GELU_SHAPE, masked=True)

    def run(fn):
        inputs = [t.detach().clone().requires_grad_() for t in (a_f, a_b, kernels)]
        outs = fn(*inputs, mask=mask, block_l=16, block_c=16)
        sum((o * g).sum() for o, g in zip(outs, upstream)).backward()
        return outs, [t.grad for t in inputs]
    (outs, grads), (ref_outs, ref_grads) = run(compiled_gelu_conv), run(bidirectional_gelu_long_conv)
    for out, ref in zip(outs + tuple(grads), ref_outs + tuple(ref_grads)):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


def _compiled_and_eager_layer_step(backend):
    """Output and (input, parameter) gradients of BidirectionalGatedSSM(64, 192, conv_impl='triton') under bf16
    autocast, compiled (fullgraph) with ``backend`` and eager."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(64, 192, conv_impl='triton')
    x = torch.randn(2, 32, 64)
    results = []
    for run in (torch.compile(layer, fullgraph=True, backend=backend), layer):
        layer.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = run(xi)
        out.sum().backward()
        results.append([out, xi.grad] + [p.grad for p in layer.parameters()])
    return results


def test_compiled_layer_through_aot_autograd_is_bit_identical():
    """The layer compiled fullgraph through dynamo and AOTAutograd (aot_eager: the graphs run op by op, no
    fusion): the custom ops' fake tensors and registered autograd give eager's output and gradients to the bit."""
    compiled, eager = _compiled_and_eager_layer_step('aot_eager')
    for got, expected in zip(compiled, eager):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.slow  # inductor's compile of the layer and its backward: ~25 s on one busy core
def test_compiled_layer_equals_eager_within_bf16_rounding():
    """The layer compiled fullgraph with inductor (the default backend; fails without the custom ops: dynamo
    cannot trace the Triton launch) equals eager within bf16 rounding: the convolution is the same extern call,
    the differences come from inductor fusing the bf16 ops around it (the direct route differs as much)."""
    compiled, eager = _compiled_and_eager_layer_step('inductor')
    for got, expected in zip(compiled, eager):
        assert _rel_err(got, expected) < 2e-2

# --- the compiled (CUDA) path: compile for an H100 without a GPU ------------------------------------------------

H100_SHARED_MEMORY = 227 * 1024  # bytes one block may use
TORCH_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}


def _compile_for_hopper(kernel, pointer_dtypes, constexprs, dtype, block=128):
    """Compile a jit kernel for sm_90 (PTX + cubin through triton's bundled ptxas) with the launcher's options
    for ``dtype`` tiles; checks that it fits the H100's shared memory and returns the PTX."""
    triton = pytest.importorskip('triton')
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    constexprs = dict(constexprs, BLOCK_L=block, BLOCK_C=block)
    signature = {name: 'constexpr' if name in constexprs else '*' + pointer_dtypes[name] if name.endswith('_ptr')
                 else 'i32' for name in kernel.arg_names}
    options = _launch_options(torch.empty(0, dtype=TORCH_DTYPES[dtype], device='meta'), block, block)
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget('cuda', 90, 32), options=options)
    except (FileNotFoundError, PermissionError) as e:  # no ptxas: the environment, not the kernel
        pytest.skip(f'cannot run triton\'s ptxas here: {e}')
    assert compiled.metadata.shared <= H100_SHARED_MEMORY
    return compiled.asm['ptx']


def _conv_constexprs(dtype, adjoint=False, gated=False, act=0, masked=False):
    return dict(ADJOINT=adjoint, GATED=gated, NUM_DIRECTIONS=2 if gated else 1, HAS_BIAS=gated, SAVE_FACTORS=gated,
                ACT=act, HAS_MASK=masked, UPCAST_DOT=False, DOT_PRECISION='ieee' if dtype == 'fp32' else 'tf32')


def _compile_conv(dtype, **flags):
    from mlp_vision.layers._longconv_kernels import CONV_KERNELS
    pointers = dict(u0_ptr=dtype, u1_ptr=dtype, table_ptr=dtype, bias_ptr='fp32', mask_ptr='i8', pre0_ptr=dtype,
                    pre1_ptr=dtype, out0_ptr=dtype, out1_ptr=dtype, factor_ptr=dtype)
    return _compile_for_hopper(CONV_KERNELS['cuda'], pointers, _conv_constexprs(dtype, **flags), dtype)


def _compile_table_grad(dtype):
    from mlp_vision.layers._longconv_kernels import TABLE_GRAD_KERNELS
    pointers = dict(g0_ptr=dtype, g1_ptr=dtype, u0_ptr=dtype, u1_ptr=dtype, partial_ptr='fp32')
    constexprs = dict(UPCAST_DOT=False, DOT_PRECISION='ieee' if dtype == 'fp32' else 'tf32')
    return _compile_for_hopper(TABLE_GRAD_KERNELS['cuda'], pointers, constexprs, dtype)


def test_kernels_compile_for_h100_with_tensor_core_products():
    """The bf16 gated forward (two directions, saved factors), the plain forward and the adjoint with the GELU
    derivative and mask in its epilogue (the layer's route) and the table gradient lower to Hopper's warpgroup
    tensor-core instructions: the CUDA path compiles, not just the interpreted one."""
    assert 'wgmma.mma_async' in _compile_conv('bf16', gated=True)
    assert 'wgmma.mma_async' in _compile_conv('bf16')
    assert 'wgmma.mma_async' in _compile_conv('bf16', adjoint=True, act=2, masked=True)
    assert 'wgmma.mma_async' in _compile_table_grad('bf16')


@pytest.mark.slow
@pytest.mark.parametrize('dtype', ['bf16', 'fp16', 'fp32'])
def test_every_kernel_variant_compiles_for_h100(dtype):
    for flags in ({}, {'adjoint': True}, {'gated': True}, {'adjoint': True, 'act': 2},
                  {'adjoint': True, 'act': 1, 'masked': True}):
        ptx = _compile_conv(dtype, **flags)
        assert 'mma' in ptx or dtype == 'fp32', flags  # ieee float32 products run on the FMA units
    _compile_table_grad(dtype)
