"""Checkpoints from http(s) URLs, at the seams users reach: mmengine's
``CheckpointLoader.load_checkpoint`` (its ``Pretrained`` init and ``load_from``), which ``import
mmlinattn`` points at our loader for the authors' hosts, a backbone's ``init_cfg``, the tools and
``python -m mmlinattn.core.weights.download``; and the checkpoint edges of tools/train.py.

Every URL is served by an ``http.server`` on 127.0.0.1 started here (huggingface.co URLs through
``HF_ENDPOINT``, others through ``MMLINATTN_CHECKPOINT_BASE_URL``); torch's hub dir is a tmp folder.
Nothing leaves the machine. Expected values come from the files the tests write (torch.load of the
served file, hashlib of its bytes), the messages from what a user reads today.
"""
import functools
import glob
import hashlib
import http.server
import importlib
import os.path as osp
import re
import socket
import threading

import pytest
import torch
import torch.hub
from mmengine.runner.checkpoint import CheckpointLoader

from mmlinattn.core.families import AUTHORS_CHECKPOINTS
from mmlinattn.core.models import InLinePVT, MAViT
from mmlinattn.core.weights import CheckpointError, url_cache_path

from helpers import save_authors_file, save_mala_style, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_MAVIT = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
SEG_PVT = osp.join(ROOT, 'configs/toy/fpn_inline-pvt-t_toy-ade.py')
TINY = dict(embed_dims=[16, 32, 32, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
HTML = (b'<!DOCTYPE html>\n<html><head><title>Link expired</title></head>'
        b'<body>This share link has expired.</body></html>\n')
HF = 'https://huggingface.co/'
MAVIT_T = AUTHORS_CHECKPOINTS['MAViT_T'].url  # https://huggingface.co/aldjalkdf/MAViT/resolve/...


class _Server:
    """A static file server on 127.0.0.1 (port 0) in a thread, recording the GET paths."""

    def __init__(self, root):
        self.root, self.requests = root, []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path.split('?')[0].lstrip('/'))
                super().do_GET()

            def log_message(self, *args):
                pass
        self.httpd = http.server.ThreadingHTTPServer(
            ('127.0.0.1', 0), functools.partial(Handler, directory=str(root)))
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def count(self, path):
        return self.requests.count(path)

    def put(self, path, data=None, seed=1):
        """Serve ``data`` (default: a tiny MAViT's weights) at ``path``; returns the weights as
        torch.load reads them back from the file."""
        dst = self.root / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:
            dst.write_bytes(data)
            return None
        torch.manual_seed(seed)
        m = MAViT(arch=TINY, out_norm=False)
        m.init_weights()
        torch.save({'state_dict': m.state_dict(), 'epoch': 3}, dst)
        return torch.load(dst, weights_only=True)['state_dict']


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The server, HF_ENDPOINT pointing at it, torch's hub dir ``tmp_path/hub``, the working
    directory ``tmp_path/run`` (no checkpoints/ folder)."""
    (tmp_path / 'srv').mkdir()
    (tmp_path / 'run').mkdir()
    monkeypatch.chdir(tmp_path / 'run')
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))
    srv = _Server(tmp_path / 'srv')
    monkeypatch.setenv('HF_ENDPOINT', srv.url)
    for name in ('MMLINATTN_CHECKPOINT_BASE_URL', 'HF_HUB_OFFLINE'):
        monkeypatch.delenv(name, raising=False)
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def _mavit(checkpoint=None):
    init = dict(type='Pretrained', checkpoint=checkpoint) if checkpoint else None
    return MAViT(arch=TINY, out_norm=False, init_cfg=init)


def _loads(url, want):
    """A backbone whose init_cfg names ``url`` gets exactly ``want``."""
    m = _mavit(url)
    m.init_weights()
    got = m.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())


def _load(url):
    return CheckpointLoader.load_checkpoint(url, map_location='cpu')


def _error(fn, *args):
    with pytest.raises(CheckpointError) as e:
        fn(*args)
    assert '\n' not in str(e.value)
    return str(e.value)


# --------------------------------------------------------------------------- mmengine's loader
def test_the_authors_hosts_go_through_our_loader_and_other_urls_stay_mmengines():
    from mmengine.runner import checkpoint as mc

    from mmlinattn.core.weights import reading
    ours = [MAVIT_T, AUTHORS_CHECKPOINTS['InLine_PVT_T'].url, HF + 'someone/x/resolve/v1/y.pth']
    assert all(CheckpointLoader._get_checkpoint_loader(u) is reading.load_from_mmlinattn
               for u in ours)
    for url, theirs in (('https://download.openmmlab.com/x.pth', mc.load_from_http),
                        ('http://huggingface.co/a/b/resolve/main/c.pth', mc.load_from_http),
                        ('https://huggingface.co.evil.example/c.pth', mc.load_from_http),
                        ('open-mmlab://resnet50_v1c', mc.load_from_openmmlab),
                        ('s3://bucket/c.pth', mc.load_from_ceph)):
        assert CheckpointLoader._get_checkpoint_loader(url) is theirs, url
    # a local path: mmengine's loader, or where mmlinattn.upstream_fixes applied its local_loader
    # (torch loads weights-only by default), that fix's wrapper of it
    from mmlinattn.training import compat
    local = CheckpointLoader._get_checkpoint_loader('checkpoints/c.pth')
    assert local is mc.load_from_local or (compat.STATUS.get('local_loader') is True and
                                           local.__qualname__.endswith('load_local'))


def test_a_url_is_fetched_once_for_mmengine_load_from_and_the_backbone(server):
    from mmengine.runner import load_checkpoint
    url = HF + 'me/w/resolve/main/w.pth'
    want = server.put('me/w/resolve/main/w.pth')
    got = _load(url)['state_dict']
    assert got.keys() == want.keys() and all(torch.equal(got[k], v) for k, v in want.items())
    m = _mavit()
    load_checkpoint(m, url, map_location='cpu', strict=True)  # the Runner's load_from
    assert all(torch.equal(m.state_dict()[k], v) for k, v in want.items())
    _loads(url, want)
    assert server.requests == ['me/w/resolve/main/w.pth']
    assert osp.isfile(url_cache_path(url))


def test_two_urls_with_one_file_name_keep_their_own_files(server, tmp_path):
    """Two releases both called mavit_t.pth: each URL loads its own file, each downloaded once; a
    file of that name in torch's cache (fetched by torch or mmengine from yet another URL) is not
    taken for either. Was: the second URL loaded the first URL's weights."""
    want = {r: server.put(f'{r}/m/resolve/main/mavit_t.pth', seed=s) for r, s in (('a', 1),
                                                                                    ('b', 2))}
    (tmp_path / 'hub' / 'checkpoints').mkdir(parents=True)
    torch.save({'state_dict': {'x': torch.zeros(1)}}, tmp_path / 'hub/checkpoints/mavit_t.pth')
    for _ in range(2):
        for r in ('a', 'b'):
            _loads(f'{HF}{r}/m/resolve/main/mavit_t.pth', want[r])
    assert sorted(server.requests) == [f'{r}/m/resolve/main/mavit_t.pth' for r in 'ab']


def test_a_hash_named_file_is_checked(server, tmp_path):
    """torch hub's name-<sha256 prefix>.pth: the right file loads (cached under that name, as torch
    keeps it); one whose hash differs from its name is refused, named and removed; a date or a
    numeric id in a name is no hash."""
    server.put('h/w.pth')
    data = (server.root / 'h/w.pth').read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    wrong = 'deadbeef' if not digest.startswith('deadbeef') else 'feedface'
    for name in (f'w-{digest[:8]}.pth', f'w-{wrong}.pth', 'w-20240131.pth', 'w-12345678.pth'):
        server.put(f'h/{name}', data)
    assert _load(f'{HF}h/w-{digest[:8]}.pth')['epoch'] == 3
    assert (tmp_path / 'hub' / 'checkpoints' / f'w-{digest[:8]}.pth').is_file()
    msg = _error(_load, f'{HF}h/w-{wrong}.pth')
    assert re.search(f'sha256 is {digest[:8]}.*promises {wrong}', msg), msg
    assert not (tmp_path / 'hub' / 'checkpoints' / f'w-{wrong}.pth').exists()
    assert _load(f'{HF}h/w-20240131.pth')['epoch'] == _load(f'{HF}h/w-12345678.pth')['epoch'] == 3


@pytest.mark.parametrize('kind', ['truncated', 'html'])
def test_a_bad_download_is_named_and_removed(server, kind):
    """Half a file, or the web page an expired link returns: the URL, the cached path and the
    reason in one line; nothing stays cached, so the next use downloads again."""
    server.put('x/good.pth')
    data = (server.root / 'x/good.pth').read_bytes()
    server.put(f'x/{kind}.pth', data[:len(data) // 2] if kind == 'truncated' else HTML)
    url = f'{HF}x/{kind}.pth'
    for attempt in (1, 2):
        msg = _error(_load, url)
        assert url in msg and url_cache_path(url) in msg
        assert ('truncated' if kind == 'truncated' else 'HTML page') in msg
        assert not osp.exists(url_cache_path(url)) and server.count(f'x/{kind}.pth') == attempt


def test_a_404_says_not_found_at_the_url_and_leaves_no_folder(server, tmp_path):
    msg = _error(_load, MAVIT_T)
    requested = server.url + '/' + MAVIT_T[len(HF):]
    assert msg.startswith(f'{requested} (mirror of {MAVIT_T}): not found at that URL (HTTP 404')
    assert 'connection' not in msg
    assert not list((tmp_path / 'hub' / 'checkpoints' / 'mmlinattn-urls').iterdir())


def test_hf_hub_offline_is_named_and_reads_the_cache(server, monkeypatch):
    """HF_HUB_OFFLINE=1: a Hugging Face file not cached is one line saying offline mode is set and
    what to do, without a request; once cached, it loads without a request."""
    want = server.put(MAVIT_T[len(HF):])
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    msg = _error(_load, MAVIT_T)
    assert 'HF_HUB_OFFLINE=1 is set (Hugging Face offline mode)' in msg
    assert 'Unset HF_HUB_OFFLINE to download it' in msg and server.requests == []
    monkeypatch.delenv('HF_HUB_OFFLINE')
    _loads(MAVIT_T, want)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    _loads(MAVIT_T, want)
    assert len(server.requests) == 1


def test_the_base_url_mirrors_every_url(server, monkeypatch):
    """MMLINATTN_CHECKPOINT_BASE_URL: an authors' file under its local name (what the download
    command saves), any other URL under its host and path; the cache stays the config URL's. A
    value that is no URL is one error naming the variable."""
    monkeypatch.setenv('MMLINATTN_CHECKPOINT_BASE_URL', f'{server.url}/mirror/')
    want = server.put('mirror/MAViT_T.pth', seed=1)
    other = server.put('mirror/example.invalid/files/release.pth', seed=2)
    _loads(MAVIT_T, want)
    _loads('https://example.invalid/files/release.pth', other)
    assert sorted(server.requests) == ['mirror/MAViT_T.pth',
                                       'mirror/example.invalid/files/release.pth']
    assert osp.isfile(url_cache_path(MAVIT_T))
    monkeypatch.setenv('MMLINATTN_CHECKPOINT_BASE_URL', 'mirror.example.org')
    assert _error(_load, HF + 'a/b/resolve/main/c.pth').startswith(
        'MMLINATTN_CHECKPOINT_BASE_URL=mirror.example.org: expected an http')


def test_a_tsinghua_share_page_says_to_add_dl1(server, monkeypatch):
    monkeypatch.setenv('MMLINATTN_CHECKPOINT_BASE_URL', server.url)
    server.put('cloud.tsinghua.edu.cn/f/abc.pth', HTML)  # the page a link without ?dl=1 gives
    url = 'https://cloud.tsinghua.edu.cn/f/abc/'
    msg = _error(_load, url)
    assert 'HTML page' in msg and '"?dl=1"' in msg and url_cache_path(url).endswith('/abc.pth')


def test_an_hf_endpoint_without_a_scheme_is_refused_before_any_work(server, tmp_path, monkeypatch,
                                                                     capsys):
    """HF_ENDPOINT=mirror.local: one error naming the variable and its value, before a request;
    the tools say it in one line before any work."""
    monkeypatch.setenv('HF_ENDPOINT', 'mirror.local')
    assert _error(_load, MAVIT_T).startswith(
        'HF_ENDPOINT=mirror.local: expected an http:// or https:// URL')
    from tools import image_demo
    out = tmp_path / 'out'
    rc = image_demo.main([str(tmp_path / 'none.jpg'), str(tmp_path / 'none.py'),
                          str(tmp_path / 'none.pth'), '--out-dir', str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith('image_demo.py: error: HF_ENDPOINT=mirror.local: expected an '
                             'http:// or https:// URL'), err
    assert not out.exists() and server.requests == []


# --------------------------------------------------------------------------- checkpoints/<name>
def _zoo_backbone():
    """A tiny MAViT whose init_cfg names the file as the zoo's MAViT-T configs do."""
    return _mavit('checkpoints/MAViT_T.pth')


def _mala_file(path, seed):
    """A tiny MAViT in the MALA release's layout; its weights as torch.load reads them back."""
    torch.manual_seed(seed)
    m = MAViT(arch=TINY, out_norm=False)
    m.init_weights()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_mala_style(path, m.state_dict())
    return torch.load(path, weights_only=False)['model']


def test_an_authors_url_reads_its_saved_checkpoints_file(server, tmp_path):
    """checkpoints/MAViT_T.pth in the working directory (the download command's file) is what the
    authors' URL loads, through mmengine's loader as through a backbone: no request."""
    want = _mala_file(tmp_path / 'run' / 'checkpoints' / 'MAViT_T.pth', seed=2)
    got = _load(MAVIT_T)['model']
    assert all(torch.equal(got[k], v) for k, v in want.items())
    _loads(MAVIT_T, want)
    assert server.requests == []


def test_a_missing_checkpoints_file_is_fetched_from_the_authors_url(server, tmp_path, capsys):
    """A zoo config's checkpoints/MAViT_T.pth run from a directory without it (mmdet's root, mim
    train): the authors' file loads instead, downloaded once; one log line names the missing path
    and the URL; the pre-flight's check takes the same route. A file that is there is read."""
    from mmengine.logging import MMLogger

    from mmlinattn.core.weights import fit_backbone_checkpoint
    want = _mala_file(server.root / MAVIT_T[len(HF):], seed=1)
    MMLogger.get_instance(f'checkpoint-urls-{tmp_path.name}', log_level='INFO')  # to this capsys
    for _ in range(2):
        _loads('checkpoints/MAViT_T.pth', want)
    fit_backbone_checkpoint(_zoo_backbone(), 'checkpoints/MAViT_T.pth', check_only=True)
    assert len(server.requests) == 1 and not (tmp_path / 'run' / 'checkpoints').exists()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if 'does not exist' in ln]
    assert len(lines) == 1, lines
    assert (f'checkpoints/MAViT_T.pth does not exist in the working directory {tmp_path / "run"}'
            in lines[0] and MAVIT_T in lines[0])
    local = _mala_file(tmp_path / 'run' / 'checkpoints' / 'MAViT_T.pth', seed=2)
    _loads('checkpoints/MAViT_T.pth', local)
    assert len(server.requests) == 1


def test_a_missing_checkpoints_file_without_network_says_how_to_get_it(server, tmp_path,
                                                                       monkeypatch):
    """The authors' host unreachable (HF_ENDPOINT on a closed port): one line with the missing
    path, why the download failed, the download command (a module of the package: it runs from
    any folder, and takes the name) and the --cfg-options line for a local file."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]  # closed once the socket is: nothing listens there
    monkeypatch.setenv('HF_ENDPOINT', f'http://127.0.0.1:{port}')
    msg = _error(_zoo_backbone().init_weights)
    assert msg.startswith('checkpoints/MAViT_T.pth does not exist in the working directory '
                          f'{tmp_path / "run"}'), msg
    assert f'cannot connect to 127.0.0.1:{port}' in msg
    module, key = re.search(r'`python -m ([\w.]+) --only (\S+)`', msg).groups()
    assert importlib.import_module(module).select([key]) == ['MAViT_T']
    assert msg.endswith('--cfg-options model.backbone.init_cfg.checkpoint=/path/to/MAViT_T.pth')


def test_a_missing_file_of_another_name_keeps_the_error_with_the_hint(server, tmp_path):
    """checkpoints/<a name the table does not have>: 'checkpoint file not found', the working
    directory and the --cfg-options line; nothing is requested."""
    assert _error(_mavit('checkpoints/my_mavit.pth').init_weights) == (
        f'checkpoint file not found: checkpoints/my_mavit.pth (looked in the working directory '
        f'{tmp_path / "run"}); give its path: --cfg-options '
        'model.backbone.init_cfg.checkpoint=/path/to/my_mavit.pth')
    assert server.requests == []


def test_every_local_name_is_one_the_configs_load():
    """The local names of the family table's checkpoints are exactly the files the configs'
    init_cfg point at under checkpoints/ (read from the config files on disk)."""
    configs = set()
    for p in glob.glob(osp.join(ROOT, 'configs/**/*.py'), recursive=True):
        configs.update(re.findall(r"checkpoints/([\w.-]+\.pth)", open(p).read()))
    assert set(e.filename for e in AUTHORS_CHECKPOINTS.values()) == configs


# --------------------------------------------------------------------------- tools
def test_readme_table_is_the_tools_output():
    """checkpoints/README.md's table (between its markers) is what ``download_checkpoints.py
    --list --markdown`` prints; each row's glob finds the configs that load that file."""
    from tools.misc import download_checkpoints as dl
    readme = open(osp.join(ROOT, 'checkpoints/README.md')).read()
    block = re.search(r'<!-- checkpoint-table:start[^>]*-->\n(.*?)\n<!-- checkpoint-table:end -->',
                      readme, re.S)
    assert block, 'checkpoints/README.md lost its checkpoint-table markers'
    assert block.group(1) == dl.markdown_table(), ('stale table: run python '
                                                   'tools/misc/download_checkpoints.py --list '
                                                   '--markdown')
    for name, entry in AUTHORS_CHECKPOINTS.items():
        pattern = re.search(r'`(configs/[^`]+)`', dl.markdown_table([name])).group(1)
        found = glob.glob(osp.join(ROOT, pattern + '.py'))
        assert found and all(f'checkpoints/{entry.filename}' in open(f).read() for f in found), \
            name


def test_download_checkpoints_tool(server, tmp_path, capsys):
    """Files fetched once into --out-dir with their sha256 recorded (--base-url, and HF_ENDPOINT
    for the huggingface.co file); a second run verifies; a changed file and an HTML page are
    named (the page removed)."""
    from tools.misc import download_checkpoints as dl
    server.put('mirror/inline_pvt_t.pth', seed=2)
    mavit_path = MAVIT_T[len(HF):]
    server.put(mavit_path, seed=1)  # through HF_ENDPOINT, no --base-url
    out_dir = tmp_path / 'checkpoints'
    base = ['--out-dir', str(out_dir), '--no-progress']
    assert dl.main(['--only', 'InLine_PVT_T', '--base-url', f'{server.url}/mirror', *base]) == 0
    assert dl.main(['--only', 'mavit-t', *base]) == 0
    sums = dict(ln.split()[::-1] for ln in (out_dir / 'SHA256SUMS').read_text().splitlines())
    for name, served in (('inline_pvt_t.pth', 'mirror/inline_pvt_t.pth'),
                         ('MAViT_T.pth', mavit_path)):
        data = (server.root / served).read_bytes()
        assert (out_dir / name).read_bytes() == data and server.count(served) == 1
        assert sums[name] == hashlib.sha256(data).hexdigest()
    assert len(sums) == 2
    capsys.readouterr()
    assert dl.main(['--only', 'MAViT_T', *base]) == 0
    assert 'sha256 verified' in capsys.readouterr().out and server.count(mavit_path) == 1
    with open(out_dir / 'MAViT_T.pth', 'ab') as f:
        f.write(b'\0')
    assert dl.main(['--only', 'MAViT_T', *base]) == 1
    assert 'MAViT_T.pth has sha256' in capsys.readouterr().err
    server.put('mirror/MAViT_S.pth', HTML)
    assert dl.main(['--only', 'MAViT_S', '--base-url', f'{server.url}/mirror', *base]) == 1
    err = capsys.readouterr().err
    assert 'HTML page' in err and f'{server.url}/mirror/MAViT_S.pth' in err
    assert not (out_dir / 'MAViT_S.pth').exists()
    assert 'MAViT_S.pth' not in (out_dir / 'SHA256SUMS').read_text()


def _seg_data(root):
    return [f'{k}_dataloader.dataset.data_root={root}/toy_ade' for k in ('train', 'val', 'test')]


def test_test_tool_takes_a_url(server, tmp_path, toy_data, toy_checkpoints, capsys):
    from tools import test as test_tool
    assert toy_checkpoints.seg_cfg == SEG_MAVIT
    server.put('me/seg/resolve/main/seg.pth', open(toy_checkpoints.seg, 'rb').read())
    url = HF + 'me/seg/resolve/main/seg.pth'  # the checks and mmengine's load read one download
    rc = test_tool.main([SEG_MAVIT, url, '--work-dir', str(tmp_path / 'wd'), '--cfg-options',
                         *_seg_data(toy_data)])
    assert rc == 0 and 'mIoU' in capsys.readouterr().out
    assert server.requests == ['me/seg/resolve/main/seg.pth'] and osp.isfile(url_cache_path(url))


# --------------------------------------------------------------------------- train.py edges
def _fresh_logger(name):
    """The pre-flight logs to mmengine's current logger, which an earlier test may have bound to
    its own (now closed) captured stdout: a fresh one, made in the test's body, writes to this
    test's."""
    from mmengine.logging import MMLogger
    return MMLogger.get_instance(f'checkpoint-urls-{name}', log_level='INFO')


def test_backbone_checkpoint_of_another_architecture_is_one_line(tmp_path, toy_data, capsys):
    """InLine-PVT weights as MAViT's init_cfg: exit 2, one line naming the file, the backbone and
    the first keys, before the Runner (no work dir checkpoint)."""
    from tools import train as train_tool
    torch.manual_seed(0)
    ckpt = tmp_path / 'pvt.pth'
    torch.save({'model': InLinePVT(arch=TINY, mlp_ratio=2).state_dict()}, ckpt)
    work = tmp_path / 'wd'
    _fresh_logger(tmp_path.name)
    capsys.readouterr()
    rc = train_tool.main([SEG_MAVIT, '--work-dir', str(work), '--cfg-options', *_seg_data(toy_data),
                          'model.backbone.init_cfg.type=Pretrained',
                          f'model.backbone.init_cfg.checkpoint={ckpt}', 'train_cfg.max_iters=1'])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1, err
    assert str(ckpt) in err[0] and 'MAViT' in err[0] and 'init_cfg' in err[0]
    assert 'patch_embed' in err[0]  # the first keys
    assert not list(work.glob('**/*.pth')) if work.exists() else True


def test_load_from_converted_backbone_file(tmp_path, toy_data, capsys):
    """The converter's backbone file as load_from: mmengine would load none of its keys (no
    "backbone." prefix), in mmdet's own train.py as in ours. Stopped in one line that gives the
    init_cfg to write; with that line the backbone gets exactly its weights and the run trains."""
    from tools import train as train_tool
    from tools.model_converters import convert_authors_checkpoint as conv
    src, dst = tmp_path / 'authors.pth', tmp_path / 'converted.pth'
    save_authors_file(src, 'inline_pvt', 'tiny')
    assert conv.main(['inline_pvt', 'tiny', str(src), str(dst)]) == 0
    want = torch.load(dst, weights_only=True)['state_dict']
    work = tmp_path / 'wd'
    _fresh_logger(tmp_path.name)
    common = ['train_cfg.max_iters=1', 'optim_wrapper.optimizer.lr=0',
              'optim_wrapper.optimizer.weight_decay=0']
    rc = train_tool.main([SEG_PVT, '--work-dir', str(work), '--cfg-options', *_seg_data(toy_data),
                          f'load_from={dst}', *common])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith('tools/')]
    assert rc == 2 and len(err) == 1, err
    assert f'load_from {dst} holds backbone weights only' in err[0]
    fix = err[0].split('--cfg-options ', 1)[1].split(' (in a config')[0].split()
    assert work_dir_files(work) == {}  # no checkpoint, no config dump (a log folder)
    rc = train_tool.main([SEG_PVT, '--work-dir', str(work), '--cfg-options', *_seg_data(toy_data),
                          f'load_from={dst}', *common, *fix])
    assert rc == 0
    got = torch.load(work / 'iter_1.pth', weights_only=False, map_location='cpu')['state_dict']
    assert all(torch.equal(got['backbone.' + k], v) for k, v in want.items())
