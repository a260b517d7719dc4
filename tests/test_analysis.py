"""Analysis tools: confusion counts, local mass, attention maps (FLOPs: tests/test_flops.py)."""
import math
import os.path as osp

import pytest
import torch

from mmlinattn.core.models import InLinePVT, MAViT
from mmlinattn.core.ops import (
    inline_attention_matrix,
    linear_attention_matrix,
    softmax_attention_matrix,
)
from tools.analysis_tools import analyze_attention
from tools.analysis_tools.analyze_attention import (
    collect_attention,
    confusion_count,
    local_mass,
    summarize,
)


def test_confusion_zero_for_softmax_on_random_queries():
    q, k = torch.randn(1, 1, 64, 16), torch.randn(1, 1, 64, 16)
    a = softmax_attention_matrix(q * 4, k)
    assert confusion_count(a[0, 0], q[0, 0]) == 0


def test_confusion_positive_for_linear_with_collinear_queries():
    base = torch.rand(8, 16) + 0.1
    q = torch.cat([base, 2 * base, 5 * base])            # each row has two collinear partners
    k = torch.randn(64, 16)
    lin = linear_attention_matrix(q[None, None], k[None, None], kernel='relu')[0, 0]
    assert confusion_count(lin, q) == 8 * 3             # 3 pairs per direction
    inl = inline_attention_matrix(q[None, None] * 8, k[None, None])[0, 0]
    assert confusion_count(inl, q) == 0


def test_local_mass_against_chance():
    hw = (6, 7)
    n = 42
    uniform = torch.full((n, n), 1.0 / n)
    # interior queries see 9 cells, border ones fewer: the mean is below 9/N
    assert local_mass(uniform, hw) < 9 / n
    identity = torch.eye(n)
    assert local_mass(identity, hw) == pytest.approx(1.0)


def test_collect_attention_matches_linear_path():
    """The explicit matrices come from the same weights and inputs as the linear-time output."""
    model = InLinePVT(arch='tiny', attn_cfg=dict(local_residual=False))
    model.init_weights()
    model.eval()
    x = torch.randn(1, 3, 64, 64)
    recs = collect_attention(model, x)
    assert [r['name'] for r in recs][:2] == ['block1.0.attn', 'block1.1.attn']
    rows = summarize(recs)
    # InLine weights may be negative, so the 3x3 mass is not bounded by [0, 1] in general; on a map
    # of at most 2x2 every key is in each query's 3x3 neighbourhood and the mass is the row sum, 1.
    small = [(r, rec) for r, rec in zip(rows, recs) if max(rec['hw']) <= 2]
    assert small, 'the 64 px input should give a 2x2 last stage'
    for r, _ in small:
        # a float32 sum of <= 4 weights under 0.4 (measured): ~1e-7 off 1 in any order
        assert r['local_mass'] == pytest.approx(1.0, abs=1e-5)
    assert all(math.isfinite(r['local_mass']) for r in rows)
    # rebuild block1.0's attention output from the matrix: A @ v then proj
    blk = model.block1[0]
    captured = {}
    blk.attn.register_forward_hook(lambda m, a, o: captured.update(inp=a, out=o))
    model(x)
    tokens, hw = captured['inp']
    q, k, v, _ = blk.attn._qkv(tokens, hw)
    a = blk.attn.attention_matrix(tokens, hw)
    ref = blk.attn.proj((a @ v).transpose(1, 2).reshape(tokens.shape))
    # float32, the linear-time form against A @ v: other sums over 256 tokens, 5e-7 of the output's
    # scale apart (measured); relative to that scale, 5e-3 here (an absolute 1e-4 would be 2 %)
    scale = ref.abs().max().item()
    torch.testing.assert_close(captured['out'], ref, rtol=0, atol=2e-4 * scale)


def test_mavit_records_mala_and_softmax(tmp_path):
    model = MAViT(arch='tiny')
    model.init_weights()
    recs = collect_attention(model.eval(), torch.randn(1, 3, 64, 64))
    assert {r['core'] for r in recs} == {'mala', 'softmax'}
    for r in recs:
        assert torch.isfinite(r['attn']).all()
        if r['core'] == 'softmax':
            rows = r['attn'].sum(-1)
            # float32 rows of <= 16 softmax weights: <= 16 * 2^-24 = 1e-6 off 1 in any order
            assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4)
        # MALA rows sum to 1 only without RoPE: the authors rotate the numerator, not z


def test_analyze_attention_tool_writes_png(tmp_path, capsys):
    analyze_attention.main(['--backbone', 'InLinePVT', 'tiny', '--size', '64',
                            '--out', str(tmp_path)])
    assert osp.getsize(tmp_path / 'attention_maps.png') > 1000
    assert 'confused pairs' in capsys.readouterr().out


def test_benchmark_step_table_compares_models_at_the_same_size():
    """A resolution sweep's table divides each reference's time by ours at the *same* size only;
    inference-only rows (no training step) print '-' instead of a ratio."""
    from tools.analysis_tools.benchmark_step import table

    def row(bb, size, train, infer):  # reference rows carry the config they swapped the backbone in
        return dict(config='upernet_inline-swin-t_160k_ade20k-512x512', backbone=bb, params_m=1.0,
                    batch=2, size=[size, size], train_s=train, infer_s=infer,
                    train_mem_mb=None if train is None else 10.0)
    rows = [row('InLineSwin', 512, 2.0, 1.0), row('InLineSwin', 1024, 8.0, 4.0),
            row('Swin-T', 512, 3.0, 1.5), row('Swin-T', 1024, 4.0, 8.0),
            row('PVT-S', 512, 1.0, 0.5), row('PVT-S', 1024, None, 2.0)]
    lines = table(rows).splitlines()
    ours = [ln for ln in lines if '| InLineSwin |' in ln]
    assert len(ours) == 2
    # 512: Swin-T 3/2 = 1.50 (train), 1.5/1 = 1.50 (infer); PVT-S 1/2 = 0.50, 0.5/1 = 0.50
    assert ours[0].startswith('| upernet_inline-swin-t_160k_ade20k-512x512 | 512x512 |')
    assert ours[0].endswith('| 1.50 / 1.50 | 0.50 / 0.50 |')
    # 1024: Swin-T 4/8 = 0.50, 8/4 = 2.00; PVT-S has no training step there
    assert ours[1].endswith('| 0.50 / 2.00 | - / 0.50 |')
