"""Draw the package's layout from its import statements (docs/design.md section 5).

    python tools/misc/draw_layout.py           # the parts, their modules, the arrows between parts
    python tools/misc/draw_layout.py --dot     # the module graph in Graphviz's dot language

Every import of every module of ``mmlinattn/`` (inside functions too, relative ones resolved) is
read with ``ast``; nothing is imported. The parts: ``core``, ``training``, ``apis`` and ``top`` (the
package's own top-level modules). tests/test_structure.py asserts its rules on the same graph.
"""
import argparse
import ast
import collections
import os
import os.path as osp

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PARTS = ('core', 'training', 'apis')


def module_files(package='mmlinattn', root=ROOT):
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


def module_graph(package='mmlinattn', root=ROOT):
    """{module: modules of the package it imports}; ``from a import b`` points at ``a.b`` where that
    is a module, else at ``a``."""
    files = module_files(package, root)
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


def part_of(module, package='mmlinattn'):
    """'core', 'training', 'apis', or 'top' for the package's own top-level modules."""
    rest = module[len(package) + 1:].split('.')[0] if module != package else ''
    return rest if rest in PARTS else 'top'


def draw(graph, package='mmlinattn'):
    """Per part its modules and what they import from other parts; then the arrows between parts."""
    lines, between = [], collections.Counter()
    for part in ('top',) + PARTS:
        mods = sorted(m for m in graph if part_of(m, package) == part)
        lines.append(f'[{part}] {len(mods)} modules')
        for m in mods:
            out = sorted(d for d in graph[m] if part_of(d, package) != part)
            for d in out:
                between[(part, part_of(d, package))] += 1
            short = m[len(package) + 1:] or package
            lines.append(f'    {short}' + (f'  -> {", ".join(d[len(package) + 1:] for d in out)}'
                                            if out else ''))
    lines.append('arrows between parts (importer -> imported: count):')
    lines += [f'    {a} -> {b}: {n}' for (a, b), n in sorted(between.items())]
    return '\n'.join(lines)


def dot(graph, package='mmlinattn'):
    """The module graph in Graphviz's dot language, one cluster per part."""
    out = ['digraph mmlinattn {', '  rankdir=BT; node [shape=box, fontsize=10];']
    for part in ('top',) + PARTS:
        out.append(f'  subgraph cluster_{part} {{ label="{part}";')
        out += [f'    "{m}";' for m in sorted(graph) if part_of(m, package) == part]
        out.append('  }')
    out += [f'  "{m}" -> "{d}";' for m in sorted(graph) for d in sorted(graph[m])]
    out.append('}')
    return '\n'.join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--dot', action='store_true', help='Graphviz dot instead of the text picture')
    args = p.parse_args()
    graph = module_graph()
    print(dot(graph) if args.dot else draw(graph))


if __name__ == '__main__':
    main()
