"""The layout rules of the tree: the tools are command lines over the package and import no other
tool (what they share is the package's, so that they run from an installed wheel); the package
imports no tool; no script edits sys.path; the tests reach the tools through the repo root
(pytest.ini), not through sys.path edits."""
import ast
import os
import os.path as osp

import pytest

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
    """What tools share lives in the package (``mmlinattn.analysis``, ``mmlinattn.training.cli``,
    ...): a script imports neither a sibling by its bare name (as when its folder is on sys.path)
    nor any ``tools.*``, which an installed wheel does not put on ``sys.path``."""
    tools = {osp.splitext(osp.basename(p))[0]: p for p in _py_files('tools')}
    assert 'export_onnx' in tools and 'get_flops' in tools  # the tree this test is about
    bad = [f'{osp.relpath(path, ROOT)} imports {mod}' for path in tools.values()
           for mod in _imported_modules(path) if mod in tools or mod.split('.')[0] == 'tools']
    assert not bad, bad


def test_the_package_imports_no_tool():
    """The installed package is the product: no module of ``mmlinattn`` imports the tools."""
    bad = [f'{osp.relpath(path, ROOT)} imports {mod}' for path in _py_files('mmlinattn')
           for mod in _imported_modules(path) if mod.split('.')[0] in ('tools', 'workshop')]
    assert not bad, bad


def _edits_sys_path(path):
    """Whether the file assigns, extends or inserts into ``sys.path`` (read with ``ast``)."""
    for node in ast.walk(ast.parse(open(path).read(), path)):
        target = node.func.value if isinstance(node, ast.Call) and \
            isinstance(node.func, ast.Attribute) and \
            node.func.attr in ('insert', 'append', 'extend', 'remove', 'pop', 'clear') else None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets), None)
        if isinstance(target, ast.Attribute) and target.attr == 'path' and \
                isinstance(target.value, ast.Name) and target.value.id == 'sys':
            return True
    return False


def test_no_script_edits_sys_path(tmp_path):
    """No script of tools/ or tests/data/ puts a folder on ``sys.path``: each runs on the
    installed package as it is (docs/development.md). The reader on made-up files first."""
    for code, edits in (('import sys\nsys.path.insert(0, "x")\n', True),
                        ('import sys\nsys.path[:0] = ["x"]\n', True),
                        ('import sys\nsys.path.append("x")\n', True),
                        ('import sys\nsys.path = ["x"]\n', True),
                        ('import sys\nprint(sys.path)\nenv = dict(PATH=sys.path)\n', False)):
        (tmp_path / 'f.py').write_text(code)
        assert _edits_sys_path(str(tmp_path / 'f.py')) is edits, code
    files = list(_py_files('tools')) + list(_py_files(osp.join('tests', 'data')))
    bad = [osp.relpath(p, ROOT) for p in files if _edits_sys_path(p)]
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


def _module_files(package='mmlinattn', root=ROOT):
    """{module name: file path} of every module of the package (a package by its ``__init__``)."""
    files = {}
    for base, dirs, names in os.walk(osp.join(root, package)):
        dirs[:] = sorted(d for d in dirs if not d.startswith(('.', '__')))
        for f in sorted(names):
            if f.endswith('.py'):
                rel = osp.relpath(osp.join(base, f), root)[:-3].replace(os.sep, '.')
                files[rel[:-len('.__init__')] if rel.endswith('.__init__') else rel] = \
                    osp.join(base, f)
    return files


def _module_graph(package='mmlinattn', root=ROOT):
    """{module: modules of the package it imports}, read with ``ast`` (inside functions too,
    relative imports resolved); ``from a import b`` points at ``a.b`` where that is a module, else
    at ``a``."""
    files = _module_files(package, root)
    graph = {}
    for mod, path in files.items():
        is_pkg, deps = path.endswith('__init__.py'), set()
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = mod.split('.')
                    keep = len(parts) - node.level + (1 if is_pkg else 0)
                    base = '.'.join(parts[:keep] + ([base] if base else []))
                names = [f'{base}.{a.name}' if f'{base}.{a.name}' in files else base
                         for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition('.')[0]
                if name and name != mod:
                    deps.add(name)
        graph[mod] = deps
    return graph


def test_the_graph_reader_sees_every_kind_of_import(tmp_path):
    """The reader (:func:`_module_graph`) on a small made-up package: an absolute, a relative
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
    graph = _module_graph('pkg', root=str(tmp_path))
    assert graph == {'pkg': {'pkg.c'}, 'pkg.b': set(), 'pkg.c': {'pkg.b'}, 'pkg.d': set(),
                     'pkg.sub': set(), 'pkg.sub.e': {'pkg.b', 'pkg.c'}}


def _part(module):
    rest = module.split('.')[1] if '.' in module else ''
    return rest if rest in ('core', 'training') else 'top'


def test_the_tools_code_in_the_package_stays_out_of_its_import():
    """``mmlinattn.analysis`` (what the benchmark, FLOP and export tools compute) is imported by
    the tools alone: no other module of the package imports it, and ``import mmlinattn`` loads
    none of it (nor onnx), read from a fresh interpreter."""
    import subprocess
    import sys
    graph = _module_graph()
    assert 'mmlinattn.analysis.deploy' in graph
    bad = [f'{m} -> {d}' for m, deps in graph.items() if not m.startswith('mmlinattn.analysis')
           for d in deps if d.startswith('mmlinattn.analysis')]
    assert not bad, bad
    code = ('import sys, mmlinattn; '
            "print(sorted(m for m in sys.modules if m.startswith(('mmlinattn.analysis', 'onnx'))))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr


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
