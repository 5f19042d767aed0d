"""Measurement helpers of the benchmark tools (timing, peak tensor memory, the machine's matmul
rate and bandwidth, scaling-exponent fits, the environment record) and :func:`run_benchmark`, the
backbones of :mod:`.model_zoo` timed side by side (eager, compiled, onnxruntime)."""
import contextlib
import json
import math
import os
import platform
import statistics
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ['PeakTensorMemory', 'peak_memory', 'time_once', 'backward_of_outputs', 'median',
           'fit_exponent', 'environment', 'matmul_flops_per_s', 'is_oom', 'synchronize',
           'grid_tokens', 'parse_size', 'predict_power_law', 'copy_bandwidth', 'MEMORY_METHOD',
           'PRESETS', 'BenchmarkSettings', 'run_benchmark', 'exponents']

#: how memory is measured, stated in every output
MEMORY_METHOD = {
    'cpu': ('peak tensor memory: parameters, buffers and inputs plus the peak of the tensors '
            'alive during the call, tracked per storage by a torch dispatch mode (allocator '
            'caching and fragmentation not included)'),
    'cuda': 'torch.cuda.max_memory_allocated during the call (the caching allocator\'s peak)',
}


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


class PeakTensorMemory(TorchDispatchMode):
    """The ``peak`` bytes of the tensor storages created (not views) and alive inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: set = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._alive.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._alive:
                continue  # a view (or an in-place result) of memory already counted
            self._alive.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            # storages keep their Python object for their whole life (PyObject preservation),
            # so the finalizer runs exactly when the memory is released
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def _bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: Dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def peak_memory(fn: Callable[[], Any], resident: Sequence[torch.Tensor],
                device: torch.device) -> int:
    """Peak bytes while ``fn()`` runs: on CUDA the allocator's peak; elsewhere the bytes of
    ``resident`` (parameters, inputs) plus the peak of the tensors ``fn`` creates."""
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    with PeakTensorMemory() as tracker:
        fn()
    return _bytes(resident) + tracker.peak


def time_once(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one ``fn()``: CUDA events on a GPU (host overhead excluded from the queue
    wait), ``perf_counter`` around the call otherwise."""
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def backward_of_outputs(out: Any) -> None:
    """Backward of the sum of a model's outputs (a tensor or any nest of them; other leaves are
    ignored): the stand-in loss of a timed training step."""
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    sum(t.float().sum() for t in leaves).backward()


