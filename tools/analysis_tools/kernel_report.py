#!/usr/bin/env python
"""What the compiled Triton kernels look like, and how fast each op could be, without a GPU.

    python tools/analysis_tools/kernel_report.py                      # docs/perf/kernels.{md,json}
    python tools/analysis_tools/kernel_report.py --quick --out-dir /tmp/kr   # a few, sm_90 only

1. **Compiled code.** Every launch the launchers issue at each GPU check's shapes (the
   ``aot_case`` of each roofline, :mod:`mmeffattn.analysis.kernels`) is compiled ahead of time
   for sm_80 and sm_90 in a subprocess with Triton's interpreter off. Per kernel: registers,
   spills, shared memory (``cuobjdump -res-usage``) and SASS counts: instructions, tensor-core
   ops, shuffles (also inside loops), barriers, global loads/stores by width.
2. **Roofline.** Per op and dtype, the predicted time of one call at H100 and H200 peaks
   (``kernels.PEAKS``); ``tools/gpu_check.py`` measures the same calls on a GPU.

``--before FILE.json`` adds a before/after table against an earlier report (e.g. one made with
``--root`` at another checkout).
"""
import argparse
import json
import math
import os
import os.path as osp
import re
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmeffattn.analysis import kernels
from mmeffattn.analysis.report import md_table, write_outputs

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

GPUS = ('H100', 'H200')
DTYPES = ('bf16', 'fp32')


# -- SASS reading --
_INSTR = re.compile(r'^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);')
_BRA = re.compile(r'BRA\s+(?:`?\(?)?(0x[0-9a-f]+)')


def sass_stats(sass: str) -> Dict[str, Any]:
    """Opcode counts of one kernel's SASS (``cuobjdump -sass`` text of one function).

    A loop is the address range from a backward branch's target to the branch (a branch to
    itself, the trap at the end, is none); ``shfl_in_loops`` counts SHFL inside any loop."""
    instrs: List[Tuple[int, str, str]] = []
    for line in sass.splitlines():
        m = _INSTR.match(line)
        if m:
            instrs.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loops = []
    for addr, op, rest in instrs:
        if op == 'BRA':
            b = _BRA.search(op + rest)
            if b and int(b.group(1), 16) < addr:
                loops.append((int(b.group(1), 16), addr))

    def count(pred) -> int:
        return sum(1 for _, op, _ in instrs if pred(op))

    def in_loop(addr: int) -> bool:
        return any(lo <= addr <= hi for lo, hi in loops)

    def width(op: str) -> str:
        parts = op.split('.')[1:]
        for p in parts:
            if p in ('128', '64'):
                return p
            if p in ('U16', 'S16', 'U8', 'S8'):
                return '16' if '16' in p else '8'
        return '32'

    stats: Dict[str, Any] = dict(
        instructions=len(instrs),
        tensor_core=count(lambda o: o.startswith(('HMMA', 'HGMMA', 'IMMA'))),
        wgmma=count(lambda o: o.startswith('HGMMA')),
        shfl=count(lambda o: o.startswith('SHFL')),
        shfl_in_loops=sum(1 for a, o, _ in instrs if o.startswith('SHFL') and in_loop(a)),
        loops=len(loops),
        bar=count(lambda o: o.startswith('BAR')),
        lds=count(lambda o: o.startswith('LDS') or o.startswith('LDSM')),
        sts=count(lambda o: o.startswith('STS')),
        fp32=count(lambda o: o.split('.')[0] in ('FADD', 'FMUL', 'FFMA', 'FMNMX', 'MUFU',
                                                  'FSETP', 'FSEL')),
    )
    for kind in ('LDG', 'STG'):
        w: Dict[str, int] = {}
        for _, op, _ in instrs:
            if op.startswith(kind + '.'):
                w[width(op)] = w.get(width(op), 0) + 1
        stats[kind.lower()] = dict(sorted(w.items(), key=lambda kv: -int(kv[0])))
    return stats


