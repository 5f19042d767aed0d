from .arch import resolve_arch
from .freeze import FreezeStagesMixin
from .init import init_linear_and_norm, parse_out_indices
from .pretrained import (StrictPretrainedMixin, clip_keys, load_state_dict_strict,
                         read_checkpoint, strip_key_prefix, strip_module_prefix,
                         unwrap_state_dict)

__all__ = ['FreezeStagesMixin', 'StrictPretrainedMixin', 'clip_keys', 'unwrap_state_dict',
           'init_linear_and_norm', 'parse_out_indices', 'resolve_arch',
           'load_state_dict_strict', 'read_checkpoint', 'strip_key_prefix',
           'strip_module_prefix']
