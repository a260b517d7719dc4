"""Checkpoints from http(s) URLs (init_cfg, load_from, tools/test.py,
tools/misc/download_checkpoints.py) and the checkpoint edges of tools/train.py (a backbone file of
another architecture; the converter's backbone file through load_from).

Every URL points at an ``http.server`` on 127.0.0.1 started here; torch's hub dir is a tmp folder.
Nothing leaves the machine. Expected values come from the files the tests write (torch.load of the
served file, hashlib of its bytes), not from the code under test.
"""
import functools
import hashlib
import http.server
import os.path as osp
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.hub

from mmlinattn.core.families import AUTHORS_CHECKPOINTS
from mmlinattn.core.models import InLinePVT, MAViT
from mmlinattn.core.weights import CheckpointError

from helpers import save_authors_file, save_mala_style

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_MAVIT = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
SEG_PVT = osp.join(ROOT, 'configs/toy/fpn_inline-pvt-t_toy-ade.py')
TINY = dict(embed_dims=[16, 32, 32, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
HTML = (b'<!DOCTYPE html>\n<html><head><title>Link expired</title></head>'
        b'<body>This share link has expired.</body></html>\n')


class _Server:
    """A static file server on 127.0.0.1 (port 0) in a thread, counting the GET requests per
    path."""

    def __init__(self, root):
        self.requests = []
        self.heads = []
        self.hub_headers = True  # False: a static file server (no X-Repo-Commit, no ETag)
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split('?')[0]
                # huggingface_hub >= 2.x asks the endpoint for its agent registry once a process
                # (a header, not a file): not a request of ours
                if path != '/api/agent-harnesses':
                    outer.requests.append(path)
                super().do_GET()

            def do_HEAD(self):
                outer.heads.append(self.path.split('?')[0])
                super().do_HEAD()

            def end_headers(self):
                # what the Hugging Face Hub sends with a file (huggingface_hub needs both)
                if outer.hub_headers:
                    self.send_header('X-Repo-Commit', 'c' * 40)
                    self.send_header('ETag',
                                     '"%s"' % hashlib.sha1(self.path.encode()).hexdigest())
                super().end_headers()

            def log_message(self, *args):
                pass
        handler = functools.partial(Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def count(self, name):
        return self.requests.count('/' + name)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(server, folder it serves); torch's hub dir is ``tmp_path/hub``."""
    root = tmp_path / 'srv'
    root.mkdir()
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))
    server = _Server(root)
    yield server, root
    server.close()


def _tiny_mavit_file(path, seed=1):
    """A tiny MAViT's weights as the MALA release stores them (``model``); returns what torch.load
    reads back from the file."""
    torch.manual_seed(seed)
    m = MAViT(arch=TINY, out_norm=False)
    m.init_weights()
    torch.save({'model': m.state_dict(), 'epoch': 3}, path)
    return torch.load(path, weights_only=True)['model']


def _cached(tmp_path, name):
    """The one file named ``name`` in torch's hub cache (wherever under checkpoints/), or the
    path it would have at the top when there is none."""
    found = list((tmp_path / 'hub' / 'checkpoints').rglob(name))
    assert len(found) <= 1, found
    return found[0] if found else tmp_path / 'hub' / 'checkpoints' / name


# --------------------------------------------------------------------------- init_cfg URL
def test_init_cfg_url_loads_the_file_once(served, tmp_path):
    server, root = served
    want = _tiny_mavit_file(root / 'good.pth')
    url = f'{server.url}/good.pth'
    for _ in range(2):  # the second backbone reads the cached file
        torch.manual_seed(123)
        m = MAViT(arch=TINY, out_norm=False, init_cfg=dict(type='Pretrained', checkpoint=url))
        m.init_weights()
        got = m.state_dict()
        assert set(want) <= set(got)
        assert all(torch.equal(got[k], v) for k, v in want.items())
    assert _cached(tmp_path, 'good.pth').is_file()
    assert server.count('good.pth') == 1


def test_two_urls_with_one_file_name_keep_their_own_files(served, tmp_path):
    """Two releases both called mavit_t.pth (a mirror, a moved file): each URL loads its own file,
    each downloaded once; a file under the plain name in torch's cache (what torch or mmengine
    fetched from yet another URL) is not taken for either. Was: the second URL logged 'loaded
    from HOST2' and loaded the first URL's weights."""
    server, root = served
    (root / 'a').mkdir()
    (root / 'b').mkdir()
    want = {'a': _tiny_mavit_file(root / 'a' / 'mavit_t.pth', seed=1),
            'b': _tiny_mavit_file(root / 'b' / 'mavit_t.pth', seed=2)}
    plain = tmp_path / 'hub' / 'checkpoints' / 'mavit_t.pth'
    plain.parent.mkdir(parents=True)
    _tiny_mavit_file(plain, seed=3)
    for _ in range(2):
        for rel in ('a', 'b'):
            url = f'{server.url}/{rel}/mavit_t.pth'
            m = MAViT(arch=TINY, out_norm=False, init_cfg=dict(type='Pretrained', checkpoint=url))
            m.init_weights()
            got = m.state_dict()
            assert all(torch.equal(got[k], v) for k, v in want[rel].items()), rel
    assert server.count('a/mavit_t.pth') == 1 and server.count('b/mavit_t.pth') == 1
    assert not torch.equal(want['a'][next(iter(want['a']))], want['b'][next(iter(want['b']))])


def test_a_hash_named_file_is_checked(served, tmp_path):
    """torch hub's name-<sha256 prefix>.pth: the right file loads (cached under that name, as torch
    keeps it); a file whose hash differs from its name is refused, named and removed."""
    import hashlib
    server, root = served
    _tiny_mavit_file(root / 'w.pth')
    digest = hashlib.sha256((root / 'w.pth').read_bytes()).hexdigest()
    (root / f'w-{digest[:8]}.pth').write_bytes((root / 'w.pth').read_bytes())
    wrong = 'deadbeef' if not digest.startswith('deadbeef') else 'feedface'
    (root / f'w-{wrong}.pth').write_bytes((root / 'w.pth').read_bytes())
    from mmlinattn.core.weights import local_checkpoint
    good = local_checkpoint(f'{server.url}/w-{digest[:8]}.pth')
    assert good.endswith(f'/w-{digest[:8]}.pth')
    with pytest.raises(CheckpointError, match=f'sha256 is {digest[:8]}.*promises {wrong}'):
        local_checkpoint(f'{server.url}/w-{wrong}.pth')
    assert not (tmp_path / 'hub' / 'checkpoints' / f'w-{wrong}.pth').exists()
    # a date or a numeric id in a name is no hash: such a file loads whatever its hash is
    for name in ('w-20240131.pth', 'w-12345678.pth'):
        (root / name).write_bytes((root / 'w.pth').read_bytes())
        assert local_checkpoint(f'{server.url}/{name}').endswith(f'/{name}')


@pytest.mark.parametrize('kind', ['truncated', 'html'])
def test_bad_download_is_named_and_removed(served, tmp_path, kind):
    server, root = served
    _tiny_mavit_file(root / 'good.pth')
    data = (root / 'good.pth').read_bytes()
    name = f'{kind}.pth'
    (root / name).write_bytes(data[:len(data) // 2] if kind == 'truncated' else HTML)
    url = f'{server.url}/{name}'
    from mmlinattn.core.weights import url_cache_path
    cached = Path(url_cache_path(url))  # where this URL's file is kept (named in the message)
    assert cached.is_relative_to(tmp_path / 'hub' / 'checkpoints')
    for attempt in (1, 2):  # nothing bad stays cached: the second use downloads again
        m = MAViT(arch=TINY, out_norm=False, init_cfg=dict(type='Pretrained', checkpoint=url))
        with pytest.raises(CheckpointError) as e:
            m.init_weights()
        msg = str(e.value)
        assert url in msg and str(cached) in msg
        assert ('truncated' in msg) if kind == 'truncated' else ('HTML page' in msg)
        assert not cached.exists()
        assert server.count(name) == attempt


def test_tsinghua_share_page_hint(served, tmp_path):
    """A link without the direct-download form gives an HTML page; the error says what to add."""
    server, root = served
    (root / 'f').mkdir()
    (root / 'f' / 'abc').mkdir()
    (root / 'f' / 'abc' / 'index.html').write_bytes(HTML)
    from mmlinattn.core.weights import read_checkpoint
    url = f'{server.url}/f/abc/'
    with pytest.raises(CheckpointError, match='HTML page') as e:
        read_checkpoint(url)
    from mmlinattn.core.weights import url_cache_path
    assert url_cache_path(url).endswith('/abc.pth') and url_cache_path(url) in str(e.value)


def test_every_local_name_is_one_the_configs_load():
    """The local names of the family table's checkpoints are exactly the files the configs'
    init_cfg point at under checkpoints/ (read from the config files on disk)."""
    configs = set()
    import glob
    for p in glob.glob(osp.join(ROOT, 'configs/**/*.py'), recursive=True):
        configs.update(re.findall(r"checkpoints/([\w.-]+\.pth)", open(p).read()))
    assert set(e.filename for e in AUTHORS_CHECKPOINTS.values()) == configs


def test_readme_table_is_the_tools_output():
    """checkpoints/README.md's table (between its markers) is what ``download_checkpoints.py
    --list --markdown`` prints: prose around it may change freely; each row's glob finds the
    configs that load that file."""
    import glob

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


# --------------------------------------------------------------------------- tools
def _seg_data(root):
    return [f'{k}_dataloader.dataset.data_root={root}/toy_ade' for k in ('train', 'val', 'test')]


def test_test_tool_takes_a_url(served, tmp_path, toy_data, toy_checkpoints, capsys):
    from tools import test as test_tool
    server, root = served
    assert toy_checkpoints.seg_cfg == SEG_MAVIT
    shutil.copy(toy_checkpoints.seg, root / 'seg.pth')
    url = f'{server.url}/seg.pth'
    rc = test_tool.main([SEG_MAVIT, url, '--work-dir', str(tmp_path / 'wd'), '--cfg-options',
                         *_seg_data(toy_data)])
    out = capsys.readouterr().out
    assert rc == 0 and 'mIoU' in out
    assert server.count('seg.pth') == 1 and _cached(tmp_path, 'seg.pth').is_file()


def test_download_checkpoints_tool(served, tmp_path, capsys):
    from tools.misc import download_checkpoints as dl
    server, root = served
    names = {'MAViT_T': 'MAViT_T.pth', 'InLine_PVT_T': 'inline_pvt_t.pth'}
    _tiny_mavit_file(root / 'MAViT_T.pth', seed=1)
    _tiny_mavit_file(root / 'inline_pvt_t.pth', seed=2)
    out_dir = tmp_path / 'checkpoints'
    argv = ['--only', 'mavit-t', 'InLine_PVT_T', '--out-dir', str(out_dir), '--base-url',
            server.url,
            '--no-progress']
    assert dl.main(argv) == 0
    sums = {}
    for line in (out_dir / 'SHA256SUMS').read_text().splitlines():
        digest, name = line.split()
        sums[name] = digest
    for name, filename in names.items():
        data = (root / filename).read_bytes()
        assert (out_dir / filename).read_bytes() == data
        assert sums[filename] == hashlib.sha256(data).hexdigest()
        assert server.count(filename) == 1
    assert set(sums) == set(names.values())
    # a second run fetches nothing and verifies the files
    capsys.readouterr()
    assert dl.main(argv) == 0
    assert capsys.readouterr().out.count('sha256 verified') == 2
    assert server.count('MAViT_T.pth') == 1
    # a file changed after its download is reported, not silently accepted
    with open(out_dir / 'MAViT_T.pth', 'ab') as f:
        f.write(b'\0')
    assert dl.main(argv) == 1
    assert 'MAViT_T.pth has sha256' in capsys.readouterr().err
    # an HTML page where a file should be: named and removed, the others kept
    (root / 'MAViT_S.pth').write_bytes(HTML)
    assert dl.main(['--only', 'MAViT_S', '--out-dir', str(out_dir), '--base-url', server.url,
                    '--no-progress']) == 1
    err = capsys.readouterr().err
    assert 'HTML page' in err and f'{server.url}/MAViT_S.pth' in err
    assert not (out_dir / 'MAViT_S.pth').exists() and 'MAViT_S.pth' not in \
        (out_dir / 'SHA256SUMS').read_text()


# --------------------------------------------------------------------------- mirrors
MAVIT_HF = 'https://huggingface.co/aldjalkdf/MAViT/resolve/{}/MAViT_T.pth'


def _loads(url, want):
    m = MAViT(arch=TINY, out_norm=False, init_cfg=dict(type='Pretrained', checkpoint=url))
    m.init_weights()
    got = m.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())


def _hf_mirror_file(server, root, monkeypatch, revision):
    """A tiny MAViT-T file served as the Hugging Face Hub serves MAViT_T.pth at ``revision``, with
    HF_ENDPOINT pointing at the test's server (and no checkpoint mirror set); its state dict."""
    folder = root / 'aldjalkdf' / 'MAViT' / 'resolve' / revision
    folder.mkdir(parents=True)
    monkeypatch.setenv('HF_ENDPOINT', server.url)
    monkeypatch.delenv('MMLINATTN_CHECKPOINT_BASE_URL', raising=False)
    return _tiny_mavit_file(folder / 'MAViT_T.pth')


def _hub_here(monkeypatch, tmp_path):
    """huggingface_hub on this test's server only: its cache in tmp_path, online, no token sent
    (it reads these settings once, when imported)."""
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, 'HF_HUB_CACHE', str(tmp_path / 'hf'))
    monkeypatch.setattr(c, 'HF_HUB_OFFLINE', False)
    monkeypatch.setattr(c, 'HF_HUB_DISABLE_IMPLICIT_TOKEN', True)
    monkeypatch.delenv('HF_TOKEN', raising=False)


@pytest.mark.parametrize('hub', ['huggingface_hub', 'torch.hub'])
def test_hf_endpoint_is_honoured(served, tmp_path, monkeypatch, hub):
    """A huggingface.co URL is fetched from HF_ENDPOINT (the server here), once: through
    huggingface_hub where it is installed (the URL's revision asked for, the file in the Hugging
    Face cache), else by torch.hub into the cache of the URL the config names."""
    from mmlinattn.core.weights import urls
    server, root = served
    want = _hf_mirror_file(server, root, monkeypatch, 'v1.0')
    if hub == 'huggingface_hub':
        _hub_here(monkeypatch, tmp_path)
    else:
        monkeypatch.setattr(urls, '_hf_hub_download', lambda: None)  # as without the library
    url = MAVIT_HF.format('v1.0')
    for _ in range(2):
        _loads(url, want)
    assert server.count('aldjalkdf/MAViT/resolve/v1.0/MAViT_T.pth') == 1
    if hub == 'huggingface_hub':
        assert '/aldjalkdf/MAViT/resolve/v1.0/MAViT_T.pth' in server.heads
        assert list((tmp_path / 'hf').rglob('MAViT_T.pth'))
        assert not (tmp_path / 'hub').exists()
    else:
        assert _cached(tmp_path, 'MAViT_T.pth') == Path(urls.url_cache_path(url))


def test_a_page_through_huggingface_hub_is_named_and_removed(served, tmp_path, monkeypatch):
    server, root = served
    folder = root / 'aldjalkdf' / 'MAViT' / 'resolve' / 'main'
    folder.mkdir(parents=True)
    (folder / 'MAViT_T.pth').write_bytes(HTML)
    monkeypatch.setenv('HF_ENDPOINT', server.url)
    _hub_here(monkeypatch, tmp_path)
    for attempt in (1, 2):  # removed from the Hugging Face cache: the second use fetches again
        with pytest.raises(CheckpointError, match='HTML page.*was removed'):
            _loads(MAVIT_HF.format('main'), {})
        assert not [p for p in (tmp_path / 'hf').rglob('*') if p.is_file() and
                    p.read_bytes() == HTML]
        assert server.count('aldjalkdf/MAViT/resolve/main/MAViT_T.pth') == attempt


def test_base_url_mirrors_config_urls_and_the_download_tool(served, tmp_path, monkeypatch):
    """MMLINATTN_CHECKPOINT_BASE_URL serves every URL: an authors' file under its local name (what
    download_checkpoints.py saves and fetches), any other under its host and path (two URLs that
    end in one name stay two files), even with
    huggingface_hub installed; the cache stays the config URL's. A value that is no URL is one
    error naming the variable. The download tool honours HF_ENDPOINT."""
    from tools.misc import download_checkpoints as dl
    server, root = served
    (root / 'mirror' / 'example.invalid' / 'files').mkdir(parents=True)
    want = _tiny_mavit_file(root / 'mirror' / 'MAViT_T.pth', seed=1)
    other = _tiny_mavit_file(root / 'mirror' / 'example.invalid' / 'files' / 'release.pth', seed=2)
    monkeypatch.setenv('MMLINATTN_CHECKPOINT_BASE_URL', f'{server.url}/mirror/')
    authors = AUTHORS_CHECKPOINTS['MAViT_T'].url
    _loads(authors, want)
    _loads('https://example.invalid/files/release.pth', other)
    assert server.count('mirror/MAViT_T.pth') == 1
    assert server.count('mirror/example.invalid/files/release.pth') == 1
    from mmlinattn.core.weights import url_cache_path
    assert Path(url_cache_path(authors)).is_file()
    monkeypatch.setenv('MMLINATTN_CHECKPOINT_BASE_URL', 'mirror.example.org')
    with pytest.raises(CheckpointError, match='MMLINATTN_CHECKPOINT_BASE_URL=mirror.example.org: '
                                              'expected an http'):
        _loads('https://example.invalid/files/other.pth', other)
    # the download tool: HF_ENDPOINT for the huggingface.co files
    monkeypatch.delenv('MMLINATTN_CHECKPOINT_BASE_URL')
    monkeypatch.setenv('HF_ENDPOINT', server.url)
    folder = root / 'aldjalkdf' / 'MAViT' / 'resolve' / 'main'
    folder.mkdir(parents=True)
    (folder / 'MAViT_T.pth').write_bytes((root / 'mirror' / 'MAViT_T.pth').read_bytes())
    assert dl.main(['--only', 'MAViT_T', '--out-dir', str(tmp_path / 'ck'), '--no-progress']) == 0
    assert server.count('aldjalkdf/MAViT/resolve/main/MAViT_T.pth') == 1
    assert (tmp_path / 'ck' / 'MAViT_T.pth').read_bytes() == (folder / 'MAViT_T.pth').read_bytes()


def test_a_failed_download_leaves_no_folder(served, tmp_path):
    from mmlinattn.core.weights import local_checkpoint
    server, _ = served
    with pytest.raises(CheckpointError, match='missing.pth: not found at that URL'):
        local_checkpoint(f'{server.url}/missing.pth')
    assert not list((tmp_path / 'hub' / 'checkpoints' / 'mmlinattn-urls').iterdir())


def _without_hub(monkeypatch):
    """As if huggingface_hub were not installed: its import fails."""
    monkeypatch.setitem(sys.modules, 'huggingface_hub', None)


def _hub_or_not(hub, monkeypatch, tmp_path):
    if hub == 'huggingface_hub':
        pytest.importorskip('huggingface_hub')
        _hub_here(monkeypatch, tmp_path)
    else:
        _without_hub(monkeypatch)


@pytest.mark.parametrize('hub', ['huggingface_hub', 'without huggingface_hub'])
def test_a_static_hf_endpoint_mirror_serves_with_and_without_the_hub(served, tmp_path,
                                                                       monkeypatch, hub):
    """HF_ENDPOINT on a plain static file server (none of the Hub's X-Repo-Commit / ETag headers):
    the file loads, once, whether huggingface_hub is installed or not. Was: with huggingface_hub
    installed its metadata check refused the mirror that worked without it."""
    server, root = served
    server.hub_headers = False
    want = _hf_mirror_file(server, root, monkeypatch, 'main')
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    _hub_or_not(hub, monkeypatch, tmp_path)
    for _ in range(2):
        _loads(MAVIT_HF.format('main'), want)
    assert server.count('aldjalkdf/MAViT/resolve/main/MAViT_T.pth') == 1


@pytest.mark.parametrize('hub', ['huggingface_hub', 'without huggingface_hub'])
def test_a_404_says_not_found_at_the_url(served, tmp_path, monkeypatch, hub):
    """A file the mirror does not have: 'not found at that URL' naming the URL requested (was:
    huggingface_hub's 'check your connection')."""
    server, root = served
    monkeypatch.setenv('HF_ENDPOINT', server.url)
    monkeypatch.delenv('MMLINATTN_CHECKPOINT_BASE_URL', raising=False)
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    _hub_or_not(hub, monkeypatch, tmp_path)
    from mmlinattn.core.weights import local_checkpoint
    with pytest.raises(CheckpointError) as e:
        local_checkpoint(MAVIT_HF.format('main'))
    msg = str(e.value)
    requested = f'{server.url}/aldjalkdf/MAViT/resolve/main/MAViT_T.pth'
    assert msg.startswith(f'{requested} (mirror of {MAVIT_HF.format("main")}): not found at that '
                          'URL (HTTP 404'), msg
    assert 'connection' not in msg and '\n' not in msg


@pytest.mark.parametrize('hub', ['huggingface_hub', 'without huggingface_hub'])
def test_hf_hub_offline_is_named_and_reads_the_cache(served, tmp_path, monkeypatch, hub):
    """HF_HUB_OFFLINE=1: a Hugging Face file not cached is an error saying offline mode is set and
    what to do, without a request; one cached before (by either route) loads without a request."""
    server, root = served
    want = _hf_mirror_file(server, root, monkeypatch, 'main')
    _hub_or_not(hub, monkeypatch, tmp_path)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(CheckpointError) as e:
        _loads(MAVIT_HF.format('main'), want)
    msg = str(e.value)
    assert 'HF_HUB_OFFLINE=1 is set (Hugging Face offline mode)' in msg, msg
    assert 'Unset HF_HUB_OFFLINE to download it' in msg and 'connection' not in msg
    assert server.requests == [] and server.heads == []
    monkeypatch.delenv('HF_HUB_OFFLINE')
    _loads(MAVIT_HF.format('main'), want)  # online: fetched once
    heads = len(server.heads)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    # an offline machine: no host takes a connection (the probe before huggingface_hub is asked
    # would turn to a direct download, which fails there)
    from mmlinattn.core.weights import urls
    probes = []
    monkeypatch.setattr(urls, '_accepts_connections',
                        lambda url, logger, timeout=5.0: probes.append(url) and False)
    _loads(MAVIT_HF.format('main'), want)  # offline: from the cache
    assert probes == []
    assert server.count('aldjalkdf/MAViT/resolve/main/MAViT_T.pth') == 1
    assert len(server.heads) == heads


def test_an_hf_endpoint_without_a_scheme_is_refused_before_any_work(served, tmp_path,
                                                                      monkeypatch, capsys):
    """HF_ENDPOINT=mirror.local: one error naming the variable and its value, before a request
    (was: a download error saying the link may have expired); the tools say it in one line before
    any work."""
    server, root = served
    monkeypatch.setenv('HF_ENDPOINT', 'mirror.local')
    monkeypatch.delenv('MMLINATTN_CHECKPOINT_BASE_URL', raising=False)
    from mmlinattn.core.weights import local_checkpoint
    with pytest.raises(CheckpointError, match='^HF_ENDPOINT=mirror.local: expected an http:// or '
                                              'https:// URL'):
        local_checkpoint(MAVIT_HF.format('main'))
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
def _tiny_mala_file(path, seed=1):
    """A tiny MAViT saved in the MALA release's layout (model, model_ema, training state, an
    argparse Namespace); returns its weights as torch.load reads them back."""
    torch.manual_seed(seed)
    m = MAViT(arch=TINY, out_norm=False)
    m.init_weights()
    save_mala_style(path, m.state_dict())
    return torch.load(path, weights_only=False)['model']


def _zoo_backbone():
    """A tiny MAViT whose init_cfg names the file as the zoo's MAViT-T configs do."""
    return MAViT(arch=TINY, out_norm=False,
                 init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_T.pth'))


def _fresh_mmlogger(name):
    """A new current MMLogger, writing to this test's captured stdout."""
    from mmengine.logging import MMLogger
    return MMLogger.get_instance(f'checkpoint-urls-fallback-{name}', log_level='INFO')


def test_a_missing_checkpoints_file_is_fetched_from_the_authors_url(served, tmp_path, monkeypatch,
                                                                      capsys):
    """A zoo config's checkpoints/MAViT_T.pth run from a directory without it (mmdet's root, mim
    train): the authors' file of that name (its URL in the family table, here served through
    HF_ENDPOINT) loads instead, downloaded once; one log line names the missing path and the URL.
    The pre-flight's check (check_only) takes the same route. A checkpoints/MAViT_T.pth that exists
    is read as before, without a request."""
    from mmlinattn.core.weights import fit_backbone_checkpoint
    server, root = served
    authors = AUTHORS_CHECKPOINTS['MAViT_T'].url
    assert authors.startswith('https://huggingface.co/')
    served_file = root / authors[len('https://huggingface.co/'):]
    served_file.parent.mkdir(parents=True)
    want = _tiny_mala_file(served_file, seed=1)
    monkeypatch.setenv('HF_ENDPOINT', server.url)
    monkeypatch.delenv('MMLINATTN_CHECKPOINT_BASE_URL', raising=False)
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    _without_hub(monkeypatch)
    run_dir = tmp_path / 'mmdet_root'
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    _fresh_mmlogger(tmp_path.name)
    capsys.readouterr()
    for _ in range(2):
        m = _zoo_backbone()
        m.init_weights()
        got = m.state_dict()
        assert all(torch.equal(got[k], v) for k, v in want.items())
    fit_backbone_checkpoint(_zoo_backbone(), 'checkpoints/MAViT_T.pth', check_only=True)
    assert server.count(authors[len('https://huggingface.co/'):]) == 1
    assert not (run_dir / 'checkpoints').exists()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if 'does not exist' in ln]
    assert len(lines) == 1, lines
    assert f'checkpoints/MAViT_T.pth does not exist in the working directory {run_dir}' in lines[0]
    assert authors in lines[0]
    # a file that is there is the one read
    (run_dir / 'checkpoints').mkdir()
    local = _tiny_mala_file(run_dir / 'checkpoints' / 'MAViT_T.pth', seed=2)
    m = _zoo_backbone()
    m.init_weights()
    assert all(torch.equal(m.state_dict()[k], v) for k, v in local.items())
    assert server.count(authors[len('https://huggingface.co/'):]) == 1


@pytest.mark.parametrize('hub', ['huggingface_hub', 'without huggingface_hub'])
def test_a_missing_checkpoints_file_without_network_says_how_to_get_it(tmp_path, monkeypatch, hub):
    """The authors' URL unreachable (HF_ENDPOINT on a closed 127.0.0.1 port): one line that says
    the path is missing, why the download failed, the download tool's command (a name it takes)
    and the --cfg-options line that points the config at a local file; at once, also with
    huggingface_hub installed (which retries a refused host for about half a minute)."""
    import socket
    import time

    from tools.misc import download_checkpoints as dl
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]  # closed once the socket is: nothing listens there
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))
    monkeypatch.setenv('HF_ENDPOINT', f'http://127.0.0.1:{port}')
    monkeypatch.delenv('MMLINATTN_CHECKPOINT_BASE_URL', raising=False)
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    _hub_or_not(hub, monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        _zoo_backbone().init_weights()
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert '\n' not in msg
    assert msg.startswith(f'checkpoints/MAViT_T.pth does not exist in the working directory '
                          f'{tmp_path}'), msg
    assert f'cannot connect to 127.0.0.1:{port}' in msg
    only = re.search(r'`python tools/misc/download_checkpoints.py --only (\S+)`', msg).group(1)
    assert dl.select([only]) == ['MAViT_T']
    assert msg.endswith('--cfg-options model.backbone.init_cfg.checkpoint=/path/to/MAViT_T.pth')


def test_a_missing_file_of_another_name_keeps_the_error_with_the_hint(served, tmp_path,
                                                                        monkeypatch):
    """checkpoints/<a name the table does not have>: 'checkpoint file not found', the working
    directory and the --cfg-options line; nothing is requested."""
    server, _ = served
    monkeypatch.setenv('MMLINATTN_CHECKPOINT_BASE_URL', server.url)
    monkeypatch.chdir(tmp_path)
    m = MAViT(arch=TINY, out_norm=False,
              init_cfg=dict(type='Pretrained', checkpoint='checkpoints/my_mavit.pth'))
    with pytest.raises(CheckpointError) as e:
        m.init_weights()
    assert str(e.value) == (
        f'checkpoint file not found: checkpoints/my_mavit.pth (looked in the working directory '
        f'{tmp_path}); give its path: --cfg-options '
        'model.backbone.init_cfg.checkpoint=/path/to/my_mavit.pth')
    assert server.requests == []


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
    assert not work.exists() or not list(work.glob('2*'))
    rc = train_tool.main([SEG_PVT, '--work-dir', str(work), '--cfg-options', *_seg_data(toy_data),
                          f'load_from={dst}', *common, *fix])
    assert rc == 0
    got = torch.load(work / 'iter_1.pth', weights_only=False, map_location='cpu')['state_dict']
    assert all(torch.equal(got['backbone.' + k], v) for k, v in want.items())
