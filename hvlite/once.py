"""Warnings for conditions that can repeat every step: ``warn_once(key, message)`` issues the
warning the first time ``key`` is seen in this process and never again (whatever the warnings
filters say), so a training loop that hits the condition at every step gets one line. Any
thread. Framework-neutral.
"""
import threading
import warnings

_seen = set()
_lock = threading.Lock()


def warn_once(key, message, category=UserWarning, stacklevel=2):
    """Warn with ``message`` unless ``key`` was warned about before; return True if it warned."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    warnings.warn(message, category, stacklevel=stacklevel + 1)
    return True
