"""Deployment of models built with mmeffattn: ONNX export and its onnxruntime check
(:mod:`.onnx`). Needs the ``deploy`` extra (``pip install mmeffattn[deploy]``): onnx,
onnxscript and onnxruntime, imported only when a function needs them."""
from .onnx import (ExportWrapper, check_parity, check_sizes, export_onnx, input_dims,
                   onnx_session, preprocess_meta, require_onnx, translation_table)

__all__ = ['ExportWrapper', 'check_parity', 'check_sizes', 'export_onnx', 'input_dims',
           'onnx_session', 'preprocess_meta', 'require_onnx', 'translation_table']
