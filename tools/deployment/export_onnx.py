#!/usr/bin/env python
"""Export a config's model to ONNX and check it against PyTorch with onnxruntime.

    python tools/deployment/export_onnx.py configs/sema/sema-t_8xb128_in1k.py CKPT \
        --out sema-t.onnx --shape 224 224 --dynamic
    python tools/deployment/export_onnx.py configs/mila/mask-rcnn_mila-t_fpn_1x_coco.py \
        --out mila-t_fpn.onnx --shape 800 1216 --dynamic

A command line over :mod:`mmeffattn.deploy.onnx`. ``--dynamic`` makes height and width
symbolic. onnxruntime then runs the file at the export size (and two more for a dynamic file);
the tool exits non-zero when the largest relative error exceeds ``--tolerance``.
"""
import argparse
import os.path as osp
import sys
import time
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

from mmeffattn.deploy.onnx import (DEFAULT_OPSET, PARTS, ExportWrapper, check_parity,
                                   check_sizes, dynamic_side_error, export_onnx, input_dims,
                                   preprocess_meta, require_onnx)

DEFAULT_TOLERANCE = 1e-4
#: smallest image side an export accepts (every backbone of ours has a stride of 32)
MIN_SIDE = 32


def load_model(config: str, checkpoint: Optional[str] = None,
               cfg_options: Optional[dict] = None) -> Tuple[nn.Module, Any]:
    """``(model, cfg)`` of ``config`` (a path or ``pkg::path``) in eval mode, with the weights of
    ``checkpoint`` if given (random weights otherwise)."""
    from mmeffattn.analysis.model_zoo import build_from_config
    model, cfg = build_from_config(config, cfg_options)
    if checkpoint:
        from mmengine.runner import load_checkpoint

        from mmeffattn.engine.runner_setup import prepare_runtime
        prepare_runtime()  # our Runner's checkpoints load under torch's weights-only loader
        load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
    return model.eval(), cfg


def parse_args(argv=None) -> argparse.Namespace:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config', help='a config file, or pkg::path inside a package')
    p.add_argument('checkpoint', nargs='?', help='weights (random weights if left out)')
    p.add_argument('--out', required=True, help='the .onnx file to write')
    p.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'),
                   help='input size of the export (and of the first parity check)')
    p.add_argument('--dynamic', action='store_true',
                   help='symbolic height and width (checked at two more sizes)')
    p.add_argument('--opset', type=int, default=DEFAULT_OPSET)
    p.add_argument('--part', choices=PARTS, default='auto',
                   help="'backbone': only the backbone's outputs")
    p.add_argument('--tolerance', type=float, default=DEFAULT_TOLERANCE,
                   help='largest relative error accepted (exit status 1 above it)')
    p.add_argument('--no-check', action='store_true', help='skip the onnxruntime check')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    if min(args.shape) < MIN_SIDE:
        p.error(f'--shape {args.shape[0]} {args.shape[1]}: each side must be at least '
                f'{MIN_SIDE} (the backbones downsample by 32)')
    return args


def main(argv=None) -> Dict[str, Any]:
    """Export, check, print; returns ``dict(out, what, dims, records, max_rel_err, ok)``."""
    args = parse_args(argv)
    require_onnx()
    torch.manual_seed(0)
    model, _ = load_model(args.config, args.checkpoint, args.cfg_options)
    wrapper = ExportWrapper(model, args.part).eval()
    meta = dict(preprocess_meta(model), exported=wrapper.what, config=osp.basename(args.config))
    t0 = time.time()
    if args.dynamic and min(args.shape) < wrapper.min_dynamic_side:  # one line, no traceback
        raise SystemExit(f'export_onnx.py: {dynamic_side_error(wrapper, args.shape)}')
    export_onnx(wrapper, args.shape, args.out, args.dynamic, args.opset, meta)
    dims = input_dims(args.out)
    print(f'exported {wrapper.what} of {args.config} to {args.out} (opset {args.opset}, input '
          f'{dims}, {time.time() - t0:.0f} s)', flush=True)
    result: Dict[str, Any] = dict(out=args.out, what=wrapper.what, dims=dims, records=[],
                                  max_rel_err=None, ok=True)
    if args.no_check:
        return result
    records = check_parity(args.out, wrapper,
                           check_sizes(args.shape, args.dynamic, wrapper.min_dynamic_side))
    for r in records:
        print(f'  {r["size"][0]}x{r["size"][1]}: max relative error {r["rel_err"]:.2e} '
              f'(onnxruntime {r["ort_ms"]:.0f} ms, PyTorch {r["torch_ms"]:.0f} ms), outputs '
              f'{r["shapes"]}')
    worst = max(r['rel_err'] for r in records)
    result.update(records=records, max_rel_err=worst, ok=worst <= args.tolerance)
    print(f'max relative error {worst:.2e} ({"within" if result["ok"] else "ABOVE"} the '
          f'tolerance {args.tolerance:g})')
    return result


if __name__ == '__main__':
    sys.exit(0 if main()['ok'] else 1)
