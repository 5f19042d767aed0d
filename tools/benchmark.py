#!/usr/bin/env python
"""Benchmark backbones side by side: latency, throughput, peak memory, parameters and FLOPs.

    python tools/benchmark.py --preset readme --out-dir work_dirs/benchmark
    python tools/benchmark.py --models SEMA-T MILA-T Swin-T --sizes 224 1024 512x768

Every model of :mod:`mmeffattn.analysis.model_zoo` (ours and the OpenMMLab peers) is built as a
backbone with random weights and timed at each input size. The models are interleaved within
each size (warm-up, then repeat rounds that visit every model once), so drift of the machine
hits them alike. Sizes that a model's earlier sizes predict to exceed the per-call limit, the
model's time budget or the memory limit are reported as skipped, and a model that runs out of
memory is reported as such. Outputs under ``--out-dir``: ``benchmark.json``, ``benchmark.md``
(ratios to ``--reference``) and log-log plots of latency and memory against tokens with the
fitted scaling exponent per model; ``benchmark.partial.json`` holds the results so far after each
size (what is left if the run is stopped).
"""
import argparse
import json
import os
import os.path as osp
import time
from typing import Any, Dict, List, Optional

import torch

SQUARE_SIZES = ['224', '512', '768', '1024', '1248', '1536', '2048']
#: presets: the sizes, batch, repeats and limits of a run (any flag given overrides them)
PRESETS: Dict[str, Dict[str, Any]] = {
    # tiny, for the test suite: two models, two small sizes
    'smoke': dict(models=['SEMA-T', 'ResNet-50'], sizes=['32', '32x64'], batch=1, warmup=1,
                  repeats=2, backward_max_side=64, budget_s=120., max_call_s=30.,
                  max_memory_gb=4.),
    # the README run: about 10 minutes on 2 CPU cores (all models, up to 1024 px, backward up
    # to 512 px)
    'readme': dict(models=['all'], sizes=['224', '512', '768', '1024', '512x768'], batch=1,
                   warmup=1, repeats=3, backward_max_side=512, budget_s=60., max_call_s=6.,
                   max_memory_gb=8.),
    # everything the issue lists; hours on a CPU
    'full': dict(models=['all'], sizes=SQUARE_SIZES + ['1024x2048'], batch=1, warmup=2,
                 repeats=10, backward_max_side=2048, budget_s=1800., max_call_s=120.,
                 max_memory_gb=16.),
    # the attention zoo (configs/zoo: SEMA-T with each token mixer), once on a shared CPU: one
    # thread (OpenMP spin-waits on a loaded machine made two threads 20x slower), forward only,
    # one timed run, a time budget per model (global softmax is skipped where its predicted time
    # or memory exceeds the limits); tools/analysis_tools/zoo_table.py runs it
    'zoo': dict(models=['zoo'], sizes=['224', '512', '1024'], batch=1, warmup=1, repeats=1,
                backward_max_side=0, budget_s=120., max_call_s=30., max_memory_gb=8.,
                threads=1, reference='Zoo-sema'),
    # a CUDA GPU, inside the 10-minute GPU script (200 s for 16 models; FLOPs do not depend on
    # the device: take them from get_flops.py or a CPU run)
    'gpu': dict(models=['all'], sizes=SQUARE_SIZES + ['1024x2048'], batch=8, warmup=3,
                repeats=10, backward_max_side=1536, budget_s=7., max_call_s=0.3,
                max_memory_gb=60., no_flops=True),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--preset', choices=sorted(PRESETS), default='readme')
    p.add_argument('--models', nargs='+', help="names, or 'ours'/'peers'/'all' (preset's)")
    p.add_argument('--sizes', nargs='+', help='N (square) or HxW, e.g. 224 512x768')
    p.add_argument('--batch', type=int, help='images per forward (images/s = batch / latency)')
    p.add_argument('--warmup', type=int)
    p.add_argument('--repeats', type=int, help='timed runs per model and size (median kept)')
    p.add_argument('--backward-max-side', type=int,
                   help='time forward+backward only up to this image side')
    p.add_argument('--budget-s', type=float, help='measurement seconds per model, all sizes')
    p.add_argument('--max-call-s', type=float,
                   help='skip a size whose one forward is predicted to take longer')
    p.add_argument('--max-memory-gb', type=float,
                   help='skip a size whose peak memory is predicted to exceed this')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--dtype', choices=['fp32', 'bf16'], default='fp32',
                   help='bf16 runs under autocast (CPU or CUDA)')
    p.add_argument('--threads', type=int, help='torch.set_num_threads (CPU)')
    p.add_argument('--ops-backend', choices=['auto', 'torch', 'reference', 'triton'],
                   help="backend of mmeffattn's ops (default: auto, i.e. Triton on CUDA; the "
                   'torch backend on a CPU, even when the Triton interpreter is on, since the '
                   "interpreter is a test tool; 'reference' times the naive formulas)")
    p.add_argument('--reference', help='model the ratios are taken against (default: Swin-T, '
                   "the preset's)")
    p.add_argument('--no-flops', action='store_true', default=None,
                   help='skip the FLOP count (one traced forward per model and size)')
    p.add_argument('--no-plots', action='store_true')
    p.add_argument('--compile', action='store_true',
                   help='also time each model under torch.compile (inductor, one static graph '
                        'per size), interleaved with eager: fwd compiled (ms), eager/compiled')
    p.add_argument('--compile-backend', default='inductor',
                   help="torch.compile backend of --compile ('aot_eager' to check the path)")
    p.add_argument('--out-dir', default='work_dirs/benchmark')
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.reference is None:
        args.reference = 'Swin-T'
    args.no_flops = bool(args.no_flops)
    return args


