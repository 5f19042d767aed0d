from .laplacianformer import LaplacianFormer
from .sema import MILA, SEMA, checkpoint_filter_mlla
from .veca import VECA, convert_veca
from .weightformer import WeightFormer, convert_weightformer

__all__ = ['SEMA', 'MILA', 'checkpoint_filter_mlla', 'WeightFormer', 'convert_weightformer',
           'LaplacianFormer', 'VECA', 'convert_veca']
