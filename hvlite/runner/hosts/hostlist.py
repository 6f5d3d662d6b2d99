"""Host lists for ``hvlrun``: parsing ``-H``/``--hostfile`` and placing ranks.

Contract:
  * A host list is a list of :class:`Host` (name, slots) in the order given; ranks are placed by
    filling each host's slots in that order (what MPICH hydra and Open MPI do by default).
  * ``-H`` accepts ``a:2,b:4`` and ``a,b`` (one slot each). A hostfile accepts one host per line
    as ``host slots=N``, ``host:N`` or ``host``; ``#`` starts a comment; blank lines are skipped.
  * Every malformed input raises ``ValueError`` whose message quotes the offending text.
  * Nothing here starts a process or touches the network except :func:`this_host_names`, which
    asks ``socket.gethostname()``, :func:`is_local`, which tries to bind a UDP socket to a host
    given as an IPv4 address, and :func:`interface_ipv4`, which asks the kernel for an
    interface's address. Host names are never resolved. IPv6 literals are not supported.
"""

import dataclasses
import fcntl
import socket
import struct
from typing import Iterable, List, Optional, Sequence, Set

__all__ = ["Host", "parse_hosts", "parse_hostfile", "parse_hostfile_text", "total_slots",
           "check_np", "localhost_only", "this_host_names", "is_local", "ranks_per_host",
           "local_rank_count", "interface_ipv4"]


@dataclasses.dataclass(frozen=True)
class Host:
    """One host and the number of ranks it may run."""

    name: str
    slots: int


def _parse_slots(text: str, where: str) -> int:
    """Parse a slot count (a positive integer).

    Args:
        text: the slot count as written.
        where: the whole entry, quoted in the error message.

    Returns:
        The slot count.

    Raises:
        ValueError: if ``text`` is not a positive integer.
    """
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise ValueError("bad slot count %r in host entry %r (want a positive integer)"
                         % (text, where))
    return int(digits)


def _check_name(name: str, where: str) -> str:
    """Return ``name`` if it is a usable host name.

    Raises:
        ValueError: if the name is empty or contains whitespace or ``=``.
    """
    if not name:
        raise ValueError("empty host name in %r" % where)
    if any(c.isspace() for c in name) or "=" in name:
        raise ValueError("bad host name %r in %r" % (name, where))
    return name


def _parse_entry(entry: str, where: str) -> Host:
    """Parse ``host`` or ``host:N``.

    Args:
        entry: one entry, already stripped.
        where: text quoted in error messages (the whole list or hostfile line).

    Returns:
        The parsed :class:`Host`.

    Raises:
        ValueError: on an empty host name or a bad slot count.
    """
    if ":" in entry:
        name, _, slots_text = entry.partition(":")
        return Host(_check_name(name.strip(), where), _parse_slots(slots_text, entry))
    return Host(_check_name(entry, where), 1)


def parse_hosts(spec: str) -> List[Host]:
    """Parse an ``-H`` value such as ``"a:2,b:4"`` or ``"a,b"``.

    Args:
        spec: comma-separated ``host[:slots]`` entries.

    Returns:
        The hosts, in order.

    Raises:
        ValueError: on an empty list, an empty host name (``"a,,b"``) or a bad slot count.
    """
    if not spec.strip():
        raise ValueError("empty host list %r" % spec)
    return [_parse_entry(entry.strip(), spec) for entry in spec.split(",")]


def parse_hostfile_text(text: str, source: str = "hostfile") -> List[Host]:
    """Parse the contents of a hostfile.

    Args:
        text: the file contents.
        source: the file name, used in error messages.

    Returns:
        The hosts, in order.

    Raises:
        ValueError: on a line that is not ``host``, ``host:N`` or ``host slots=N``, or on a
            file that names no host.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s line %d: %r" % (source, number, raw.strip())
        fields = line.split()
        if len(fields) == 1:
            hosts.append(_parse_entry(fields[0], where))
        elif len(fields) == 2 and fields[1].startswith("slots=") and ":" not in fields[0]:
            name = _check_name(fields[0], where)
            hosts.append(Host(name, _parse_slots(fields[1][len("slots="):], where)))
        else:
            raise ValueError("cannot parse %s (want 'host', 'host:N' or 'host slots=N')"
                             % where)
    if not hosts:
        raise ValueError("%s names no host" % source)
    return hosts


def parse_hostfile(path: str) -> List[Host]:
    """Read and parse a hostfile.

    Args:
        path: the hostfile's path.

    Returns:
        The hosts, in order.

    Raises:
        ValueError: as :func:`parse_hostfile_text`, or if the file cannot be read.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise ValueError("cannot read hostfile %r: %s" % (path, e.strerror)) from e
    return parse_hostfile_text(text, path)


