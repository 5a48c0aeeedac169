"""Database URLs: parsed with an error that names the problem, shown without a password.

Every message, log line and report that shows a database URL shows :func:`shown`: the
password of its user info and of every query key naming one (libpq's ``password``,
``sslpassword``) as ``***``; a URL that cannot be parsed as its scheme alone, since where a
password sits in it cannot be known. SQLAlchemy's ``hide_password`` masks only the user
info's.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import printable

_MASK = "***"


def parse(url: str) -> URL:
    """``url`` parsed; an InputError naming what is wrong with it otherwise (shown without
    its password)."""
    try:
        return make_url(url)
    except ValueError:  # SQLAlchemy's int() of the port
        raise InputError(f"database URL {shown(url)}: its port is not a number") from None
    except ArgumentError:
        raise InputError(
            f"database URL {shown(url)}: not a URL (dialect+driver://user@host:port/database)"
        ) from None


def shown(url: str | URL) -> str:
    """``url`` fit to print: passwords masked, or its scheme alone when it cannot be
    parsed (the text before ``://`` or ``:``; nothing when it has neither)."""
    try:
        parsed = make_url(url)
    except (ValueError, ArgumentError):
        text = str(url)
        for sep in ("://", ":"):
            if sep in text:
                return printable(text.split(sep, 1)[0], 40) + sep + "..."
        return "..."
    hidden = {key: _MASK for key in parsed.query if "password" in key.lower()}
    text = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return printable(text.replace("=%2A%2A%2A", f"={_MASK}"), 300)
