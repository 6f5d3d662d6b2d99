"""hvlrun's own voice: one ``hvlrun: ...`` line on stderr.

Contract: :func:`say` writes ``hvlrun: <message>`` and a newline to stderr and flushes it. A
closed stderr (the reader of hvlrun's output is gone) must not stop hvlrun from ending the job,
so write errors are ignored: it cannot fail. Every message hvlrun itself prints goes through it
(the rank wrappers and host guards, other processes, print their own; the wrappers with
:func:`tell`, the same without the prefix).
"""
import sys

__all__ = ["say", "tell"]


def say(message: str) -> None:
    """Write ``hvlrun: <message>`` on stderr. Cannot fail."""
    tell("hvlrun: " + message)


def tell(line: str) -> None:
    """Write ``line`` and a newline on stderr. Cannot fail."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
