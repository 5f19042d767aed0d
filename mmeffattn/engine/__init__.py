from .checkpoint_io import (CheckpointError, CheckpointNotFoundError, atomic_save, atomic_write,
                            find_resume_checkpoint, install_checkpoint_io, load_checkpoint_file,
                            mmengine_safe_globals, mmengine_safe_loading)
from .compat import (allow_mmengine_checkpoints, configure_cpu_ddp, cpu_distributed_requested,
                     init_cpu_distributed)
from .data_check import AnnotationFileError, check_annotation_files, check_dataset_paths
from .exact_resume import ExactResumeHook, get_rng_state, set_rng_state
from .mesa import MESAHook
from .optim_wrapper import CPUAutocastOptimWrapper

__all__ = ['allow_mmengine_checkpoints', 'configure_cpu_ddp', 'cpu_distributed_requested',
           'init_cpu_distributed', 'check_dataset_paths', 'check_annotation_files',
           'AnnotationFileError', 'CPUAutocastOptimWrapper', 'CheckpointError',
           'CheckpointNotFoundError', 'atomic_save', 'atomic_write', 'find_resume_checkpoint',
           'install_checkpoint_io', 'load_checkpoint_file', 'mmengine_safe_globals',
           'mmengine_safe_loading', 'ExactResumeHook', 'MESAHook', 'get_rng_state', 'set_rng_state']
