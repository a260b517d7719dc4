"""Download the authors' ImageNet checkpoints into checkpoints/ under the names the configs use.

    python tools/misc/download_checkpoints.py                      # all eleven files
    python tools/misc/download_checkpoints.py --only MAViT_T InLine_PVT_T
    python tools/misc/download_checkpoints.py --list               # names, URLs, local names

The URLs are the ones the authors' READMEs publish (LeapLabTHU/InLine: TsinghuaCloud, in their
direct ``?dl=1`` form; qhfan/MALA: the Hugging Face repository aldjalkdf/MAViT, ``resolve/main/``
form), kept in one table, :data:`mmlinattn.core.families.AUTHORS_CHECKPOINTS`. Each file is fetched
with ``torch.hub.download_url_to_file`` (progress bar; a temporary file renamed into place), checked
to be a torch checkpoint that reads weights-only (an HTML page or a truncated file is removed and
named), and its sha256 recorded in ``OUT_DIR/SHA256SUMS`` (``sha256sum -c`` format). A file already
present is not fetched again: its sha256 is verified against the record (or recorded, for a file put
there by hand). The authors publish no checksums, so the first download is the reference.

``--base-url URL`` (or ``MMLINATTN_CHECKPOINT_BASE_URL``) fetches ``URL/<local name>`` instead: a
mirror holding the files under the configs' names (the same variable mirrors the URLs of configs).
``HF_ENDPOINT`` is honoured for the huggingface.co files.
"""
import argparse
import hashlib
import http.client
import os
import os.path as osp
import sys

from mmlinattn.core.families import AUTHORS_CHECKPOINTS
from mmlinattn.core.weights import (
    BASE_URL_ENV,
    CheckpointError,
    checkpoint_file_problem,
    extract_state_dict,
    is_url,
    read_checkpoint,
    source_url,
)
from mmlinattn.core.weights.urls import download_failure
from mmlinattn.training.fileio import write_atomic

SUMS = 'SHA256SUMS'


def _key(name: str) -> str:
    return name.lower().replace('-', '_')


def select(names):
    """The table entries for ``names`` (case and ``-``/``_`` ignored; all when empty)."""
    if not names:
        return list(AUTHORS_CHECKPOINTS)
    by_key = {_key(n): n for n in AUTHORS_CHECKPOINTS}
    unknown = [n for n in names if _key(n) not in by_key]
    if unknown:
        raise SystemExit('download_checkpoints.py: error: unknown backbone(s) '
                         f'{", ".join(unknown)}; choose from {", ".join(AUTHORS_CHECKPOINTS)}')
    return [by_key[_key(n)] for n in names]


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def read_sums(out_dir: str) -> dict:
    """``SHA256SUMS`` as ``{file name: hex digest}`` (empty when there is none)."""
    path = osp.join(out_dir, SUMS)
    sums = {}
    if osp.isfile(path):
        with open(path) as f:
            for line in f:
                parts = line.strip().split(None, 1)
                if len(parts) == 2:
                    sums[parts[1].lstrip('*')] = parts[0].lower()
    return sums


def write_sums(out_dir: str, sums: dict) -> None:
    text = ''.join(f'{digest}  {name}\n' for name, digest in sorted(sums.items()))

    def write(tmp):
        with open(tmp, 'w') as f:
            f.write(text)
    write_atomic(osp.join(out_dir, SUMS), write)


def check_readable(url: str, path: str) -> None:
    """A torch checkpoint with tensors, read weights-only on the meta device; otherwise the file is
    removed and :class:`CheckpointError` names the URL, the file and the reason."""
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
    one-line report. Raises :class:`CheckpointError` for a failed download, a file that is no
    checkpoint or a sha256 that differs from the record."""
    import torch.hub
    entry = AUTHORS_CHECKPOINTS[name]
    url = source_url(entry.url, base_url)
    dst = osp.join(out_dir, entry.filename)
    recorded = sums.get(entry.filename)
    if osp.isfile(dst) and not force:
        digest = sha256(dst)
        if recorded is None:
            check_readable(url, dst)
            sums[entry.filename] = digest
            return f'{name}: {dst} present, sha256 {digest} recorded'
        if digest != recorded:
            raise CheckpointError(
                f'{name}: {dst} has sha256 {digest}, but {SUMS} records {recorded}: the file '
                'changed since it was downloaded (corrupt or replaced); run again with --force to '
                'download it anew')
        return f'{name}: {dst} present, sha256 verified'
    os.makedirs(out_dir, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, dst, progress=progress)
    except (OSError, http.client.HTTPException, ValueError) as e:
        # HTTP errors and refused connections (OSError), short reads (IncompleteRead), bad URLs
        reason, hint = download_failure(e, url, entry.url)
        raise CheckpointError(f'{name}: {url}: {reason}; nothing was saved to {dst}.{hint}') \
            from None
    check_readable(url, dst)
    digest = sha256(dst)
    if recorded is not None and recorded != digest and not force:
        os.remove(dst)
        raise CheckpointError(f'{name}: {url} now serves a file with sha256 {digest}, but {SUMS} '
                              f'records {recorded}; removed it (pass --force to accept the new '
                              'one)')
    sums[entry.filename] = digest
    size = osp.getsize(dst) / 2**20
    return f'{name}: downloaded {url} -> {dst} ({size:.1f} MiB, sha256 {digest})'


def markdown_table(names=None) -> str:
    """The table of checkpoints/README.md (between its ``checkpoint-table`` markers), from the
    family table: download key, local name, the authors' URL, the configs that load the file."""
    from mmlinattn.core.families import FAMILIES
    lines = ['| backbone (`--only`) | local name (`checkpoints/...`) | URL (the authors\' README) '
             '| configs |', '|---|---|---|---|']
    for n in names or list(AUTHORS_CHECKPOINTS):
        e = AUTHORS_CHECKPOINTS[n]
        glob = f'configs/{e.family}/*{FAMILIES[e.family].prefix}-{e.arch[0]}_*'
        lines.append(f'| {n} | `{e.filename}` | {e.url} | `{glob}` |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
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
    if args.list and args.markdown:
        print(markdown_table(names))
        return 0
    if args.list:
        for n in names:
            e = AUTHORS_CHECKPOINTS[n]
            print(f'{n:14s} {osp.join(args.out_dir, e.filename):32s} {e.url}')
        return 0
    sums = read_sums(args.out_dir)
    failed = 0
    for n in names:
        try:
            print(fetch_one(n, args.out_dir, sums, args.base_url, args.force,
                            progress=not args.no_progress), flush=True)
        except CheckpointError as e:
            print(f'download_checkpoints.py: error: {e}', file=sys.stderr, flush=True)
            failed += 1
        if sums:
            write_sums(args.out_dir, sums)  # after each file: an interrupted run keeps the others
    if failed:
        print(f'{failed} of {len(names)} file(s) failed', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
