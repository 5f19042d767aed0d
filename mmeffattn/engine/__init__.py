from .compat import (allow_mmengine_checkpoints, configure_cpu_ddp, cpu_distributed_requested,
                     init_cpu_distributed)
from .data_check import check_dataset_paths
from .optim_wrapper import CPUAutocastOptimWrapper

__all__ = ['allow_mmengine_checkpoints', 'configure_cpu_ddp', 'cpu_distributed_requested',
           'init_cpu_distributed', 'check_dataset_paths', 'CPUAutocastOptimWrapper']