# -- the compile worker (subprocess, interpreter off) --
def worker(cases: List[dict], archs: Sequence[int]) -> None:
    """Print one JSON line per distinct (launch, arch) of ``cases`` (each with ``op``), with
    the package found first on the path (:func:`compile_cases` puts the checkout there)."""
    assert not os.environ.get('TRITON_INTERPRET'), "run with Triton's interpreter off"
    seen = set()
    for case in cases:
        for launch in kernels.record(case):
            cfg = launch.config
            for arch in archs:
                _, signature, constexprs, attrs, _ = kernels.specialise(launch, arch)
                key = (cfg.kernel.__name__, repr((signature, constexprs, attrs)),
                       repr(cfg.launch_options), arch)
                if key in seen:
                    continue
                seen.add(key)
                r = kernels.compile_launch(launch, arch, sass=True)
                grid = [int(g) for g in launch.grid]
                print(json.dumps(dict(
                    op=case['op'], case=case, role=launch.role, kernel=cfg.kernel.__name__,
                    arch=arch, grid=grid, programs=math.prod(grid),
                    constexprs=dict(cfg.constexprs), num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages,
                    **{k: r[k] for k in ('regs', 'stack', 'local', 'shared')},
                    ptx_mma=r['ptx'].count('mma.sync') + r['ptx'].count('wgmma.mma_async'),
                    seconds=r['seconds'], **sass_stats(r['sass']))), flush=True)


def compile_cases(cases: List[dict], archs: Sequence[int], root: str = ROOT,
                  timeout: int = 3600) -> List[dict]:
    """Run :func:`worker` in a subprocess (Triton's interpreter off) with ``root``'s package
    first on the path; one dict per compiled (launch, arch)."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([root] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, osp.abspath(__file__), '--worker', json.dumps(cases),
                          '--archs', *map(str, archs)], capture_output=True, text=True,
                         env=env, cwd=root, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f'compilation failed:\n{res.stdout[-2000:]}\n{res.stderr[-6000:]}')
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{')]


# -- the report --
def plan(quick: bool, ops: Optional[Sequence[str]] = None) -> List[dict]:
    """The AOT cases to compile: each roofline's shape; ``quick`` keeps one case per op."""
    cases: List[dict] = []
    for r in kernels.ROOFLINES.values():
        if (ops and r.op not in ops) or (quick and any(c['op'] == r.op for c in cases)):
            continue
        cases.append(r.aot_case)
    return cases


def rooflines(ops: Optional[Sequence[str]] = None) -> List[dict]:
    """One row per (op, GPU check, dtype, pass): bytes, work and the predicted times."""
    rows = []
    for check, r in kernels.ROOFLINES.items():
        if ops and r.op not in ops:
            continue
        for dtype in DTYPES:
            costs = r.costs(dtype)
            for pas, cost in list(costs.items()) + [('fwd+bwd', kernels.total_cost(costs))]:
                rows.append(dict(
                    op=r.op, check=check, dtype=dtype, pass_=pas,
                    **{f: int(getattr(cost, f)) for f in kernels.Cost._fields},
                    predicted_us={g: round(kernels.predicted_seconds(cost, g, dtype) * 1e6,
                                           2) for g in GPUS}))
    return rows


def _fmt_bytes(n: int) -> str:
    return f'{n / 1e6:.2f} MB' if n >= 1e5 else f'{n / 1e3:.1f} kB'


def _widths(d: Dict[str, int]) -> str:
    return ' '.join(f'{k}:{v}' for k, v in d.items()) or '-'


def kernel_table(kernels: List[dict]) -> List[str]:
    rows = []
    for k in kernels:
        c = {a: b for a, b in k['constexprs'].items() if a != 'INPUT_PRECISION'}
        cfg = ' '.join(f'{a}={b}' for a, b in c.items()) + f" w{k['num_warps']}s{k['num_stages']}"
        rows.append([k['op'], k['role'], f"`{k['kernel']}`", k['arch'], cfg] + [
            k[f] for f in ('programs', 'regs', 'stack', 'shared', 'instructions', 'tensor_core')]
            + [f"{k['shfl']} ({k['shfl_in_loops']})", k['bar'], _widths(k['ldg']),
               _widths(k['stg'])])
    return md_table(['op', 'role', 'kernel', 'sm', 'config', 'programs', 'regs', 'stack',
                     'shared', 'instr', 'TC', 'SHFL (in loops)', 'BAR', 'LDG bits:count',
                     'STG bits:count'], rows)


