#!/usr/bin/env python
"""Convert an official WeightFormer checkpoint (github.com/LeapLabTHU/WeightFormer) to mmpretrain.

    python tools/model_converters/weightformer_official.py wfm-t.pth wfm-t_mmpretrain.pth

SRC: a training checkpoint, a bare state dict or the Hub's ``model.safetensors``. DST holds
``backbone.*`` and ``head.fc.*`` keys for configs/weightformer/weightformer-t_8xb256_in1k.py
(:func:`mmeffattn.models.converters.convert_official`).
"""
from typing import Optional, Sequence

from mmeffattn.models.converters import converter_main


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return converter_main('WeightFormer', argv)


if __name__ == '__main__':
    main()
