#!/usr/bin/env python
"""Count parameters and FLOPs of a config's model: a classifier whole; a detector or segmentor
whole (backbone, neck, heads) next to its backbone alone.

    python tools/analysis_tools/get_flops.py configs/sema/sema-t_8xb128_in1k.py --shape 224 224
    python tools/analysis_tools/get_flops.py configs/mila/mask-rcnn_mila-t_fpn_1x_coco.py
    python tools/analysis_tools/get_flops.py mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py
    python tools/analysis_tools/get_flops.py mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py
    python tools/analysis_tools/get_flops.py --zoo   # the benchmark models' classifiers, as a
                                                     # Markdown table beside published figures

Without ``--shape`` the size is the papers' (224x224 classifier, 800x1280 detector, 512x2048
segmentor). Whole detectors and segmentors are counted as mmdet's and mmseg's ``get_flops.py``
count them (``model._forward`` in tensor mode). FLOPs are multiply-accumulates, counted by
:mod:`mmeffattn.analysis.flops`.
"""
import argparse
from typing import Optional, Sequence

import torch

from mmeffattn.analysis.flops import model_kind
from mmeffattn.analysis.model_zoo import build_from_config


#: the papers' input sizes (H, W) per kind of model
PAPER_SHAPES = {'classifier': (224, 224), 'detector': (800, 1280), 'segmentor': (512, 2048)}


class WholeModel(torch.nn.Module):
    """A detector's or segmentor's tensor-mode forward (``model._forward``) on one image of
    ``shape`` with made-up meta data."""

    def __init__(self, model: torch.nn.Module, shape: Sequence[int]) -> None:
        super().__init__()
        self.model, self.kind = model, model_kind(model)
        self.samples = None
        if self.kind == 'detector':
            from mmdet.structures import DetDataSample
            hw = tuple(int(s) for s in shape)
            self.samples = [DetDataSample(metainfo=dict(
                img_shape=hw, ori_shape=hw, pad_shape=hw, batch_input_shape=hw,
                scale_factor=(1., 1.)))]

    def forward(self, x: torch.Tensor):
        if self.kind == 'detector':
            return self.model._forward(x, self.samples)
        return self.model._forward(x)  # segmentor: the decode head's logits


def build(config: str, cfg_options: Optional[dict] = None) -> torch.nn.Module:
    """The model of ``config`` (a path or ``pkg::path``), in eval mode with random weights."""
    return build_from_config(config, cfg_options)[0]


def count(config: str, shape: Optional[Sequence[int]] = None,
          cfg_options: Optional[dict] = None, whole: bool = True) -> dict:
    """``dict(what, params, flops, shape, ops)`` of a classifier, or a detector's or segmentor's
    backbone (with ``whole``, also ``model=dict(...)`` for the whole model), at ``shape``
    (default: the paper's size)."""
    from mmeffattn.analysis.flops import CountedForward, count_flops, count_parameters
    built = build(config, cfg_options)
    kind = model_kind(built)
    shape = tuple(shape) if shape else PAPER_SHAPES.get(kind, (224, 224))
    model = CountedForward(built).eval()
    x = torch.randn(1, 3, *shape)
    result = count_flops(model, (x, ))
    out = dict(what=model.what, kind=kind, params=count_parameters(model.counted),
               flops=result.total, shape=shape, ops=result.ops)
    if whole and kind in ('detector', 'segmentor'):
        full = count_flops(WholeModel(built, shape), (x, ))
        out['model'] = dict(what=f'whole {kind}', params=count_parameters(built),
                            flops=full.total, ops=full.ops)
    return out


def zoo_table(shape: Sequence[int] = (224, 224)) -> str:
    """Markdown: each benchmark model's ImageNet classifier at ``shape``, with the published
    figure where the model zoo lists one (and the deviation from it)."""
    from mmeffattn.analysis.flops import CountedForward, count_flops, count_parameters
    from mmeffattn.analysis.model_zoo import MODEL_ZOO, build_classifier, unavailable_reason
    lines = [f'| model | classifier config | params (M) | GFLOPs (MACs) at {shape[0]}x{shape[1]} '
             f'| published | deviation |', '|---|---|---:|---:|---:|---:|']
    for name, entry in MODEL_ZOO.items():
        if entry.classifier is None:
            continue
        reason = unavailable_reason(name)
        if reason:
            lines.append(f'| {name} | `{entry.classifier}` | {reason} | | | |')
            continue
        model = CountedForward(build_classifier(name))
        gmacs = count_flops(model, (torch.randn(1, 3, *shape), )).total / 1e9
        pub = entry.published_gflops
        dev = f'{100 * (gmacs / pub - 1):+.1f}%' if pub else '-'
        lines.append(f'| {name} | `{entry.classifier}` | '
                     f'{count_parameters(model.counted) / 1e6:.2f} | {gmacs:.2f} | '
                     f'{pub if pub else "-"} | {dev} |')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config', nargs='?', help='a config file, or pkg::path inside a package')
    p.add_argument('--zoo', action='store_true',
                   help="count every benchmark model's classifier instead of one config")
    p.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                   help="input size (default: the paper's: 224x224 classifier, 800x1280 "
                   'detector, 512x2048 segmentor)')
    p.add_argument('--backbone-only', action='store_true',
                   help='for a detector or segmentor, count only the backbone')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    if args.zoo:
        print(zoo_table(args.shape or (224, 224)), end='')
        return
    if not args.config:
        p.error('give a config, or --zoo')
    r = count(args.config, args.shape, args.cfg_options, whole=not args.backbone_only)
    rows = ([r['model']] if 'model' in r else []) + [r]
    for row in rows:
        print(f'{args.config}: {row["what"]} at {r["shape"][0]}x{r["shape"][1]}: '
              f'{row["params"] / 1e6:.2f} M parameters, {row["flops"] / 1e9:.2f} GFLOPs (MACs)')
        for op, macs in sorted(row['ops'].items()):
            print(f'  of which {op}: {macs / 1e9:.3f} GMACs (analytic)')


if __name__ == '__main__':
    main()
