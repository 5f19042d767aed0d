#!/usr/bin/env python
"""Convert an official VECA checkpoint (github.com/alansong1322/VECA) to an mmeffattn checkpoint.

    python tools/model_converters/veca_official.py veca_small.pt veca-s_mmeffattn.pth

SRC is the authors' training checkpoint (the student under ``student``, next to the optimizers,
schedulers and ``config``) or a bare state dict. The official VECA is a distilled backbone with
no classifier, so DST holds ``backbone.*`` keys only (``{'state_dict', 'meta'}``): they load
strictly into ``meta['backbone']`` (``mmeffattn.VECA``, ``out_type='raw'``) and, with
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``, into the backbones of
configs/veca. The conversion is :func:`mmeffattn.models.converters.convert_official`.
"""
from typing import Optional, Sequence

from mmeffattn.models.converters import converter_main


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return converter_main('VECA', argv)


if __name__ == '__main__':
    main()
