"""Safe checkpoint I/O (docs/advanced/reliability.md): a scoped ``weights_only`` allow-list,
atomic saves, one-line :class:`CheckpointError` messages naming the file and the fix, cached URL
downloads, and the opt-in routing of mmengine's Runner through them."""
import collections
import contextlib
import glob
import hashlib
import http.client
import inspect
import io
import os
import os.path as osp
import pathlib
import pickle
import re
import secrets
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional

import torch

#: What to do with a checkpoint that cannot be read: said once, used by every message.
_CORRUPT_HINT = ('point to an intact checkpoint instead (e.g. an earlier epoch_*.pth / iter_*.pth '
                 'in the same folder), or download or convert it again')


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used; the message is one line naming the file and the fix."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint file does not exist."""


def _history_buffer_getattr(obj: Any, name: str) -> Any:
    """Stand-in for ``builtins.getattr`` while unpickling: returns only ``HistoryBuffer``'s
    statistics methods, so a crafted file cannot walk from an allowed object to ``os.system``."""
    from mmengine.logging import HistoryBuffer
    allowed = {'min', 'max', 'mean', 'current', *HistoryBuffer._statistics_methods}
    if (obj is HistoryBuffer and isinstance(name, str) and name in allowed
            and not name.startswith('_') and inspect.isfunction(vars(HistoryBuffer).get(name))):
        return vars(HistoryBuffer)[name]
    raise pickle.UnpicklingError(
        f'refused getattr({obj!r:.60}, {name!r:.60}) while loading a checkpoint: only the '
        f'statistics methods of mmengine HistoryBuffer may be looked up')


def mmengine_safe_globals() -> List[Any]:
    """The minimum allow-list for ``torch.load(weights_only=True)`` of mmengine checkpoints:
    objects, or ``(object, 'pickled.name')`` pairs (stand-ins, numpy 1.x's ``numpy.core``)."""
    import numpy as np
    from mmengine.logging import HistoryBuffer
    core = getattr(np, '_core', None) or np.core
    fns = (core.multiarray._reconstruct, core.multiarray.scalar)
    found: List[Any] = [HistoryBuffer, np.ndarray, np.dtype, *fns,
                        (_history_buffer_getattr, 'builtins.getattr')]
    found += [(fn, f'{mod}.multiarray.{fn.__name__}') for fn in fns
              for mod in ('numpy.core', 'numpy._core')]
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:  # some numpy versions pickle dtypes as np.dtypes.<Name>DType classes
        found += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    return found


def mmengine_safe_loading(extra: Iterable[Any] = ()) -> ContextManager[None]:
    """Allow-list mmengine's checkpoint contents (plus ``extra``) for the ``with`` block only."""
    return torch.serialization.safe_globals([*mmengine_safe_globals(), *extra])


class _YacsConfig:
    """Stands in for the yacs ``CfgNode`` of official training checkpoints: a plain dict."""

    def __new__(cls, *args, **kwargs):
        return collections.OrderedDict()


#: ``(stand-in, pickled name)`` pairs the safe loader may build in official checkpoints
OFFICIAL_STAND_INS = ((_YacsConfig, 'yacs.config.CfgNode'), )