def roofline_table(rows: List[dict]) -> List[str]:
    cells = []
    for r in rows:
        mem = r['bytes'] / kernels.PEAKS['H100']['hbm']
        bound = 'memory' if mem * 1e6 >= r['predicted_us']['H100'] - 1e-9 else 'compute'
        cells.append([r['op'], r['check'], r['dtype'], r['pass_'], _fmt_bytes(r['bytes']),
                      f"{r['fp32']:.3g}", f"{r['tc']:.3g}", r['launches'],
                      r['predicted_us']['H100'], r['predicted_us']['H200'], bound])
    return md_table(['op', 'GPU check', 'dtype', 'pass', 'bytes', 'fp32 inst', 'TC FLOP',
                     'launches', 'H100 µs', 'H200 µs', 'bound'], cells)


def before_after_table(before: dict, after: dict) -> List[str]:
    """Per op (sm_90, the first GPU-check shape): summed kernel figures and the roofline, before
    and after."""
    def per_op(report: dict) -> Dict[str, dict]:
        out: Dict[str, dict] = {}
        seen = set()
        for k in report['kernels']:  # the first sm_90 compile of each launch role
            if k['arch'] != 90 or (k['op'], k['role']) in seen:
                continue
            seen.add((k['op'], k['role']))
            o = out.setdefault(k['op'], dict(kernels=0, regs=0, instructions=0, shfl=0,
                                             shfl_in_loops=0, tc=0, ldg128=0, ldg_narrow=0,
                                             stack=0))
            o['kernels'] += 1
            o['regs'] = max(o['regs'], k['regs'])
            o['stack'] += k['stack']
            o['instructions'] += k['instructions']
            o['shfl'] += k['shfl']
            o['shfl_in_loops'] += k['shfl_in_loops']
            o['tc'] += k['tensor_core']
            o['ldg128'] += k['ldg'].get('128', 0)
            o['ldg_narrow'] += sum(v for w, v in k['ldg'].items() if w not in ('128', '64'))
        return out

    def roof(report: dict) -> Dict[str, dict]:
        out: Dict[str, dict] = {}
        for r in report.get('rooflines', []):  # reports that modelled two designs: the current
            if r['pass_'] == 'fwd+bwd' and r['dtype'] == 'bf16' and \
                    r.get('design', 'current') == 'current':
                out.setdefault(r['op'], r)
        return out

    b, a = per_op(before), per_op(after)
    rb, ra = roof(before), roof(after)
    def cell(x, y, fmt=str):
        x = '-' if x is None else fmt(x)
        y = '-' if y is None else fmt(y)
        return y if x == y else f'{x} → {y}'

    rows = []
    for op in sorted(set(a) | set(b)):
        kb, ka = b.get(op, {}), a.get(op, {})
        r_new = ra.get(op)
        r_old = rb.get(op, r_new)
        rows.append([
            op, cell(kb.get('kernels'), ka.get('kernels')),
            cell(kb.get('regs'), ka.get('regs')), cell(kb.get('stack'), ka.get('stack')),
            cell(kb.get('instructions'), ka.get('instructions')),
            cell(f"{kb['shfl']} ({kb['shfl_in_loops']})" if kb else None,
                 f"{ka['shfl']} ({ka['shfl_in_loops']})" if ka else None),
            cell(kb.get('tc'), ka.get('tc')),
            cell(f"{kb['ldg128']} / {kb['ldg_narrow']}" if kb else None,
                 f"{ka['ldg128']} / {ka['ldg_narrow']}" if ka else None),
            cell(r_old and r_old['bytes'], r_new and r_new['bytes'], _fmt_bytes),
            cell(r_old and r_old['predicted_us']['H100'], r_new and r_new['predicted_us']['H100']),
            cell(r_old and r_old['predicted_us']['H200'], r_new and r_new['predicted_us']['H200'])])
    return md_table(['op', 'kernels', 'max regs', 'stack', 'SASS instr', 'SHFL (in loops)',
                     'TC instr', 'LDG 128-bit / narrow', 'bytes fwd+bwd (bf16)', 'H100 µs',
                     'H200 µs'], rows)


