"""mmeffattn's registries: children of mmengine's root registries.

Because they are children of the root, any downstream library (mmdet, mmseg, mmpretrain) resolves
``type='mmeffattn.SEMA'`` once ``custom_imports=dict(imports=['mmeffattn'])`` has run."""
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, locations=['mmeffattn.models'])
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, locations=['mmeffattn.datasets'])
OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS,
                          locations=['mmeffattn.engine'])
