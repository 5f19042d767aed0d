"""ONNX export (mmeffattn.deploy.onnx, and its command line tools/deployment/export_onnx.py) on
small models: every family exports (static and dynamic), onnxruntime agrees with PyTorch, the
translations it adds (cdist, flooring //) are right, and it works from the library alone.

Skipped cleanly without the optional extra (`pip install -e .[deploy]`)."""
import os.path as osp

import pytest
import torch

pytest.importorskip('onnx', reason='the deploy extra is not installed (pip install -e .[deploy])')
pytest.importorskip('onnxruntime', reason='the deploy extra is not installed')
pytest.importorskip('onnxscript', reason='the deploy extra is not installed')

import sys  # noqa: E402

from mmeffattn.deploy import onnx as E  # noqa: E402  (after the extras' skips)
from tools.deployment import export_onnx as T  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

pytestmark = pytest.mark.usefixtures('one_thread')

# one small classifier config per family: depth 1 per stage, narrow, so an export takes seconds
SMALL = {
    'sema': ('configs/sema/sema-t_8xb128_in1k.py',
             dict(arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]))),
    'mila': ('configs/mila/mila-t_8xb128_in1k.py',
             dict(arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]))),
    'laplacianformer': ('configs/laplacianformer/laplacianformer-t_8xb128_in1k.py',
                        dict(arch=dict(embed_dims=[16, 32, 40, 64], depths=[1, 1, 1, 1],
                                       num_heads=[1, 1, 1, 1]))),
    'weightformer': ('configs/weightformer/weightformer-t_8xb256_in1k.py',
                     dict(arch=dict(embed_dims=64, depth=2))),
    'veca': ('configs/veca/veca-s_8xb128_in1k.py',
             dict(arch=dict(embed_dims=64, depth=2, num_heads=2))),
}


def small_backbone(family: str) -> torch.nn.Module:
    from mmengine.registry import MODELS
    config, arch = SMALL[family]
    torch.manual_seed(0)
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(ROOT, config))
    bb = dict(cfg.model.backbone, drop_path_rate=0., **arch)
    bb.pop('init_cfg', None)
    return MODELS.build(bb).eval()


@pytest.mark.slow  # the dynamic test below also checks each family at its export size
@pytest.mark.parametrize('family', sorted(SMALL))
def test_every_family_exports_and_matches(family, tmp_path):
    wrapper = E.ExportWrapper(small_backbone(family)).eval()
    out = E.export_onnx(wrapper, (64, 96), str(tmp_path / f'{family}.onnx'))
    assert E.input_dims(out) == [1, 3, 64, 96]
    (rec, ) = E.check_parity(out, wrapper, E.check_sizes((64, 96), dynamic=False))
    assert rec['size'] == (64, 96) and rec['rel_err'] <= 1e-4, rec


@pytest.mark.parametrize('family', sorted(SMALL))
def test_every_family_exports_dynamic_and_matches_at_odd_sizes(family, tmp_path):
    """One file at three sizes, one of them odd. What pinned the size before: LaplacianFormer's
    ``cdist`` (no translation) and truncating ``//``; Python branches and ``int()`` on sizes
    (every family's padding, SEMA's window layout and size checks, MILA's RoPE cache);
    ``adaptive_avg_pool2d`` (WeightFormer, LaplacianFormer: gather indices of the export size);
    data-dependent checks in the references (WeightFormer, LaplacianFormer)."""
    wrapper = E.ExportWrapper(small_backbone(family)).eval()
    out = E.export_onnx(wrapper, (64, 96), str(tmp_path / f'{family}.onnx'), dynamic=True)
    dims = E.input_dims(out)
    assert dims[:2] == [1, 3] and all(isinstance(d, str) for d in dims[2:]), dims
    sizes = E.check_sizes((64, 96), dynamic=True)
    assert len(sizes) == 3 and any(h % 2 and w % 2 for h, w in sizes)
    for rec in E.check_parity(out, wrapper, sizes):
        assert rec['rel_err'] <= 1e-4, rec


