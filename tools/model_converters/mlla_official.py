#!/usr/bin/env python
"""Convert an official MLLA checkpoint (github.com/LeapLabTHU/MLLA) to an mmpretrain checkpoint.

    python tools/model_converters/mlla_official.py mlla_t.pth mila-t_mmpretrain.pth

SRC is the authors' file (the weights under ``model``, head included, with or without the
training state). DST gets ``{'state_dict', 'meta'}`` with ``backbone.*`` and ``head.fc.*`` keys
that mmengine's own loader reads strictly into the classifier of
configs/mila/mila-t_8xb128_in1k.py (MILA, ``out_indices=(3, )``, the classification norm as
``norm3``), so mmpretrain's and mmdet's tools take it unchanged. The conversion is
:func:`mmeffattn.models.converters.convert_official`.
"""
from typing import Optional, Sequence

from mmeffattn.models.converters import converter_main


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return converter_main('MLLA', argv)


if __name__ == '__main__':
    main()