# --------------------------------------------------------------------------------------------
# one model at one size
# --------------------------------------------------------------------------------------------
class Runner:
    """Forward / forward+backward closures of one built backbone at one input size."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype,
                 compiled: Optional[torch.nn.Module] = None) -> None:
        self.model, self.x, self.dtype, self.compiled = model, x, dtype, compiled
        self.autocast = dtype != torch.float32

    def _autocast(self):
        return torch.autocast(self.x.device.type, dtype=self.dtype, enabled=self.autocast)

    def forward(self) -> None:
        with torch.no_grad(), self._autocast():
            self.model(self.x)

    def forward_compiled(self) -> None:
        with torch.no_grad(), self._autocast():
            self.compiled(self.x)

    def forward_backward(self) -> None:
        from mmeffattn.analysis.benchmarking import backward_of_outputs
        with self._autocast():
            outs = self.model(self.x)
        backward_of_outputs(outs)
        for p in self.model.parameters():
            p.grad = None

    def resident(self) -> List[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers(), self.x]


def apply_ops_backend(choice: Optional[str], device: torch.device) -> str:
    """Set ``$MMEFFATTN_OPS_BACKEND`` for this process and return it: the choice, or by
    default the torch backend on a CPU (the Triton interpreter would otherwise be timed) and
    automatic dispatch on a GPU (Triton kernels)."""
    if choice is None:
        choice = 'auto' if device.type == 'cuda' else 'torch'
    os.environ['MMEFFATTN_OPS_BACKEND'] = choice
    return choice


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> Dict[str, Any]:
    from mmeffattn.analysis import benchmarking as bm
    from mmeffattn.analysis.flops import count_flops, count_parameters
    from mmeffattn.analysis.model_zoo import (build_backbone, get_model, select_models,
                                              unavailable_reason)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: no CUDA device is visible to torch')
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[args.dtype]
    apply_ops_backend(args.ops_backend, device)
    names = select_models(args.models)
    sizes = sorted((bm.parse_size(s) for s in args.sizes), key=lambda hw: (hw[0] * hw[1], hw))
    t_start = time.time()

    results: List[Dict[str, Any]] = []
    models: Dict[str, torch.nn.Module] = {}
    compiled: Dict[str, torch.nn.Module] = {}
    info: Dict[str, Dict[str, Any]] = {}
    for name in names:
        entry = get_model(name)
        info[name] = dict(attention=entry.attention, ours=entry.ours, params_m=None,
                          status='ok', spent_s=0., time_hist=[], mem_hist=[])
        reason = unavailable_reason(name)
        if reason is None:
            try:
                models[name] = build_backbone(name).to(device)
                if getattr(args, 'compile', False):
                    # static: one graph per size (the fair comparison at each size); a compile
                    # error surfaces at the first call and is recorded per size
                    compiled[name] = torch.compile(models[name], dynamic=False,
                                                   backend=args.compile_backend)
                info[name]['params_m'] = count_parameters(models[name]) / 1e6
            except Exception as e:  # a peer whose constructor changed, say
                reason = f'build failed: {type(e).__name__}: {e}'
        if reason:
            info[name]['status'] = reason if reason.startswith('not available') else \
                f'not available: {reason}'
            print(f'[{name}] {info[name]["status"]}', flush=True)

    for hw in sizes:
        pixels = hw[0] * hw[1]
        records: Dict[str, Dict[str, Any]] = {}
        runners: Dict[str, Runner] = {}
        for name in names:
            rec = dict(model=name, size=list(hw), tokens=bm.grid_tokens(hw), batch=args.batch,
                       status=info[name]['status'], fwd_ms=None, fwd_bwd_ms=None,
                       images_per_s=None, peak_mem_mb=None, fwd_bwd_peak_mem_mb=None,
                       gmacs=None, params_m=info[name]['params_m'])
            if getattr(args, 'compile', False):
                rec.update(fwd_compiled_ms=None, compile_s=None, compiled_speedup=None,
                           compile_status=None)
            records[name] = rec
            if name not in models:
                continue
            calls = args.warmup + args.repeats
            pred_t = bm.predict_power_law(info[name]['time_hist'], pixels)
            pred_m = bm.predict_power_law(info[name]['mem_hist'], pixels)
            if pred_m > args.max_memory_gb * 2**30:
                rec['status'] = 'skipped (memory limit)'
            elif pred_t > args.max_call_s or \
                    info[name]['spent_s'] + 2 * calls * pred_t > args.budget_s:
                rec['status'] = 'skipped (time limit)'
            else:
                x = torch.randn(args.batch, 3, *hw, device=device)
                runners[name] = Runner(models[name], x, dtype, compiled.get(name))
        _measure(runners, records, info, args, device, backward=False)
        if getattr(args, 'compile', False):
            _measure_compiled(runners, records, args, device)
        if max(hw) <= args.backward_max_side:
            _measure(runners, records, info, args, device, backward=True)
        for name, runner in runners.items():
            rec = records[name]
            if rec['status'] != 'ok':
                continue
            t0 = time.time()
            try:
                mem = bm.peak_memory(runner.forward, runner.resident(), device)
                rec['peak_mem_mb'] = mem / 2**20
                info[name]['mem_hist'].append((pixels, mem))
                if rec['fwd_bwd_ms'] is not None:
                    rec['fwd_bwd_peak_mem_mb'] = bm.peak_memory(
                        runner.forward_backward, runner.resident(), device) / 2**20
                if not args.no_flops:
                    one = runner.x[:1]
                    rec['gmacs'] = count_flops(models[name], (one, )).total / 1e9
            except Exception as e:
                rec['status'] = 'out of memory' if bm.is_oom(e) else \
                    f'error: {type(e).__name__}: {e}'
            info[name]['spent_s'] += time.time() - t0
        for name in names:
            rec = records[name]
            shown = f'{rec["fwd_ms"]:.1f} ms' if rec['fwd_ms'] is not None else rec['status']
            if rec.get('fwd_compiled_ms') is not None:
                shown += (f', compiled {rec["fwd_compiled_ms"]:.1f} ms '
                          f'({rec["compiled_speedup"]:.2f}x, compiled in {rec["compile_s"]:.0f} s)')
            elif rec.get('compile_status'):
                shown += f', compiled: {rec["compile_status"]}'
            print(f'[{hw[0]}x{hw[1]}] {name}: {shown}', flush=True)
        results += records.values()
        del runners
        if getattr(args, 'out_dir', None):  # a run stopped from outside keeps what it measured
            with open(osp.join(args.out_dir, 'benchmark.partial.json'), 'w') as f:
                json.dump(dict(results=results), f)
        if device.type == 'cuda':
            torch.cuda.empty_cache()

    settings = {k: getattr(args, k) for k in ('preset', 'batch', 'warmup', 'repeats',
                                              'backward_max_side', 'budget_s', 'max_call_s',
                                              'max_memory_gb', 'reference')}
    settings['sizes'] = [list(s) for s in sizes]
    settings['ops_backend'] = os.environ.get('MMEFFATTN_OPS_BACKEND', 'auto')
    settings['compile'] = getattr(args, 'compile_backend', 'inductor') \
        if getattr(args, 'compile', False) else False
    return dict(environment=bm.environment(device, dtype), settings=settings,
                models={n: dict(attention=i['attention'], ours=i['ours'],
                                params_m=i['params_m']) for n, i in info.items()},
                results=results, exponents=exponents(results),
                elapsed_s=time.time() - t_start)


def _measure(runners: Dict[str, Runner], records: Dict[str, Dict[str, Any]],
             info: Dict[str, Dict[str, Any]], args: argparse.Namespace, device: torch.device,
             backward: bool) -> None:
    """Warm every runner up, then ``repeats`` rounds that time each model once.

    On a GPU the first call of each pass at each size compiles the Triton kernels it meets for
    the first time (a few seconds each), which says nothing about the model's speed: it is
    recorded as ``first_call_s`` and kept out of the model's time budget (``budget_s`` bounds
    measurement), so that compilation does not make the later sizes look too slow to run."""
    from mmeffattn.analysis import benchmarking as bm
    key = 'fwd_bwd_ms' if backward else 'fwd_ms'
    times: Dict[str, List[float]] = {name: [] for name in runners}
    first = set(runners) if device.type == 'cuda' else set()

    def call(name: str, timed: bool) -> None:
        rec = records[name]
        if rec['status'] != 'ok':
            return
        runner = runners[name]
        fn = runner.forward_backward if backward else runner.forward
        t0 = time.time()
        try:
            t = bm.time_once(fn, device)
        except Exception as e:
            rec['status'] = 'out of memory' if bm.is_oom(e) else \
                f'error: {type(e).__name__}: {e}'
            if device.type == 'cuda':
                torch.cuda.empty_cache()
            return
        finally:
            spent = time.time() - t0
            if name in first:
                first.discard(name)
                rec['first_call_s'] = (rec.get('first_call_s') or 0.) + spent
            else:
                info[name]['spent_s'] += spent
        if timed:
            times[name].append(t)

    for name in runners:
        for _ in range(args.warmup):
            call(name, timed=False)
    for _ in range(args.repeats):
        for name in runners:
            call(name, timed=True)
    for name, ts in times.items():
        rec = records[name]
        if rec['status'] == 'ok' and ts:
            rec[key] = bm.median(ts) * 1e3
            if not backward:
                rec['images_per_s'] = args.batch / bm.median(ts)
                info[name]['time_hist'].append((rec['size'][0] * rec['size'][1],
                                                bm.median(ts)))


def _measure_compiled(runners: Dict[str, Runner], records: Dict[str, Dict[str, Any]],
                      args: argparse.Namespace, device: torch.device) -> None:
    """The compiled forward of every runner: the first call compiles (its time is
    ``compile_s``), then warm-up and ``repeats`` rounds, each timing eager and compiled back to
    back, so that both see the same machine load; ``compiled_speedup`` = eager / compiled
    (medians of these rounds)."""
    from mmeffattn.analysis import benchmarking as bm
    ok = {}
    for name, runner in runners.items():
        rec = records[name]
        if rec['status'] != 'ok' or runner.compiled is None:
            continue
        t0 = time.time()
        try:
            runner.forward_compiled()
            for _ in range(args.warmup):
                runner.forward_compiled()
        except Exception as e:
            rec['compile_status'] = f'error: {type(e).__name__}: {str(e).splitlines()[0]}'
            continue
        rec['compile_s'] = time.time() - t0
        ok[name] = ([], [])
    for _ in range(args.repeats):
        for name, (eager, comp) in ok.items():
            eager.append(bm.time_once(runners[name].forward, device))
            comp.append(bm.time_once(runners[name].forward_compiled, device))
    for name, (eager, comp) in ok.items():
        rec = records[name]
        rec['fwd_compiled_ms'] = bm.median(comp) * 1e3
        rec['compiled_speedup'] = bm.median(eager) / bm.median(comp)


def exponents(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per model: the fitted exponent k of latency ~ tokens^k and memory ~ tokens^k over the
    square sizes measured."""
    from mmeffattn.analysis.benchmarking import fit_exponent
    out: Dict[str, Dict[str, Optional[float]]] = {}
    for name in dict.fromkeys(r['model'] for r in results):
        rows = [r for r in results if r['model'] == name and r['size'][0] == r['size'][1]]
        out[name] = {
            key: fit_exponent([r['tokens'] for r in rows if r[col] is not None],
                              [r[col] for r in rows if r[col] is not None])
            for key, col in (('latency', 'fwd_ms'), ('memory', 'peak_mem_mb'),
                             ('flops', 'gmacs'))}
    return out


