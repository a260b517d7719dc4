"""The layout rules of the tree: the tools are command lines over the library and import no other
tool; the tests reach the tools through the repo root (pytest.ini), not through sys.path edits."""
import ast
import os
import os.path as osp

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _py_files(folder):
    for base, _, files in os.walk(osp.join(ROOT, folder)):
        for f in sorted(files):
            if f.endswith('.py'):
                yield osp.join(base, f)


def _imported_modules(path):
    """Every module name an ``import`` / ``from ... import`` in the file names, at any depth (inside
    functions too), with the names a ``from`` takes (``from a import b`` gives ``a`` and ``a.b``)."""
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            for a in node.names:
                yield f'{node.module}.{a.name}'


def test_no_tool_imports_another_tool():
    """A tool's helpers live in the library (mmlinattn.benchmarking, ...): a script imports neither a
    sibling by its bare name (as when its folder is on sys.path) nor ``tools.*``."""
    tools = {osp.splitext(osp.basename(p))[0]: p for p in _py_files('tools')}
    bad = []
    for path in tools.values():
        for mod in _imported_modules(path):
            if mod.split('.')[0] == 'tools' or mod in tools:
                bad.append(f'{osp.relpath(path, ROOT)} imports {mod}')
    assert not bad, bad


def test_conftest_patches_no_sys_path():
    src = open(osp.join(ROOT, 'tests', 'conftest.py')).read()
    assert 'sys.path' not in src


def test_importing_the_library_loads_no_toolbox():
    """``import mmlinattn.ops`` (and so ``import mmlinattn``, which it runs first) loads none of mmdet,
    mmseg or mmpretrain: the math and the backbones need only torch, mmengine and mmcv. Read from a
    fresh interpreter's ``sys.modules``."""
    import subprocess
    import sys
    code = ('import sys, mmlinattn.ops, mmlinattn; '
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mmdet', 'mmseg', 'mmpretrain'}))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr


def test_function_registries_for_toolboxes_imported_before_us():
    """A toolbox imported before ``mmlinattn`` (mmdet's own demo with ``custom_imports``) gets the
    empty ``function`` registry that silences its inferencer's registry-scope warning."""
    import subprocess
    import sys
    code = ('import mmdet.registry, mmlinattn; from mmengine.registry import FUNCTIONS; '
            "print('mmdet' in FUNCTIONS.children, 'mmseg' in FUNCTIONS.children)")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == 'True False', out.stdout + out.stderr
