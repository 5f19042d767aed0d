from .laplacianformer import LaplacianFormer
from .sema import MILA, SEMA, checkpoint_filter_mlla
from .veca import VECA
from .weightformer import WeightFormer

__all__ = ['SEMA', 'MILA', 'checkpoint_filter_mlla', 'WeightFormer', 'LaplacianFormer', 'VECA']
