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
    """A tool's helpers live in the library (mmlinattn.benchmarking, ...): a script imports neither
    a sibling by its bare name (as when its folder is on sys.path) nor ``tools.*``."""
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
    """``import mmlinattn.ops`` (and so ``import mmlinattn``, which it runs first) loads none of
    mmdet, mmseg or mmpretrain: the math and the backbones need only torch, mmengine and mmcv. Read
    from a fresh interpreter's ``sys.modules``."""
    import subprocess
    import sys
    code = ('import sys, mmlinattn.ops, mmlinattn; '
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mmdet', 'mmseg', "
            "'mmpretrain'}))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr


def _module_graph(package='mmlinattn'):
    """{module: modules of the package it imports}, from every import statement (inside functions
    too); ``from a import b`` points at ``a.b`` where that is a module, else at ``a``."""
    files = {}
    for path in _py_files(package):
        rel = osp.relpath(path, ROOT)[:-3].replace(os.sep, '.')
        files[rel[:-len('.__init__')] if rel.endswith('.__init__') else rel] = path
    graph = {}
    for mod, path in files.items():
        is_pkg = path.endswith('__init__.py')
        deps = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = mod.split('.')[:len(mod.split('.')) - node.level + (1 if is_pkg else 0)]
                    base = '.'.join(parts + ([base] if base else []))
                names = [f'{base}.{a.name}' if f'{base}.{a.name}' in files else base
                         for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:  # a name inside a module: the module
                    name = name.rpartition('.')[0]
                if name and name != mod:
                    deps.add(name)
        graph[mod] = deps
    return graph


def test_no_import_cycle_in_the_library():
    """No two modules of mmlinattn import each other, directly or through others, counting imports
    placed inside functions (which only hide a cycle until the function runs)."""
    graph = _module_graph()
    # the graph sees relative, absolute and in-function imports
    assert 'mmlinattn.ops.attention' in graph['mmlinattn.ops.cores']
    assert 'mmlinattn.models.backbones' in graph['mmlinattn.models.classification']
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
