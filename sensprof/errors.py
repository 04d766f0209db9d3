"""The one error type the CLI turns into a one-line message and exit code 2."""


class SensprofError(Exception):
    """A problem with the user's input: the message names it and says how to fix it."""
