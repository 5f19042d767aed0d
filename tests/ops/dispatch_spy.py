"""Record which implementation an op's public function dispatches to (the dispatch tests)."""
from types import ModuleType


def spy_on(monkeypatch, module: ModuleType, naive: str, triton: str) -> list:
    """Replace the op module's reference and Triton entry points (by name) with wrappers that
    record which one runs ('reference' / 'triton'); returns the record."""
    calls = []
    for name, label in ((naive, 'reference'), (triton, 'triton')):
        def spy(*a, _fn=getattr(module, name), _label=label, **kw):
            calls.append(_label)
            return _fn(*a, **kw)
        monkeypatch.setattr(module, name, spy)
    return calls
