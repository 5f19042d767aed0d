"""Glue for mmengine 0.10.7: distributed runs on CPU-only machines (gloo, DDP of a CPU module;
mmengine's launchers select a CUDA device) and the ``mmeffattn::`` config prefix."""
import os
import os.path as osp

import torch
import torch.distributed as dist


def cpu_distributed_requested(launcher: str) -> bool:
    """True when a distributed launcher is used on a machine without CUDA."""
    return launcher != 'none' and not torch.cuda.is_available()


def init_cpu_distributed(timeout_s: int = 1800, launcher: str = 'pytorch') -> None:
    """Start a gloo process group from the torchrun environment (RANK, WORLD_SIZE, ...); the
    error names ``launcher`` when that environment is missing."""
    if dist.is_available() and dist.is_initialized():
        return
    missing = [k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
               if k not in os.environ]
    if missing and launcher == 'pytorch':
        raise RuntimeError(
            f'--launcher pytorch needs the torchrun environment, but {missing} are not set: start '
            f'the run with tools/dist_train.sh or tools/dist_test.sh (or torchrun), not plain '
            f'python.')
    if missing:
        raise RuntimeError(
            f"--launcher {launcher} needs a CUDA GPU (mmengine's {launcher} launcher selects "
            f'one), and this machine has none: on CPUs the tools run distributed only with '
            f'--launcher pytorch under torchrun (bash tools/dist_train.sh CONFIG NUM_PROCS, or '
            f'tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS), or in one process without '
            f'--launcher.')
    import datetime
    dist.init_process_group(backend='gloo', timeout=datetime.timedelta(seconds=timeout_s))


def configure_cpu_ddp(cfg) -> None:
    """Make mmengine wrap the model in DDP over CPU tensors."""
    cfg.model_wrapper_cfg = {  # the config's own settings win, but the device is the CPU
        'type': 'MMDistributedDataParallel', 'broadcast_buffers': False,
        'find_unused_parameters': cfg.get('find_unused_parameters', False),
        **(cfg.get('model_wrapper_cfg') or {}), 'device_ids': None}
    cfg.merge_from_dict({'env_cfg.dist_cfg.backend': 'gloo'})


def register_config_package() -> None:
    """Let configs inherit ours as ``_base_ = 'mmeffattn::sema/...py'`` (mmengine resolves
    ``pkg::`` only for its known packages, and misses an editable install)."""
    from mmengine.config import config as cfg_module
    from mmengine.config import utils as cfg_utils
    cfg_utils.MODULE2PACKAGE.setdefault('mmeffattn', 'mmeffattn')
    lookup = cfg_module.get_installed_path
    if getattr(lookup, 'mmeffattn_aware', False):
        return

    def get_installed_path(package: str) -> str:
        if package == 'mmeffattn':
            return osp.dirname(osp.dirname(osp.abspath(__file__)))  # mmeffattn/engine/..
        return lookup(package)

    get_installed_path.mmeffattn_aware = True
    cfg_module.get_installed_path = get_installed_path
