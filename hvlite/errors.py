"""Exceptions raised by hvlite, and the one place C status codes become them.

Every error the engine reports is an :class:`HvliteError` (a ``RuntimeError``), with a message
naming the tensor and, for disagreements, the ranks on each side.

Contract: every engine call that returns an ``hvl_status`` goes through ``_check(rc)``, which
returns on ``HVL_OK`` and otherwise raises the class mapped below with the engine's message
(``hvl_last_error()``, which names the tensor and, for mismatches, the ranks).
"""
from ._lib import ffi, lib

__all__ = ["HvliteError", "HorovodInternalError", "HvliteInvalidArgument", "MismatchError",
           "HvliteTimeoutError", "HvliteShutdownError", "HvliteNotInitializedError",
           "HvliteDeadlockError", "HvliteNotSupportedError", "HorovodVersionMismatchError",
           "HostsUpdatedInterrupt"]


class HvliteError(RuntimeError):
    """Base class of every error hvlite raises from the engine (a ``RuntimeError``).

    Raised as itself for MPI, NCCL and system failures, and by collectives after the engine
    stopped for such a reason; the subclasses below are the other cases. Horovod's name for it,
    ``HorovodInternalError``, is the same class.
    """


HorovodInternalError = HvliteError
"""Horovod's name for :class:`HvliteError`, the same class, so that ``except
hvd.HorovodInternalError`` keeps working."""


class HorovodVersionMismatchError(ImportError):
    """Horovod's error for a framework whose version differs from the one it was compiled with.

    hvlite never raises it: the engine includes no framework header, so a framework upgrade
    needs no rebuild. It exists so that ``except hvd.HorovodVersionMismatchError`` in a Horovod
    script still names a class.

    Args:
        name: the framework's name.
        version: the framework version found at run time.
        installed_version: the version a compiled extension was built against (Horovod's).
    """

    def __init__(self, name, version, installed_version):
        super().__init__("%s %s is installed, but %s was found at run time"
                         % (name, installed_version, version))
        self.name = name
        """The framework's name."""
        self.version = version
        """The version found at run time."""
        self.installed_version = installed_version
        """The version a compiled extension was built against."""


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed: raised on every rank at the same commit (or host check).

    Args:
        skip_sync: Horovod's flag (True when only hosts were removed).
        committed: True when raised by ``commit()``, whose state is then stored.
    """

    def __init__(self, skip_sync: bool = False, committed: bool = False) -> None:
        super().__init__("the job's hosts changed; the job re-forms from the last commit")
        self.skip_sync = skip_sync
        """Horovod's flag (True when only hosts were removed); kept for compatibility."""
        self.committed = committed
        """True when raised by ``commit()``, whose state is then stored."""


class HvliteInvalidArgument(HvliteError, ValueError):
    """A request refused on this rank before any communication: a name already in flight, a
    process set this rank is not in, a collective other than allreduce or barrier after a rank
    joined. Also a ``ValueError``."""


class MismatchError(HvliteError):
    """Ranks submitted the same tensor name with a different op, dtype, shape, root, scaling
    or device. Raised on every rank; the message names the tensor, the field and the ranks
    (``tensor 'w': ranks disagree on the dtype: float32 on ranks 0,2; float16 on rank 1``)."""


class HvliteTimeoutError(HvliteError):
    """Other ranks gave no answer or made no progress for ``HVLITE_PEER_TIMEOUT_SECONDS`` (a
    dead, stopped or unreachable rank, named when it is on this host), or a stall lasted
    ``HVLITE_STALL_SHUTDOWN_TIME_SECONDS``. The engine has stopped."""


class HvliteDeadlockError(HvliteError):
    """Every rank a collective needs waits in hvlite on collectives that can never complete (the
    ranks called different collectives, or the same ones in another order); raised on every
    waiting rank after HVLITE_DEADLOCK_SECONDS, naming what each rank waits on. The engine keeps
    running."""


class HvliteNotSupportedError(HvliteError, NotImplementedError):
    """A valid request that hvlite, like Horovod, does not run: Adasum outside allreduce, on a
    dtype other than float16/32/64, or over a set whose size is not a power of 2 (Horovod raises
    ``NotImplementedError`` or a ``RuntimeError`` there; this is both)."""


class HvliteShutdownError(HvliteError):
    """The engine is not running: shut down by a rank, or stopped by an error or another rank's
    exit; the message says why. ``init()`` starts it again."""


class HvliteNotInitializedError(HvliteShutdownError, ValueError):
    """A collective before ``init()``. Also a ``ValueError``, as Horovod raises there."""


_BY_STATUS = {
    lib.HVL_ERR_NOT_INITIALIZED: HvliteNotInitializedError,
    lib.HVL_ERR_INVALID_ARG: HvliteInvalidArgument,
    lib.HVL_ERR_MISMATCH: MismatchError,
    lib.HVL_ERR_TIMEOUT: HvliteTimeoutError,
    lib.HVL_ERR_SHUT_DOWN: HvliteShutdownError,
    lib.HVL_ERR_DEADLOCK: HvliteDeadlockError,
    lib.HVL_ERR_UNSUPPORTED: HvliteNotSupportedError,
}


def _check(rc):
    """Raise the exception for a non-OK engine status, with the engine's message."""
    if rc != lib.HVL_OK:
        message = ffi.string(lib.hvl_last_error()).decode("utf-8", "replace")
        raise _BY_STATUS.get(rc, HvliteError)(message or "hvlite error %d" % rc)