def median(xs: Sequence[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Least-squares slope of ``log y`` against ``log x`` (y ~ x^k); None with < 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def is_oom(e: BaseException) -> bool:
    """Out of memory on any device (CUDA's OutOfMemoryError or an allocator's message)."""
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return True
    msg = str(e).lower()
    return isinstance(e, RuntimeError) and ('out of memory' in msg or
                                            'failed to allocate' in msg or
                                            "can't allocate memory" in msg)


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype = torch.float32,
                       n: int = 0, repeats: int = 5) -> Dict[str, Any]:
    """The machine's practical limit: FLOP/s (2 per MAC) of a square matmul (``n`` 2048 on CPU,
    8192 on CUDA), the median of ``repeats`` runs after a warm-up."""
    n = n or (8192 if device.type == 'cuda' else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    time_once(lambda: a @ b, device)
    secs = median([time_once(lambda: a @ b, device) for _ in range(repeats)])
    return dict(n=n, dtype=str(dtype).replace('torch.', ''), seconds=secs,
                flops_per_s=2 * n ** 3 / secs)


def environment(device: torch.device, dtype: torch.dtype) -> Dict[str, Any]:
    """What a reader needs to reproduce or discount a result."""
    from mmeffattn.ops import _backend
    env = dict(torch=torch.__version__, python=platform.python_version(),
               machine=platform.machine(), processor=platform.processor() or platform.machine(),
               device=str(device), dtype=str(dtype).replace('torch.', ''),
               threads=torch.get_num_threads(), triton=_backend.HAS_TRITON,
               triton_interpreter=_backend.TRITON_INTERPRET,
               memory_method=MEMORY_METHOD['cuda' if device.type == 'cuda' else 'cpu'],
               time=time.strftime('%Y-%m-%d %H:%M:%S %Z'))
    if _backend.HAS_TRITON:  # the compiled code, and so the speed, depends on its version
        import triton
        env['triton_version'] = triton.__version__
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   capability=f'{props.major}.{props.minor}')
    return env


def grid_tokens(size: Tuple[int, int], stride: int = 16) -> int:
    """Tokens of a ``stride`` x ``stride`` patch grid over an ``H x W`` image (rounded up)."""
    return math.ceil(size[0] / stride) * math.ceil(size[1] / stride)


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> ``(512, 512)``, ``'512x768'`` -> ``(512, 768)`` (height x width)."""
    try:
        parts = [int(p) for p in str(text).lower().split('x')]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or min(parts) < 1:
        raise ValueError(f'size {text!r} is not N or HxW with positive integers (e.g. 512 or '
                         f'512x768)')
    return parts[0], parts[1]


def predict_power_law(history: Sequence[Tuple[float, float]], x: float,
                      min_exponent: float = 1.0) -> float:
    """Extrapolate a cost to ``x`` from ``(x, cost)`` pairs: a power law through the last two,
    exponent at least ``min_exponent`` (a noisy flat start promises no free size); 0 without."""
    if not history:
        return 0.
    k = fit_exponent(*zip(*history[-2:])) if len(history) >= 2 else None
    k = max(min_exponent, k if k is not None else min_exponent)
    x0, c0 = history[-1]
    return c0 * (x / x0) ** k if x > x0 else c0


def copy_bandwidth(device: torch.device, nbytes: int = 0, repeats: int = 5) -> Dict[str, Any]:
    """The machine's practical memory bandwidth: bytes read + written per second by a large copy."""
    nbytes = nbytes or (2**30 if device.type == 'cuda' else 2**26)
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    time_once(lambda: dst.copy_(src), device)
    secs = median([time_once(lambda: dst.copy_(src), device) for _ in range(repeats)])
    return dict(bytes=nbytes, seconds=secs, bytes_per_s=2 * nbytes / secs)


# -- backbones side by side --
SQUARE_SIZES = ['224', '512', '768', '1024', '1248', '1536', '2048']
#: presets of :class:`BenchmarkSettings`: the sizes, batch, repeats and limits of a run
PRESETS: Dict[str, Dict[str, Any]] = {
    'smoke': dict(models=['SEMA-T', 'ResNet-50'], sizes=['32', '32x64'], batch=1, warmup=1,
                  repeats=2, backward_max_side=64, budget_s=120., max_call_s=30.,
                  max_memory_gb=4.),
    # the README run: about 10 minutes on 2 CPU cores
    'readme': dict(models=['all'], sizes=['224', '512', '768', '1024', '512x768'], batch=1,
                   warmup=1, repeats=3, backward_max_side=512, budget_s=60., max_call_s=6.,
                   max_memory_gb=8.),
    # everything the issue lists; hours on a CPU
    'full': dict(models=['all'], sizes=SQUARE_SIZES + ['1024x2048'], batch=1, warmup=2,
                 repeats=10, backward_max_side=2048, budget_s=1800., max_call_s=120.,
                 max_memory_gb=16.),
    # the attention zoo (tools/analysis_tools/zoo_table.py): one thread (OpenMP spin-waits on a
    # loaded machine), forward only, one timed run
    'zoo': dict(models=['zoo'], sizes=['224', '512', '1024'], batch=1, warmup=1, repeats=1,
                backward_max_side=0, budget_s=120., max_call_s=30., max_memory_gb=8.,
                threads=1, reference='Zoo-sema'),
    # a CUDA GPU, inside the 10-minute GPU script (FLOPs: from get_flops.py or a CPU run)
    'gpu': dict(models=['all'], sizes=SQUARE_SIZES + ['1024x2048'], batch=8, warmup=3,
                repeats=10, backward_max_side=1536, budget_s=7., max_call_s=0.3,
                max_memory_gb=60., no_flops=True),
}
PEER_LAYOUTS = ('channels-last', 'as-built')


@dataclass
class BenchmarkSettings:
    """What :func:`run_benchmark` measures, and how (``tools/benchmark.py``'s options). Ours
    run as built, fed NCHW; the peers in ``peer_layout`` (their best CPU setting: channels-last);
    all under the same ``dtype`` (``'bf16'``: autocast) and compile options."""
    models: List[str] = field(default_factory=lambda: ['all'])
    sizes: List[str] = field(default_factory=lambda: ['224'])
    batch: int = 1
    warmup: int = 1
    repeats: int = 3
    backward_max_side: int = 512
    budget_s: float = 60.
    max_call_s: float = 6.
    max_memory_gb: float = 8.
    device: str = 'cpu'
    dtype: str = 'fp32'
    threads: Optional[int] = None
    ops_backend: Optional[str] = None
    reference: str = 'Swin-T'
    no_flops: bool = False
    peer_layout: str = 'channels-last'
    compile: bool = False
    compile_backend: str = 'inductor'
    compile_mode: Optional[str] = None
    freezing: bool = False
    onnx: bool = False
    preset: Optional[str] = None
    out_dir: Optional[str] = None  # where benchmark.partial.json is written after each size


class Runner:
    """The forwards of one built backbone at one input size: eager, forward+backward, compiled
    and onnxruntime (the last two when set up)."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype,
                 compiled: Optional[torch.nn.Module] = None) -> None:
        self.model, self.x, self.dtype, self.compiled = model, x, dtype, compiled
        self.autocast = dtype != torch.float32
        self.session: Any = None  # onnxruntime's, and its input feed
        self.feed: Dict[str, Any] = {}

    def _autocast(self):
        return torch.autocast(self.x.device.type, dtype=self.dtype, enabled=self.autocast)

    def forward(self) -> Any:
        with torch.no_grad(), self._autocast():
            return self.model(self.x)

    def forward_compiled(self) -> None:
        with torch.no_grad(), self._autocast():
            self.compiled(self.x)

    def forward_ort(self) -> None:
        self.session.run(None, self.feed)

    def forward_backward(self) -> None:
        with self._autocast():
            outs = self.model(self.x)
        backward_of_outputs(outs)
        for p in self.model.parameters():
            p.grad = None

    def resident(self) -> List[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers(), self.x]


def _compile_config(settings: BenchmarkSettings) -> Any:
    """Inductor's freezing (weights folded as constants) for the whole run: a graph compiled
    without it would serve a later frozen compile of the same module class."""
    if settings.compile and settings.freezing and settings.compile_backend == 'inductor':
        import torch._inductor.config as inductor_config
        return inductor_config.patch(freezing=True)
    return contextlib.nullcontext()


def run_benchmark(settings: BenchmarkSettings) -> Dict[str, Any]:
    """Time every model of ``settings.models`` at each size (models interleaved within a size;
    a size predicted past a limit is reported as skipped) and return the report: environment,
    settings, models, per-(model, size) results and the fitted scaling exponents."""
    device = torch.device(settings.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError("device 'cuda': no CUDA device is visible to torch")
    if settings.peer_layout not in PEER_LAYOUTS:
        raise ValueError(f'peer_layout must be one of {PEER_LAYOUTS}, got '
                         f'{settings.peer_layout!r}')
    if settings.onnx:
        if device.type != 'cpu' or settings.dtype != 'fp32':
            raise ValueError("onnx: onnxruntime's CPU provider runs the fp32 graph; time it "
                             "with device 'cpu' and dtype 'fp32'")
        from mmeffattn.deploy.onnx import require_onnx
        require_onnx()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    from mmeffattn.ops import use_backend

    # default: the torch backend on a CPU (not the Triton interpreter), Triton on a GPU
    backend = settings.ops_backend or ('auto' if device.type == 'cuda' else 'torch')
    with use_backend(backend), _compile_config(settings), tempfile.TemporaryDirectory() as tmp:
        return _run(settings, device, backend, tmp)


def _run(settings: BenchmarkSettings, device: torch.device, backend: str,
         tmp: str) -> Dict[str, Any]:
    from mmeffattn.analysis import model_zoo
    from mmeffattn.analysis.flops import count_flops, count_parameters
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[settings.dtype]
    names = model_zoo.select_models(settings.models)
    sizes = sorted((parse_size(s) for s in settings.sizes), key=lambda hw: (hw[0] * hw[1], hw))
    variants = [v for v, on in (('compiled', settings.compile), ('ort', settings.onnx)) if on]
    t_start = time.time()
    results: List[Dict[str, Any]] = []
    models: Dict[str, torch.nn.Module] = {}
    compiled: Dict[str, torch.nn.Module] = {}
    info: Dict[str, Dict[str, Any]] = {}
    for name in names:
        entry = model_zoo.get_model(name)
        setting = 'as built' if entry.ours or settings.peer_layout == 'as-built' else \
            'channels-last'
        info[name] = dict(attention=entry.attention, ours=entry.ours, params_m=None,
                          setting=setting, status='ok', spent_s=0., time_hist=[], mem_hist=[])
        reason = model_zoo.unavailable_reason(name)
        if reason is None:
            try:
                model = model_zoo.build_backbone(name).to(device)
                if setting == 'channels-last':
                    model = model.to(memory_format=torch.channels_last)
                models[name] = model
                if settings.compile:  # static: one graph per size, the best at each size
                    compiled[name] = torch.compile(
                        model, dynamic=False, backend=settings.compile_backend,
                        **({'mode': settings.compile_mode} if settings.compile_mode else {}))
                info[name]['params_m'] = count_parameters(model) / 1e6
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
            rec = dict(model=name, size=list(hw), tokens=grid_tokens(hw), batch=settings.batch,
                       status=info[name]['status'], setting=info[name]['setting'], fwd_ms=None,
                       fwd_bwd_ms=None, images_per_s=None, peak_mem_mb=None,
                       fwd_bwd_peak_mem_mb=None, gmacs=None, params_m=info[name]['params_m'])
            rec.update({k.format(v): None for v in variants
                        for k in ('fwd_{}_ms', '{}_speedup', '{}_setup_s', '{}_status')})
            records[name] = rec
            if name not in models:
                continue
            calls = settings.warmup + settings.repeats
            pred_t = predict_power_law(info[name]['time_hist'], pixels)
            pred_m = predict_power_law(info[name]['mem_hist'], pixels)
            if pred_m > settings.max_memory_gb * 2**30:
                rec['status'] = 'skipped (memory limit)'
            elif pred_t > settings.max_call_s or \
                    info[name]['spent_s'] + 2 * calls * pred_t > settings.budget_s:
                rec['status'] = 'skipped (time limit)'
            else:
                x = torch.randn(settings.batch, 3, *hw, device=device)
                if info[name]['setting'] == 'channels-last':
                    x = x.contiguous(memory_format=torch.channels_last)
                runners[name] = Runner(models[name], x, dtype, compiled.get(name))
        _measure(runners, records, info, settings, device, backward=False)
        _measure_variants(runners, records, settings, device, variants, tmp)
        if max(hw) <= settings.backward_max_side:
            _measure(runners, records, info, settings, device, backward=True)
        for name, runner in runners.items():
            rec = records[name]
            if rec['status'] != 'ok':
                continue
            t0 = time.time()
            try:
                mem = peak_memory(runner.forward, runner.resident(), device)
                rec['peak_mem_mb'] = mem / 2**20
                info[name]['mem_hist'].append((pixels, mem))
                if rec['fwd_bwd_ms'] is not None:
                    rec['fwd_bwd_peak_mem_mb'] = peak_memory(
                        runner.forward_backward, runner.resident(), device) / 2**20
                if not settings.no_flops:
                    rec['gmacs'] = count_flops(models[name], (runner.x[:1], )).total / 1e9
            except Exception as e:
                rec['status'] = 'out of memory' if is_oom(e) else \
                    f'error: {type(e).__name__}: {e}'
            info[name]['spent_s'] += time.time() - t0
        for rec in records.values():
            shown = f'{rec["fwd_ms"]:.1f} ms' if rec['fwd_ms'] is not None else rec['status']
            for v in variants:
                if rec[f'fwd_{v}_ms'] is not None:
                    shown += (f', {v} {rec[f"fwd_{v}_ms"]:.1f} ms ({rec[f"{v}_speedup"]:.2f}x '
                              f'eager, set up in {rec[f"{v}_setup_s"]:.0f} s)')
                elif rec[f'{v}_status']:
                    shown += f', {v}: {rec[f"{v}_status"]}'
            print(f'[{hw[0]}x{hw[1]}] {rec["model"]}: {shown}', flush=True)
        results += records.values()
        del runners
        if settings.out_dir:  # a run stopped from outside keeps what it measured
            with open(os.path.join(settings.out_dir, 'benchmark.partial.json'), 'w') as f:
                json.dump(dict(results=results), f)
        if device.type == 'cuda':
            torch.cuda.empty_cache()

    report_settings = asdict(settings)
    report_settings.update(sizes=[list(s) for s in sizes], ops_backend=backend)
    if settings.compile:
        report_settings['compile'] = settings.compile_backend + (
            ', freezing' if settings.freezing and settings.compile_backend == 'inductor' else ''
        ) + (f', mode {settings.compile_mode}' if settings.compile_mode else '')
    env = environment(device, dtype)
    if settings.onnx:
        import onnxruntime
        env['onnxruntime'] = onnxruntime.__version__
        threads = torch.get_num_threads()
        report_settings['onnx'] = ('CPUExecutionProvider, graph optimization level all, '
                                   f'{threads} intra-op thread' + 's' * (threads != 1))
    return dict(environment=env, settings=report_settings,
                models={n: {k: i[k] for k in ('attention', 'ours', 'params_m', 'setting')}
                        for n, i in info.items()},
                results=results, exponents=exponents(results), elapsed_s=time.time() - t_start)


def _measure(runners: Dict[str, Runner], records: Dict[str, Dict[str, Any]],
             info: Dict[str, Dict[str, Any]], settings: Any, device: torch.device,
             backward: bool) -> None:
    """Warm every runner up, then ``repeats`` rounds that time each model once. On a GPU the
    first call of each pass (Triton compiles) is ``first_call_s``, outside the time budget."""
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
            t = time_once(fn, device)
        except Exception as e:
            rec['status'] = 'out of memory' if is_oom(e) else \
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
        for _ in range(settings.warmup):
            call(name, timed=False)
    for _ in range(settings.repeats):
        for name in runners:
            call(name, timed=True)
    for name, ts in times.items():
        rec = records[name]
        if rec['status'] == 'ok' and ts:
            rec[key] = median(ts) * 1e3
            if not backward:
                rec['images_per_s'] = settings.batch / median(ts)
                info[name]['time_hist'].append((rec['size'][0] * rec['size'][1], median(ts)))


def _setup_ort(runner: Runner, rec: Dict[str, Any], tmp: str) -> Callable[[], None]:
    """Export the backbone at this size, open an onnxruntime session, and record the largest
    relative error of its outputs against eager's."""
    from mmeffattn.deploy.onnx import export_onnx, onnx_session, relative_error
    path = os.path.join(tmp, f'{rec["model"]}.onnx')
    export_onnx(runner.model, tuple(runner.x.shape[2:]), path, batch=runner.x.shape[0])
    runner.session = onnx_session(path, torch.get_num_threads())
    os.remove(path)  # the session holds the graph
    runner.feed = {runner.session.get_inputs()[0].name: runner.x.contiguous().cpu().numpy()}
    got = runner.session.run(None, runner.feed)
    ref = [t for t in tree_flatten(runner.forward())[0] if isinstance(t, torch.Tensor)]
    rec['ort_rel_err'] = max(relative_error(g, r) for g, r in zip(got, ref))
    return runner.forward_ort


def _measure_variants(runners: Dict[str, Runner], records: Dict[str, Dict[str, Any]],
                      settings: BenchmarkSettings, device: torch.device, variants: List[str],
                      tmp: str) -> None:
    """The compiled and onnxruntime forwards of every runner: set up (``<variant>_setup_s``),
    warmed up, then timed back to back with eager in ``repeats`` rounds;
    ``<variant>_speedup`` = eager / variant."""
    calls: Dict[str, Dict[str, Callable[[], Any]]] = {}
    for name, runner in runners.items():
        rec = records[name]
        if rec['status'] != 'ok':
            continue
        fns: Dict[str, Callable[[], Any]] = {}
        for v in variants:
            t0 = time.time()
            try:
                fn = _setup_ort(runner, rec, tmp) if v == 'ort' else runner.forward_compiled
                for _ in range(1 + settings.warmup):  # (a compiled forward's first compiles)
                    fn()
            except Exception as e:
                first = (str(e).splitlines() or [''])[0]
                rec[f'{v}_status'] = f'error: {type(e).__name__}: {first}'
                continue
            rec[f'{v}_setup_s'], rec[f'{v}_status'] = time.time() - t0, 'ok'
            fns[v] = fn
        if fns:
            calls[name] = dict(eager=runner.forward, **fns)
    times = {name: {k: [] for k in fns} for name, fns in calls.items()}
    for _ in range(settings.repeats):
        for name, fns in calls.items():
            for key, fn in fns.items():
                times[name][key].append(time_once(fn, device))
    for name, ts in times.items():
        for v in variants:
            if ts.get(v):
                records[name][f'fwd_{v}_ms'] = median(ts[v]) * 1e3
                records[name][f'{v}_speedup'] = median(ts['eager']) / median(ts[v])


def exponents(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per model: the fitted exponent k of latency ~ tokens^k and memory ~ tokens^k over the
    square sizes measured."""
    out: Dict[str, Dict[str, Optional[float]]] = {}
    for name in dict.fromkeys(r['model'] for r in results):
        rows = [r for r in results if r['model'] == name and r['size'][0] == r['size'][1]]
        out[name] = {
            key: fit_exponent([r['tokens'] for r in rows if r[col] is not None],
                              [r[col] for r in rows if r[col] is not None])
            for key, col in (('latency', 'fwd_ms'), ('memory', 'peak_mem_mb'),
                             ('flops', 'gmacs'))}
    return out
