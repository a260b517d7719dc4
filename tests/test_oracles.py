"""Independent oracles: the attention modules recomputed from the papers' definitions, written here
without any helper of ``mmlinattn.core.ops`` (kernels, RoPE, attention formulas, the local
residual), and Swin's softmax blocks checked against mmdet's own ``SwinBlock`` given the same
weights.

Everything runs in float64 so that a wrong detail (a channel pairing, an angle, a LayerNorm epsilon,
a mask) shows up far above rounding.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from mmlinattn.core.models.backbones.inline_pvt import PVTBlock
from mmlinattn.core.models.backbones.inline_swin import SwinBlock
from mmlinattn.core.models.layers import QKVOAttention, TokenAttention
from mmlinattn.core.ops import apply_rope, get_kernel, rope_angles, rope_sin_cos

D64 = torch.float64
# float64 on both sides, ours (linear-time, fused) and the oracle or mmdet's block (quadratic):
# another order of the sums moves an O(1) result by ~1e-15, six orders under TOL, which is seven
# under what a wrong detail gives (1e-2 and up)
TOL = dict(rtol=1e-9, atol=1e-10)


# ----------------------------------------------------------------------------- definitions
def kernel_oracle(name, x):
    """The feature maps phi of the papers: identity, ReLU, LeakyReLU (slope 0.01), exp(x/5) (the
    InLine ablation's exp kernel with temperature 0.2) and ELU + 1."""
    if name == 'identity':
        return x
    if name == 'relu':
        return torch.where(x > 0, x, torch.zeros_like(x))
    if name == 'leakyrelu':
        return torch.where(x > 0, x, 0.01 * x)
    if name == 'exp':
        return torch.exp(x / 5)
    if name == 'elu':
        return torch.where(x > 0, x + 1, torch.exp(x))
    raise KeyError(name)


def rope_oracle(x, hw):
    """2-D RoPE of MAViT, one complex rotation per channel pair.

    Head dim d: m = d/4 frequencies f_i = 10000^(-i/(m-1)). Pairs (2i, 2i+1), i < d/4, of the first
    half rotate by angle row * f_i; pairs of the second half (2i + d/2, 2i + 1 + d/2) by col * f_i.
    Tokens are the row-major flattening of the h x w map."""
    h, w = hw
    d = x.shape[-1]
    m = d // 4
    freqs = [10000.0 ** (-(i / (m - 1))) if m > 1 else 1.0 for i in range(m)]
    out = torch.empty_like(x)
    for n in range(h * w):
        row, col = divmod(n, w)
        for half, pos in ((0, row), (1, col)):
            for i in range(m):
                a, b = half * d // 2 + 2 * i, half * d // 2 + 2 * i + 1
                z = torch.complex(x[..., n, a], x[..., n, b]) * complex(
                    math.cos(pos * freqs[i]), math.sin(pos * freqs[i]))
                out[..., n, a], out[..., n, b] = z.real, z.imag
    return out


def inline_oracle(q, k, v, phi='identity'):
    """InLine: s_ij = (scale/N) phi(q_i).phi(k_j); A_ij = s_ij - mean_j s_ij + 1/N; out = A v."""
    n, d = k.shape[-2], k.shape[-1]
    s = kernel_oracle(phi, q) @ kernel_oracle(phi, k).transpose(-2, -1) * (d ** -0.5 / n)
    a = s - s.mean(-1, keepdim=True) + 1.0 / n
    return a @ v


def mala_oracle(q, k, v, hw=None, eps=1e-6):
    """MALA as released: z_i = scale phi(q_i).mean_j phi(k_j) (un-rotated);
    out_i = (1 + 1/(z_i + eps)) sum_j (scale/N) R(phi(q_i)).R(phi(k_j)) v_j - z_i mean_j v_j."""
    n, d = k.shape[-2], k.shape[-1]
    pq, pk = kernel_oracle('elu', q), kernel_oracle('elu', k)
    z = pq @ pk.mean(-2, keepdim=True).transpose(-2, -1) * d ** -0.5
    if hw is not None:
        pq, pk = rope_oracle(pq, hw), rope_oracle(pk, hw)
    num = (pq @ pk.transpose(-2, -1)) * (d ** -0.5 / n) @ v
    return num * (1 + 1 / (z + eps)) - z * v.mean(-2, keepdim=True)


def softmax_oracle(q, k, v, bias=None):
    logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if bias is not None:
        logits = logits + bias
    return torch.softmax(logits, -1) @ v


def local_residual_oracle(mlp, x_tokens, v_map):
    """r = Conv1d(groups=h) -> GELU -> Conv1d(groups=h) on the mean token; channel c's 3x3 kernel is
    r[9c:9c+9] (row-major); res[c, y, x] = sum_{dy,dx} W_c[dy+1, dx+1] v[c, y+dy, x+dx], zero
    padded."""
    def grouped_1x1(conv, t):  # t (B, Cin); explicit block-diagonal product
        g = conv.groups
        w, b = conv.weight[..., 0], conv.bias
        cin, cout = t.shape[1] // g, w.shape[0] // g
        parts = [t[:, i * cin:(i + 1) * cin] @ w[i * cout:(i + 1) * cout].t() for i in range(g)]
        return torch.cat(parts, 1) + b
    m = x_tokens.mean(1)
    r = grouped_1x1(mlp[2], F.gelu(grouped_1x1(mlp[0], m)))
    bsz, c, h, w = v_map.shape
    kern = r.reshape(bsz, c, 3, 3)
    vp = F.pad(v_map, (1, 1, 1, 1))
    res = torch.zeros_like(v_map)
    for dy in range(3):
        for dx in range(3):
            res += kern[:, :, dy, dx, None, None] * vp[:, :, dy:dy + h, dx:dx + w]
    return res


def heads(t, nh):  # (B, N, C) head-major channels -> (B, h, N, d)
    b, n, c = t.shape
    return t.reshape(b, n, nh, c // nh).transpose(1, 2)


# ----------------------------------------------------------------------------- kernels and RoPE
@pytest.mark.parametrize('name', ['identity', 'relu', 'leakyrelu', 'exp', 'elu'])
def test_kernels_are_the_papers(name):
    x = torch.linspace(-6, 6, 241, dtype=D64)
    assert torch.allclose(get_kernel(name)(x), kernel_oracle(name, x), **TOL)


@pytest.mark.parametrize('hw,d', [((3, 5), 8), ((4, 4), 16), ((2, 7), 32), ((1, 3), 4)])
def test_rope_rotates_the_papers_pairs_by_row_and_column(hw, d):
    x = torch.randn(2, 3, hw[0] * hw[1], d, dtype=D64)
    ours = apply_rope(x, *rope_sin_cos(hw, rope_angles(d, dtype=D64)))
    assert torch.allclose(ours, rope_oracle(x, hw), **TOL)


def test_a_wrong_rope_pairing_is_caught():
    """Sanity of the oracle itself: a half-split pairing (i, i + d/2), as other RoPE variants use,
    differs from the paper's adjacent pairs."""
    hw, d = (3, 4), 8
    x = torch.randn(1, 1, 12, d, dtype=D64)
    sin, cos = rope_sin_cos(hw, rope_angles(d, dtype=D64))
    half = d // 2
    wrong = x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin
    assert not torch.allclose(wrong, rope_oracle(x, hw), **TOL)


# ----------------------------------------------------------------------------- modules
@pytest.mark.parametrize('hw', [(5, 7), (8, 8)])
@pytest.mark.parametrize('kernel', [None, 'relu', 'exp'])
def test_inline_token_attention_is_the_papers(hw, kernel):
    torch.manual_seed(0)
    dim, nh = 24, 3
    m = TokenAttention(dim, nh, core='inline', kernel=kernel).double().eval()
    for p in m.parameters():
        p.data.normal_(0, 0.2)
    x = torch.randn(2, hw[0] * hw[1], dim, dtype=D64)
    q, k, v = m.qkv(x).chunk(3, -1)
    out = inline_oracle(heads(q, nh), heads(k, nh), heads(v, nh), kernel or 'identity')
    out = out.transpose(1, 2).reshape(x.shape)
    v_map = v.transpose(1, 2).reshape(2, dim, *hw)
    out = out + local_residual_oracle(m.residual, x, v_map).flatten(2).transpose(1, 2)
    assert torch.allclose(m(x, hw), m.proj(out), **TOL)


@pytest.mark.parametrize('core', ['mala', 'softmax'])
@pytest.mark.parametrize('hw', [(4, 6), (5, 5)])
def test_mavit_attention_module_is_the_papers(core, hw):
    """qkvo split, RoPE, MALA (or softmax) core, LePE 5x5 and the output gate."""
    torch.manual_seed(0)
    dim, nh = 32, 2
    m = QKVOAttention(dim, nh, core=core).double().eval()
    for p in m.parameters():
        p.data.normal_(0, 0.2)
    x = torch.randn(2, dim, *hw, dtype=D64)
    qkvo = m.qkvo(x)
    q, k, v, o = qkvo.split(dim, 1)
    lepe = m.lepe(v)
    q, k, v = (heads(t.flatten(2).transpose(1, 2), nh) for t in (q, k, v))
    if core == 'mala':
        res = mala_oracle(q, k, v, hw)
    else:
        res = softmax_oracle(rope_oracle(q, hw), rope_oracle(k, hw), v)
    res = res.transpose(-2, -1).reshape(2, dim, *hw)
    ref = m.proj((res + lepe) * o)
    rope = rope_sin_cos(hw, rope_angles(dim // nh, dtype=D64))
    assert torch.allclose(m(x, rope), ref, **TOL)


@pytest.mark.parametrize('sr,hw', [(2, (8, 6)), (4, (8, 12))])
def test_pvt_softmax_with_spatial_reduction_is_pvts(sr, hw):
    """PVT v1's spatial-reduction attention: keys/values from a strided conv + LayerNorm (torch's
    default eps 1e-5) of the map, queries from every token."""
    torch.manual_seed(0)
    dim, nh = 32, 2
    blk = PVTBlock(dim, nh, 4, 'softmax', 0.0, sr_ratio=sr).double().eval()
    for p in blk.parameters():
        p.data.normal_(0, 0.2)
    m = blk.attn
    x = torch.randn(2, hw[0] * hw[1], dim, dtype=D64)
    q = m.q(x)
    red = F.conv2d(x.transpose(1, 2).reshape(2, dim, *hw), m.sr.weight, m.sr.bias, stride=sr)
    red = red.flatten(2).transpose(1, 2)
    mu, var = red.mean(-1, keepdim=True), red.var(-1, unbiased=False, keepdim=True)
    red = (red - mu) / torch.sqrt(var + 1e-5) * m.norm.weight + m.norm.bias
    k, v = m.kv(red).chunk(2, -1)
    out = softmax_oracle(heads(q, nh), heads(k, nh), heads(v, nh)).transpose(1, 2).reshape(x.shape)
    assert torch.allclose(m(x, hw), m.proj(out), **TOL)


# ----------------------------------------------------------------------------- Swin vs mmdet
def _mmdet_swin_block(ours, dim, nh, shift):
    from mmdet.models.backbones.swin import SwinBlock as MMDetSwinBlock
    ref = MMDetSwinBlock(embed_dims=dim, num_heads=nh, feedforward_channels=4 * dim, window_size=7,
                         shift=shift, qkv_bias=True, drop_path_rate=0.).double().eval()
    mapping = {'norm1.': 'norm1.', 'attn.qkv.': 'attn.w_msa.qkv.', 'attn.proj.': 'attn.w_msa.proj.',
               'attn.relative_position_bias_table': 'attn.w_msa.relative_position_bias_table',
               'norm2.': 'norm2.', 'mlp.fc1.': 'ffn.layers.0.0.', 'mlp.fc2.': 'ffn.layers.1.'}
    state = {}
    for k, v in ours.state_dict().items():
        src = next(p for p in mapping if k.startswith(p))
        state[mapping[src] + k[len(src):]] = v
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all('relative_position_index' in k for k in missing), \
        (missing, unexpected)
    return ref


@pytest.mark.parametrize('shift', [False, True])
@pytest.mark.parametrize('hw', [(14, 14), (12, 19), (9, 23)])
def test_swin_softmax_block_equals_mmdet(shift, hw):
    """Window partition, padding, cyclic shift, mask and relative position bias as mmdet's Swin, for
    maps larger than the window (smaller maps are one unshifted window, as in Swin's own code)."""
    torch.manual_seed(0)
    dim, nh = 32, 2
    ours = SwinBlock(dim, nh, 'softmax', window_size=7, shift=shift).double().eval()
    for p in ours.parameters():
        p.data.normal_(0, 0.2)
    ref = _mmdet_swin_block(ours, dim, nh, shift)
    x = torch.randn(2, hw[0] * hw[1], dim, dtype=D64)
    with torch.no_grad():
        assert torch.allclose(ours(x, hw), ref(x, hw), **TOL)
