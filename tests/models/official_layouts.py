"""Official checkpoint layouts written from seeded models of ours, by inverting the documented key
mapping of each family's converter (the official code is never imported): the files that
tests/models/test_official_pretrained.py, test_weights_by_url.py and test_verify_port.py load;
and a local HTTP server that serves them at URLs shaped like the authors' own."""
import http.server
import logging
import re
import threading

import pytest
import torch
from mmengine.logging import MMLogger

from mmeffattn.models.backbones.sema import MILA
from mmeffattn.models.backbones.veca import VECA
from mmeffattn.models.backbones.weightformer import WeightFormer, is_dynamic_block


# ------------------------------------------------------------------ official layouts, inverted
def to_official_mlla(sd: dict, head: dict = None) -> dict:
    """Ours -> an official MLLA classification checkpoint: the same names, plus the classifier
    (``head``, the ``head.fc.*`` of a classifier, or random), the classification norm (our
    ``norm3`` where the model has it) and a fixed-size RoPE table (dropped on load); no
    per-output norms."""
    out = {k: v for k, v in sd.items() if not re.match(r'norm\d+\.', k)}
    c = sd['layers.3.blocks.0.norm1.weight'].numel()
    out.update({'norm.weight': sd.get('norm3.weight', torch.ones(c)),
                'norm.bias': sd.get('norm3.bias', torch.zeros(c)),
                'layers.0.blocks.0.attn.rope.rotations': torch.randn(7, 7, 8)})
    out.update(_official_head(head, c))
    return {'model': out}


def _official_head(head: dict, c: int) -> dict:
    """``head.weight``/``head.bias`` from a classifier's ``head.fc.*``, or random (10 classes)."""
    if head is None:
        return {'head.weight': torch.randn(10, c), 'head.bias': torch.zeros(10)}
    return {'head.' + k.split('.')[-1]: v for k, v in head.items()}


def to_official_weightformer(sd: dict, depth: int, head: dict = None) -> dict:
    """Ours -> official ``model/wfm.py`` names (the converter's table, read right to left)."""
    out = {}
    for k, v in sd.items():
        m = re.match(r'blocks\.(\d+)\.(.+)$', k)
        if k.startswith('patch_embed.proj.'):
            out[k] = v
        elif k.startswith('patch_embed.norm.'):
            out['init_norm.' + k.split('.')[-1]] = v
        elif k.startswith(f'norm{depth - 1}.'):
            out['norm.' + k.split('.')[-1]] = v
        elif m:
            i, rest = int(m.group(1)), m.group(2)
            dyn = is_dynamic_block(i)
            rest = (rest.replace('mlp.fc2.', 'linear2.').replace('kernel_gen.', 'wfm.')
                    .replace('mlp.fc1.token_proj.', 'linear1.wfm.')
                    .replace('mlp.fc1.in_basis', 'linear1.w1')
                    .replace('mlp.fc1.out_basis', 'linear1.w2'))
            if dyn and rest == 'mlp.fc1.weight':
                rest, v = 'linear1.w', v.t().contiguous()  # official w is [in, out]
            elif dyn and rest == 'mlp.fc1.bias':
                rest = 'linear1.b'
            elif dyn and rest in ('dwc.weight', 'dwc.bias'):
                rest = 'dwc.' + rest[4]  # dwc.w / dwc.b
            rest = rest.replace('mlp.fc1.', 'linear1.')
            out[f'blocks.{i}.{rest}'] = v
        else:
            raise AssertionError(f'unexpected key {k}')
    out.update(_official_head(head, sd['patch_embed.proj.bias'].numel()))
    return {'model': out}


_VECA_BLOCK = {'norm1': 'norm_attn', 'norm2': 'norm_ffn', 'attn.q': 'attn.q_proj',
               'attn.k': 'attn.k_proj', 'attn.v': 'attn.v_proj', 'attn.proj': 'attn.out_proj',
               'ffn.fc1': 'fc1', 'ffn.fc2': 'fc2'}


