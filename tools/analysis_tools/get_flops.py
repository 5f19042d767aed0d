#!/usr/bin/env python
"""Count parameters and FLOPs of a config's model (classifier: whole model; otherwise backbone).

    python tools/analysis_tools/get_flops.py configs/sema/sema-t_8xb128_in1k.py --shape 224 224
    python tools/analysis_tools/get_flops.py mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py
    python tools/analysis_tools/get_flops.py --zoo   # the benchmark models' classifiers, as a
                                                     # Markdown table beside published figures

FLOPs are counted as multiply-accumulates, the convention of the papers and of mmengine's
analyzer. The counting lives in :mod:`mmeffattn.analysis.flops`: it adds
``scaled_dot_product_attention`` (which mmengine skips) and counts mmeffattn's ops analytically.
"""
import argparse
import os.path as osp
import sys
from typing import Optional, Sequence

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402


def count(config: str, shape: Sequence[int], cfg_options: Optional[dict] = None) -> dict:
    """``dict(what, params, flops, shape, ops)`` for the model of ``config`` at ``shape``."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope

    import mmeffattn  # noqa: F401
    from mmeffattn.analysis.flops import CountedForward, count_flops, count_parameters
    from mmeffattn.analysis.model_zoo import resolve_config
    cfg = Config.fromfile(resolve_config(config))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = CountedForward(MODELS.build(cfg.model)).eval()
    result = count_flops(model, (torch.randn(1, 3, *shape), ))
    return dict(what=model.what, params=count_parameters(model.counted), flops=result.total,
                shape=tuple(shape), ops=result.ops)


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
    p.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    if args.zoo:
        print(zoo_table(args.shape), end='')
        return
    if not args.config:
        p.error('give a config, or --zoo')
    r = count(args.config, args.shape, args.cfg_options)
    print(f'{args.config}: {r["what"]} at {r["shape"][0]}x{r["shape"][1]}: '
          f'{r["params"] / 1e6:.2f} M parameters, {r["flops"] / 1e9:.2f} GFLOPs (MACs)')
    for op, macs in sorted(r['ops'].items()):
        print(f'  of which {op}: {macs / 1e9:.3f} GMACs (analytic)')


if __name__ == '__main__':
    main()
