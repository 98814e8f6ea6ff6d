"""Exit codes shared by every command (DESIGN.md: 0 ok, 1 problem found, 2 bad usage/input;
3 when the service a command asks, the coordinator, did not answer: nothing was judged)."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    PROBLEM_FOUND = 1
    BAD_INPUT = 2
    UNAVAILABLE = 3


class InputError(Exception):
    """Bad usage or bad input: the CLI prints the message and exits 2, nothing else is touched."""
