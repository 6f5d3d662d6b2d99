"""Process liveness for the launcher tests that check nothing is left behind."""


def alive(pid):
    """Is ``pid`` a live process (not a zombie)?"""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