def load_error_reason(exc: BaseException, limit: int = 160) -> str:
    """The reason in a ``torch.load`` exception, one short line: the safe loader's own line
    (``Unsupported operand 110``, ``Unsupported global: ...``), else the first."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = next((line for line in lines if line.startswith('Unsupported')), lines[0])
    text = text.split('. ')[0]  # torch appends advice meant for torch developers
    return text if len(text) <= limit else text[:limit - 3] + '...'


def load_checkpoint_file(path: str, map_location: Any = 'cpu', *, mmap: bool = False,
                         extra_safe_globals: Iterable[Any] = (), hint: str = _CORRUPT_HINT,
                         weights_only: bool = True, folder_hint: str = '') -> Any:
    """``torch.load`` a local checkpoint safely (or read a ``.safetensors`` file), or raise a
    one-line :class:`CheckpointError` naming the file and ``hint`` (``folder_hint``: the way out
    when ``path`` is a folder). ``weights_only=False`` only for trusted files."""
    path = osp.expanduser(str(path))
    if osp.isdir(path):
        newest = _newest_pth(path)
        raise CheckpointError(f'checkpoint {path!r} is a directory, not a checkpoint file: pass a '
                              f'.pth file' + (f' (e.g. its newest, {newest!r})' if newest else
                                              ' (it holds none)') +
                              (f', or {folder_hint}' if folder_hint else ''))
    if not osp.isfile(path):
        raise CheckpointNotFoundError(f'checkpoint {path!r} does not exist')
    if osp.getsize(path) == 0:
        raise CheckpointError(f'checkpoint {path!r} is empty (0 bytes; an interrupted save or '
                              f'download?): {hint}')
    if is_safetensors(path):
        return _load_safetensors(path, map_location, hint)
    mmap = mmap and zipfile.is_zipfile(path)  # (a file of the legacy format cannot be mapped)
    try:
        with mmengine_safe_loading(extra_safe_globals):
            return torch.load(path, map_location=map_location, weights_only=weights_only,
                              mmap=mmap or None)
    except pickle.UnpicklingError as e:
        # only an unknown global means a real object; anything else is not a pickle
        if 'Unsupported global' in str(e):
            raise CheckpointError(
                f'checkpoint {path!r} holds objects that the safe loader refuses '
                f'({_unsupported_global(e)}): it was not written by torch.save of tensors or by '
                f'an mmengine Runner. Only if you trust the file: convert it with '
                f'tools/model_converters --unsafe-load, or load it with '
                f'torch.load(weights_only=False) and save its state_dict') from None
        raise CheckpointError(
            f'checkpoint {path!r} is corrupt ({load_error_reason(e)}): {hint}') from None
    except MemoryError:
        raise
    except Exception as e:  # torch's readers fail in many ways on junk (IndexError, KeyError...)
        raise CheckpointError(f'checkpoint {path!r} is truncated or corrupt '
                              f'({load_error_reason(e)}): {hint}') from None


def is_safetensors(path: str) -> bool:
    """Whether ``path`` is a safetensors file: its suffix, or its header (an 8-byte length, then
    a JSON object) for a download cached without the suffix."""
    if path.endswith('.safetensors'):
        return True
    with open(path, 'rb') as f:
        head = f.read(9)
    return (len(head) == 9 and not head.startswith(b'PK') and head[8:9] == b'{'
            and 2 <= int.from_bytes(head[:8], 'little') <= osp.getsize(path) - 8)


def _load_safetensors(path: str, map_location: Any, hint: str) -> Dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise CheckpointError(f'checkpoint {path!r} is a .safetensors file, which needs the '
                              f'safetensors package: pip install safetensors') from None
    try:  # (safetensors raises its own error types on a bad header or size)
        return load_file(path, device=map_location if isinstance(map_location, str) else 'cpu')
    except Exception as e:
        raise CheckpointError(f'checkpoint {path!r} is a truncated or corrupt safetensors file '
                              f'({load_error_reason(e)}): {hint}') from None


def _newest_pth(folder: str) -> Optional[str]:
    """The most recently written ``*.pth`` in ``folder``, or None."""
    return max(glob.glob(osp.join(glob.escape(folder), '*.pth')), key=osp.getmtime, default=None)


def _unsupported_global(exc: BaseException) -> str:
    """The refused global named in torch's weights-only message, or its first line."""
    m = re.search(r'(?:Unsupported global|GLOBAL) ?:? ?(?:GLOBAL )?([\w.]+)', str(exc))
    return f'GLOBAL {m.group(1)}' if m else load_error_reason(exc)


#: the names of atomic_write's temporary files: cleaning up removes no file it did not create
_TEMP_NAME = r'\.({name})\.[a-z0-9_]{{8}}\.tmp'


def _stale_temp_files(folder: str, name: str) -> List[str]:
    """What saves killed mid-write left in ``folder`` for targets matching the regex ``name``."""
    pattern = re.compile(_TEMP_NAME.format(name=name))
    with contextlib.suppress(OSError):
        return sorted(osp.join(folder, n) for n in os.listdir(folder) if pattern.fullmatch(n))
    return []