def total_slots(hosts: Sequence[Host]) -> int:
    """Return the number of slots over all hosts. Cannot fail."""
    return sum(h.slots for h in hosts)


def check_np(hosts: Sequence[Host], np: int) -> None:
    """Check that ``np`` ranks fit into the host list.

    Args:
        hosts: the host list.
        np: the requested number of ranks.

    Raises:
        ValueError: if ``np`` is below 1 or larger than the total number of slots; the message
            gives both numbers.
    """
    if np < 1:
        raise ValueError("-np must be at least 1, got %d" % np)
    slots = total_slots(hosts)
    if np > slots:
        raise ValueError("-np %d is larger than the %d slot%s in the host list (%s)"
                         % (np, slots, "" if slots == 1 else "s",
                            ",".join("%s:%d" % (h.name, h.slots) for h in hosts)))


def localhost_only(np: int) -> List[Host]:
    """Return the host list used without ``-H``/``--hostfile``: all ``np`` ranks here."""
    return [Host("localhost", np)]


def this_host_names() -> Set[str]:
    """Return the names under which this machine may appear in a host list."""
    names = {"localhost", "127.0.0.1", "::1"}
    hostname = socket.gethostname()
    if hostname:
        names.update({hostname, hostname.split(".", 1)[0]})
    return names


def _is_own_address(name: str) -> bool:
    """True if ``name`` is an IPv4 address of this machine (binding to it succeeds)."""
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    if name.count(".") != 3:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((name, 0))
        except OSError:
            return False
    return True


def is_local(name: str, local_names: Optional[Iterable[str]] = None) -> bool:
    """Tell whether host ``name`` is this machine.

    Args:
        name: a host name from the host list.
        local_names: this machine's names; :func:`this_host_names` when omitted (then an IPv4
            address of one of this machine's interfaces counts too, as mpiexec sees it).

    Returns:
        True if ``name`` (or its short form) is one of this machine's names.
    """
    if local_names is None and _is_own_address(name):
        return True
    names = set(this_host_names() if local_names is None else local_names)
    return name in names or name.split(".", 1)[0] in names


def ranks_per_host(hosts: Sequence[Host], np: int) -> List[int]:
    """Place ``np`` ranks by filling each host's slots in order.

    Args:
        hosts: the host list; must hold at least ``np`` slots (see :func:`check_np`).
        np: the number of ranks.

    Returns:
        The number of ranks on each host, parallel to ``hosts``.
    """
    placed, left = [], np
    for host in hosts:
        count = min(host.slots, left)
        placed.append(count)
        left -= count
    return placed


def local_rank_count(hosts: Sequence[Host], np: int,
                     local_names: Optional[Iterable[str]] = None) -> int:
    """Count the ranks that will run on this machine (for ``OMP_NUM_THREADS``).

    Args:
        hosts: the host list.
        np: the number of ranks.
        local_names: this machine's names; :func:`this_host_names` when omitted.

    Returns:
        The ranks placed on this machine, or, when none are (a launch node that runs no rank),
        the largest count on any one host, assuming the nodes are alike. At least 1.
    """
    names = set(this_host_names() if local_names is None else local_names)
    counts = ranks_per_host(hosts, np)
    local = sum(c for h, c in zip(hosts, counts) if is_local(h.name, names))
    return max(1, local or max(counts, default=1))


_SIOCGIFADDR = 0x8915


def interface_ipv4(name: str) -> str:
    """Return the IPv4 address of network interface ``name`` on this machine (Linux).

    Raises:
        ValueError: if there is no such interface or it has no IPv4 address; the message names it.
    """
    if not name or len(name) > 15:
        raise ValueError("bad network interface name %r" % name)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError as e:
            raise ValueError("network interface %r has no IPv4 address here: %s"
                             % (name, e.strerror)) from None
    return socket.inet_ntoa(packed[20:24])
