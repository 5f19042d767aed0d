"""Runtime pieces for mmengine's Runner: hooks, the CPU optimizer wrapper, checkpoint I/O.

Importing this package registers the hooks and the wrapper and changes nothing in mmengine; the
checkpoint patches are the opt-in :mod:`mmeffattn.engine.patch_mmengine`."""
from .checkpoint_io import (CheckpointError, CheckpointNotFoundError, atomic_save, atomic_write,
                            checkpoint_cache_path, download_checkpoint, find_resume_checkpoint,
                            install_checkpoint_io, load_checkpoint_file, mmengine_safe_globals,
                            mmengine_safe_loading, open_checkpoint)
from .compat import configure_cpu_ddp, cpu_distributed_requested, init_cpu_distributed
from .data_check import AnnotationFileError, check_annotation_files, check_dataset_paths
from .exact_resume import ExactResumeHook, get_rng_state, set_rng_state
from .mesa import MESAHook
from .optim_wrapper import CPUAutocastOptimWrapper

__all__ = ['configure_cpu_ddp', 'cpu_distributed_requested', 'init_cpu_distributed',
           'check_dataset_paths', 'check_annotation_files', 'AnnotationFileError',
           'CPUAutocastOptimWrapper', 'CheckpointError', 'CheckpointNotFoundError', 'atomic_save',
           'atomic_write', 'checkpoint_cache_path', 'download_checkpoint',
           'find_resume_checkpoint', 'install_checkpoint_io', 'load_checkpoint_file',
           'mmengine_safe_globals', 'mmengine_safe_loading', 'open_checkpoint', 'ExactResumeHook',
           'MESAHook', 'get_rng_state', 'set_rng_state']
