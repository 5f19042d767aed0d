#!/usr/bin/env python
"""Convert an official VECA checkpoint (github.com/alansong1322/VECA) to an mmeffattn checkpoint.

    python tools/model_converters/veca_official.py veca_small.pt veca-s_mmeffattn.pth

VECA is a distilled backbone: DST holds ``backbone.*`` keys for the backbones of configs/veca,
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``
(:func:`mmeffattn.models.converters.convert_official`).
"""
from typing import Optional, Sequence

from mmeffattn.models.converters import converter_main


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return converter_main('VECA', argv)


if __name__ == '__main__':
    main()