def markdown(report: dict, before: Optional[dict] = None) -> str:
    out = ['# Compiled kernels and rooflines', '',
           'Generated by `tools/analysis_tools/kernel_report.py` from ahead-of-time compiles '
           '(no GPU). **All times are predictions** from the analytic rooflines of '
           '`mmeffattn/analysis/kernels.py`, at peak rates '
           + ', '.join(f"{g}: {p['hbm'] / 1e12:g} TB/s HBM, {p['fp32'] * 2 / 1e12:g} TFLOP/s fp32, "
                       f"{p['tc16'] / 1e12:g} TFLOP/s bf16 TC, {p['tf32'] / 1e12:g} tf32"
                       for g, p in report['peaks'].items())
           + '; launch latency (a few µs per launch) is not included. '
           '`tools/gpu_check.py` measures the same calls on a GPU and prints measured next to '
           'predicted time; until it has run, no figure here is a measurement.', '',
           f"Targets: {', '.join('sm_%d' % a for a in report['archs'])}; "
           f"{len(report['kernels'])} compiled kernels"
           f"{' (quick run)' if report['quick'] else ''}.", '']
    if before is not None:
        out += ['## Before / after', '',
                'Kernel columns: sm_90, the first compiled configuration of each launch role, '
                'summed over the roles (max for registers); "kernels" counts the roles. Bytes '
                'and times: the first GPU-check shape, bf16, forward + backward; "-" where the '
                'op declares no roofline.', '',
                f"Before: {before.get('source', 'earlier report')}; after: the current code."
                + ('' if before.get('rooflines') else
                   ' The earlier report models no rooflines, so bytes and times are the current'
                   " code's; the earlier designs' are on the page on earlier kernel designs."),
                '']
        out += before_after_table(before, report) + ['']
    out += ['## Rooflines (per call)', '',
            '"fp32 inst": fp32 CUDA-core lane instructions; "TC FLOP": tensor-core FLOPs; '
            'the predicted time is max(bytes / HBM, compute).', '']
    out += roofline_table(report['rooflines']) + ['']
    out += ['## Compiled kernels', '',
            '"TC": HMMA/HGMMA instructions; "SHFL (in loops)": shuffles, and those between a '
            'backward branch and its target; LDG/STG: global loads/stores by bit width '
            '(128 = vectorised).', '']
    out += kernel_table(report['kernels']) + ['']
    return '\n'.join(out)


def build_report(quick: bool, archs: Sequence[int], ops: Optional[Sequence[str]] = None,
                 root: str = ROOT) -> dict:
    t0 = time.time()
    cases = plan(quick, ops)
    order = {json.dumps(c, sort_keys=True): i for i, c in enumerate(cases)}  # the checks' order
    compiled = compile_cases(cases, archs, root)
    compiled.sort(key=lambda k: (k['op'], order[json.dumps(k['case'], sort_keys=True)], k['arch']))
    # where the kernels came from: a path only for another checkout (--root), never this one's
    source = 'the current code' if osp.realpath(root) == osp.realpath(ROOT) else root
    return dict(source=source, quick=quick, archs=list(archs), peaks=kernels.PEAKS,
                kernels=compiled, rooflines=rooflines(ops), seconds=round(time.time() - t0, 1))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out-dir', default=osp.join(ROOT, 'docs', 'perf'))
    p.add_argument('--name', default='kernels', help='output file stem')
    p.add_argument('--quick', action='store_true',
                   help='one case per op, sm_90 only (the default test run)')
    p.add_argument('--archs', nargs='+', type=int, default=None)
    p.add_argument('--ops', nargs='+', default=None, help='only these ops')
    p.add_argument('--root', default=ROOT,
                   help='checkout whose kernels are compiled (e.g. an older commit that has '
                        'mmeffattn.analysis.kernels)')
    p.add_argument('--before', default=None, help='an earlier report JSON to compare against')
    p.add_argument('--worker', default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    archs = args.archs or ([90] if args.quick else [80, 90])
    if args.worker is not None:
        worker(json.loads(args.worker), archs)
        return 0
    report = build_report(args.quick, archs, args.ops, osp.abspath(args.root))
    before = None
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    stem = osp.join(args.out_dir, args.name)
    write_outputs(args.out_dir, {args.name + '.json': report,
                                 args.name + '.md': markdown(report, before)})
    bad = [k for k in report['kernels'] if k['stack'] or k['local']]
    print(f"{len(report['kernels'])} kernels compiled in {report['seconds']} s; "
          f"{len(bad)} with spills; {stem}.md / .json")
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
