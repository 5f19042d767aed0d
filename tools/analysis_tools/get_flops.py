#!/usr/bin/env python
"""Count parameters and FLOPs of a config's model (classifier: whole model; otherwise backbone).

    python tools/analysis_tools/get_flops.py configs/sema/sema-t_8xb128_in1k.py --shape 224 224

FLOPs are counted as multiply-accumulates, the convention of the papers and of mmengine's
analyzer. ``scaled_dot_product_attention`` (what the attention references call) is counted too:
mmengine's analyzer skips it.
"""
import argparse
import os
import os.path as osp
import sys
from typing import Any, List

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """MACs of softmax(q k^T) v for q [..., L, D], k [..., S, D], v [..., S, Dv]."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = 1
    for n in q[:-2]:
        batch *= n
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


class _Forward(nn.Module):
    """What is counted: a classifier's logits, or the backbone's features."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.classifier = hasattr(model, 'head') and hasattr(model, 'neck') and \
            type(model).__name__ == 'ImageClassifier'

    def forward(self, x: torch.Tensor):
        if self.classifier:
            return self.model(x, mode='tensor')
        return self.model.backbone(x)


def count(config: str, shape, cfg_options=None) -> dict:
    from mmengine.analysis import FlopAnalyzer
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope

    import mmeffattn  # noqa: F401
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = _Forward(MODELS.build(cfg.model)).eval()
    counted = model.model if model.classifier else model.model.backbone
    x = torch.randn(1, 3, *shape)
    # The analyzer traces the model: count the reference ops (a Triton kernel is opaque to it).
    saved = os.environ.get('MMEFFATTN_OPS_BACKEND')
    os.environ['MMEFFATTN_OPS_BACKEND'] = 'reference'
    try:
        with torch.no_grad():
            analyzer = FlopAnalyzer(model, (x, ))
            analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_flop_jit)
            analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            flops = analyzer.total()
    finally:
        if saved is None:
            os.environ.pop('MMEFFATTN_OPS_BACKEND')
        else:
            os.environ['MMEFFATTN_OPS_BACKEND'] = saved
    return dict(what='classifier' if model.classifier else 'backbone',
                params=sum(p.numel() for p in counted.parameters()), flops=flops,
                shape=tuple(shape))


def main(argv=None) -> None:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config')
    p.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    r = count(args.config, args.shape, args.cfg_options)
    print(f'{args.config}: {r["what"]} at {r["shape"][0]}x{r["shape"][1]}: '
          f'{r["params"] / 1e6:.2f} M parameters, {r["flops"] / 1e9:.2f} GFLOPs (MACs)')


if __name__ == '__main__':
    main()
