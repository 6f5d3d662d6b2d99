#!/usr/bin/env python3
"""Checks the engine's shape rules (csrc/), so they stay true. (The Python layers' rules are
checked by tests/unit/test_layers.py.)

Usage: ``python tools/check_engine.py [ROOT]`` (ROOT: a checkout, default this one). Prints each
broken rule with the file and line, and exits 1 if there is any (0 otherwise). It reads the
sources as text; nothing is built or imported.

Rules (the reasons are in ../shared/DESIGN.md and the headers named):
1. No call circles between C files: the graph "file A calls a function defined in file B" has
   no cycle, so every file has a place in one order, and core/engine.c (the cycle's life) is on
   top: no other file calls a function it defines.
2. The error rule (csrc/util/util.h): no ``return HVL_ERR_...;`` — every error sets its message
   where it happens (hvl__fail / hvl__oom) and callers pass the status on.
3. Private headers stay private: cache.h and coordinator.h belong to the negotiation
   (core/negotiate.c and their own .c), shm.h to backends/, timeline_writer.h to observe/,
   stage.h to the core files that run (or free) the staged path, nccl_lib.h and nccl_set.h to
   the NCCL plane's files (and nccl_lib.h to its own .c).
4. A data plane is named only in backends/: nothing else mentions ``hvl__backend_<name>`` or
   includes a plane's private header.
5. util/ and kernels/ know nothing of the engine: they include only their own headers and
   hvlite.h (util.h for kernels), and they call only functions defined in the leaves (util/
   calls util/; kernels/ calls kernels/ and util/). A call is judged by the file that defines
   the function, whatever its name: a public ``hvl_`` name defined in core/ is still core's.
6. Only core/world.c names MPI_COMM_WORLD: everything else derives the job from the engine's
   world communicator (``e->comm``), which ``init(comm=...)`` may make of part of it.

Calls are found by name: every function a .c file defines without ``static`` (any name) is
looked up in the other .c files; a name defined by no file (libc, MPI) is not a call between
files.
"""
import os
import re
import sys

# A non-static function definition at the start of a line: "<type> <name>(" (the line must not
# end with ";", which would make it a prototype).
DEFINITION = re.compile(r"^(?!static\b|typedef\b|extern\b|#|\s)[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\s*\(", re.M)
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)
BARE_ERROR = re.compile(r"\breturn\s+HVL_ERR_\w+\s*;")

PRIVATE_HEADERS = {
    "cache.h": ("core/negotiate.c", "core/cache.c"),
    "coordinator.h": ("core/negotiate.c", "core/coordinator.c"),
    "shm.h": ("backends/",),
    "timeline_writer.h": ("observe/",),
    "stage.h": ("core/execute.c", "core/stage.c", "core/engine.c"),
    "nccl_lib.h": ("backends/backend_nccl.c", "backends/nccl_set.", "util/nccl_lib.c"),
    "nccl_set.h": ("backends/backend_nccl.c", "backends/nccl_set.c"),
}
LEAF_FOLDERS = {"util/": {"util.h", "cuda_driver.h", "nccl_lib.h", "hvlite.h"}, "kernels/": {"kernels.h", "half.h", "util.h", "hvlite.h"}}
LEAF_CALLS = {"util/": ("util/",), "kernels/": ("kernels/", "util/")}   # where a leaf's callees may live


def strip_c(text):
    """C text without comments and string/char literals (same line numbers)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text, flags=re.S)


def c_files(csrc):
    for here, dirs, files in os.walk(csrc):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".c", ".h")):
                path = os.path.join(here, name)
                yield os.path.relpath(path, csrc).replace(os.sep, "/"), open(path).read()


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def find_cycle(edges):
    """One cycle (a list of nodes) in the directed graph, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def leaf_calls_out(caller, callees):
    """A leaf file's calls of functions defined outside the folders it may call."""
    for folder, allowed in LEAF_CALLS.items():
        if not caller.startswith(folder):
            continue
        return ["%s calls %s, defined in %s: %s is a leaf and calls only functions defined in %s"
                % (caller, ", ".join(sorted(set(fns))), home, folder, " and ".join(allowed))
                for home, fns in sorted(callees.items()) if not home.startswith(allowed)]
    return []


def check_c(root):
    csrc = os.path.join(root, "csrc")
    files = dict(c_files(csrc))
    code = {name: strip_c(text) for name, text in files.items()}
    problems = []
    defined = {}
    for name, text in code.items():
        if name.endswith(".c"):
            for m in DEFINITION.finditer(text):
                line_end = text.find("\n", m.start())
                if not text[m.start():line_end].rstrip().endswith(";"):
                    defined[m.group(1)] = name
    calls = {}
    for name, text in code.items():
        if not name.endswith(".c"):
            continue
        for fn, home in defined.items():
            if home != name and re.search(r"\b%s\s*\(" % re.escape(fn), text):
                calls.setdefault(name, {}).setdefault(home, []).append(fn)
    for caller, callees in sorted(calls.items()):
        problems += leaf_calls_out(caller, callees)
        if "core/engine.c" in callees:
            problems.append("%s calls up into the cycle file core/engine.c: %s"
                            % (caller, ", ".join(callees["core/engine.c"])))
    cycle = find_cycle({a: set(b) for a, b in calls.items()})
    if cycle:
        links = ["%s -> %s (%s)" % (a, b, ", ".join(sorted(set(calls[a][b]))[:3])) for a, b in zip(cycle, cycle[1:])]
        problems.append("call circle: " + "; ".join(links))
    for name, text in code.items():
        for m in BARE_ERROR.finditer(text):
            problems.append("%s:%d: bare '%s': set the message where the error happens (hvl__fail/hvl__oom)"
                            % (name, line_of(text, m.start()), m.group(0)))
        for m in INCLUDE.finditer(files[name]):
            header = m.group(1)
            owners = PRIVATE_HEADERS.get(header)
            if owners and not name.startswith(owners) and os.path.basename(name) != header:
                problems.append("%s:%d: includes %s, private to %s" % (name, line_of(files[name], m.start()),
                                                                       header, " and ".join(owners)))
            for folder, allowed in LEAF_FOLDERS.items():
                if name.startswith(folder) and header not in allowed:
                    problems.append("%s:%d: %s includes %s; it may include only %s"
                                    % (name, line_of(files[name], m.start()), folder, header, ", ".join(sorted(allowed))))
        if name != "core/world.c":
            for m in re.finditer(r"\bMPI_COMM_WORLD\b", text):
                problems.append("%s:%d: names MPI_COMM_WORLD; the job's world is the engine's e->comm "
                                "(core/world.c makes it)" % (name, line_of(text, m.start())))
        if not name.startswith("backends/"):
            for m in re.finditer(r"\bhvl__backend_(?!for\b)\w+", text):
                problems.append("%s:%d: names the data plane %s outside backends/"
                                % (name, line_of(text, m.start()), m.group(0)))
    return problems


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = check_c(root)
    for p in problems:
        print(p)
    print("%d problem(s)" % len(problems) if problems else "engine shape: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
