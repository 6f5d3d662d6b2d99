"""Host parsing and rank placement (hvlite.runner.hosts.hostlist): pure functions, no processes."""

import socket

import pytest

from hvlite.runner.hosts.hostlist import (Host, check_np, is_local, local_rank_count, parse_hostfile,
                                 parse_hostfile_text, parse_hosts, ranks_per_host, total_slots)


def test_parse_hosts_with_slots():
    assert parse_hosts("a:2,b:4") == [Host("a", 2), Host("b", 4)]
    assert parse_hosts(" a:2 , b:4 ") == [Host("a", 2), Host("b", 4)]


def test_parse_hosts_without_slots_gives_one_each():
    assert parse_hosts("a,b") == [Host("a", 1), Host("b", 1)]
    assert parse_hosts("node-1.example.org") == [Host("node-1.example.org", 1)]


@pytest.mark.parametrize("spec, quoted", [
    ("a:0", "'0'"), ("a:x", "'x'"), ("a:-1", "'-1'"), ("a:2:3", "'2:3'"), ("a:", "''"),
    ("a:1.5", "'1.5'"),
])
def test_parse_hosts_bad_slots_name_the_text(spec, quoted):
    with pytest.raises(ValueError, match="bad slot count") as err:
        parse_hosts(spec)
    assert quoted in str(err.value)


@pytest.mark.parametrize("spec", ["a,,b", ":2", "a,", ",a"])
def test_parse_hosts_empty_host(spec):
    with pytest.raises(ValueError, match="empty host name") as err:
        parse_hosts(spec)
    assert repr(spec) in str(err.value)


def test_parse_hosts_empty_list():
    with pytest.raises(ValueError, match="empty host list"):
        parse_hosts("  ")


def test_hostfile_formats_comments_and_blank_lines():
    text = """
    # cluster
    a slots=2
    b:3   # inline comment
    c

    d   slots=4
    """
    assert parse_hostfile_text(text) == [Host("a", 2), Host("b", 3), Host("c", 1), Host("d", 4)]


@pytest.mark.parametrize("line, fragment", [
    ("a slots=x", "bad slot count 'x'"),
    ("a slots=0", "bad slot count '0'"),
    ("a foo=3", "cannot parse"),
    ("a b c", "cannot parse"),
    ("a:2 slots=2", "cannot parse"),
])
def test_hostfile_bad_lines_name_file_line_and_text(line, fragment):
    with pytest.raises(ValueError) as err:
        parse_hostfile_text("ok\n" + line + "\n", "hosts.txt")
    message = str(err.value)
    assert fragment in message
    assert "hosts.txt line 2" in message and line in message


def test_hostfile_without_hosts():
    with pytest.raises(ValueError, match="names no host"):
        parse_hostfile_text("# nothing\n\n", "empty.txt")


def test_parse_hostfile_reads_file(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("x slots=2\ny\n")
    assert parse_hostfile(str(path)) == [Host("x", 2), Host("y", 1)]
    with pytest.raises(ValueError, match="cannot read hostfile"):
        parse_hostfile(str(tmp_path / "missing"))


def test_check_np_message_gives_both_numbers():
    hosts = parse_hosts("a:2,b:2")
    assert total_slots(hosts) == 4
    check_np(hosts, 4)
    with pytest.raises(ValueError) as err:
        check_np(hosts, 5)
    assert "-np 5" in str(err.value) and "4 slots" in str(err.value)
    with pytest.raises(ValueError, match="at least 1"):
        check_np(hosts, 0)


def test_ranks_fill_hosts_in_order():
    hosts = parse_hosts("a:2,b:4,c:1")
    assert ranks_per_host(hosts, 3) == [2, 1, 0]
    assert ranks_per_host(hosts, 7) == [2, 4, 1]


def test_local_rank_count():
    names = {"localhost", "127.0.0.1", "me"}
    hosts = parse_hosts("me:2,other:2")
    assert local_rank_count(hosts, 1, names) == 1
    assert local_rank_count(hosts, 4, names) == 2
    assert local_rank_count(parse_hosts("localhost:3"), 3, names) == 3
    # A launch node running no rank: assume nodes alike, use the busiest host.
    assert local_rank_count(parse_hosts("x:2,y:3"), 5, names) == 3


def test_this_host_counts_as_local():
    hostname = socket.gethostname()
    assert is_local("localhost") and is_local("127.0.0.1") and is_local(hostname)
    assert not is_local("surely-not-this-host.invalid")
