"""tools/benchmark.py on tiny sizes, and the measurement helpers it relies on."""
import json
import os
import os.path as osp

import pytest
import torch

from mmeffattn.analysis import benchmarking as bm
from mmeffattn.analysis import model_zoo

from tools import benchmark

TINY = ['--preset', 'smoke', '--warmup', '0', '--repeats', '1']


def test_smoke_run_writes_every_output(tmp_path, monkeypatch):
    runners = []
    init = bm.Runner.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(bm.Runner, '__init__', keep)
    before = os.environ.get('MMEFFATTN_OPS_BACKEND')
    report = benchmark.main(TINY + ['--models', 'ResNet-50', 'SEMA-T', '--sizes', '32',
                                    '32x48', '--reference', 'ResNet-50',
                                    '--out-dir', str(tmp_path)])
    assert os.environ.get('MMEFFATTN_OPS_BACKEND') == before  # not leaked to the caller
    saved = json.loads((tmp_path / 'benchmark.json').read_text())
    assert saved['results'] == report['results']
    assert saved['environment']['threads'] == torch.get_num_threads()
    assert 'dispatch mode' in saved['environment']['memory_method']
    assert saved['settings']['ops_backend'] == 'torch'  # what a CPU runs, never the interpreter
    rows = {(r['model'], tuple(r['size'])): r for r in report['results']}
    assert len(rows) == 4
    for name in ('ResNet-50', 'SEMA-T'):
        small, wide = rows[name, (32, 32)], rows[name, (32, 48)]
        for r in (small, wide):
            assert r['status'] == 'ok', r
            assert r['fwd_ms'] > 0 and r['images_per_s'] == pytest.approx(1e3 / r['fwd_ms'])
            assert r['fwd_bwd_ms'] > 0  # all sides <= the smoke preset's backward limit
            # peak memory includes the parameters, and training holds more than inference
            assert r['peak_mem_mb'] * 2**20 > r['params_m'] * 1e6 * 4
            assert r['fwd_bwd_peak_mem_mb'] > r['peak_mem_mb']
        assert 0 < small['gmacs'] < wide['gmacs']
        assert small['tokens'] == 4 and wide['tokens'] == 6
    # the peer runs in its best CPU setting, channels-last model and input; ours as built, fed
    # a plain NCHW batch
    assert {n: m['setting'] for n, m in saved['models'].items()} == {
        'ResNet-50': 'channels-last', 'SEMA-T': 'as built'}
    cl = torch.channels_last
    for runner in runners:
        peer = type(runner.model).__name__ == 'ResNet'
        assert runner.x.is_contiguous(memory_format=cl) == peer
        assert runner.x.is_contiguous() != peer
        built = model_zoo.build_backbone('ResNet-50' if peer else 'SEMA-T')
        for p, q in zip(runner.model.parameters(), built.parameters()):
            if peer and p.dim() == 4:
                assert p.is_contiguous(memory_format=cl)
            else:
                assert p.stride() == q.stride()
    assert sorted(type(r.model).__name__ for r in runners) == ['ResNet', 'ResNet', 'SEMA', 'SEMA']
    md = (tmp_path / 'benchmark.md').read_text()
    assert '| ResNet-50 | channels-last |' in md and '| SEMA-T | as built |' in md
    assert '1.00x' in md and 'Scaling exponents' in md
    for png in ('latency_vs_tokens.png', 'memory_vs_tokens.png'):
        assert (tmp_path / png).stat().st_size > 1000


def test_sizes_past_the_time_limit_are_reported_not_run(tmp_path):
    report = benchmark.main(TINY + ['--models', 'ResNet-50', '--sizes', '32', '48', '64',
                                    '--max-call-s', '1e-9', '--no-plots', '--no-flops',
                                    '--out-dir', str(tmp_path)])
    status = [r['status'] for r in report['results']]
    # the first size has no history to predict from; the next ones are predicted too slow
    assert status == ['ok', 'skipped (time limit)', 'skipped (time limit)']
    assert 'skipped (time limit)' in (tmp_path / 'benchmark.md').read_text()


