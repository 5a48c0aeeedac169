"""The project's exception types and the exit codes the CLI maps them to."""


class IcefrogError(Exception):
    """Base class of every error icefrog raises on purpose."""

    exit_code = 1


class InputError(IcefrogError):
    """Bad input from a user or a file: the message names the offending field. Exit code 2."""

    exit_code = 2


class LostLead(IcefrogError):
    """This controller no longer leads: its lock is gone or another controller took the
    lease. Nothing more may be enacted until it leads again."""


class StoreUnavailable(IcefrogError):
    """The database did not answer or was busy (a dropped connection, a lock or statement
    timeout, a serialization failure): a transient fault, tried again later; the
    transaction it ended was rolled back."""
