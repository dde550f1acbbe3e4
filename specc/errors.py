"""Errors a user can act on. The CLI turns them into one-line messages.

`UsageError` means the request itself is wrong (exit code 2); `SpeccError`
means the request was fine but the work failed (exit code 1).
"""


class SpeccError(Exception):
    """A runtime failure with a message that says what went wrong and what to do."""

    exit_code = 1


class UsageError(SpeccError):
    """A bad argument, path or config value: the user must change the request."""

    exit_code = 2
