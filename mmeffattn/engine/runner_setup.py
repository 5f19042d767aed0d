"""What tools/train.py and tools/test.py share: config loading and runtime set-up for mmdet,
mmseg and mmpretrain configs on GPUs and CPUs alike."""
import os
import os.path as osp
import sys
from typing import Callable, Optional

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import print_log

from .checkpoint_io import (CheckpointError, find_resume_checkpoint, install_checkpoint_io,
                            load_checkpoint_file)
from .compat import (configure_cpu_ddp, cpu_distributed_requested, init_cpu_distributed,
                     register_config_package)
from .data_check import AnnotationFileError


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Load a config with a clear error when the file does not exist."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file {path!r} does not exist (paths are relative to the '
                                f'current directory; configs live under configs/)')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def set_work_dir(cfg: Config, config_path: str, work_dir: Optional[str]) -> None:
    """``--work-dir`` wins, then the config's own, then ``work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def setup_launcher(cfg: Config, launcher: str) -> None:
    """Record the launcher; on a CPU-only machine start gloo and wrap DDP for CPU modules."""
    cfg.launcher = launcher
    os.environ.setdefault('LOCAL_RANK', '0')
    if cpu_distributed_requested(launcher):
        init_cpu_distributed(launcher=launcher)
        configure_cpu_ddp(cfg)


def enable_amp(cfg: Config) -> None:
    """``--amp``: fp16 with dynamic loss scaling on a GPU, bf16 autocast on the CPU."""
    optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if optim_wrapper in ('AmpOptimWrapper', 'mmeffattn.CPUAutocastOptimWrapper'):
        return
    if optim_wrapper != 'OptimWrapper':
        raise ValueError(f'--amp works with the plain OptimWrapper, but the config uses '
                         f'{optim_wrapper!r}; set the mixed-precision wrapper in the config '
                         f'instead')
    if torch.cuda.is_available():
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
        return
    nms_key = _training_nms_key(cfg.get('model', {}).get('train_cfg'), 'model.train_cfg')
    if nms_key:
        raise ValueError(f'--amp on the CPU trains under bf16 autocast, but this model runs '
                         f"mmcv's NMS while training ({nms_key}), whose CPU kernel takes fp32 "
                         f'boxes only (it stops with "expected scalar type Float but found '
                         f'BFloat16"). Train this config without --amp on a CPU, or with --amp '
                         f"on a GPU (fp16, which mmcv's CUDA NMS takes)")
    cfg.optim_wrapper.type = 'mmeffattn.CPUAutocastOptimWrapper'


def _training_nms_key(train_cfg: object, key: str) -> Optional[str]:
    """The dotted key of the first ``nms`` in a model's ``train_cfg`` (e.g. Mask R-CNN's
    ``model.train_cfg.rpn_proposal.nms``), or None."""
    if isinstance(train_cfg, dict):
        if train_cfg.get('nms') is not None:
            return f'{key}.nms'
        children = ((f'{key}.{name}', value) for name, value in train_cfg.items())
    elif isinstance(train_cfg, (list, tuple)):  # e.g. Cascade R-CNN's per-stage rcnn settings
        children = ((f'{key}[{i}]', value) for i, value in enumerate(train_cfg))
    else:
        return None
    return next(filter(None, (_training_nms_key(value, k) for k, value in children)), None)


def prepare_runtime() -> None:
    """What :mod:`mmeffattn.engine.patch_mmengine` does (idempotent): our checkpoint I/O in
    mmengine's Runner and ``mmeffattn::`` config paths."""
    install_checkpoint_io()
    register_config_package()


def add_exact_resume_hook(cfg: Config) -> None:
    """Add :class:`~mmeffattn.engine.ExactResumeHook` to ``custom_hooks`` unless it is there."""
    hooks = list(cfg.get('custom_hooks') or [])
    if not any(isinstance(h, dict) and str(h.get('type', '')).split('.')[-1] == 'ExactResumeHook'
               for h in hooks):
        hooks.append(dict(type='ExactResumeHook'))
    cfg.custom_hooks = hooks


def configure_resume(cfg: Config, resume: Optional[str]) -> None:
    """Turn ``--resume [PATH]`` (``'auto'``: :func:`find_resume_checkpoint`, none: a fresh
    start) into ``cfg.resume``/``cfg.load_from``; a ``None`` seed is taken from the checkpoint."""
    if resume is None:
        return
    if resume == 'auto':
        path = find_resume_checkpoint(cfg.work_dir)
        if path is None:
            # printed: no logger of this run exists yet, and a stale MMLogger would swallow it
            print_log(f'WARNING: --resume: there is no checkpoint to resume from in '
                      f'{cfg.work_dir!r} (no last_checkpoint record and no *.pth): training starts '
                      f'from scratch', logger=None)
            cfg.resume = False
            return
        print_log(f'--resume: resuming from {path}', logger='current')
    else:
        path = resume
    # a folder is probably the work dir, whose latest checkpoint --resume alone finds
    meta = load_checkpoint_file(path, mmap=True, hint='pass --resume PATH with an intact '
                                'checkpoint, e.g. an earlier one in the same folder',
                                folder_hint=f'--resume with no value to continue from the latest '
                                f'checkpoint in the work dir (--work-dir {path} --resume for '
                                f'this folder)').get('meta')
    cfg.resume, cfg.load_from = True, path
    randomness = dict(cfg.get('randomness') or {})
    if randomness.get('seed') is None and isinstance(meta, dict) and meta.get('seed') is not None:
        randomness['seed'] = meta['seed']
        cfg.randomness = randomness


