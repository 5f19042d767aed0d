"""Every command the user-facing pages give runs as far as its arguments: the script exists,
each flag parses with the tool's own parser, and every config and repository file it names
exists. The pages: README.md, docs/**/*.md, configs/*/README.md (fenced bash/shell blocks and
inline ``python tools/...`` spans; see doc_commands.py).

Upper-case words are placeholders (CONFIG, CKPT, URL, SRC, DST, H, W, ...): CONFIG and CFG stand
for a real config, a single letter for a size, the others for any string. ``[...]`` marks an optional argument and is dropped."""
import argparse
import contextlib
import importlib
import io
import os.path as osp
import re
import shlex
import sys

import pytest

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from doc_commands import ROOT, commands  # noqa: E402

#: a config that stands for the CONFIG / CFG placeholder
ANY_CONFIG = 'configs/sema/sema-t_8xb128_in1k.py'
#: repository folders whose files a command may name; a named path there must exist
REPO_DIRS = ('configs/', 'tools/', 'scripts/', 'demo/', 'docs/', 'requirements/', 'tests/')


class _Parsed(Exception):
    """Raised by the patched parser once the tool's arguments parsed."""


def _placeholder(word: str) -> str:
    if word in ('CONFIG', 'CFG'):
        return ANY_CONFIG
    if re.fullmatch(r'[A-Z]', word):  # a size: --shape H W
        return '224'
    if re.fullmatch(r'[A-Z][A-Z0-9_]*', word):
        return 'placeholder'
    return word


def _args(words):
    return [_placeholder(w) for w in words if not (w.startswith('[') and w.endswith(']'))]


def _parse_with_tool(script: str, argv) -> None:
    """Parse ``argv`` with the tool's own argparse parser: its ``parse_args(argv)`` where it has
    one, else its ``main(argv)`` stopped right after parsing. A bad flag is a SystemExit."""
    module = importlib.import_module(script[:-3].replace('/', '.'))
    if hasattr(module, 'parse_args'):
        module.parse_args(list(argv))
        return
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        module.main(list(argv))
    except _Parsed:
        return
    finally:
        argparse.ArgumentParser.parse_args = real
    raise AssertionError(f'{script}: main() returned without parsing any arguments')


def _tool_and_args(words):
    """``(python script or None, its argv)`` that a command amounts to; shell wrappers are
    unwrapped into the script they run."""
    runner, script, rest = words[0], words[1], _args(words[2:])
    if runner == 'torchrun':
        i = next(i for i, w in enumerate(words) if w.endswith('.py'))
        script, rest = words[i], _args(words[i + 1:])
    if script.endswith('.py'):
        return script, rest
    name = osp.basename(script)
    if name in ('setup.sh', 'gpu_wheels.sh'):
        assert not rest, f'{script} takes no arguments, given {rest}'
        return None, []
    if name == 'test.sh':  # arguments go to pytest: test paths must exist
        for w in rest:
            if w.startswith('tests/'):
                assert osp.exists(osp.join(ROOT, w.split('::')[0])), f'{w} does not exist'
        return None, []
    if name == 'demo.sh':
        return 'tools/demo.py', rest
    if name == 'gpu_device.sh':
        if rest[:1] == ['--time-limit']:
            assert len(rest) > 1 and rest[1].isdigit(), '--time-limit takes seconds'
            rest = rest[2:]
        return 'tools/gpu_check.py', ['--out-dir', 'x'] + rest
    if name == 'dist_train.sh':  # CONFIG GPUS [args]
        assert rest[1].isdigit() or rest[1] == 'placeholder', f'GPUS: {rest[1]}'
        return 'tools/train.py', [rest[0]] + rest[2:]
    if name == 'dist_test.sh':  # CONFIG CKPT GPUS [args]
        return 'tools/test.py', rest[:2] + rest[3:]
    if name == 'slurm_train.sh':  # PARTITION JOB CONFIG WORK_DIR [args]
        return 'tools/train.py', [rest[2], '--work-dir', rest[3]] + rest[4:]
    if name == 'slurm_test.sh':  # PARTITION JOB CONFIG CKPT [args]
        return 'tools/test.py', rest[2:]
    raise AssertionError(f'{script}: the test does not know how this script takes arguments; '
                         f'teach _tool_and_args')


COMMANDS = commands()


def test_the_pages_give_commands():
    """The collector finds the README's and the family pages' commands (a collector that finds
    nothing would pass every check below)."""
    pages = {c.page for c in COMMANDS}
    assert 'README.md' in pages and 'configs/mila/README.md' in pages
    assert any(c.words[:2] == ('python', 'tools/test.py') and c.words[3].startswith('https://')
               for c in COMMANDS), 'no verify command with a URL was collected'
    assert len(COMMANDS) > 50


@pytest.mark.parametrize('cmd', COMMANDS, ids=lambda c: f'{c.page}:{c.line}')
def test_doc_command(cmd):
    where = f'{cmd.page}:{cmd.line}: {shlex.join(cmd.words)}'
    script = cmd.words[1] if cmd.words[0] != 'torchrun' else next(
        w for w in cmd.words if w.endswith('.py'))
    assert osp.isfile(osp.join(ROOT, script)), f'{where}: {script} does not exist'
    for w in _args(cmd.words[2:]):
        for part in w.split('='):
            if part.startswith(REPO_DIRS) and not part.startswith('tests/') and \
                    not osp.exists(osp.join(ROOT, part.split('::')[0])):
                raise AssertionError(f'{where}: {part} does not exist')
    tool, argv = _tool_and_args(cmd.words)
    if tool is None:
        return
    assert osp.isfile(osp.join(ROOT, tool)), f'{where}: {tool} does not exist'
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _parse_with_tool(tool, argv)
    except SystemExit as e:
        raise AssertionError(f'{where}: {tool} rejects {argv}:\n{err.getvalue()}') from e


def test_placeholders_and_options():
    """The rules above: a placeholder config is a real one, ``[...]`` is dropped, a bad flag
    fails the parse."""
    assert _args(['CONFIG', '[CKPT]', 'CKPT', '--out', 'x']) == \
        [ANY_CONFIG, 'placeholder', '--out', 'x']
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        _parse_with_tool('tools/test.py', [ANY_CONFIG, 'ckpt', '--no-such-flag'])
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        _parse_with_tool('tools/analysis_tools/get_flops.py', [ANY_CONFIG, '--shape', 'H'])
    _parse_with_tool('tools/analysis_tools/get_flops.py', [ANY_CONFIG, '--shape', '448', '448'])
