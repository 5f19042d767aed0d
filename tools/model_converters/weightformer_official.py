#!/usr/bin/env python
"""Convert an official WeightFormer checkpoint (github.com/LeapLabTHU/WeightFormer) to mmpretrain.

    python tools/model_converters/weightformer_official.py wfm-t.pth wfm-t_mmpretrain.pth

SRC is the authors' file: a training checkpoint (weights under ``model``, with ``optimizer``,
``epoch``, the yacs ``config``...), a bare state dict, or the Hugging Face Hub's
``model.safetensors``. DST gets ``{'state_dict', 'meta'}`` with ``backbone.*`` and ``head.fc.*``
keys that mmengine's own loader reads strictly into the classifier of
configs/weightformer/weightformer-t_8xb256_in1k.py (WeightFormer, ``out_type='avgpool'``,
``neck=None``, ``LinearClsHead``). The conversion is
:func:`mmeffattn.models.converters.convert_official`.
"""
from typing import Optional, Sequence

from mmeffattn.models.converters import converter_main


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return converter_main('WeightFormer', argv)


if __name__ == '__main__':
    main()
