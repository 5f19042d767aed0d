#!/usr/bin/env python
"""Convert an official MLLA checkpoint (github.com/LeapLabTHU/MLLA) to an mmpretrain checkpoint.

    python tools/model_converters/mlla_official.py mlla_t.pth mila-t_mmpretrain.pth

DST holds ``backbone.*`` and ``head.fc.*`` keys for configs/mila/mila-t_8xb128_in1k.py
(:func:`mmeffattn.models.converters.convert_official`).
"""
from typing import Optional, Sequence

from mmeffattn.models.converters import converter_main


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return converter_main('MLLA', argv)


if __name__ == '__main__':
    main()
