from .sema import MILA, SEMA, checkpoint_filter_mlla

__all__ = ['SEMA', 'MILA', 'checkpoint_filter_mlla']
