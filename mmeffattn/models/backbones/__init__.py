from .sema import MILA, SEMA, checkpoint_filter_mlla
from .weightformer import WeightFormer, convert_weightformer  # noqa: F401

__all__ = ['SEMA', 'MILA', 'checkpoint_filter_mlla']
