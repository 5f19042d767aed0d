"""What tools/train.py and tools/test.py share: config loading and the runtime set-up that makes
one set of tools serve mmdet, mmseg and mmpretrain configs on GPUs and CPUs alike."""
import os
import os.path as osp
from typing import Optional

import torch
from mmengine.config import Config, DictAction  # noqa: F401  (re-exported for the tools)

from .compat import (allow_mmengine_checkpoints, configure_cpu_ddp, cpu_distributed_requested,
                     init_cpu_distributed)


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
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = '0'
    if cpu_distributed_requested(launcher):
        init_cpu_distributed()
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
    else:
        cfg.optim_wrapper.type = 'mmeffattn.CPUAutocastOptimWrapper'


def prepare_runtime() -> None:
    """Process-wide settings every tool needs before building a Runner."""
    allow_mmengine_checkpoints()
