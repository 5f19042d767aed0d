#!/usr/bin/env python
"""Profile one forward (or training step) of a benchmark model: time per op class and per module.

    python tools/analysis_tools/profile_model.py SEMA-T --size 1024 --dtype bf16
    python tools/analysis_tools/profile_model.py Swin-T --size 1024 --channels-last
    python tools/analysis_tools/profile_model.py MILA-T --size 512 --backward --json out.json

MODEL is a name of :mod:`mmeffattn.analysis.model_zoo` (as ``tools/benchmark.py`` takes),
built as a backbone with random weights in eval mode, batch 1. ``--dtype bf16`` runs under
autocast. The logic and the op classes: :mod:`mmeffattn.analysis.profiling`.
"""
import argparse
import json
import os

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('model', help='a model of mmeffattn.analysis.model_zoo (e.g. SEMA-T, Swin-T)')
    p.add_argument('--size', default='1024', help='input side, or HxW (default 1024)')
    p.add_argument('--dtype', choices=['fp32', 'bf16'], default='fp32',
                   help='bf16 runs under autocast')
    p.add_argument('--backward', action='store_true',
                   help='profile forward + backward of the outputs\' sum')
    p.add_argument('--compile', action='store_true',
                   help='profile torch.compile(model) (inductor); no module times')
    p.add_argument('--channels-last', action='store_true',
                   help='convert the model and the input to channels-last first')
    p.add_argument('--threads', type=int, default=None, help='torch intra-op threads')
    p.add_argument('--ops-backend', default='torch',
                   help='$MMEFFATTN_OPS_BACKEND for our ops (default torch, what a CPU runs)')
    p.add_argument('--top', type=int, default=15, help='ops and modules listed')
    p.add_argument('--json', help='also write the result to this JSON file')
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ['MMEFFATTN_OPS_BACKEND'] = args.ops_backend
    from mmeffattn.analysis.benchmarking import parse_size
    from mmeffattn.analysis.model_zoo import build_backbone
    from mmeffattn.analysis.profiling import format_profile, profile_model
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_backbone(args.model)
    x = torch.randn(1, 3, *parse_size(args.size))
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(model) if args.compile else None
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[args.dtype]
    result = profile_model(model, x, dtype, backward=args.backward, compiled=compiled,
                           top=args.top)
    result['settings'] = dict(model=args.model, size=list(x.shape[2:]), dtype=args.dtype,
                              backward=args.backward, compile=args.compile,
                              channels_last=args.channels_last, threads=torch.get_num_threads(),
                              ops_backend=args.ops_backend, torch=torch.__version__)
    print(f'{args.model} {args.size} {args.dtype}' + ' fwd+bwd' * args.backward
          + ' compiled' * args.compile + ' channels-last' * args.channels_last
          + f', {torch.get_num_threads()} threads')
    print(format_profile(result))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()
