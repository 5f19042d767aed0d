"""The models the benchmarks compare, ours and the installed OpenMMLab packages' peers: each a
backbone and, where the papers publish one, the ImageNet classifier whose FLOPs they report."""
import importlib
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn

__all__ = ['ZooModel', 'MODEL_ZOO', 'OURS', 'PEERS', 'ATTENTION_ZOO', 'ZOO', 'get_model',
           'unavailable_reason', 'build_backbone', 'build_classifier', 'select_models',
           'resolve_config', 'package_configs', 'build_from_config']


@dataclass(frozen=True)
class ZooModel:
    """One benchmarked model.

    Attributes:
        name: display name (``'SEMA-T'``).
        scope: the package whose registry builds it (``'mmeffattn'``, ``'mmpretrain'``, ...).
        backbone: registry config of the backbone (task-neutral outputs).
        classifier: an ImageNet classifier config, ``'<package>::<path under its configs>'``.
        published_gflops: the paper's GFLOPs (MACs) of that classifier at 224x224.
        attention: the token mixer, for reports (``'window softmax'``, ...).
        ours: one of this project's models.
        attrs: attributes set on the built backbone (VECA's ``num_cores``).
    """
    name: str
    scope: str
    backbone: dict
    classifier: Optional[str] = None
    published_gflops: Optional[float] = None
    attention: str = ''
    ours: bool = False
    attrs: Tuple[Tuple[str, object], ...] = field(default_factory=tuple)


_HIER = (0, 1, 2, 3)


def _veca(cores: int) -> ZooModel:
    return ZooModel(f'VECA-S-C{cores}', 'mmeffattn',
                    dict(type='VECA', arch='small', num_cores=cores, out_type='featmap'),
                    classifier='mmeffattn::veca/veca-s_8xb128_in1k.py',
                    attention='core-periphery', ours=True, attrs=(('num_cores', cores), ))


MODEL_ZOO: Dict[str, ZooModel] = {m.name: m for m in [
    # ours
    ZooModel('SEMA-T', 'mmeffattn', dict(type='SEMA', arch='tiny', out_indices=_HIER),
             classifier='mmeffattn::sema/sema-t_8xb128_in1k.py', attention='SEMA', ours=True),
    ZooModel('MILA-T', 'mmeffattn', dict(type='MILA', arch='tiny', out_indices=_HIER),
             classifier='mmeffattn::mila/mila-t_8xb128_in1k.py', published_gflops=4.2,
             attention='linear', ours=True),
    ZooModel('LaplacianFormer-T', 'mmeffattn',
             dict(type='LaplacianFormer', arch='tiny', out_indices=_HIER),
             classifier='mmeffattn::laplacianformer/laplacianformer-t_8xb128_in1k.py',
             published_gflops=2.1, attention='Laplacian-Nystrom', ours=True),
    ZooModel('LaplacianFormer-S', 'mmeffattn',
             dict(type='LaplacianFormer', arch='small', out_indices=_HIER),
             classifier='mmeffattn::laplacianformer/laplacianformer-s_8xb128_in1k.py',
             published_gflops=4.8, attention='Laplacian-Nystrom', ours=True),
    ZooModel('WeightFormer-T', 'mmeffattn',
             dict(type='WeightFormer', arch='tiny', out_type='featmap', out_indices=(-1, )),
             classifier='mmeffattn::weightformer/weightformer-t_8xb256_in1k.py',
             attention='dynamic weight', ours=True),
    ZooModel('WeightFormer-S', 'mmeffattn',
             dict(type='WeightFormer', arch='small', out_type='featmap', out_indices=(-1, )),
             classifier='mmeffattn::weightformer/weightformer-s_8xb256_in1k.py',
             attention='dynamic weight', ours=True),
    _veca(8), _veca(16), _veca(64),
    # peers, from the registries of the installed OpenMMLab packages
    ZooModel('Swin-T', 'mmpretrain', dict(type='SwinTransformer', arch='tiny', out_indices=_HIER,
                                         pad_small_map=True),
             classifier='mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py',
             published_gflops=4.5, attention='window softmax'),
    ZooModel('ConvNeXt-T', 'mmpretrain',
             dict(type='ConvNeXt', arch='tiny', out_indices=_HIER, gap_before_final_norm=False),
             classifier='mmpretrain::convnext/convnext-tiny_32xb128_in1k.py',
             published_gflops=4.5, attention='convolution'),
    ZooModel('PVTv2-b1', 'mmdet', dict(type='PyramidVisionTransformerV2', embed_dims=64,
                                       num_layers=[2, 2, 2, 2], out_indices=_HIER),
             attention='spatial-reduction softmax'),
    ZooModel('PVTv2-b2', 'mmdet', dict(type='PyramidVisionTransformerV2', embed_dims=64,
                                       num_layers=[3, 4, 6, 3], out_indices=_HIER),
             attention='spatial-reduction softmax'),
    ZooModel('DeiT-T', 'mmpretrain',
             dict(type='VisionTransformer', arch='deit-tiny', out_type='featmap'),
             classifier='mmpretrain::deit/deit-tiny_4xb256_in1k.py', published_gflops=1.3,
             attention='global softmax'),
    ZooModel('DeiT-S', 'mmpretrain',
             dict(type='VisionTransformer', arch='deit-small', out_type='featmap'),
             classifier='mmpretrain::deit/deit-small_4xb256_in1k.py', published_gflops=4.6,
             attention='global softmax'),
    ZooModel('ResNet-50', 'mmpretrain', dict(type='ResNet', depth=50, out_indices=_HIER),
             classifier='mmpretrain::resnet/resnet50_8xb32_in1k.py', published_gflops=4.1,
             attention='convolution'),
]}
OURS: List[str] = [n for n, m in MODEL_ZOO.items() if m.ours]
PEERS: List[str] = [n for n, m in MODEL_ZOO.items() if not m.ours]

