"""Record which implementation an op's public function dispatches to (the dispatch tests)."""
from types import ModuleType

#: the backend each module-level entry point of an op's ``op.py`` implements, by suffix
ENTRY_POINTS = (('_triton', 'triton'), ('_torch', 'torch'), ('_naive', 'reference'))


def spy_on(monkeypatch, module: ModuleType, name: str) -> list:
    """Replace ``module``'s ``<name>_triton``, ``<name>_torch`` and ``<name>_naive`` (the
    functions its dispatch calls) with wrappers that record which backend runs
    ('triton' / 'torch' / 'reference'); returns the record."""
    calls = []
    for suffix, label in ENTRY_POINTS:
        def spy(*a, _fn=getattr(module, name + suffix), _label=label, **kw):
            calls.append(_label)
            return _fn(*a, **kw)
        monkeypatch.setattr(module, name + suffix, spy)
    return calls
