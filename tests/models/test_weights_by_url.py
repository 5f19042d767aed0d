"""Official weights in one line: ``init_cfg=dict(type='Pretrained', checkpoint=URL)``.

A local HTTP server serves official-layout files (mini archs, written by official_layouts.py)
at URLs shaped like the authors' own: MLLA's TsinghuaCloud ``/f/<id>/?dl=1`` (a query string,
no file name in the path) and WeightFormer's Hugging Face ``/<org>/<repo>/resolve/main/
model.safetensors`` (every file has the same name). Downloads go to a temporary TORCH_HOME.
"""
import os
import sys
import types

import pytest
import torch

from mmeffattn.engine import CheckpointError, checkpoint_cache_path
from mmeffattn.models.backbones.sema import MILA
from mmeffattn.models.backbones.weightformer import WeightFormer
from official_layouts import server  # noqa: F401  (a fixture)
from official_layouts import CASES, seeded, to_official_mlla, to_official_weightformer

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')


def _torch_bytes(obj, tmp_path) -> bytes:
    path = tmp_path / 'tmp.pth'
    torch.save(obj, str(path))
    return path.read_bytes()


def _training_checkpoint(model_state: dict, tmp_path) -> bytes:
    """What the official (Swin-derived) training scripts save: the weights under ``model`` beside
    the optimizer state, the epoch and the yacs ``CfgNode`` config. yacs is not installed here: a
    stand-in module gives the class its pickled name while saving, and is gone for the load."""
    yacs, yacs_config = types.ModuleType('yacs'), types.ModuleType('yacs.config')
    CfgNode = type('CfgNode', (dict, ), {'__module__': 'yacs.config'})
    yacs_config.CfgNode, yacs.config = CfgNode, yacs_config
    config = CfgNode(MODEL=CfgNode(TYPE='mlla', DROP_PATH_RATE=0.2), TAG='default')
    sys.modules.update({'yacs': yacs, 'yacs.config': yacs_config})
    try:
        return _torch_bytes({'model': model_state, 'optimizer': {}, 'epoch': 299,
                             'max_accuracy': 83.5, 'config': config}, tmp_path)
    finally:
        del sys.modules['yacs'], sys.modules['yacs.config']


def _safetensors_bytes(state_dict, tmp_path) -> bytes:
    from safetensors.torch import save_file
    path = tmp_path / 'tmp.safetensors'
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    return path.read_bytes()


def _same_outputs(src, dst, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for a, b in zip(torch.utils._pytree.tree_leaves(src.eval()(x)),
                        torch.utils._pytree.tree_leaves(dst.eval()(x))):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_mlla_url_with_a_query_string_loads_and_is_cached(server, tmp_path):
    _, kwargs, _, shape = CASES['MLLA']
    src = seeded(MILA, **kwargs)
    route = '/f/7a19712877cb4242889c/?dl=1'
    server.files[route] = _torch_bytes(to_official_mlla(src.state_dict()), tmp_path)
    url = server.base + route
    build = {k: v for k, v in kwargs.items() if k != 'keep'}
    for _ in range(2):  # the second build reads the cached download
        dst = MILA(**build, init_cfg=dict(type='Pretrained', checkpoint=url))
        dst.init_weights()
        _same_outputs(src, dst, shape)
    assert server.requests == [route]
    cached = checkpoint_cache_path(url)
    assert os.path.isfile(cached) and cached.endswith('-7a19712877cb4242889c')
    assert os.path.dirname(cached).startswith(str(tmp_path / 'torch_home'))


def test_official_training_checkpoint_with_its_yacs_config_loads_by_url(server, tmp_path):
    _, kwargs, _, shape = CASES['MLLA']
    src = seeded(MILA, **kwargs)
    route = '/f/0e5d0b1409d540aaa80c/?dl=1'
    server.files[route] = _training_checkpoint(to_official_mlla(src.state_dict())['model'],
                                               tmp_path)
    build = {k: v for k, v in kwargs.items() if k != 'keep'}
    dst = MILA(**build, init_cfg=dict(type='Pretrained', checkpoint=server.base + route))
    dst.init_weights()
    _same_outputs(src, dst, shape)


def test_same_basename_from_two_repos_never_collide(server, tmp_path):
    """WeightFormer-T then -S, both ``model.safetensors`` (the Hugging Face layout: a flat state
    dict of the official model, classifier included)."""
    pytest.importorskip('safetensors')
    depth = WeightFormer.mini_arch['depth']
    archs = {'a': WeightFormer.mini_arch, 'b': dict(embed_dims=48, depth=depth)}
    models, urls = {}, {}
    for repo, arch in archs.items():
        models[repo] = seeded(WeightFormer, arch=arch, out_type='featmap', out_indices=(-1, ))
        official = to_official_weightformer(models[repo].state_dict(), depth)['model']
        route = f'/RuizeHe/weightformer-{repo}/resolve/main/model.safetensors'
        server.files[route] = _safetensors_bytes(official, tmp_path)
        urls[repo] = server.base + route
    for repo, arch in archs.items():
        dst = WeightFormer(arch=arch, out_type='featmap', out_indices=(-1, ),
                           init_cfg=dict(type='Pretrained', checkpoint=urls[repo]))
        dst.init_weights()
        _same_outputs(models[repo], dst, CASES['WeightFormer'][3])
    assert checkpoint_cache_path(urls['a']) != checkpoint_cache_path(urls['b'])
    assert len(server.requests) == 2


def test_safetensors_without_the_package_names_it(server, tmp_path, monkeypatch):
    pytest.importorskip('safetensors')
    model = seeded(WeightFormer, arch=WeightFormer.mini_arch, out_type='featmap',
                   out_indices=(-1, ))
    official = to_official_weightformer(model.state_dict(), WeightFormer.mini_arch['depth'])
    route = '/RuizeHe/weightformer-t/resolve/main/model.safetensors'
    server.files[route] = _safetensors_bytes(official['model'], tmp_path)
    for name in ('safetensors', 'safetensors.torch'):  # as if it were not installed
        monkeypatch.setitem(__import__('sys').modules, name, None)
    dst = WeightFormer(arch=WeightFormer.mini_arch, out_type='featmap', out_indices=(-1, ),
                       init_cfg=dict(type='Pretrained', checkpoint=server.base + route))
    with pytest.raises(CheckpointError, match=r'needs the safetensors package: pip install '
                                              r'safetensors'):
        dst.init_weights()


def test_a_failed_download_says_why_and_caches_nothing(server):
    dst = MILA(arch=MILA.mini_arch,
               init_cfg=dict(type='Pretrained', checkpoint=server.base + '/f/nothing/?dl=1'))
    with pytest.raises(CheckpointError, match=r'HTTP 404.*check the URL'):
        dst.init_weights()
    route = '/f/broken/?dl=1'
    server.files[route], server.cut = b'x' * 100000, {route}
    dst = MILA(arch=MILA.mini_arch,
               init_cfg=dict(type='Pretrained', checkpoint=server.base + route))
    with pytest.raises(CheckpointError, match=r'broke off after 50000 of 100000 bytes'):
        dst.init_weights()
    assert not os.listdir(os.path.dirname(checkpoint_cache_path(server.base + '/x')))