def test_out_of_memory_and_unavailable_models_are_reported(tmp_path, monkeypatch):
    monkeypatch.setitem(model_zoo.MODEL_ZOO, 'Missing-T', model_zoo.ZooModel(
        'Missing-T', 'mmeffattn', dict(type='NoSuchBackbone')))

    def oom(self):
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 1 TiB')

    monkeypatch.setattr(bm.Runner, 'forward', oom)
    report = benchmark.main(TINY + ['--models', 'ResNet-50', 'Missing-T', '--sizes', '32',
                                    '--no-plots', '--out-dir', str(tmp_path)])
    status = {r['model']: r['status'] for r in report['results']}
    assert status['ResNet-50'] == 'out of memory'
    assert status['Missing-T'].startswith('not available') and 'NoSuchBackbone' in \
        status['Missing-T']


def test_every_zoo_model_builds_or_says_why():
    assert {'SEMA-T', 'MILA-T', 'LaplacianFormer-T', 'LaplacianFormer-S', 'WeightFormer-T',
            'WeightFormer-S', 'VECA-S-C8', 'VECA-S-C16', 'VECA-S-C64'} == set(model_zoo.OURS)
    assert {'Swin-T', 'ConvNeXt-T', 'PVTv2-b1', 'PVTv2-b2', 'DeiT-T', 'DeiT-S',
            'ResNet-50'} == set(model_zoo.PEERS)
    for name in model_zoo.MODEL_ZOO:
        reason = model_zoo.unavailable_reason(name)
        assert reason is None or reason.startswith('not available'), (name, reason)
    veca = model_zoo.unavailable_reason('VECA-S-C16')
    if veca is None:
        assert model_zoo.build_backbone('VECA-S-C16').num_cores == 16
    with pytest.raises(ValueError, match="unknown model 'Nope'"):
        model_zoo.select_models(['Nope'])
    assert model_zoo.select_models(['peers', 'Swin-T']) == model_zoo.PEERS


def test_roster_configs_resolve_through_the_package(tmp_path, monkeypatch):
    """Our classifier configs are named inside the package (``mmeffattn::``), so the roster
    works from an installed wheel (tests/packaging builds one from it); in a checkout they are
    the project's configs/."""
    configs = model_zoo.package_configs()
    assert osp.isfile(osp.join(configs, 'sema', 'sema-t_8xb128_in1k.py'))
    for name in model_zoo.OURS:
        cfg = model_zoo.get_model(name).classifier
        assert cfg.startswith('mmeffattn::'), cfg
        assert model_zoo.resolve_config(cfg) == osp.join(configs, cfg.split('::')[1])
        assert osp.isfile(model_zoo.resolve_config(cfg))
    monkeypatch.chdir(tmp_path)  # a project path works from any folder
    assert model_zoo.resolve_config('configs/mila/mila-t_8xb128_in1k.py') == \
        osp.join(configs, 'mila', 'mila-t_8xb128_in1k.py')


def test_peak_tensor_memory_follows_allocations_and_releases():
    x = torch.randn(1000, 1000)  # 4 MB, resident

    def work():
        a = x @ x  # +4 MB
        b = a @ a  # +4 MB
        del a  # -4 MB
        c = torch.empty(3000, 1000)  # +12 MB: peak b + c = 16 MB
        return (b.sum() + c.sum()).item()

    # resident x, then b and c alive with the two 4-byte sums and their 4-byte total
    assert bm.peak_memory(work, [x], torch.device('cpu')) == 4_000_000 + 16_000_000 + 12
    # views of resident memory are not new memory
    assert bm.peak_memory(lambda: x.t()[:10].unsqueeze(0)[0, 2:], [x], torch.device('cpu')) == \
        4_000_000


def test_fit_and_prediction_of_power_laws():
    xs = [196, 784, 3136]
    assert bm.fit_exponent(xs, [3 * x ** 1.5 for x in xs]) == pytest.approx(1.5)
    assert bm.fit_exponent([196], [1.0]) is None
    assert bm.predict_power_law([(100, 1.0), (400, 4.0)], 1600) == pytest.approx(16.0)
    # a flat (noisy) start still predicts at least linear growth
    assert bm.predict_power_law([(100, 1.0), (400, 1.0)], 1600) == pytest.approx(4.0)
    assert bm.parse_size('512x768') == (512, 768) and bm.parse_size('64') == (64, 64)
    with pytest.raises(ValueError, match='512x'):
        bm.parse_size('512x')


