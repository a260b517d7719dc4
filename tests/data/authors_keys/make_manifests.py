"""Regenerate the manifests in this folder from the authors' own model definitions.

    python tests/data/authors_keys/make_manifests.py \
        --inline-repo PATH/TO/InLine --mala-repo PATH/TO/MALA

PATH/TO/InLine is a clone of LeapLabTHU/InLine, PATH/TO/MALA a clone of qhfan/MALA (their model
files need ``timm``, ``einops`` and ``fvcore``: ``pip install timm einops fvcore`` in a scratch
environment). The script builds each released classifier from the authors' code with the arguments
listed in README.md, and writes one JSON file per architecture:

* ``keys``: every ``state_dict()`` entry in order, as ``[name, shape, dtype]``;
* ``num_params``: the parameter count (the papers' model sizes);
* ``classification_prefixes``: the top-level modules that only the ImageNet classifier uses (its
  head and the final norm / projection before pooling), which a detection backbone drops;
* ``derived_buffers``: buffers that are no learned weights and no normalisation statistics (window
  index tables, shift masks, RoPE frequencies): a function of the architecture alone.

Nothing in the test suite runs this script (the suite never reaches the network or the authors'
code); it documents how the committed data was made, so it can be checked and remade.
"""
import argparse
import importlib.util
import json
import os.path as osp
import subprocess
import sys

HERE = osp.dirname(osp.abspath(__file__))


def _authors_code():
    """tests/authors_code.py (the authors' constructors and arguments, and the file importer the
    tests use too), loaded from its file: tests/ is no package, and no folder is put on
    ``sys.path``."""
    spec = importlib.util.spec_from_file_location(
        'authors_code', osp.join(HERE, '..', '..', 'authors_code.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# the classifier-only top-level modules of each family's released model
CLASSIFICATION_PREFIXES = {'inline_swin': ['head.', 'norm.'], 'inline_pvt': ['head.'],
                           'mavit': ['head.', 'proj.', 'norm.']}
STATISTICS = ('running_mean', 'running_var', 'num_batches_tracked')


def manifest(model, family: str, arch: str) -> dict:
    params = dict(model.named_parameters())
    state = model.state_dict()
    derived = sorted({k.rsplit('.', 1)[-1] for k in state
                      if k not in params and not k.endswith(STATISTICS)})
    return {'family': family, 'arch': arch,
            'num_params': sum(p.numel() for p in params.values()),
            'classification_prefixes': CLASSIFICATION_PREFIXES[family],
            'derived_buffers': derived,
            'keys': [[k, list(v.shape), str(v.dtype).replace('torch.', '')]
                     for k, v in state.items()]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--inline-repo', required=True, help='a clone of LeapLabTHU/InLine')
    p.add_argument('--mala-repo', required=True, help='a clone of qhfan/MALA')
    p.add_argument('--out', default=HERE, help='where to write the JSON files (default: here)')
    args = p.parse_args(argv)
    repos = {'LeapLabTHU/InLine': args.inline_repo, 'qhfan/MALA': args.mala_repo}
    authors_code = _authors_code()
    for family, (repo_name, rel, archs) in authors_code.SOURCES.items():
        repo = repos[repo_name]
        module = authors_code.load_file(osp.join(repo, rel), f'authors_{family}')
        commit = subprocess.run(['git', '-C', repo, 'rev-parse', '--short', 'HEAD'],
                                capture_output=True, text=True).stdout.strip() or '?'
        for arch, (ctor, kwargs) in archs.items():
            model = getattr(module, ctor)(**kwargs)
            data = manifest(model, family, arch)
            with open(osp.join(args.out, f'{family}_{arch}.json'), 'w') as f:
                json.dump(data, f, separators=(',', ':'))
            print(f'{family}_{arch}.json: {data["num_params"] / 1e6:.2f} M parameters, '
                  f'{len(data["keys"])} entries ({rel} @ {commit})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
