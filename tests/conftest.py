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
    config.addinivalue_line('markers', 'e2e: end-to-end runs through the tools')


def pytest_collection_modifyitems(config, items):
    if config.getoption('--run-slow'):
        return
    skip_slow = pytest.mark.skip(reason='slow sweep: pass --run-slow to run it')
    for item in items:
        if 'slow' in item.keywords:
            item.add_marker(skip_slow)


#: The real sample of each dataset layout under ../shared/data.
REAL_SAMPLES = {'coco': 'coco_tiny', 'ade20k': 'ade20k_sample', 'imagenet': 'imagenet_sample'}
#: The data tiers of the end-to-end tests: generated shapes in every clone, and the real samples
#: where ../shared/data is present.
TIERS = ('generated', 'real')


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


def _generate(layout: str, root: str) -> None:
    """A few small images of shapes in ``layout``'s file layout: enough for the end-to-end runs
    (two processes x two batches of 4 for classification), small enough to train in seconds."""
    from mmeffattn import datasets
    if layout == 'coco':
        datasets.generate_shapes_coco(root, num_train=4, num_val=4, img_size=(128, 160))
    elif layout == 'ade20k':
        datasets.generate_shapes_ade20k(root, num_images=4, img_size=(128, 160))
    else:
        datasets.generate_shapes_imagenet(root, num_per_class=2, img_size=(64, 64))


@pytest.fixture(scope='session')
def generated_data(tmp_path_factory):
    """``generated_data('coco')`` (or ``'ade20k'``, ``'imagenet'``) -> the root of a small set of
    shapes in that dataset's layout (mmeffattn.datasets' generators), made once per session."""
    roots = {}

    def get(layout: str) -> str:
        if layout not in roots:
            roots[layout] = str(tmp_path_factory.mktemp(f'{layout}_shapes'))
            _generate(layout, roots[layout])
        return roots[layout]
    return get


@pytest.fixture
def sample_data(shared_data, generated_data):
    """``sample_data('coco', tier)`` -> the root (with a trailing '/') of a dataset in COCO's
    layout (or ``'ade20k'``'s, ``'imagenet'``'s) of the ``tier``: ``'generated'`` shapes, always
    there, or ``'real'``, the sample under ../shared/data (the test skips when it is absent)."""
    def get(layout: str, tier: str) -> str:
        if tier not in TIERS:
            raise ValueError(f'tier must be one of {TIERS}, got {tier!r}')
        root = generated_data(layout) if tier == 'generated' else shared_data(REAL_SAMPLES[layout])
        return root.rstrip('/') + '/'
    return get


def _restoring_default_scope():
    """mmengine keeps the default scope (mmdet, mmseg, ...) in a process-wide registry of
    instances; a Runner or init_default_scope in one test (or a module's fixture) would change
    how later tests' registries resolve types. Each module and test starts from the scopes that
    existed before it."""
    from mmengine.registry import DefaultScope
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)


_isolated_default_scope = pytest.fixture(autouse=True)(_restoring_default_scope)
_module_default_scope = pytest.fixture(scope='module', autouse=True)(_restoring_default_scope)
