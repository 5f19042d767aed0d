"""Collect the shell commands that the user-facing Markdown gives: README.md, docs/**/*.md and
configs/*/README.md. Shared by tests/docs/test_doc_commands.py."""
import glob
import itertools
import os.path as osp
import re
import shlex
from typing import Iterator, List, NamedTuple

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SHELL_LANGS = {'bash', 'shell', 'sh', 'console'}
#: how a command starts, for those the test checks: a tool or script of this repository
RUNNERS = ('python', 'bash', 'torchrun', 'python3')


class Command(NamedTuple):
    page: str   # relative to the repository root
    line: int   # 1-based line of the command on its page
    words: tuple


def pages() -> List[str]:
    found = ['README.md'] + glob.glob('docs/**/*.md', recursive=True, root_dir=ROOT) + \
        glob.glob('configs/*/README.md', root_dir=ROOT)
    return sorted(p for p in found if not p.startswith('docs/_build'))


def expand_braces(word: str) -> List[str]:
    """``mila-{s,b}_x.py`` -> ``['mila-s_x.py', 'mila-b_x.py']``, as the shell expands it."""
    m = re.search(r'\{([^{}]*,[^{}]*)\}', word)
    if not m:
        return [word]
    return [w for alt in m.group(1).split(',')
            for w in expand_braces(word[:m.start()] + alt + word[m.end():])]


def _split(text: str) -> List[str]:
    words = shlex.split(text, comments=True)
    # environment assignments in front of the command (VAR=value cmd ...)
    while words and re.match(r'^[A-Za-z_][A-Za-z0-9_]*=', words[0]):
        words = words[1:]
    return words


def _commands_in_block(lines: List[str], first: int) -> Iterator[tuple]:
    buf, start = '', None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if start is None:
            if not stripped or stripped.startswith('#'):
                continue
            start = first + i
        buf += line.rstrip()
        if buf.endswith('\\'):
            buf = buf[:-1] + ' '
            continue
        text = buf.strip()
        if text.startswith('$ '):
            text = text[2:]
        buf, s, start = '', start, None
        for part in re.split(r'\s*(?:&&|;)\s*', text):
            yield s, part


def _inline(text: str) -> Iterator[tuple]:
    for n, line in enumerate(text.splitlines(), 1):
        for m in re.finditer(r'`((?:python|bash|torchrun)\s[^`]+)`', line):
            yield n, m.group(1)


def commands() -> List[Command]:
    """Every command of a fenced shell block or an inline code span that runs a tool or script
    of this repository (``python tools/...``, ``bash scripts/...``, ``bash tools/...``), with
    braces expanded into one command per alternative."""
    out = []
    for page in pages():
        text = open(osp.join(ROOT, page), encoding='utf-8').read()
        lines = text.splitlines()
        found, fence, block, lang = [], None, [], ''
        for i, line in enumerate(lines, 1):
            m = re.match(r'^\s*(```+|~~~+)\s*([\w+-]*)', line)
            if fence is None and m:
                fence, lang, block, start = m.group(1), m.group(2).lower(), [], i + 1
                continue
            if fence is not None and line.strip().startswith(fence):
                if lang in SHELL_LANGS:
                    found += list(_commands_in_block(block, start))
                fence = None
                continue
            if fence is not None:
                block.append(line)
        prose = re.sub(r'^\s*(```+|~~~+).*?^\s*\1', lambda m: '\n' * m.group(0).count('\n'),
                       text, flags=re.S | re.M)
        found += list(_inline(prose))
        for n, cmd in found:
            try:
                words = _split(cmd)
            except ValueError:  # an unbalanced quote in a prose fragment: not a command
                continue
            if len(words) < 2 or words[0] not in RUNNERS:
                continue
            target = words[1] if words[0] != 'torchrun' else next(
                (w for w in words[1:] if w.endswith('.py')), '')
            if not re.match(r'^(tools|scripts)/', target):
                continue
            for combo in itertools.product(*[expand_braces(w) for w in words]):
                out.append(Command(page, n, tuple(combo)))
    return out


if __name__ == '__main__':
    for c in commands():
        print(f'{c.page}:{c.line}: {shlex.join(c.words)}')
