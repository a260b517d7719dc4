import contextlib
import gc
import os

import pytest
import torch

import upstream_memo  # noqa: F401  (parsed metafiles and formatted config text, kept)

# The suite's torch thread count: MMLINATTN_TEST_THREADS (default: 2, or fewer cores). A float
# comparison must hold at any count (the split over threads changes the order of the sums:
# tests/compare.py), so run the suite both ways: MMLINATTN_TEST_THREADS=1 make test.
_threads = os.environ.get('MMLINATTN_TEST_THREADS', '').strip()


def _default_threads(workers: int) -> int:
    """2, or fewer cores, shared out among ``workers`` processes."""
    return max(1, min(2, (os.cpu_count() or 1) // max(1, workers)))


if _threads:
    if not _threads.isdigit() or int(_threads) < 1:
        raise pytest.UsageError(
            f'MMLINATTN_TEST_THREADS={_threads!r}: expected a positive integer (torch threads)')
    THREADS = int(_threads)
else:
    # under pytest-xdist (``make test``: TEST_WORKERS workers) the cores are shared out
    THREADS = _default_threads(int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1') or 1))
torch.set_num_threads(THREADS)
# the tools the tests start as subprocesses (train, test, torchrun) read these at start-up; a test
# that needs another count (the DDP tests: one thread per rank) sets its own
for _var in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
    os.environ[_var] = str(THREADS)


def pytest_report_header(config):
    workers = getattr(config.option, 'numprocesses', None) or 0
    if workers and not _threads:  # the controller: each worker sets its own count
        return (f'torch threads: {_default_threads(workers)} per xdist worker '
                '(MMLINATTN_TEST_THREADS)')
    return f'torch threads: {torch.get_num_threads()} (MMLINATTN_TEST_THREADS)'


# Free disk where the tests write (pytest's temp dir), read after every test: the summary names
# the lowest it went, and after which test, so that a CI run that fills the disk says where. Under
# pytest-xdist each worker reads it and hands its lowest to the controller, which prints the line.
_disk = {}


def _free_bytes(config):
    try:
        base = config._tmp_path_factory.getbasetemp()
        st = os.statvfs(base)
    except (AttributeError, OSError):
        return None
    return st.f_bavail * st.f_frsize


def pytest_collection_finish(session):
    """What the test modules imported stays for the session: kept out of the garbage collector's
    passes from now on (mmengine collects at each dataset's construction: 0.2 s a time over the
    whole heap on 2 cores), as tests/warm.py does in each tool run."""
    gc.collect()
    gc.freeze()


def pytest_sessionstart(session):
    _disk['start'] = _free_bytes(session.config)


def pytest_runtest_teardown(item, nextitem):
    free = _free_bytes(item.config)
    if free is not None and ('low' not in _disk or free < _disk['low'][0]):
        _disk['low'] = (free, item.nodeid)


def pytest_sessionfinish(session):
    # an xdist worker's report to the controller
    out = getattr(session.config, 'workeroutput', None)
    if out is not None and 'low' in _disk:
        out['mmlinattn_disk_low'] = list(_disk['low'])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: keep the lowest free space any worker saw."""
    low = getattr(node, 'workeroutput', {}).get('mmlinattn_disk_low')
    if low and ('low' not in _disk or low[0] < _disk['low'][0]):
        _disk['low'] = tuple(low)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    start, low = _disk.get('start'), _disk.get('low')
    if start is None or low is None:
        return
    gb = 1024 ** 3
    terminalreporter.write_line(
        f'disk: {start / gb:.1f} GiB free in the temp dir at the start, lowest '
        f'{low[0] / gb:.1f} GiB (after {low[1]})')


# make test's 2 workers take whole files (--dist loadfile) from one queue. pytest-xdist orders that
# queue by the number of tests in a file, which put the files with few but long tests (the DDP
# cycles, the end-to-end training) last, where one worker ran them alone while the other had
# finished: about 100 s of the 19 min on 2 cores (xdist's queue replayed with the durations of a
# --durations=0 run, 2026-11-28). The files below go first instead, longest first (their seconds,
# rounded, in `make test PYTEST_ARGS=--durations=0` on 2 idle cores, 2026-11-29); the others
# follow in collection order. Only the order changes: every file still runs whole on one worker.
LONGEST_FIRST = {
    'test_wheel.py': 128, 'test_deploy.py': 101, 'test_distributed.py': 91,
    'test_backbones.py': 76, 'test_end_to_end.py': 60, 'test_compile.py': 60,
    'test_one_run.py': 58, 'test_guest.py': 57, 'test_flops.py': 53, 'test_upstream_tools.py': 50,
    'test_tool_parity.py': 48, 'test_benchmarking.py': 45, 'test_configs.py': 43,
    'test_inference.py': 40, 'test_deploy_jit.py': 37, 'test_custom_dataset.py': 35,
    'test_edges.py': 34, 'test_faults.py': 31, 'test_upstream_train.py': 26,
    'test_stop_and_resume.py': 20, 'test_data_faults.py': 18, 'test_extras.py': 18,
    'test_runner_seams.py': 15, 'test_trained_function.py': 14,
}


def pytest_configure(config):
    config.addinivalue_line('markers', 'gpu: the CUDA case of an oracle test (helpers.on_devices; '
                            '`make gpu-check` runs pytest -m gpu)')
    if hasattr(config.option, 'loadscopereorder'):  # pytest-xdist >= 3.6: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """The files of LONGEST_FIRST first, longest first; within a file the order is pytest's."""
    def seconds(item):
        return -LONGEST_FIRST.get(os.path.basename(str(item.path)), 0)
    items.sort(key=seconds)  # stable: the others and each file's tests keep their order


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def _visualizers(where):
    """(class, name) of the mmengine visualizers with a save dir for which ``where(dir)`` holds."""
    import sys
    if 'mmengine.visualization' not in sys.modules:
        return []
    from mmengine.visualization import Visualizer
    classes, todo = [], [Visualizer]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    stale = []
    for cls in classes:
        for name, vis in list(cls.__dict__.get('_instance_dict', {}).items()):
            backends = getattr(vis, '_vis_backends', {}).values()
            dirs = [getattr(b, '_save_dir', None) for b in backends]
            if any(d and where(str(d)) for d in dirs):
                stale.append((cls, name))
    return stale


@pytest.fixture(autouse=True)
def _no_visualizer_into_a_removed_dir():
    """mmengine keeps visualizers by name ('visualizer' in every OpenMMLab config) and hands the
    existing one to the next Runner built in the process, save dir and all. A test that builds a
    Runner itself (not through mmlinattn's build_runner, which takes a fresh name) would write its
    vis_data into an earlier test's tmp_path, which pytest deletes when that test passes
    (pytest.ini). After each test (and after its tmp_path is gone: autouse fixtures are torn down
    last), visualizers pointing into a removed folder are dropped, as a fresh process has none."""
    yield
    for cls, name in _visualizers(lambda d: not os.path.isdir(d)):  # the removed ones
        cls._instance_dict.pop(name, None)


@pytest.fixture(autouse=True)
def _no_log_handler_on_a_closed_stream():
    """A logger mmengine made during a test (a plain Runner's, or mmengine's own first one) writes
    to ``sys.stdout`` as it was then: a test's capture, closed when the test ends, so that a later
    ``print_log`` of the current logger in this process printed '--- Logging error ---'. Our
    Runner's loggers follow the streams of the moment (LinAttnRunner.build_logger); after each
    test, a handler left on a closed stream does too, as a fresh process has none."""
    yield
    import logging
    import sys
    if 'mmengine.logging' not in sys.modules:
        return
    from mmengine.logging import MMLogger

    from mmlinattn.training.runner import _CurrentStream
    for logger in list(MMLogger._instance_dict.values()):
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and \
                    getattr(handler.stream, 'closed', False):
                handler.stream = _CurrentStream('stdout')  # (setStream would flush the closed)


def _tree_digest(root):
    import hashlib
    h = hashlib.sha256()
    for base, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(base, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, 'rb') as f:
                h.update(f.read())
    return h.hexdigest()


@contextlib.contextmanager
def _read_only(root, what):
    """Around a shared session fixture's files: any change to them under ``root`` fails the
    session at its end."""
    before = _tree_digest(root)
    yield
    assert _tree_digest(root) == before, (
        f'a test wrote into the shared {what} {root}: copy what it changes into tmp_path first')


@pytest.fixture(scope='session')
def toy_data(tmp_path_factory):
    """The shared toy dataset: ``toy_coco`` (COCO instances) and ``toy_ade`` (ADE20K
    layout), 4 training and 2 validation images of 48x48 each (2 iterations per epoch at batch
    2, which tests of epoch-based runs count on), made once per session (per xdist worker).
    Shared and read-only: a test that changes data copies the part it changes into its own
    ``tmp_path`` first. Any change to the shared files fails the session at its end."""
    from helpers import make_toy_sets
    root = make_toy_sets(tmp_path_factory.mktemp('toy_data'), seed=5, size=48, train=4, val=2)
    with _read_only(root, 'toy dataset'):
        yield root


_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')


@pytest.fixture(scope='session')
def toy_checkpoints(tmp_path_factory):
    """The shared checkpoints, for every test that needs *a* checkpoint of a toy model:
    ``.det`` (``configs/toy`` RetinaNet with MAViT-T, config ``.det_cfg``) and ``.seg`` (Semantic
    FPN with MAViT-T, ``.seg_cfg``), built at seed 1 and saved as mmengine's Runner saves them:
    ``state_dict`` and ``meta`` with the test dataset's classes and palette and the config's text
    (which tools/test.py reads to check the attention function). Made once per session (per xdist
    worker), in seconds: the models are untrained, because what these tests check (a tool's output
    beside upstream's on the same weights, a submission's format, a refusal) holds for any weights;
    the suite's trainings are each the subject of their own test. Read-only, as ``toy_data``."""
    from types import SimpleNamespace

    from mmengine.config import Config

    from test_inference import make_checkpoint
    root = tmp_path_factory.mktemp('toy_checkpoints')
    out = SimpleNamespace(det_cfg=os.path.join(_CONFIGS, 'toy/retinanet_mavit-t_fpn_toy-coco.py'),
                          seg_cfg=os.path.join(_CONFIGS, 'toy/fpn_mavit-t_toy-ade.py'),
                          det=str(root / 'det.pth'), seg=str(root / 'seg.pth'))
    for cfg_path, path in ((out.det_cfg, out.det), (out.seg_cfg, out.seg)):
        cfg = Config.fromfile(cfg_path)
        make_checkpoint(cfg, path, seed=1, meta=cfg.test_dataloader.dataset.get('metainfo'),
                        record_cfg=True)
    with _read_only(root, 'toy checkpoints'):
        yield out


def _let_go_of(root):
    """mmengine keeps a finished run's logger (its log file open) and visualizer by name, and a
    later Runner or ``print_log(logger='current')`` in this process may write into them: the run
    under ``root`` gives both up, as a finished process would."""
    from mmengine.logging import MMLogger
    for logger in list(MMLogger._instance_dict.values()):
        for handler in list(logger.handlers):
            if str(getattr(handler, 'baseFilename', '')).startswith(str(root) + os.sep):
                logger.removeHandler(handler)
                handler.close()
    for cls, name in _visualizers(lambda d: d.startswith(str(root) + os.sep)):
        cls._instance_dict.pop(name, None)


def _finished_run(tmp_path_factory, toy_data, kind):
    """One short training of the ``configs/toy`` config of ``kind`` on ``toy_data``, through
    tools/train.py's ``main`` in this process (our Runner), validated at its end."""
    from types import SimpleNamespace

    from mmlinattn.training.runs import read_metrics
    from tools import train as train_tool

    from helpers import TOY_SEG_64, toy_coco_options
    root = tmp_path_factory.mktemp(f'finished_{kind}')
    work = root / 'work'
    if kind == 'det':
        # Mask R-CNN (boxes and masks: every loss a detection tool reads); one epoch of the 4
        # training images at batch 2 (2 iterations) at 64 px, validated at the epoch's end
        config = os.path.join(_CONFIGS, 'toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
        options = toy_coco_options(
            f'{toy_data}/toy_coco', 'train_dataloader.dataset.pipeline.2.scale=(64,64)',
            'test_dataloader.dataset.pipeline.1.scale=(64,64)',
            'val_dataloader.dataset.pipeline.1.scale=(64,64)')
        run = ['train_cfg.max_epochs=1', 'train_dataloader.batch_size=2',
               'default_hooks.logger.interval=1']
        checkpoint = work / 'epoch_1.pth'
    else:
        # the Semantic FPN: 2 iterations at batch 2 at 64 px, validated and saved at the second
        config = os.path.join(_CONFIGS, 'toy/fpn_mavit-t_toy-ade.py')
        options = [f'{k}_dataloader.dataset.data_root={toy_data}/toy_ade'
                   for k in ('train', 'val', 'test')] + TOY_SEG_64
        run = ['train_cfg.max_iters=2', 'train_cfg.val_interval=2',
               'default_hooks.checkpoint.interval=2', 'train_dataloader.batch_size=2',
               'default_hooks.logger.interval=1']
        checkpoint = work / 'iter_2.pth'
    rc = train_tool.main([config, '--work-dir', str(work), '--cfg-options', *options, *run,
                          f'experiment_name=finished_{kind}'])
    _let_go_of(root)
    assert rc == 0 and checkpoint.is_file(), f'the shared {kind} training failed ({rc})'
    metrics = read_metrics(str(work))
    assert metrics, f'the shared {kind} training logged no validation'
    return root, SimpleNamespace(work_dir=work, config=config, checkpoint=str(checkpoint),
                                 metrics=metrics, options=options)


@pytest.fixture(scope='session')
def finished_det(tmp_path_factory, toy_data):
    """A finished toy detection run, for every test that reads one (its logs, its checkpoint, its
    metrics) and whose subject is not the training itself: ``work_dir``, ``config``
    (configs/toy Mask R-CNN with MAViT-T), ``checkpoint`` (``epoch_1.pth``), ``metrics`` (what its
    validation at the end logged) and ``options`` (the ``--cfg-options`` that point the config at
    ``toy_data`` at 64 px). Trained once per session (per xdist worker), a few seconds: 2
    iterations. Read-only, as ``toy_data``: a test that changes it works on a copy."""
    root, out = _finished_run(tmp_path_factory, toy_data, 'det')
    with _read_only(root, 'finished detection run'):
        yield out


@pytest.fixture(scope='session')
def finished_seg(tmp_path_factory, toy_data):
    """A finished toy segmentation run (configs/toy Semantic FPN with MAViT-T, 2 iterations at
    64 px, validated at the end): as :func:`finished_det`, ``checkpoint`` being ``iter_2.pth``."""
    root, out = _finished_run(tmp_path_factory, toy_data, 'seg')
    with _read_only(root, 'finished segmentation run'):
        yield out