#: the attention zoo: SEMA-T with each token mixer (configs/zoo), the group ``'zoo'`` (not in 'all')
ZOO_ATTN_TYPES = ('sema', 'linear', 'window', 'softmax', 'laplacian', 'core_periphery', 'dynamic')
ATTENTION_ZOO: Dict[str, ZooModel] = {
    f'Zoo-{t}': ZooModel(f'Zoo-{t}', 'mmeffattn',
                         dict(type='SEMA', arch='tiny', attn_type=t, out_indices=_HIER),
                         classifier=f'mmeffattn::zoo/zoo-{t.replace("_", "-")}-t_8xb128_in1k.py',
                         attention=t, ours=True)
    for t in ZOO_ATTN_TYPES}
ZOO: List[str] = list(ATTENTION_ZOO)


def get_model(name: str) -> ZooModel:
    """The entry ``name`` of :data:`MODEL_ZOO` or :data:`ATTENTION_ZOO` (KeyError if none)."""
    return MODEL_ZOO[name] if name in MODEL_ZOO else ATTENTION_ZOO[name]


def _registry(scope: str):
    """The MODELS registry of ``scope``, with its models imported (registered)."""
    if scope == 'mmeffattn':
        import mmeffattn  # noqa: F401  (registers our models)
    else:
        importlib.import_module(f'{scope}.models')
    return importlib.import_module(f'{scope}.registry').MODELS


def unavailable_reason(name: str) -> Optional[str]:
    """Why ``name`` cannot be built here (None if it can)."""
    if name not in MODEL_ZOO and name not in ATTENTION_ZOO:
        return f'unknown model {name!r}; choose from {", ".join([*MODEL_ZOO, *ZOO])}'
    model = get_model(name)
    try:
        registry = _registry(model.scope)
    except Exception as e:
        return f'{model.scope} is not importable ({type(e).__name__}: {e})'
    if registry.get(model.backbone['type']) is None:
        return (f'not available: {model.scope} has no registered {model.backbone["type"]!r} '
                f'in this version')
    return None


def _build(scope: str, cfg: dict) -> nn.Module:
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(scope):
        return _registry(scope).build(cfg)


