"""Exceptions raised by hvlite, and the one place C status codes become them.

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
    """Base class of every error hvlite raises from the engine."""


#: Horovod's name for the same thing, so ``except hvd.HorovodInternalError`` keeps working.
HorovodInternalError = HvliteError


class HorovodVersionMismatchError(ImportError):
    """Horovod's error for a framework whose version differs from the one it was compiled with.

    hvlite never raises it: the engine includes no framework header, so a framework upgrade
    needs no rebuild. It exists so that ``except hvd.HorovodVersionMismatchError`` in a Horovod
    script still names a class. Args, as Horovod's: the framework's ``name``, the ``version``
    found at run time and the ``installed_version``; all three are kept as attributes.
    """

    def __init__(self, name, version, installed_version):
        super().__init__("%s %s is installed, but %s was found at run time"
                         % (name, installed_version, version))
        self.name = name
        self.version = version
        self.installed_version = installed_version


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed: raised on every rank at the same commit (or host check).

    Attributes:
        skip_sync: Horovod's flag (True when only hosts were removed); kept for compatibility.
        committed: True when raised by ``commit()``, whose state is then stored.
    """

    def __init__(self, skip_sync: bool = False, committed: bool = False) -> None:
        super().__init__("the job's hosts changed; the job re-forms from the last commit")
        self.skip_sync = skip_sync
        self.committed = committed


class HvliteInvalidArgument(HvliteError, ValueError):
    """A request was rejected on this rank before any communication (e.g. a duplicate name)."""


class MismatchError(HvliteError):
    """Ranks submitted the same tensor name with different op, dtype, shape, root or scaling."""


class HvliteTimeoutError(HvliteError):
    """Other ranks did not answer in time (a dead or hung peer, or a stalled tensor)."""


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
    """The engine is not running: not initialised, shut down by a rank, or failed."""


class HvliteNotInitializedError(HvliteShutdownError, ValueError):
    """A collective or query before ``init()`` (a ValueError, as Horovod raises there)."""


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