def test_compile_reports_eager_and_compiled_side_by_side(tmp_path, monkeypatch):
    """``--compile`` on a tiny stand-in backbone (the aot_eager backend: the path, not
    inductor's speed, which tools/benchmark.py --compile measures)."""
    import mmeffattn.analysis.model_zoo as zoo

    def tiny(name):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU()).eval()

    monkeypatch.setattr(zoo, 'build_backbone', tiny)
    report = benchmark.main(TINY + ['--models', 'SEMA-T', '--sizes', '32', '--no-flops',
                                    '--no-plots', '--compile', '--compile-backend', 'aot_eager',
                                    '--backward-max-side', '0', '--out-dir', str(tmp_path)])
    (rec, ) = report['results']
    assert rec['fwd_compiled_ms'] > 0 and rec['compiled_speedup'] > 0
    assert rec['compiled_setup_s'] >= 0 and rec['compiled_status'] == 'ok'
    table = (tmp_path / 'benchmark.md').read_text()
    assert 'compiled (aot_eager) against eager' in table
    assert '| SEMA-T | as built | 32x32 |' in table


def test_freezing_is_set_for_the_run_only():
    """``--freezing``: inductor compiles with freezing (weights folded as constants) within the
    run, and the setting is restored after; not asked for, or another backend, leaves it."""
    import torch._inductor.config as inductor_config
    before = inductor_config.freezing
    with bm._compile_config(bm.BenchmarkSettings(compile=True, freezing=True)):
        assert inductor_config.freezing
    for settings in (bm.BenchmarkSettings(compile=True),
                     bm.BenchmarkSettings(compile=True, freezing=True, compile_backend='eager')):
        with bm._compile_config(settings):
            assert inductor_config.freezing == before
    assert inductor_config.freezing == before


def test_onnxruntime_beside_eager(tmp_path, monkeypatch):
    """``--onnx`` exports each backbone at each size, times it under onnxruntime back to back
    with eager and checks its outputs against eager's; here a tiny stand-in under a peer's name,
    so that the export starts from a channels-last model."""
    pytest.importorskip('onnxruntime', reason='the deploy extra is not installed')
    pytest.importorskip('onnxscript', reason='the deploy extra is not installed')
    import mmeffattn.analysis.model_zoo as zoo

    def tiny(name):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU(),
                                   torch.nn.Conv2d(8, 4, 3, stride=2)).eval()

    monkeypatch.setattr(zoo, 'build_backbone', tiny)
    report = benchmark.main(TINY + ['--models', 'ResNet-50', '--sizes', '32', '32x48',
                                    '--no-flops', '--no-plots', '--onnx', '--threads', '1',
                                    '--backward-max-side', '0', '--out-dir', str(tmp_path)])
    for rec in report['results']:
        assert rec['setting'] == 'channels-last' and rec['ort_status'] == 'ok', rec
        assert rec['fwd_ort_ms'] > 0 and rec['ort_speedup'] > 0 and rec['ort_setup_s'] > 0
        assert rec['ort_rel_err'] < 1e-5
    assert report['settings']['onnx'] == ('CPUExecutionProvider, graph optimization level all, '
                                          '1 intra-op thread')
    table = (tmp_path / 'benchmark.md').read_text()
    assert '### onnxruntime 1.' in table and '| ResNet-50 | channels-last | 32x48 |' in table
    with pytest.raises(ValueError, match="CPU provider runs the fp32 graph"):
        benchmark.main(['--onnx', '--dtype', 'bf16', '--out-dir', str(tmp_path)])


@pytest.mark.parametrize('device', ['cuda', 'cpu'])
def test_first_gpu_call_is_kept_out_of_the_time_budget(monkeypatch, device):
    """On a GPU the first call of a pass compiles Triton kernels: it is recorded apart and not
    charged to the budget (on a CPU nothing is compiled and every call is charged)."""
    import argparse
    import time
    import types
    calls = []

    def fn():
        time.sleep(0.2 if not calls else 0.001)  # the first call "compiles"
        calls.append(1)

    def fake_time_once(f, dev):
        t0 = time.perf_counter()
        f()
        return time.perf_counter() - t0

    monkeypatch.setattr(bm, 'time_once', fake_time_once)
    records = {'m': dict(status='ok', size=[8, 8])}
    info = {'m': dict(spent_s=0., time_hist=[])}
    runners = {'m': types.SimpleNamespace(forward=fn, forward_backward=fn)}
    args = argparse.Namespace(warmup=2, repeats=3, batch=1)
    bm._measure(runners, records, info, args, torch.device(device), backward=False)
    assert len(calls) == 5 and records['m']['fwd_ms'] < 50
    if device == 'cuda':
        assert records['m']['first_call_s'] >= 0.2 and info['m']['spent_s'] < 0.1
    else:
        assert 'first_call_s' not in records['m'] and info['m']['spent_s'] >= 0.2
