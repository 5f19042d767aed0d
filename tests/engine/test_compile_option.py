"""The ``compile`` config option (``--cfg-options compile=...``) as tools/train.py and
tools/test.py check it before anything is built; its runs are in tests/e2e/test_compile_option_e2e.py."""
import pytest
from mmengine.config import Config

import torch
from mmeffattn.engine.runner_setup import _draw_before_each_step, check_compile_option


@pytest.mark.parametrize('option', [None, True, False, dict(backend='aot_eager', dynamic=False)],
                         ids=['unset', 'true', 'false', 'dict'])
def test_valid_options_pass(option):
    cfg = Config(dict(compile=option) if option is not None else {})
    check_compile_option(cfg)
    assert cfg.get('compile') == option  # left as given


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match=r"compile has unknown keys \['backnd'\]"):
        check_compile_option(Config(dict(compile=dict(backnd='inductor'))))


@pytest.mark.parametrize('option,match', [
    (dict(backend='nonexistent_backend'), r"compile\.backend='nonexistent_backend' is not a "
                                          r'torch\.compile backend; use one of .*inductor'),
    (dict(mode='bogus'), r"compile\.mode='bogus' is not a torch\.compile mode; use one of "
                         r'.*max-autotune'),
    (dict(fullgraph='yes'), r"compile\.fullgraph must be True or False, got 'yes'"),
    (dict(dynamic=1.5), r'compile\.dynamic must be True, False or None, got 1\.5'),
], ids=['backend', 'mode', 'fullgraph', 'dynamic'])
def test_bad_values_are_named(option, match):
    """Refused before the build, naming the key (torch raised only when the run compiled)."""
    with pytest.raises(ValueError, match=match):
        check_compile_option(Config(dict(compile=option)))


def test_not_a_bool_or_dict():
    with pytest.raises(ValueError, match="compile='yes': use compile=True or a dict"):
        check_compile_option(Config(dict(compile='yes')))


def test_compiled_train_step_draws_before_each_step():
    """Modules with ``draw_for_next_forward`` (VECA's nested dropout) draw eagerly before each
    compiled ``train_step``, before the step runs."""
    events = []

    class Drawer(torch.nn.Module):
        def draw_for_next_forward(self):
            events.append('draw')

    class Wrapped:
        def train_step(self, data):
            events.append(f'step {data}')
            return data

    model, wrapped = torch.nn.Sequential(torch.nn.Linear(2, 2), Drawer()), Wrapped()
    _draw_before_each_step(wrapped, model)
    assert wrapped.train_step(1) == 1 and wrapped.train_step(2) == 2
    assert events == ['draw', 'step 1', 'draw', 'step 2']
