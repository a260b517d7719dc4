"""The layout rules of the tree: the tools are command lines over the library and its workshop
(``tools/workshop``, outside the package) and import no other tool; the package imports no tool;
the tests reach the tools through the repo root (pytest.ini), not through sys.path edits."""
import ast
import os
import os.path as osp

import pytest

from tools.misc import draw_layout

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _py_files(folder):
    for base, _, files in os.walk(osp.join(ROOT, folder)):
        for f in sorted(files):
            if f.endswith('.py'):
                yield osp.join(base, f)


def _imported_modules(path):
    """Every module name an ``import`` / ``from ... import`` in the file names, at any depth (inside
    functions too), with the names a ``from`` takes (``from a import b`` gives ``a`` and
    ``a.b``)."""
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
    """What tools share lives in their workshop (``tools.workshop.benchmarking``, ...): a script
    imports neither a sibling by its bare name (as when its folder is on sys.path) nor any
    ``tools.*`` but the workshop, and the workshop imports no script."""
    tools = {osp.splitext(osp.basename(p))[0]: p for p in _py_files('tools')}
    bad = []
    for path in tools.values():
        for mod in _imported_modules(path):
            if mod in tools or (mod.split('.')[0] == 'tools' and mod != 'tools' and
                                mod.split('.')[1] != 'workshop'):
                bad.append(f'{osp.relpath(path, ROOT)} imports {mod}')
    assert not bad, bad
    assert 'benchmarking' in tools and osp.basename(osp.dirname(tools['benchmarking'])) == \
        'workshop'


def test_the_package_imports_no_tool():
    """The installed package is the product: no module of ``mmlinattn`` imports the tools or
    their workshop, which a wheel does not put on ``sys.path``."""
    bad = [f'{osp.relpath(path, ROOT)} imports {mod}' for path in _py_files('mmlinattn')
           for mod in _imported_modules(path) if mod.split('.')[0] in ('tools', 'workshop')]
    assert not bad, bad


def test_conftest_patches_no_sys_path():
    src = open(osp.join(ROOT, 'tests', 'conftest.py')).read()
    assert 'sys.path' not in src


def test_importing_the_library_loads_no_toolbox():
    """``import mmlinattn.core.ops`` (and so ``import mmlinattn``, which it runs first) loads none
    of mmdet, mmseg or mmpretrain: the math and the backbones need only torch, mmengine and mmcv.
    Read from a fresh interpreter's ``sys.modules``."""
    import subprocess
    import sys
    code = ('import sys, mmlinattn.core.ops, mmlinattn; '
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mmdet', 'mmseg', "
            "'mmpretrain'}))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr


def _module_graph(package='mmlinattn'):
    return draw_layout.module_graph(package)


def test_the_graph_reader_sees_every_kind_of_import(tmp_path):
    """The reader (tools/misc/draw_layout.py) on a small made-up package: an absolute, a relative
    (``from ..b import x``, ``from . import c``), an in-function and a name-inside-a-module import
    each give their arrow, and nothing else does."""
    pkg = tmp_path / 'pkg'
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('from . import c\n')
    (pkg / 'b.py').write_text('x = 1\n')
    (pkg / 'c.py').write_text('def f():\n    import pkg.b\n')
    (pkg / 'd.py').write_text('import os\n')
    (pkg / 'sub' / '__init__.py').write_text('')
    (pkg / 'sub' / 'e.py').write_text('from ..b import x\nfrom pkg.c import f\n')
    graph = draw_layout.module_graph('pkg', root=str(tmp_path))
    assert graph == {'pkg': {'pkg.c'}, 'pkg.b': set(), 'pkg.c': {'pkg.b'}, 'pkg.d': set(),
                     'pkg.sub': set(), 'pkg.sub.e': {'pkg.b', 'pkg.c'}}


def _part(module):
    rest = module.split('.')[1] if '.' in module else ''
    return rest if rest in ('core', 'training') else 'top'


def test_the_core_imports_nothing_outside_itself():
    """The product (mmlinattn.core: math, modules, backbones, weights, registration) stands alone:
    no module of it imports training support or the package's top level (which imports the fixes'
    switch and the hooks)."""
    graph = _module_graph()
    assert 'mmlinattn.core.models.backbones.mavit' in graph  # the layout this test is about
    bad = [f'{m} -> {d}' for m, deps in graph.items() if _part(m) == 'core'
           for d in deps if _part(d) != 'core']
    assert not bad, bad


def test_importing_the_core_loads_no_other_part():
    """Read from a fresh interpreter: ``import mmlinattn.core`` runs the package's ``__init__``
    (which registers the hooks), so this checks the core's own modules load no fixes module (the
    monkeypatches) and no tool (the pre-flight and Runner set-up among them)."""
    import subprocess
    import sys
    code = ('import sys, mmlinattn.core; '
            "print(sorted(m for m in sys.modules if m.startswith(('tools', "
            "'mmlinattn.upstream_fixes', 'mmlinattn.training.compat'))))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr


def test_the_pre_0_2_paths_are_gone():
    """``mmlinattn.ops`` / ``.models`` / ``.registry`` were removed in 0.3.0: importing them fails
    instead of handing out the core's modules under a second name."""
    import importlib

    import mmlinattn
    for old in ('mmlinattn.ops', 'mmlinattn.models.backbones.mavit', 'mmlinattn.registry'):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not hasattr(mmlinattn, 'MOVED') and not hasattr(mmlinattn, 'ops')


def test_no_import_cycle_in_the_library():
    """No two modules of mmlinattn import each other, directly or through others, counting imports
    placed inside functions (which only hide a cycle until the function runs)."""
    graph = _module_graph()
    # the graph sees relative, absolute and in-function imports
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 'open'
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 'open':
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 'done'

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, '\n'.join(' -> '.join(c) for c in cycles)
