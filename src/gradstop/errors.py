"""Errors a page raises on purpose and catches, so that the next line can run.

A cell that only fails declares its error in its metadata (CONTRIBUTING.md, "How to
show an error on purpose"). A cell that must go on after the error catches it, with
one of these two, which name the message they expect, so that the book's error index
can find it (``book/_ext/error_index.py`` reads the message from the call):

``show_error(action, message)``
    runs ``action()``, checks that it raised ``RuntimeError`` (or ``error=``) with a
    message starting with ``message``, and prints the error the way a failing cell
    shows it, ``RuntimeError: <its whole message>``, on stderr (which wraps on the
    page, as a traceback does);
``assert_raises(action, message)``
    the same check, printing nothing: for a cell tagged ``check``.

Both return the error, for further checks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _caught(action: Callable[[], object], message: str, error: type[BaseException]):
    if not callable(action):
        raise TypeError(
            f"the action must be a function to call, such as lambda: x.backward(), "
            f"not {type(action).__name__}: the error would happen before the check"
        )
    if not isinstance(message, str) or not message:
        raise ValueError("message must be the start of the expected error's message")
    try:
        action()
    except error as caught:
        text = str(caught)
        if not text.startswith(message):
            raise AssertionError(
                f"{type(caught).__name__} raised, but its message starts otherwise:\n"
                f"  expected: {message!r}\n  got:      {text!r}"
            ) from caught
        return caught
    raise AssertionError(f"no {error.__name__} was raised (expected {message!r})")


def assert_raises(
    action: Callable[[], object], message: str, error: type[BaseException] = RuntimeError
) -> BaseException:
    """Check that ``action()`` raises ``error`` with a message starting with ``message``."""
    return _caught(action, message, error)


def show_error(
    action: Callable[[], object], message: str, error: type[BaseException] = RuntimeError
) -> BaseException:
    """``assert_raises``, then print the error as ``Type: message`` on stderr."""
    caught = _caught(action, message, error)
    print(f"{type(caught).__name__}: {caught}", file=sys.stderr)
    return caught