# --------------------------------------------------------------------------------------------
# reports
# --------------------------------------------------------------------------------------------
def _fmt(v: Optional[float], digits: int = 1) -> str:
    return '-' if v is None else f'{v:,.{digits}f}'


def markdown(report: Dict[str, Any]) -> str:
    """Tables per size (with ratios to the reference model) and the fitted exponents."""
    env, settings = report['environment'], report['settings']
    ref = settings['reference']
    where = env.get('gpu', env['processor'])
    threads = f'{env["threads"]} thread' + ('s' if env['threads'] != 1 else '')
    lines = [f'Device: {env["device"]} ({where}), {threads}, {env["dtype"]}, '
             f'batch {settings["batch"]}, torch {env["torch"]}; median of '
             f'{settings["repeats"]} runs after {settings["warmup"]} warm-up; models '
             f'interleaved; ops backend {settings.get("ops_backend", "auto")}. '
             f'Memory: {env["memory_method"]}. FLOPs: GMACs per image. '
             f'Ratios: latency and memory relative to {ref}.', '']
    sizes = list(dict.fromkeys(tuple(r['size']) for r in report['results']))
    for hw in sizes:
        rows = [r for r in report['results'] if tuple(r['size']) == hw]
        base = next((r for r in rows if r['model'] == ref and r['fwd_ms'] is not None), None)
        lines += [f'### {hw[0]}x{hw[1]} ({rows[0]["tokens"]} tokens of 16x16)', '',
                  '| model | params (M) | GMACs | fwd (ms) | fwd+bwd (ms) | img/s | '
                  'peak mem (MB) | fwd vs ref | mem vs ref |',
                  '|---|---:|---:|---:|---:|---:|---:|---:|---:|']
        for r in rows:
            if r['fwd_ms'] is None:
                lines.append(f'| {r["model"]} | {_fmt(r["params_m"])} | {r["status"]} '
                             f'||||||| ')
                continue
            ratio_t = r['fwd_ms'] / base['fwd_ms'] if base else None
            ratio_m = (r['peak_mem_mb'] / base['peak_mem_mb']
                       if base and base['peak_mem_mb'] and r['peak_mem_mb'] else None)
            lines.append(
                f'| {r["model"]} | {_fmt(r["params_m"])} | {_fmt(r["gmacs"], 2)} | '
                f'{_fmt(r["fwd_ms"])} | {_fmt(r["fwd_bwd_ms"])} | {_fmt(r["images_per_s"], 2)} | '
                f'{_fmt(r["peak_mem_mb"], 0)} | {_fmt(ratio_t, 2)}x | {_fmt(ratio_m, 2)}x |')
        lines.append('')
    if report['settings'].get('compile'):
        lines += [f'### torch.compile ({report["settings"]["compile"]}) vs eager, forward', '',
                  '| model | size | eager (ms) | compiled (ms) | eager / compiled | compile (s) |',
                  '|---|---|---:|---:|---:|---:|']
        for r in report['results']:
            if r.get('fwd_compiled_ms') is not None:
                eager = r['fwd_compiled_ms'] * r['compiled_speedup']
                lines.append(f'| {r["model"]} | {r["size"][0]}x{r["size"][1]} | {_fmt(eager)} | '
                             f'{_fmt(r["fwd_compiled_ms"])} | {_fmt(r["compiled_speedup"], 2)}x | '
                             f'{_fmt(r["compile_s"], 0)} |')
            elif r.get('compile_status'):
                lines.append(f'| {r["model"]} | {r["size"][0]}x{r["size"][1]} | '
                             f'{r["compile_status"]} |||| ')
        lines.append('')
    lines += ['### Scaling exponents (y ~ tokens^k over the square sizes)', '',
              '| model | attention | latency k | memory k | FLOPs k |', '|---|---|---:|---:|---:|']
    for name, ks in report['exponents'].items():
        lines.append(f'| {name} | {report["models"][name]["attention"]} | '
                     f'{_fmt(ks["latency"], 2)} | {_fmt(ks["memory"], 2)} | '
                     f'{_fmt(ks["flops"], 2)} |')
    lines += ['', f'Total run time: {report["elapsed_s"]:.0f} s.']
    return '\n'.join(lines) + '\n'


