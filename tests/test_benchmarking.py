"""mmlinattn.analysis.benchmarking's measuring helpers against allocations of known size (numel x 4
B)."""
import torch

from mmlinattn.analysis.benchmarking import peak_memory

MB4 = 1000 * 1000 * 4  # a 1000 x 1000 float32 tensor


def _close(measured: int, expected: int) -> bool:
    return abs(measured - expected) <= 0.01 * expected


def test_peak_memory_counts_a_nested_allocation_once():
    """randn allocates through a nested aten::empty: one 4 MB tensor, not 8 MB."""
    assert _close(peak_memory(lambda: torch.randn(1000, 1000).sum()), MB4)


def test_peak_memory_follows_frees():
    def two_alive():
        a = torch.randn(1000, 1000)
        b = torch.ones(500, 1000)
        return a.sum() + b.sum()

    def one_after_another():
        a = torch.randn(1000, 1000)
        s = a.sum()
        del a
        b = torch.ones(500, 1000)
        return s + b.sum()
    assert _close(peak_memory(two_alive), MB4 + MB4 // 2)
    assert _close(peak_memory(one_after_another), MB4)


def test_count_passes_counts_the_floor_by_its_definition():
    """The floor is two products forward (K^T V, Q (K^T V)) and four gradient products backward;
    an elementwise op on (N x d) is a pass, one on (N x 1) and a view are not."""
    from mmlinattn.analysis.profiling import count_passes
    n, d = 37, 6
    q, k, v = (torch.randn(1, 2, n, d, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 2, n, d)

    def floor():
        return torch.matmul(q, torch.matmul(k.transpose(-2, -1), v))
    with torch.no_grad():
        assert len(count_passes(floor, n, d)) == 2
        x = q.detach()
        assert count_passes(lambda: (x.transpose(-2, -1).exp() + 1).sum(-2, keepdim=True).exp(),
                            n, d) == ['aten::exp', 'aten::add', 'aten::sum']
    assert len(count_passes(lambda: torch.autograd.grad(floor(), (q, k, v), g), n, d)) == 6


def _detections(fixed_heads):
    from mmlinattn.analysis.benchmarking import bench_model
    torch.manual_seed(0)
    bench = bench_model('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', size=(96, 128),
                        fixed_heads=fixed_heads)
    model = bench.model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(bench.make(1, bench.test_hw), False)
        feats = model.extract_feat(data['inputs'])
        proposals = model.rpn_head.predict(feats, data['data_samples'], rescale=False)
        dets = model.roi_head.predict(feats, proposals, data['data_samples'], rescale=True)
    return len(proposals[0]), len(dets[0]), bench.cfg.model.test_cfg


def test_same_head_work_keeps_every_proposal_and_detection():
    """mmdet's own heads: with --same-head-work a randomly initialised COCO Mask R-CNN hands on
    exactly its test_cfg's max_per_img proposals and detections (the mask head runs on all of
    them); without it the 0.05 score threshold keeps fewer (random class scores are ~1/81)."""
    n_prop, n_det, cfg = _detections(True)
    assert n_det == cfg.rcnn.max_per_img and n_prop == cfg.rpn.max_per_img
    assert cfg.rpn.nms.iou_threshold == 1.0 and cfg.rcnn.score_thr == 0.0
    _, n_det_default, cfg_default = _detections(False)
    assert n_det_default < n_det and cfg_default.rcnn.score_thr > 0


def test_infer_together_times_every_model_in_one_process():
    """--infer-together: one row per model, whole inference no faster than its backbone alone,
    and the table's ratio columns filled from the reference row."""
    from mmlinattn.analysis.benchmarking import infer_together
    from tools.analysis_tools.benchmark_step import table
    rows = infer_together([('configs/inline_pvt/retinanet_inline-pvt-t_fpn_1x_coco.py', None),
                           ('configs/inline_pvt/retinanet_inline-pvt-t_fpn_1x_coco.py', 'Swin-T')],
                          size=(96, 128), reps=2)
    assert [r['backbone'] for r in rows] == ['InLinePVT', 'Swin-T']
    for r in rows:
        assert r['infer_s'] >= r['infer_backbone_s'] > 0 and r['together'] and r['fixed_heads']
    md = table(rows)
    ratio = rows[1]['infer_s'] / rows[0]['infer_s']
    assert f'- / {ratio:.2f} (backbone ' in md


# ----------------------------------------------------------------- the tools, at the smallest sizes
SEG = 'configs/inline_pvt/fpn_inline-pvt-t_80k_ade20k-512x512.py'


def _json(path):
    import json
    with open(path) as f:
        return json.load(f)


def test_attention_tool_grid_stages_and_passes(tmp_path, capsys):
    """benchmark_attention.py in process: the grid (every core, its ratio to the floor of the same
    run, the device named), the backbones' stage shapes and the pass count."""
    from tools.analysis_tools import benchmark_attention as tool
    tool.main(['--tokens', '64', '--heads', '1', '--head-dim', '8', '--repeats', '2',
               '--out', str(tmp_path)])
    out = capsys.readouterr().out
    assert 'CPU: ' in out and 'ratio to the floor over 2 round(s)' in out
    row = _json(tmp_path / 'benchmark_attention.json')['rows'][0]
    assert row['N'] == 64 and {'floor', 'softmax', 'inline', 'mala'} <= set(row['time_s'])
    assert all(len(ts) == 2 for ts in row['rounds_s'].values())
    assert tool.main(['--stages', '--models', 'mavit-t@64x64x1', '--out', str(tmp_path)]) == 0
    rows = _json(tmp_path / 'benchmark_attention_stages_cpu.json')['rows']
    assert [(r['core'], r['N'], r['layout']) for r in rows] == [('mala', 256, 'strided'),
                                                               ('mala', 64, 'strided')]
    capsys.readouterr()
    tool.main(['--passes', '--heads', '1', '--head-dim', '8'])
    assert '     floor |   2 |   6' in capsys.readouterr().out


def test_backbones_tool_as_a_script_and_its_inference_paths(tmp_path):
    """benchmark.py as users run it, with no command name (``backbones``): the ratio columns, nan
    where a model was left out; ``inference`` (in process) times a config's backbone on a path
    against Swin-T's time of the same run (here itself)."""
    import subprocess
    import sys

    from tools.analysis_tools import benchmark as tool
    out = subprocess.run([sys.executable, tool.__file__, '--sizes', '32', '--models',
                          'InLine-PVT-S', 'PVT-S (mmdet)', '--no-memory', '--out', str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    t = _json(tmp_path / 'benchmark_backbones.json')['rows'][0]['time_s']
    nan = float('nan')
    assert 'CPU: ' in out and f"{t['PVT-S (mmdet)'] / t['InLine-PVT-S']:8.2f} {nan:9.2f}" in out
    assert (tmp_path / 'benchmark_backbones.png').exists()
    tool.main(['inference', '--sizes', '32', '--neck-sizes', '--paths', 'eager', '--repeats', '2',
               '--models', 'Swin-T (mmdet)', '--out', str(tmp_path / 'inf')])
    (row,) = _json(tmp_path / 'inf.json')['rows']
    assert len(row['times_s']) == 2 and row['ratio_best'] == row['ratio_median'] == 1.0
    assert f'| backbone | 32x32 | Swin-T (mmdet) | {row["best_s"] * 1e3:.0f} (1.00 / 1.00) |' \
        in (tmp_path / 'inf.md').read_text()


def test_amp_memory_of_each_precision(tmp_path, monkeypatch, capsys):
    """benchmark.py amp: fp32 and bf16 of a backbone (each measured here instead of in a fresh
    process); bf16 keeps less, autocast's weight copies counted apart."""
    from tools.analysis_tools import benchmark as tool
    asked = []

    def here(script, argv, **env):
        asked.append(argv)
        _, _, name, precision, _, batch, _, size = argv
        return tool.amp_step(name, precision, batch, size), None
    monkeypatch.setattr(tool, 'in_fresh_process', here)
    tool.main(['amp', '--size', '64', '--batch', '1', '--backbones', 'InLinePVT',
               '--out', str(tmp_path / 'amp.json')])
    assert [a[:4] for a in asked] == [['amp', '--one', 'InLinePVT', p] for p in ('fp32', 'bf16')]
    fp32, bf16 = _json(tmp_path / 'amp.json')
    assert 0 < bf16['activations_mb'] < fp32['activations_mb'] and bf16['weights_mb'] > 0
    assert fp32['weights_mb'] == 0 and fp32['cores_mb'] > 0
    assert '| InLinePVT tiny |' in capsys.readouterr().out


def test_step_tool_measures_a_config_in_a_fresh_process(tmp_path, capsys):
    """benchmark_step.py: one config at a small size in its own process, its row in OUT.json and
    the table under the machine's name; --table prints a saved run again."""
    from tools.analysis_tools import benchmark_step as tool
    assert tool.main([SEG, '--size', '64x64', '--batch', '1', '--warmup', '0',
                      '--out', str(tmp_path / 'step')]) == 0
    out = capsys.readouterr().out
    (row,) = _json(tmp_path / 'step.json')
    assert row['train_s'] > 0 and row['infer_s'] > 0 and row['size'] == [64, 64]
    name = '| fpn_inline-pvt-t_80k_ade20k-512x512 | 64x64 | InLinePVT |'
    assert row['where'] in out and name in out
    tool.main(['--table', str(tmp_path / 'step.json')])
    assert name in capsys.readouterr().out


def test_step_tool_times_our_hooks_after_a_real_step(capsys):
    """benchmark_step.py --hooks: the step, our two hooks, mmengine's and 0.1's check."""
    from tools.analysis_tools import benchmark_step as tool
    tool.main([SEG, '--hooks', '--size', '64x64', '--batch', '1', '--iters', '1'])
    line = [ln for ln in capsys.readouterr().out.splitlines()
            if ln.startswith('| fpn_inline-pvt-t_80k_ade20k-512x512 |')]
    assert len(line) == 1 and line[0].count('%') == 2 and '| 1 x 64x64 |' in line[0]


def test_peak_rss_sees_an_allocation_of_known_size(tmp_path):
    """The peak-RSS reader (--rss here, benchmark_step's CPU memory) grows by (at least most of) a
    200 MB buffer written once, in a fresh process as the tools run, after its high-water mark is
    reset to the current resident size through ``/proc/self/clear_refs`` where that file can be
    written (as benchmark.py --rss does). Taken in the long-lived pytest worker instead, the
    reading once grew by 0 KB under ``make test`` while it passed alone and in other full runs
    (cause not found); the tools take it in a process of their own."""
    import subprocess
    import sys
    code = ('import torch\n'
            'from mmlinattn.analysis.benchmarking import peak_rss_kb\n'
            'try:\n'
            '    with open("/proc/self/clear_refs", "w") as f: f.write("5")\n'
            'except OSError:\n'
            '    pass\n'
            'base = peak_rss_kb()\n'
            'buf = torch.ones(200 * 2 ** 20 // 4); buf += 1\n'
            'print(peak_rss_kb() - base)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, cwd=str(tmp_path))
    grown = float(out.stdout.split()[-1])
    assert grown >= 0.9 * 200 * 1024