def _remove(paths: Iterable[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):  # gone already (another rank, or a user)
            os.remove(path)


def atomic_write(path: str, write: Callable[[io.BufferedWriter], None]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync it and rename it to ``path``,
    so a kill leaves ``path`` old or complete; the next save removes a kill's leftover."""
    path = osp.abspath(path)
    folder = osp.dirname(path)
    _remove(_stale_temp_files(folder, re.escape(osp.basename(path))))
    tmp = osp.join(folder, f'.{osp.basename(path)}.{secrets.token_hex(4)}.tmp')
    try:
        with open(tmp, 'xb') as f:  # (the mode a plain open() gives, unlike mkstemp's 0600)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove([tmp])
        raise
    # persist the rename (the directory entry) where the OS allows it
    with contextlib.suppress(OSError, AttributeError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save(obj, path)``, atomically (see :func:`atomic_write`)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def checkpoint_cache_path(url: str, cache_dir: Optional[str] = None) -> str:
    """Where the download of ``url`` is cached: ``<hash of the whole URL>-<last path segment>``
    in ``cache_dir`` or ``<torch hub dir>/checkpoints/mmeffattn``."""
    folder = cache_dir or osp.join(torch.hub.get_dir(), 'checkpoints', 'mmeffattn')
    parts = urllib.parse.urlsplit(url)
    name = next((seg for seg in reversed(parts.path.split('/')) if seg), parts.netloc)
    name = re.sub(r'[^A-Za-z0-9._-]', '_', urllib.parse.unquote(name))[-80:] or 'checkpoint'
    return osp.join(folder, f'{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}')


def download_checkpoint(url: str, cache_dir: Optional[str] = None,
                        timeout_s: float = 60) -> str:
    """The local path of ``url``'s file, downloaded once (atomically) into the cache."""
    path = checkpoint_cache_path(url, cache_dir)
    if osp.isfile(path) and osp.getsize(path) > 0:
        return path
    os.makedirs(osp.dirname(path), exist_ok=True)
    local = (f"download it yourself and give its local path (init_cfg=dict(type='Pretrained', "
             f'checkpoint=LOCAL_PATH)), or place it at {path}')
    from mmengine.logging import print_log
    print_log(f'Downloading {url} to {path}', logger='current')
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            expected = int(response.headers.get('Content-Length') or -1)

            def copy(f: io.BufferedWriter) -> None:
                shutil.copyfileobj(response, f, 1 << 20)
                if expected >= 0 and f.tell() != expected:  # (http.client does not raise here)
                    raise CheckpointError(f'the download of {url!r} broke off after {f.tell()} '
                                          f'of {expected} bytes: try again, or {local}')

            atomic_write(path, copy)
    except urllib.error.HTTPError as e:
        raise CheckpointError(f'cannot download checkpoint {url!r}: the server answered '
                              f'HTTP {e.code} ({e.reason}); check the URL, or {local}') from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, 'reason', None) or e
        raise CheckpointError(f'cannot download checkpoint {url!r} ({type(e).__name__}: '
                              f'{reason}): without network access, {local}') from None
    return path


def open_checkpoint(checkpoint: str, map_location: Any = 'cpu', *,
                    cache_dir: Optional[str] = None,
                    extra_safe_globals: Iterable[Any] = ()) -> Any:
    """Read a checkpoint from a local path or an ``http(s)://`` URL (downloaded once) with
    :func:`load_checkpoint_file`; other ``scheme://`` names go to mmengine's
    ``CheckpointLoader``."""
    path, hint = checkpoint, _CORRUPT_HINT
    if urllib.parse.urlsplit(str(checkpoint)).scheme.lower() in ('http', 'https'):
        path = download_checkpoint(checkpoint, cache_dir)
        hint = f'delete the cached download to fetch {checkpoint!r} again'
    elif '://' in str(checkpoint):
        from mmengine.runner.checkpoint import CheckpointLoader
        return CheckpointLoader.load_checkpoint(checkpoint, map_location=map_location)
    return load_checkpoint_file(path, map_location=map_location,
                                extra_safe_globals=extra_safe_globals, hint=hint)


def find_resume_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint ``--resume`` continues from: ``WORK_DIR/last_checkpoint``'s, else the newest
    ``*.pth``, else ``None``; an unreadable one raises :class:`CheckpointError`."""
    leftovers = _stale_temp_files(work_dir, r'.+\.pth')
    if leftovers:
        _remove(leftovers)
        from mmengine.logging import print_log
        print_log(f'--resume: removed the partial file(s) of interrupted checkpoint saves in '
                  f'{work_dir}: ' + ', '.join(osp.basename(p) for p in leftovers), logger=None)
    record = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(record):
        named = pathlib.Path(record).read_text().strip()
        if named:
            if not osp.isfile(named) and osp.isfile(osp.join(work_dir, osp.basename(named))):
                named = osp.join(work_dir, osp.basename(named))  # the work dir was moved
            _check_readable(named, f'{record} names it')
            return named
    newest = _newest_pth(work_dir)
    if newest is None:
        return None
    _check_readable(newest, f'it is the newest *.pth in {work_dir} (there is no '
                            f'last_checkpoint record)')
    return newest


def _check_readable(path: str, why: str) -> None:
    hint = ('pass --resume PATH with an earlier checkpoint, or remove the bad file to start from '
            'scratch')
    if not osp.exists(path):  # (a folder gets load_checkpoint_file's message)
        raise CheckpointNotFoundError(f'cannot resume: checkpoint {path!r} does not exist ({why})'
                                      f'; {hint}')
    try:
        load_checkpoint_file(path, mmap=True, hint=hint)
    except CheckpointError as e:
        raise CheckpointError(f'cannot resume ({why}): {e}') from None


def install_checkpoint_io() -> None:
    """Make mmengine's Runner save local files atomically and load through
    :func:`open_checkpoint` (idempotent; :mod:`mmeffattn.engine.patch_mmengine` calls it)."""
    from mmengine.runner import checkpoint as mm_ckpt
    from mmengine.runner import runner as mm_runner

    current = mm_runner.save_checkpoint
    if not getattr(current, '_mmeffattn_atomic', False):
        def save_checkpoint(checkpoint, filename, file_client_args=None, backend_args=None):
            if not isinstance(filename, (str, os.PathLike)) or file_client_args is not None or \
                    (backend_args or {}).get('backend', 'local') != 'local' or \
                    '://' in str(filename):  # not a local file
                return current(checkpoint, filename, file_client_args=file_client_args,
                               backend_args=backend_args)
            os.makedirs(osp.dirname(osp.abspath(filename)), exist_ok=True)
            atomic_save(checkpoint, str(filename))

        save_checkpoint._mmeffattn_atomic = True
        save_checkpoint.__doc__ = 'mmengine save_checkpoint, atomic for local files (mmeffattn).'
        mm_runner.save_checkpoint = save_checkpoint

    if not getattr(mm_ckpt.CheckpointLoader._schemes.get(''), '_mmeffattn_scoped', False):
        def load(filename, map_location=None, model_dir=None, progress=True):
            return open_checkpoint(filename, map_location=map_location, cache_dir=model_dir)

        load._mmeffattn_scoped = True
        mm_ckpt.CheckpointLoader.register_scheme(prefixes=['', 'http://', 'https://'],
                                                 loader=load, force=True)


#: the line a stock config adds so that mmengine's Runner can read its own checkpoints
PATCH_IMPORT_LINE = ("custom_imports = dict(imports=['mmeffattn', "
                     "'mmeffattn.engine.patch_mmengine'], allow_failed_imports=False)")
_LOADER_PROBED = False


def warn_if_mmengine_cannot_load() -> bool:
    """Warn once per process, naming the config line that fixes it, when mmengine's own loader
    cannot read the checkpoints mmengine writes (0.10.7 under torch >= 2.6 stops on its
    ``HistoryBuffer``); backbones call it when built, so the fix is logged before a load fails."""
    global _LOADER_PROBED
    from mmengine.logging import HistoryBuffer, print_log
    from mmengine.runner import checkpoint as mm_ckpt
    loader = mm_ckpt.CheckpointLoader._schemes.get('')
    if _LOADER_PROBED or loader is None or getattr(loader, '_mmeffattn_scoped', False):
        return False
    _LOADER_PROBED, buffer = True, HistoryBuffer()
    buffer.update(1.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, 'probe.pth')
        torch.save({'meta': {'message_hub': {'log_scalars': {'loss': buffer}}}}, path)
        try:
            loader(path, 'cpu')
            return False
        except pickle.UnpicklingError as exc:
            reason = _unsupported_global(exc)
    import mmengine
    print_log(f"mmengine {mmengine.__version__} cannot load the checkpoints it writes under torch "
              f'{torch.__version__} ({reason}): test.py, --resume and load_from will fail. Add '
              f'the patch to the config: {PATCH_IMPORT_LINE}', logger='current', level=30)
    return True