def test_a_pinned_size_is_refused_by_name(tmp_path):
    """A model that branches on its input size cannot become a dynamic file: the export names
    the guard instead of writing a static file silently (what torch.onnx.export does)."""

    class Pins(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[2] == 64 else x

    with pytest.raises(Exception, match='height'):
        E.export_onnx(Pins(), (64, 96), str(tmp_path / 'pins.onnx'), dynamic=True)


def test_floordiv_translation_floors_negative_numbers(tmp_path):
    """A dynamic export of ``-((-h) // 3)`` (ceil division) gives ceil at every size."""
    import onnxruntime as ort

    class CeilRows(torch.nn.Module):
        def forward(self, x):
            rows = -((-x.shape[2]) // 3)
            return x.new_zeros(rows)

    x = torch.zeros(1, 1, 10, 4)
    program = torch.onnx.export(
        CeilRows().eval(), (x, ), dynamo=True, custom_translation_table=E.translation_table(),
        dynamic_shapes=({2: torch.export.Dim('h', min=2, max=100)}, ), verbose=False)
    program.save(str(tmp_path / 'ceil.onnx'))
    session = ort.InferenceSession(str(tmp_path / 'ceil.onnx'))
    for h in (9, 10, 11, 31):
        (out, ) = session.run(None, {session.get_inputs()[0].name:
                                     torch.zeros(1, 1, h, 4).numpy()})
        assert out.shape == (-(-h // 3), ), h


@pytest.mark.parametrize('n', [7, 150], ids=['one_block', 'three_blocks_padded'])
def test_cdist_translation_matches_torch(tmp_path, n):
    """p=1 runs over blocks of CDIST_BLOCK_ROWS rows of x1 (the last one padded), p=2 at once."""
    import onnxruntime as ort

    class L1(torch.nn.Module):
        def forward(self, a, b):
            return torch.cdist(a, b, p=1), torch.cdist(a, b, p=2)

    a, b = torch.randn(2, n, 5), torch.randn(2, 3, 5)
    program = torch.onnx.export(L1().eval(), (a, b), dynamo=True, verbose=False,
                                custom_translation_table=E.translation_table())
    program.save(str(tmp_path / 'cdist.onnx'))
    session = ort.InferenceSession(str(tmp_path / 'cdist.onnx'))
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, (a.numpy(), b.numpy()))))
    for g, r in zip(got, L1()(a, b)):
        torch.testing.assert_close(torch.from_numpy(g), r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_gelu_translation_matches_torch_and_fuses(tmp_path, approximate):
    """The exact GELU comes out of onnxruntime's graph optimizations as one Gelu kernel."""
    import onnxruntime as ort

    class Act(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x, approximate=approximate)

    x = torch.randn(3, 40) * 3
    program = torch.onnx.export(Act().eval(), (x, ), dynamo=True, verbose=False,
                                custom_translation_table=E.translation_table())
    program.save(str(tmp_path / 'gelu.onnx'))
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / 'gelu_ort.onnx')
    session = ort.InferenceSession(str(tmp_path / 'gelu.onnx'), opts)
    (got, ) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), Act()(x), rtol=1e-5, atol=1e-6)
    if approximate == 'none':
        import onnx
        ops = {n.op_type for n in onnx.load(str(tmp_path / 'gelu_ort.onnx')).graph.node}
        assert 'Gelu' in ops and 'Erf' not in ops, ops


def test_the_three_kinds_of_model_are_wrapped():
    import mmeffattn  # noqa: F401
    cls, _ = T.load_model(osp.join(ROOT, SMALL['weightformer'][0]))
    assert E.ExportWrapper(cls).what == 'logits'
    assert E.ExportWrapper(cls, 'backbone').what == 'backbone'
    with pytest.raises(ValueError, match='part must be one of'):
        E.ExportWrapper(cls, 'head')


def test_command_line_exports_a_classifier_and_checks_it(tmp_path, capsys):
    config, arch = SMALL['weightformer']
    small = tmp_path / 'small.py'  # the ImageNet classifier, narrowed
    small.write_text(f'_base_ = {osp.join(ROOT, config)!r}\n'
                     f'model = dict(backbone=dict(arch=dict(_delete_=True, **{arch["arch"]!r})),'
                     f' head=dict(in_channels=64))\n')
    result = T.main([str(small), '--out', str(tmp_path / 'wf.onnx'), '--shape', '64', '64'])
    out = capsys.readouterr().out
    assert result['ok'] and result['what'] == 'logits'
    assert result['max_rel_err'] <= 1e-4 and 'max relative error' in out
    import onnx
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / 'wf.onnx')).metadata_props}
    assert meta['exported'] == 'logits' and len(meta['mean'].split(',')) == 3


def test_bad_shape_is_named():
    with pytest.raises(SystemExit):
        T.parse_args(['cfg.py', '--out', 'x.onnx', '--shape', '16', '64'])


def test_a_detector_pyramid_exports_dynamic(tmp_path, capsys):
    """WeightFormer's ViT pyramid (its half-size level once a ceil-mode pool that torch.export
    could not keep symbolic) under RetinaNet's FPN, whose two extra levels (strides 64, 128) set
    the smallest dynamic side to 256; a smaller export size is refused by name."""
    small = tmp_path / 'det.py'
    small.write_text(
        f"_base_ = {osp.join(ROOT, 'configs/weightformer/retinanet_weightformer-t_fpn_1x_coco.py')!r}\n"
        "model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=64, depth=2),\n"
        "                           out_indices=-1),\n"
        "             neck=dict(in_channels=[64, 64, 64, 64], out_channels=16),\n"
        "             bbox_head=dict(in_channels=16, feat_channels=16))\n")
    with pytest.raises(SystemExit, match=r'at least 256 \(twice its coarsest stride\)'):
        T.main([str(small), '--out', str(tmp_path / 'x.onnx'), '--shape', '128', '160',
                '--dynamic'])
    result = T.main([str(small), '--out', str(tmp_path / 'det.onnx'), '--shape', '256', '288',
                     '--dynamic'])
    assert result['ok'] and result['what'] == 'backbone+neck', capsys.readouterr().out
    assert all(isinstance(d, str) for d in result['dims'][2:])  # symbolic height and width
    assert [r['size'] for r in result['records']][1:] == [(320, 256), (273, 297)]


def test_export_works_from_the_library_alone(tmp_path, monkeypatch):
    """A small WeightFormer exported and checked with the module reloaded while any import from
    tools/ fails."""
    import importlib
    for name in [n for n in sys.modules if n == 'tools' or n.startswith('tools.')]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, 'tools', None)  # `import tools...` raises
    lib = importlib.reload(E)
    wrapper = lib.ExportWrapper(small_backbone('weightformer')).eval()
    out = lib.export_onnx(wrapper, (64, 64), str(tmp_path / 'wf.onnx'), metadata=dict(a='b'))
    assert lib.input_dims(out) == [1, 3, 64, 64]
    (rec, ) = lib.check_parity(out, wrapper, [(64, 64)])
    assert rec['rel_err'] <= 1e-4 and rec['shapes'] == [(1, 64)], rec  # pooled