#: the keyword arguments of ``torch.compile`` that ``compile=dict(...)`` may set
COMPILE_KEYS = ('fullgraph', 'dynamic', 'backend', 'mode', 'options', 'disable')


def check_compile_option(cfg: Config) -> None:
    """Check ``compile`` (a bool or a dict of ``torch.compile`` arguments) before anything is
    built, naming the config key."""
    option = cfg.get('compile')
    if option is None or isinstance(option, bool):
        return
    if not isinstance(option, dict):
        raise ValueError(f'compile={option!r}: use compile=True or a dict of torch.compile '
                         f'arguments, e.g. --cfg-options compile.backend=inductor '
                         f'compile.dynamic=False')
    unknown = sorted(set(option) - set(COMPILE_KEYS))
    if unknown:
        raise ValueError(f'compile has unknown keys {unknown}: torch.compile takes '
                         f'{", ".join(COMPILE_KEYS)}')
    backend, mode = option.get('backend', 'inductor'), option.get('mode')
    if isinstance(backend, str):  # (a callable backend is torch.compile's to check)
        backends = torch._dynamo.list_backends(exclude_tags=())
        if backend not in backends:
            raise ValueError(f'compile.backend={backend!r} is not a torch.compile backend; use '
                             f'one of {", ".join(backends)}')
    if mode is not None:
        modes = list(torch._inductor.list_mode_options())
        if mode not in modes:
            raise ValueError(f'compile.mode={mode!r} is not a torch.compile mode; use one of '
                             f'{", ".join(modes)} (or leave it unset)')
    for key in ('fullgraph', 'disable'):
        if not isinstance(option.get(key, False), bool):
            raise ValueError(f'compile.{key} must be True or False, got {option[key]!r}')
    if option.get('dynamic') not in (None, True, False):
        raise ValueError(f"compile.dynamic must be True, False or None, got {option['dynamic']!r}")


def _keep_eager(obj: object, name: str) -> None:
    """Run ``obj.<name>`` outside ``torch.compile`` (set on the instance: the class is shared)."""
    setattr(obj, name, torch.compiler.disable(getattr(obj, name), recursive=True))


def prepare_compile(runner) -> None:
    """mmengine's ``compile`` option for our models: the data preprocessor and the optimizer
    update stay eager (docs/user_guides/compile_export.md)."""
    if not runner.cfg.get('compile'):
        return
    compile_step = runner._maybe_compile

    def maybe_compile(target: str) -> None:
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        if getattr(model, 'data_preprocessor', None) is not None:
            _keep_eager(model.data_preprocessor, 'forward')
        if target == 'train_step':
            wrappers = runner.optim_wrapper
            for wrapper in (wrappers.values() if hasattr(wrappers, 'values') else [wrappers]):
                _keep_eager(wrapper, 'update_params')
        compile_step(target)
        if target == 'train_step':
            _draw_before_each_step(runner.model, model)

    runner._maybe_compile = maybe_compile


def _draw_before_each_step(wrapped, model: torch.nn.Module) -> None:
    """Call ``draw_for_next_forward`` (VECA's nested core dropout) eagerly before each compiled
    ``train_step``: the compiled forward only reads the drawn shape."""
    drawers = [m for m in model.modules() if hasattr(m, 'draw_for_next_forward')]
    if not drawers:
        return
    # each drawn value (VECA's active core chunks) is its own graph: allow more than dynamo's 8
    variants = sum(len(getattr(m, 'budgets', ())) for m in drawers)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               8 + variants)
    compiled = wrapped.train_step

    def train_step(*args, **kwargs):
        for m in drawers:
            m.draw_for_next_forward()
        return compiled(*args, **kwargs)

    wrapped.train_step = train_step


def load_whole_checkpoints(runner, loaded: Optional[dict] = None) -> None:
    """Make the Runner's ``load_from`` strict (mmengine's is not) and able to read paths, URLs
    and official layouts (:func:`mmeffattn.models.converters.model_checkpoint`; ``loaded``: the
    file, already read)."""
    from mmengine.runner.checkpoint import load_state_dict

    from ..models.converters import model_checkpoint

    pending = [loaded]  # (not kept once loaded)

    def load_checkpoint(filename, map_location='cpu', strict=False, revise_keys=None):
        checkpoint = model_checkpoint(runner.model, filename, map_location,
                                      loaded=pending.pop() if pending else None)
        runner.call_hook('after_load_checkpoint', checkpoint=checkpoint)  # (EMA hooks)
        load_state_dict(runner.model, checkpoint['state_dict'], strict=True)  # (checked)
        runner._has_loaded = True
        runner.logger.info(f'Load checkpoint from {filename}')
        return checkpoint

    runner.load_checkpoint = load_checkpoint


def close_distributed() -> None:
    """Wait for every rank, then destroy the process group (at interpreter shutdown, gloo's
    threads could abort a finished run)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_cli(main: Callable[[], object]) -> None:
    """Run a tool's ``main``: a bad checkpoint or annotation file ends it with one line on
    stderr instead of a traceback; a distributed run closes its process group."""
    try:
        main()
    except (CheckpointError, AnnotationFileError) as e:
        sys.stderr.write(f'ERROR: {e}\n')
        sys.exit(1)
    close_distributed()
