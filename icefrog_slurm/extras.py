"""The optional extras of icefrog-slurm and the one error a missing one gives.

Each optional library belongs to one extra of ``pyproject.toml``: ``psycopg`` to
``postgres`` (a ``postgresql+psycopg://`` state store), ``prometheus_client`` to ``metrics``
(``metrics.port``), ``torch`` (and its ``torchrun``) to ``launcher`` (``icefrog launch``),
``pyslurm`` to ``pyslurm`` (``slurm.backend = 'pyslurm'``). Code that needs one calls
:func:`require` (or :func:`require_program`) before it imports or runs it; where it is absent
the command ends with one line, ``icefrog X: error: <what> needs the <extra> extra: pip
install 'icefrog-slurm[<extra>]'``, and exit code 2, instead of a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil

from icefrog_slurm.errors import IcefrogError

PACKAGE = "icefrog-slurm"


class MissingExtra(IcefrogError):
    """An optional library (or program) a setting or a command needs is not installed.
    Exit code 2: the installation does not match what was asked for."""

    exit_code = 2

    def __init__(self, what: str, extra: str, detail: str = "") -> None:
        message = f"{what} needs the {extra} extra: pip install '{PACKAGE}[{extra}]'"
        super().__init__(f"{message} ({detail})" if detail else message)
        self.extra = extra


def require(module: str, extra: str, what: str, *, load: bool = True, hint: str = "") -> None:
    """Make sure ``module`` can be imported, else raise :class:`MissingExtra` naming
    ``what`` needs it and the extra that installs it. ``load=False`` only looks the module
    up (no import: for torch, which the caller's children import); ``hint`` is added to the
    message in parentheses (e.g. where the extra can be built)."""
    try:
        if load:
            importlib.import_module(module)
            return
        if importlib.util.find_spec(module) is not None:
            return
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.split(".")[0] != exc.name.split(".")[0]:
            # the module is there but one it imports is not: say which
            raise MissingExtra(what, extra, _join(f"importing {module}: {exc}", hint)) from None
    except ImportError as exc:  # installed but broken (a missing shared library)
        raise MissingExtra(what, extra, _join(f"importing {module}: {exc}", hint)) from None
    except ValueError:  # find_spec on a module whose entry in sys.modules is not a module
        pass
    raise MissingExtra(what, extra, hint)


def require_program(program: str, extra: str, what: str, *, path: str | None = None) -> str:
    """The full path of ``program`` on ``path`` (default: ``$PATH``), else
    :class:`MissingExtra` (e.g. ``torchrun``, which the ``launcher`` extra's torch installs)."""
    found = shutil.which(program, path=path)
    if found is None:
        where = "not found" if "/" in program else "not on PATH"
        raise MissingExtra(what, extra, f"{program}: {where}")
    return found


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