def build_backbone(name: str) -> nn.Module:
    """The backbone of ``name`` in eval mode, randomly initialised (costs do not depend on the
    weights). Raises ``RuntimeError`` with the reason if it is not available."""
    reason = unavailable_reason(name)
    if reason:
        raise RuntimeError(f'{name}: {reason}')
    model = get_model(name)
    backbone = _build(model.scope, dict(model.backbone))
    for attr, value in model.attrs:
        setattr(backbone, attr, value)
    backbone.eval()  # (some OpenMMLab backbones' train() returns None: no chaining)
    return backbone


def build_classifier(name: str) -> nn.Module:
    """The ImageNet classifier of ``name`` (from its config file), in eval mode."""
    from mmengine.config import Config
    model = get_model(name)
    if model.classifier is None:
        raise RuntimeError(f'{name}: no ImageNet classifier config is listed')
    reason = unavailable_reason(name)
    if reason:
        raise RuntimeError(f'{name}: {reason}')
    cfg = Config.fromfile(resolve_config(model.classifier))
    cfg.model.pop('data_preprocessor', None)
    cfg.model.pop('train_cfg', None)  # mixup/cutmix batch augments: training only
    scope = cfg.get('default_scope') or model.scope
    classifier = _build(scope if scope != 'mmeffattn' else 'mmpretrain', cfg.model)
    for attr, value in model.attrs:
        setattr(classifier.backbone, attr, value)
    classifier.eval()
    return classifier


def build_from_config(config: str, cfg_options: Optional[dict] = None) -> Tuple[nn.Module, Any]:
    """``(model, cfg)``: the model of ``config`` (a path or ``pkg::path``) in eval mode with
    random weights, its data preprocessor inside it as the Runner puts it."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope
    _registry('mmeffattn')
    cfg = Config.fromfile(resolve_config(config))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    model_cfg = cfg.model.copy()
    if model_cfg.get('pretrained', 1) is None:
        model_cfg.pop('pretrained')
    if cfg.get('data_preprocessor') and not model_cfg.get('data_preprocessor'):
        model_cfg['data_preprocessor'] = cfg.data_preprocessor  # (mmpretrain keeps it outside)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        return MODELS.build(model_cfg).eval(), cfg


def package_configs() -> str:
    """The configs that ship with mmeffattn: the installed package's ``.mim/configs``, or
    ``configs/`` beside the package in a source checkout that was never installed."""
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    mim = osp.join(package, '.mim', 'configs')
    return mim if osp.isdir(mim) else osp.join(osp.dirname(package), 'configs')


def resolve_config(path: str) -> str:
    """A config file path from an existing path, ``'pkg::rel/path.py'`` (an installed package's
    ``.mim/configs``) or ``configs/...`` (ours, found in the package too)."""
    if osp.exists(path):
        return path
    if '::' in path:
        package, rel = path.split('::', 1)
        if package == 'mmeffattn':
            return osp.join(package_configs(), rel)
        from mmengine.utils import get_installed_path
        return osp.join(get_installed_path(package), '.mim', 'configs', rel)
    rel = path.replace(osp.sep, '/')
    return osp.join(package_configs(), rel[8:]) if rel.startswith('configs/') else path


def select_models(names: Optional[List[str]]) -> List[str]:
    """Expand ``'ours'``/``'peers'``/``'all'``/``'zoo'`` and check the names (ValueError names
    the bad one and the choices)."""
    if not names:
        return list(MODEL_ZOO)
    out: List[str] = []
    for name in names:
        group = {'all': list(MODEL_ZOO), 'ours': OURS, 'peers': PEERS,
                 'zoo': ZOO}.get(name.lower())
        if group is not None:
            out += group
        elif name in MODEL_ZOO or name in ATTENTION_ZOO:
            out.append(name)
        else:
            raise ValueError(f'unknown model {name!r}; choose from '
                             f'{", ".join([*MODEL_ZOO, *ZOO])} or the groups \'ours\', '
                             f"'peers', 'all', 'zoo'")
    return list(dict.fromkeys(out))
