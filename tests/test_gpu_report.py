"""The GPU report (tools/analysis_tools/gpu_report.py, ``make gpu-report``) on the CPU: its plan,
its markdown, and its refusal without CUDA. The measurements themselves need a GPU and are not run
here."""
import glob
import json
import os
import os.path as osp
import re

from tools.analysis_tools import gpu_report as G

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_every_test_that_skips_without_cuda_is_in_the_report():
    needs_gpu = []
    for path in sorted(glob.glob(osp.join(ROOT, 'tests', 'test_*.py'))):
        with open(path) as f:
            if re.search(r'skipif\(\s*not torch\.cuda\.is_available\(\)', f.read()):
                needs_gpu.append(osp.relpath(path, ROOT))
    assert needs_gpu and sorted(needs_gpu) == sorted(G.GPU_TESTS)


def test_plan_covers_every_t_and_s_model_once_with_and_without_amp():
    jobs = G.plan(ROOT)
    configs = {j.config for j in jobs if j.ref is None}
    # every T/S config of the matrix, except a 3x config whose 1x twin trains the same model
    on_disk = set()
    for family in G.FAMILIES:
        for name in os.listdir(osp.join(ROOT, 'configs', family)):
            m = G.BACKBONE_IN_NAME.search(name)
            if m and m.group(2) in 'ts' and name.endswith('.py'):
                on_disk.add(osp.join('configs', family, name))
    twins = {c for c in on_disk if 'ms-3x' in c and c.replace('ms-3x', '1x') in on_disk
             and G.model_kind(c) == 'mask-rcnn'}
    assert twins and configs == on_disk - twins
    assert not any('ms-3x' in c and G.model_kind(c) == 'mask-rcnn' for c in configs)
    keys = [(j.config, j.ref) for j in jobs]
    assert len(keys) == len(set(keys))
    # mmdet's Swin-T and PVT-S in Mask R-CNN and UperNet, first; then T before S
    refs = [(G.model_kind(j.config), j.ref) for j in jobs if j.ref]
    assert sorted(set(refs)) == sorted((k, r) for k in ('mask-rcnn', 'upernet')
                                       for r in ('Swin-T', 'PVT-S'))
    order = [j.arch if j.ref is None else 'R' for j in jobs]
    assert order == sorted(order, key='RTS'.index)
    assert G.estimate_s(jobs) <= 20 * 60, 'the plan no longer fits the 20-minute budget estimate'


def test_labels_name_the_reference_backbone():
    job = G.Job('configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py', 'PVT-S', 'T')
    assert job.label == 'upernet_pvt-s_160k_ade20k-512x512'


def _step(mem, seconds, backbone='MAViT', batch=2):
    return dict(backbone=backbone, batch=batch, train_hw=[800, 1333], train_mem_mb=mem,
                train_s=seconds)


def test_markdown_tables():
    jobs = [G.Job('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', None, 'T'),
            G.Job('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', 'Swin-T', 'T'),
            G.Job('configs/mavit/fpn_mavit-s_80k_ade20k-512x512.py', None, 'S')]
    swin = G.parse_worker('noise\nRESULT ' + json.dumps(dict(error='CUDA OOM', amp=False))
                          + '\nRESULT ' + json.dumps(dict(_step(6000.0, 0.4, 'Swin-T'), amp=True))
                          + '\n', 0)
    assert swin['fp32'] == dict(error='CUDA OOM') and swin['amp']['train_s'] == 0.4
    results = [dict(fp32=_step(8000.0, 0.5), amp=_step(5000.0, 0.25)), swin, None]
    md = G.format_training(jobs, results)
    lines = md.splitlines()
    assert len(lines) == 2 + 3
    assert ('| mask-rcnn_mavit-t_fpn_1x_coco | MAViT | 2 | 800x1333 | 8000 | 2.00 | 5000 | 4.00 '
            '| 0.62 | 2.00 |') in lines
    assert 'error: CUDA OOM' in lines[3]
    assert lines[3].startswith('| mask-rcnn_swin-t_fpn_1x_coco | Swin-T |')
    assert lines[3].endswith('| 6000 | 2.50 | - | - |')
    assert 'not run (time budget)' in lines[4]
    # a worker that died or was stopped: both precisions say why
    assert G.parse_worker('', -9)['amp'] == dict(error='process killed (signal 9)')
    assert G.parse_worker('', None, 120)['fp32'] == dict(error='stopped after 120 s')
    att = [dict(tokens=1024, inline_float16_err=1e-3, inline_bfloat16_err=8e-3,
                mala_float16_err=2e-3, mala_bfloat16_err=9e-3, flash_fp16_ms=0.05,
                inline_fp16_ms=0.1, mala_fp16_ms=0.2, inline_fp32_ms=0.2, mala_fp32_ms=0.4),
           dict(tokens=2048, inline_float16_err=1e-3, inline_bfloat16_err=8e-3,
                mala_float16_err=2e-3, mala_bfloat16_err=9e-3, flash_error='no kernel',
                inline_fp16_ms=0.1, mala_fp16_ms=0.2, inline_fp32_ms=0.2, mala_fp32_ms=0.4)]
    table = G.format_attention(att).splitlines()
    assert table[2].endswith('| 0.200 | 0.400 | 2.00 | 4.00 |') and '| n/a |' in table[3]
    tests = G.parse_pytest('F.s\nFAILED tests/test_amp.py::test_x[mavit] - AssertionError\n'
                           '1 failed, 2 passed, 1 skipped in 3.2s\n', 1)
    assert tests['counts'] == {'failed': 1, 'passed': 2, 'skipped': 1}
    assert tests['failed'] == ['tests/test_amp.py::test_x[mavit]']
    report = G.report('GPU X', tests, att, jobs, results, 12.5)
    assert report.startswith('# GPU report\n\nGPU X')
    assert '`tests/test_amp.py::test_x[mavit]`' in report
    assert 'Wall time: 12.5 min.' in report


def test_exits_nonzero_without_cuda(monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert G.main(['--out', 'unused']) == 2
    assert 'no CUDA GPU here' in capsys.readouterr().err
    assert G.main(['--plan']) == 0
    assert 'configs, each in fp32 and with AMP; estimated' in capsys.readouterr().out