def to_official_veca(sd: dict, depth: int) -> dict:
    """Ours -> an official VECA training checkpoint (weights under ``student``)."""
    out, alpha = {}, {}
    for k, v in sd.items():
        m = re.match(r'blocks\.(\d+)\.(norm1|norm2|attn\.\w+|ffn\.fc\d)\.(\w+)$', k)
        c = re.match(r'blocks\.(\d+)\.coord_head\.(fc\.(\w+)|alpha)$', k)
        if m:
            out[f'blocks.{m.group(1)}.{_VECA_BLOCK[m.group(2)]}.{m.group(3)}'] = v
        elif c and c.group(2) == 'alpha':
            alpha[int(c.group(1))] = v
        elif c:
            out[f'pos_linears.{int(c.group(1)) - 1}.{c.group(3)}'] = v
        elif k.startswith('core_tokens.'):
            out['query_token_chunks.' + k.split('.')[1]] = v
        elif k.startswith('core_coords.'):
            out['qcoord_chunks.' + k.split('.')[1]] = v
        elif k.startswith(f'norm{depth - 1}.'):
            out['final_norm.' + k.split('.')[-1]] = v
        elif k.startswith('patch_embed.'):
            out[k] = v
        else:
            raise AssertionError(f'unexpected key {k}')
    out['pos_alpha'] = torch.stack([alpha[i] for i in range(1, depth)])
    return {'student': out, 'optimizer': {}, 'config': {'model_family': 'custom'}}


def classifier_to_official(layout: str, sd: dict, depth: int) -> dict:
    """An mmpretrain classifier's state dict (``backbone.*``, ``head.fc.*``) in the official
    ``layout`` (VECA's has no classifier: its head is left out)."""
    backbone = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    head = {k: v for k, v in sd.items() if k.startswith('head.fc.')}
    if layout == 'MLLA':
        return to_official_mlla(backbone, head)
    if layout == 'WeightFormer':
        return to_official_weightformer(backbone, depth, head)
    return to_official_veca(backbone, depth)


class LocalServer:
    """``http.server`` on 127.0.0.1 in a thread; ``files`` maps a path (with its query) to
    bytes; ``requests`` lists what was asked for; paths in ``cut`` send half their bytes and
    close the connection (a download broken off)."""

    def __init__(self):
        self.files, self.requests, self.cut = {}, [], set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                body = outer.files.get(self.path)
                if body is None:
                    self.send_error(404, 'Not Found')
                    return
                self.send_response(200)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2] if self.path in outer.cut else body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base = f'http://127.0.0.1:{self.httpd.server_address[1]}'

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A :class:`LocalServer`, downloads cached under a temporary TORCH_HOME (import it into a
    test module to use it)."""
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    srv = LocalServer()
    yield srv
    srv.close()


def init_weights_logged(model, level: int = logging.INFO) -> list:
    """``model.init_weights()``; returns the ``(levelno, message)`` it logged at ``level`` or
    above."""
    logger, records = MMLogger.get_current_instance(), []
    handler = logging.Handler(level)
    handler.emit = lambda r: records.append((r.levelno, r.getMessage()))
    logger.addHandler(handler)
    try:
        model.init_weights()
    finally:
        logger.removeHandler(handler)
    return records


def seeded(cls, keep=None, **kwargs):
    """A seeded model whose parameters are moved off their init (so that a missed key shows),
    except those matching ``keep`` (the parts an official checkpoint lacks keep their init)."""
    torch.manual_seed(0)
    model = cls(**kwargs).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if keep is None or not re.match(keep, name):
                p.add_(torch.randn_like(p) * .02)
    return model


CASES = {
    # the official MLLA classifier has no per-output norms: they keep their init
    'MLLA': (MILA, dict(arch=MILA.mini_arch, drop_path_rate=0., keep=r'norm\d+\.'),
             lambda m: to_official_mlla(m.state_dict()), (1, 3, 64, 64)),
    'WeightFormer': (WeightFormer, dict(arch=WeightFormer.mini_arch, out_type='featmap',
                                        out_indices=(-1, )),
                     lambda m: to_official_weightformer(m.state_dict(), m.depth), (1, 3, 48, 64)),
    'VECA': (VECA, dict(arch=VECA.mini_arch, out_type='raw', num_cores=16,
                        nested_dropout=False),
             lambda m: to_official_veca(m.state_dict(), m.arch_settings['depth']),
             (1, 3, 48, 64)),
}
