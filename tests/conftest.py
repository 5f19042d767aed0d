"""Test harness shared by every test.

Triton decides at import time whether it interprets kernels, so the switch is set here, before
anything imports triton: on a machine without a CUDA GPU the Triton kernels run interpreted on CPU
tensors and are compared with the PyTorch references.
"""
import os
import os.path as osp

import pytest

if os.environ.get('TRITON_INTERPRET') is None:
    try:
        import torch
        _has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        _has_cuda = False
    if not _has_cuda:
        os.environ['TRITON_INTERPRET'] = '1'

PROJECT_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SHARED_DATA = os.environ.get('MMEFFATTN_SHARED_DATA',
                             osp.join(osp.dirname(PROJECT_ROOT), 'shared', 'data'))


def pytest_addoption(parser):
    parser.addoption('--run-slow', action='store_true', default=False,
                     help='also run the long sweeps marked @pytest.mark.slow')


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: long sweeps, run only with --run-slow')
    config.addinivalue_line('markers', 'e2e: end-to-end runs on ../shared/data')


def pytest_collection_modifyitems(config, items):
    if config.getoption('--run-slow'):
        return
    skip_slow = pytest.mark.skip(reason='slow sweep: pass --run-slow to run it')
    for item in items:
        if 'slow' in item.keywords:
            item.add_marker(skip_slow)


def shared_data_dir(name: str) -> str:
    """Path of a sample dataset under ../shared/data, or skip the test with a clear message."""
    path = osp.join(SHARED_DATA, name)
    if not osp.isdir(path):
        pytest.skip(f'sample data {path!r} is absent: put the shared data beside the project '
                    f'(../shared/data) or set MMEFFATTN_SHARED_DATA')
    return path


@pytest.fixture(scope='module')
def one_thread():
    """Run a test module with one intra-op thread, restored after. Small inputs gain nothing from
    threads, and on a shared 2-core machine OpenMP spin-waiting under contention made small CPU
    ops 10-50x slower. Opt in with ``pytestmark = pytest.mark.usefixtures('one_thread')``."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def torch_ops(monkeypatch):
    """Run the ops' torch backend (what a CPU runs); the Triton kernels and the naive references
    have their own tests in tests/ops. Opt in with ``pytest.mark.usefixtures('torch_ops')``; a
    test may still set ``MMEFFATTN_OPS_BACKEND`` itself."""
    monkeypatch.setenv('MMEFFATTN_OPS_BACKEND', 'torch')


@pytest.fixture
def shared_data():
    """``shared_data('coco_tiny')`` -> its path, or the test is skipped with a clear message."""
    return shared_data_dir


@pytest.fixture(autouse=True)
def _isolated_default_scope():
    """mmengine keeps the default scope (mmdet, mmseg, ...) in a process-wide registry of
    instances; a Runner or init_default_scope in one test would change how the next test's
    registries resolve types. Each test starts from the scopes that existed before it."""
    from mmengine.registry import DefaultScope
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)
