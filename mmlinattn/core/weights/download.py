"""Download the authors' ImageNet checkpoints into checkpoints/ under the names the configs use,
from any folder (ahead of time, for a node without a network):

    python -m mmlinattn.core.weights.download                      # all eleven files
    python -m mmlinattn.core.weights.download --only MAViT_T InLine_PVT_T
    python -m mmlinattn.core.weights.download --list [--markdown]  # names, URLs, local names

(``python tools/misc/download_checkpoints.py`` in a checkout is the same.) The URLs
(:data:`mmlinattn.core.families.AUTHORS_CHECKPOINTS`) are those of the authors' READMEs, fetched as
the configs fetch them (:mod:`.urls`: ``--base-url`` or ``MMLINATTN_CHECKPOINT_BASE_URL`` fetches
``URL/<local name>`` from a mirror; ``HF_ENDPOINT`` serves the huggingface.co files). Each file is
checked to be a checkpoint that reads weights-only (else removed and named) and its sha256 recorded
in ``OUT_DIR/SHA256SUMS`` (``sha256sum -c`` format); a file already there is verified against the
record, not fetched again. An authors' URL reads ``checkpoints/<local name>`` when it is there.
"""
import argparse
import logging
import os
import os.path as osp
import pathlib
import sys

from ..families import AUTHORS_CHECKPOINTS
from .errors import CheckpointError
from .reading import extract_state_dict, read_checkpoint
from .urls import BASE_URL_ENV, _download, checkpoint_file_problem, file_sha256, is_url, source_url

PROG = 'download_checkpoints'
SUMS = 'SHA256SUMS'


def select(names):
    """The table entries for ``names`` (case and ``-``/``_`` ignored; all when empty)."""
    by_key = {n.lower().replace('-', '_'): n for n in AUTHORS_CHECKPOINTS}
    found = [by_key.get(n.lower().replace('-', '_')) for n in names or ()]
    unknown = [n for n, f in zip(names or (), found) if f is None]
    if unknown:
        raise SystemExit(f'{PROG}: error: unknown backbone(s) {", ".join(unknown)}; choose from '
                         f'{", ".join(AUTHORS_CHECKPOINTS)}')
    return found or list(AUTHORS_CHECKPOINTS)


def read_sums(out_dir: str) -> dict:
    """``SHA256SUMS`` as ``{file name: hex digest}`` (empty when there is none)."""
    path = osp.join(out_dir, SUMS)
    lines = pathlib.Path(path).read_text().splitlines() if osp.isfile(path) else []
    return {p[1].lstrip('*'): p[0].lower() for p in (ln.strip().split(None, 1) for ln in lines)
            if len(p) == 2}


def write_sums(out_dir: str, sums: dict) -> None:
    path = osp.join(out_dir, SUMS)
    pathlib.Path(path + '.tmp').write_text(
        ''.join(f'{digest}  {name}\n' for name, digest in sorted(sums.items())))
    os.replace(path + '.tmp', path)  # never half a file


def check_readable(url: str, path: str) -> None:
    """Unless ``path`` reads weights-only (on the meta device) as a checkpoint with tensors: remove
    it, :class:`CheckpointError` naming the URL, the file and the reason."""
    problem = checkpoint_file_problem(path)
    if problem is None:
        try:
            extract_state_dict(read_checkpoint(path, map_location='meta'), path=path)
        except CheckpointError as e:
            problem = str(e)
    if problem:
        os.remove(path)
        raise CheckpointError(f'{url}: the file downloaded to {path} is not a readable checkpoint: '
                              f'{problem}; removed it')


def fetch_one(name: str, out_dir: str, sums: dict, base_url=None, force=False,
              progress=True) -> str:
    """Make ``out_dir/<local name>`` the authors' file ``name``, its sha256 in ``sums``; returns a
    one-line report, or raises :class:`CheckpointError` (the caller names ``name``)."""
    entry = AUTHORS_CHECKPOINTS[name]
    url = source_url(entry.url, base_url)
    dst = osp.join(out_dir, entry.filename)
    recorded = sums.get(entry.filename)
    if osp.isfile(dst) and not force:
        digest = file_sha256(dst)
        if recorded is None:
            check_readable(url, dst)
            sums[entry.filename] = digest
            return f'{name}: {dst} present, sha256 {digest} recorded'
        if digest != recorded:
            raise CheckpointError(
                f'{dst} has sha256 {digest}, but {SUMS} records {recorded}: the file '
                'changed since it was downloaded (corrupt or replaced); run again with --force to '
                'download it anew')
        return f'{name}: {dst} present, sha256 verified'
    _download(url, dst, logging.getLogger('mmlinattn'), progress, entry.url)
    check_readable(url, dst)
    digest = file_sha256(dst)
    if recorded is not None and recorded != digest and not force:
        os.remove(dst)
        raise CheckpointError(f'{url} now serves a file with sha256 {digest}, but {SUMS} '
                              f'records {recorded}; removed it (pass --force to accept the new '
                              'one)')
    sums[entry.filename] = digest
    return (f'{name}: downloaded {url} -> {dst} ({osp.getsize(dst) / 2**20:.1f} MiB, sha256 '
            f'{digest})')


def markdown_table(names=None) -> str:
    """The table of checkpoints/README.md (between its ``checkpoint-table`` markers)."""
    from ..families import FAMILIES
    lines = ['| backbone (`--only`) | local name (`checkpoints/...`) | URL (the authors\' README) '
             '| configs |', '|---|---|---|---|']
    for n in names or list(AUTHORS_CHECKPOINTS):
        e = AUTHORS_CHECKPOINTS[n]
        glob = f'configs/{e.family}/*{FAMILIES[e.family].prefix}-{e.arch[0]}_*'
        lines.append(f'| {n} | `{e.filename}` | {e.url} | `{glob}` |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--only', nargs='+', metavar='NAME', help='backbones to fetch (default: all)')
    p.add_argument('--out-dir', default='checkpoints',
                   help="where the configs look for them (default: checkpoints, as the configs' "
                        'init_cfg paths are relative to the working directory)')
    p.add_argument('--base-url', default=os.environ.get(BASE_URL_ENV, '').strip() or None,
                   help='fetch BASE_URL/<local name> instead of the authors\' URLs (env '
                        f'{BASE_URL_ENV})')
    p.add_argument('--force', action='store_true', help='download again even if present')
    p.add_argument('--list', action='store_true', help='print the table and exit')
    p.add_argument('--markdown', action='store_true',
                   help='with --list: the table as checkpoints/README.md shows it')
    p.add_argument('--no-progress', action='store_true', help='no progress bar')
    args = p.parse_args(argv)
    if args.base_url and not is_url(args.base_url):
        p.error(f'--base-url / {BASE_URL_ENV}: {args.base_url!r} is not an http(s):// URL')
    names = select(args.only)
    if args.list:
        print(markdown_table(names) if args.markdown else '\n'.join(
            f'{n:14s} {osp.join(args.out_dir, e.filename):32s} {e.url}'
            for n, e in ((n, AUTHORS_CHECKPOINTS[n]) for n in names)))
        return 0
    sums = read_sums(args.out_dir)
    failed = 0
    for n in names:
        try:
            print(fetch_one(n, args.out_dir, sums, args.base_url, args.force,
                            progress=not args.no_progress), flush=True)
        except CheckpointError as e:
            print(f'{PROG}: error: {n}: {e}', file=sys.stderr, flush=True)
            failed += 1
        if sums:
            write_sums(args.out_dir, sums)  # after each file: an interrupted run keeps the others
    if failed:
        print(f'{failed} of {len(names)} file(s) failed', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