def plot(report: Dict[str, Any], out_dir: str) -> List[str]:
    """Log-log latency and memory against tokens, one line per model, exponent in the legend."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    files = []
    for col, key, label, fname in (('fwd_ms', 'latency', 'forward latency (ms)',
                                    'latency_vs_tokens.png'),
                                   ('peak_mem_mb', 'memory', 'peak memory (MB)',
                                    'memory_vs_tokens.png')):
        fig, ax = plt.subplots(figsize=(7, 5))
        for name, ks in report['exponents'].items():
            rows = [r for r in report['results'] if r['model'] == name and
                    r['size'][0] == r['size'][1] and r[col] is not None]
            if not rows:
                continue
            k = ks[key]
            ours = report['models'][name]['ours']
            ax.plot([r['tokens'] for r in rows], [r[col] for r in rows],
                    '-o' if ours else '--s', markersize=4,
                    label=f'{name} (k={k:.2f})' if k is not None else name)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens (16x16 patches of the input)')
        ax.set_ylabel(label)
        env = report['environment']
        ax.set_title(f'{label} on {env.get("gpu", env["processor"])}, batch '
                     f'{report["settings"]["batch"]}, {env["dtype"]}', fontsize=9)
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = osp.join(out_dir, fname)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        files.append(path)
    return files


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    saved = os.environ.get('MMEFFATTN_OPS_BACKEND')
    try:
        report = run(args)
    finally:  # run() sets the ops backend for itself; a caller's process gets its own back
        if saved is None:
            os.environ.pop('MMEFFATTN_OPS_BACKEND', None)
        else:
            os.environ['MMEFFATTN_OPS_BACKEND'] = saved
    with open(osp.join(args.out_dir, 'benchmark.json'), 'w') as f:
        json.dump(report, f, indent=1)
    with open(osp.join(args.out_dir, 'benchmark.md'), 'w') as f:
        f.write(markdown(report))
    if not args.no_plots:
        report['plots'] = plot(report, args.out_dir)
    print(f'wrote {args.out_dir}/benchmark.json, benchmark.md'
          + ('' if args.no_plots else ', latency_vs_tokens.png, memory_vs_tokens.png')
          + f' ({report["elapsed_s"]:.0f} s)')
    return report


if __name__ == '__main__':
    main()
