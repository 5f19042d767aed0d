"""The package's import graph, read from the source with ``ast``: no cycles (imports inside
functions count), and ``mmeffattn.ops`` depends on torch and triton only, not on the layers above
it nor on OpenMMLab."""
import ast
import functools
import os.path as osp
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1] / 'mmeffattn'
#: what ops/ must not import: the package's upper layers and the OpenMMLab stack
OPS_FORBIDDEN = ('mmeffattn.models', 'mmeffattn.analysis', 'mmeffattn.engine',
                 'mmeffattn.datasets', 'mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain',
                 'tools')


@functools.lru_cache(maxsize=1)
def module_files() -> Dict[str, Path]:
    """Dotted module name -> file, for every module under mmeffattn/ (packages by __init__)."""
    mods = {}
    for path in ROOT.rglob('*.py'):
        parts = path.relative_to(ROOT.parent).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        mods['.'.join(parts)] = path
    return mods


def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute name ``from <node.module>`` names, relative levels resolved."""
    if not node.level:
        return node.module or ''
    base = module.split('.') if is_pkg else module.split('.')[:-1]
    base = base[:len(base) - (node.level - 1)]
    return '.'.join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path) -> List[Tuple[str, int]]:
    """Every module ``module`` imports, anywhere in the file (functions included), as
    ``(absolute dotted name, line)``. ``from pkg import name`` imports ``pkg.name`` when that is a
    module of the package, else ``pkg`` (a name its ``__init__`` defines)."""
    is_pkg = path.name == '__init__.py'
    modules = set(module_files())
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(module, is_pkg, node)
            for a in node.names:
                sub = f'{src}.{a.name}'
                out.append((sub if sub in modules else src, node.lineno))
    return out


def resolve(name: str, modules: Set[str]) -> Optional[str]:
    """The longest prefix of ``name`` that is a module of the package (None: outside it)."""
    parts = name.split('.')
    for n in range(len(parts), 0, -1):
        cand = '.'.join(parts[:n])
        if cand in modules:
            return cand
    return None


def import_graph() -> Dict[str, Dict[str, int]]:
    """module -> {imported module of mmeffattn: line of the first such import}. The parent
    packages Python initialises on the way to a module are not edges; a module naming its own
    package (``from . import name``, ``from mmeffattn.models import X``) is one."""
    files = module_files()
    graph = {}
    for mod, path in files.items():
        edges = {}
        for name, line in imports_of(mod, path):
            dst = resolve(name, set(files))
            if dst is not None and dst != mod:
                edges.setdefault(dst, line)
        graph[mod] = edges
    return graph


def find_cycles(graph: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """The cycles of the graph as paths ``[a, b, ..., a]``: the strongly connected components
    (Tarjan), and a shortest cycle through each of their modules (each set of modules once)."""
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(set(scc))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    cycles = []
    for scc in sccs:  # from each module of a component, a shortest path back to it
        for start in sorted(scc):
            cycle = _shortest_cycle(graph, scc, start)
            if not any(set(cycle) == set(c) for c in cycles):
                cycles.append(cycle)
    return cycles


def _shortest_cycle(graph: Dict[str, Dict[str, int]], scc: Set[str], start: str) -> List[str]:
    prev, frontier = {start: None}, [start]
    while not any(start in graph[v] for v in frontier):
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w in scc and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    path = [next(v for v in frontier if start in graph[v])]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])
    return list(reversed(path)) + [start]


def _describe(cycle: List[str], graph: Dict[str, Dict[str, int]]) -> str:
    files = module_files()
    hops = [f'{a} ({osp.relpath(files[a], ROOT.parent)}:{graph[a][b]})'
            for a, b in zip(cycle, cycle[1:])]
    return ' -> '.join(hops + [cycle[-1]])


def test_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    # a relative import at module level, and the registry's users
    assert 'mmeffattn.models.backbones.base' in graph['mmeffattn.models.backbones.sema']
    assert 'mmeffattn.registry' in graph['mmeffattn.models.backbones.sema']
    # the cycle finder itself
    assert find_cycles({'a': {'b': 1}, 'b': {'c': 2}, 'c': {'a': 3}, 'd': {'a': 4}}) == \
        [['a', 'b', 'c', 'a']]
    assert find_cycles({'a': {'b': 1}, 'b': {}}) == []


def test_imports_inside_functions_are_seen(tmp_path):
    src = 'def f():\n    from .b import x\n    import mmeffattn.c\n'
    path = tmp_path / 'a.py'
    path.write_text(src)
    names = [n for n, _ in imports_of('mmeffattn.pkg.a', path)]
    assert names == ['mmeffattn.pkg.b', 'mmeffattn.c']


def test_no_import_cycles():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, 'import cycles inside mmeffattn:\n' + '\n'.join(
        _describe(c, graph) for c in cycles)


def test_ops_import_nothing_from_the_layers_above():
    files = module_files()
    bad = []
    for mod, path in sorted(files.items()):
        if mod != 'mmeffattn.ops' and not mod.startswith('mmeffattn.ops.'):
            continue
        for name, line in imports_of(mod, path):
            if any(name == f or name.startswith(f + '.') for f in OPS_FORBIDDEN):
                bad.append(f'{osp.relpath(path, ROOT.parent)}:{line} imports {name}')
    assert not bad, 'mmeffattn.ops must need only torch and triton:\n' + '\n'.join(sorted(set(bad)))
