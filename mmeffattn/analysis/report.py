"""What the analysis tools write: JSON and Markdown files, Markdown tables, plots."""
import json
import os
import os.path as osp
from typing import Any, Dict, Iterable, List, Optional, Sequence


def fmt(v: Optional[float], digits: int = 1) -> str:
    """``v`` with thousands separators and ``digits`` decimals; ``'-'`` for None."""
    return '-' if v is None else f'{v:,.{digits}f}'


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = '') -> List[str]:
    """A Markdown table as lines; ``align`` has an ``'r'`` for each right-aligned column."""
    sep = ''.join('---:|' if a == 'r' else '---|' for a in align.ljust(len(header), 'l'))
    return ['| ' + ' | '.join(header) + ' |', '|' + sep] + [
        '| ' + ' | '.join('' if c is None else str(c) for c in row) + ' |' for row in rows]


def write_outputs(out_dir: str, files: Dict[str, Any]) -> List[str]:
    """Write each ``name: content`` into ``out_dir`` (a str as text, anything else as JSON)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, content in files.items():
        paths.append(osp.join(out_dir, name))
        with open(paths[-1], 'w') as f:
            if isinstance(content, str):
                f.write(content)
            else:
                json.dump(content, f, indent=1)
    return paths


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str) -> str:
    """Lay out, save (120 dpi) and close ``fig``; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path
