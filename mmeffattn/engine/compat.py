"""Glue between the pinned stack's versions (torch 2.14, mmengine 0.10.7) on any device.

Two problems that every OpenMMLab user of this stack meets, solved once here:

* torch >= 2.6 loads checkpoints with ``weights_only=True``; mmengine 0.10.7 stores its message
  hub (``HistoryBuffer`` of numpy arrays) in every checkpoint, so ``--resume`` and ``load_from``
  fail with "Unsupported global". We allow-list exactly the classes mmengine's own checkpoints
  contain, keeping the safe loader on (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` would turn it off
  for everything, including untrusted files).
* mmengine's ``pytorch`` launcher calls ``torch.cuda.set_device``; on a CPU-only machine we start
  the gloo process group ourselves (mmengine then skips its own) and make DDP wrap a CPU module
  (``device_ids=None``).
"""
import os
from typing import List

import torch
import torch.distributed as dist


def _numpy_safe_globals() -> List[object]:
    import numpy as np
    found: List[object] = [np.ndarray, np.dtype]
    core = getattr(np, '_core', None) or getattr(np, 'core')
    found += [core.multiarray._reconstruct, core.multiarray.scalar]
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:  # numpy >= 1.25 pickles dtypes as np.dtypes.<Name>DType classes
        found += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    return found


def allow_mmengine_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` read checkpoints written by mmengine's Runner."""
    add = getattr(torch.serialization, 'add_safe_globals', None)
    if add is None:  # torch < 2.4 does not restrict loading by default
        return
    from mmengine.logging import HistoryBuffer
    from mmengine.config import ConfigDict
    import builtins
    import collections
    # ``getattr`` is how mmengine's HistoryBuffer pickles its numpy statistics methods.
    add([HistoryBuffer, ConfigDict, builtins.getattr, collections.OrderedDict,
         *_numpy_safe_globals()])


def cpu_distributed_requested(launcher: str) -> bool:
    """True when a distributed launcher is used on a machine without CUDA."""
    return launcher != 'none' and not torch.cuda.is_available()


def init_cpu_distributed(timeout_s: int = 1800) -> None:
    """Start a gloo process group from the torchrun environment (RANK, WORLD_SIZE, ...)."""
    if dist.is_available() and dist.is_initialized():
        return
    missing = [k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
               if k not in os.environ]
    if missing:
        raise RuntimeError(
            f'--launcher pytorch needs the torchrun environment, but {missing} are not set: start '
            f'the run with tools/dist_train.sh (or torchrun), not plain python.')
    import datetime
    dist.init_process_group(backend='gloo', timeout=datetime.timedelta(seconds=timeout_s))


def configure_cpu_ddp(cfg) -> None:
    """Make mmengine wrap the model in DDP over CPU tensors."""
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    wrapper.setdefault('type', 'MMDistributedDataParallel')
    wrapper['device_ids'] = None
    wrapper.setdefault('broadcast_buffers', False)
    wrapper.setdefault('find_unused_parameters', cfg.get('find_unused_parameters', False))
    cfg.model_wrapper_cfg = wrapper
    env = cfg.setdefault('env_cfg', {})
    env.setdefault('dist_cfg', {})['backend'] = 'gloo'


def register_config_package() -> None:
    """Let configs inherit ours as ``_base_ = 'mmeffattn::sema/...py'``.

    mmengine 0.10.7 resolves ``pkg::`` only for packages in its fixed ``MODULE2PACKAGE`` table,
    so the name is added there; it then finds the configs under ``mmeffattn/.mim/configs``. This
    runs on ``import mmeffattn``, i.e. in our tools before any config is parsed.
    """
    from mmengine.config import utils as cfg_utils
    cfg_utils.MODULE2PACKAGE.setdefault('mmeffattn', 'mmeffattn')
