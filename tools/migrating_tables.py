"""Writes the two tables of docs/migrating.md that come from the code, or checks they are current.

  python tools/migrating_tables.py           # rewrite them in place
  python tools/migrating_tables.py --check   # exit 1, saying which, if either differs

  * horovodrun's flags: every flag of ``hvlite/runner/cli/horovod_flags.HOROVODRUN_FLAGS`` with
    what hvlrun does with it (``flag_table()``): honoured, no effect (hvlrun names it at
    launch) or refused.
  * Horovod's variables: every ``HOROVOD_*`` of ``hvlite/horovod_env.VARIABLES``: honoured, no
    effect (rank 0 names it at init) or a build setting (named at init, all in one line).
Each sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` lines in the page;
the prose around them is the page's own. Each is grouped by what hvlite does, under a heading,
in two-column tables (a phone shows two columns; a third scrolled off the screen), and names
that need no sentence (flags taken as they are, the build settings) are listed in a paragraph.
Flags and variable names in the text are set as code, so they read (and copy) as typed.
Imports nothing that needs the engine; ``tests/test_migrating_page.py`` runs ``--check``.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hvlite import horovod_env  # noqa: E402
from hvlite.runner.cli.horovod_flags import flag_table  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "migrating.md")
NOTE = "<!-- Written by tools/migrating_tables.py from %s: edit that, then run it. -->\n"
# A flag (-H, --mpi-args) or a setting's name (HVLITE_X, HOROVOD_X=value, NCCL_X=1) in the text
_NAME = re.compile(r"(?<![\w`.-])(--?[A-Za-z][A-Za-z0-9-]*|(?:HVLITE|HVLRUN|HOROVOD|NCCL|FI)_"
                   r"[A-Z0-9_]*[A-Z0-9](?:=[\w/]+)?)")


def _text(text):
    """``text`` for a table cell or a sentence: names as code, one line, no bare ``|``."""
    return _NAME.sub(r"`\1`", text).replace("|", "\\|").replace("\n", " ")


def _names(names):
    """``a``, ``b`` and ``c``, as code."""
    names = ["`%s`" % n for n in names]
    return names[0] if len(names) == 1 else "%s and %s" % (", ".join(names[:-1]), names[-1])


def _names_paragraph(text):
    """A paragraph listing names, in a container whose code never breaks inside a name (a
    phone would break ``--min-np`` after its first hyphen; docs/_static/hvlite.css)."""
    return ":::{container} names\n%s\n:::\n" % text


def _table(heading, intro, columns, rows):
    out = ["\n### %s\n\n" % heading] if heading else []
    if intro:
        out.append("%s\n\n" % intro)
    out.append("| %s | %s |\n|---|---|\n" % columns)
    out += ["| `%s` | %s |\n" % (name, _text(text)) for name, text in rows]
    return "".join(out)


def flags_table():
    rows = flag_table()
    same = [flag for flag, status, text in rows if status == "honoured" and not text]
    out = [NOTE % "hvlite/runner/cli/horovod_flags.py",
           "\n### Flags hvlrun honours\n\n",
           _names_paragraph("These work as in horovodrun, under the same name: %s."
                            % _names(same))]
    out.append(_table("Flags hvlrun honours in its own way", "", ("horovodrun flag", "in hvlrun"),
                      [(f, t) for f, s, t in rows if s == "honoured" and t]))
    out.append(_table("Flags with no effect", "hvlrun names each one it is given in a "
                      "`hvlrun: note:` line, saying why, and runs the job.",
                      ("horovodrun flag", "why"),
                      [(f, t) for f, s, t in rows if s == "no effect"]))
    out.append(_table("Refused flags", "hvlrun exits with code 2 before anything starts.",
                      ("horovodrun flag", "why, and what instead"),
                      [(f, t) for f, s, t in rows if s == "refused"]))
    return "".join(out)


def variables_table():
    variables = sorted(horovod_env.VARIABLES.items())

    def text(name, variable):
        if variable.honoured_values:
            return "%s=%s asks for what hvlite does; any other value: %s" % (
                name, "/".join(variable.honoured_values), variable.text)
        return variable.text
    honoured = [(n, text(n, v)) for n, v in variables if v.status == horovod_env.HONOURED]
    # "as HVLITE_X" for HOROVOD_X: the page's prose says it once, so these are only listed
    same = [n for n, t in honoured if t == "as HVLITE_" + n[len("HOROVOD_"):]]
    out = [NOTE % "hvlite/horovod_env.py", "\n### Variables hvlite honours\n\n",
           _names_paragraph("These are read as the `HVLITE_*` setting of the same name: %s."
                            % _names(same))]
    out.append(_table(None, "\nThese are honoured in their own way:", ("variable", "in hvlite"),
                      [(n, t) for n, t in honoured if n not in same]))
    out.append(_table("Variables with no effect", "", ("variable", "why, and what instead"),
                      [(n, text(n, v)) for n, v in variables if v.status == horovod_env.UNUSED]))
    build = [(n, v) for n, v in variables if v.status == horovod_env.BUILD]
    reasons = {v.text for _, v in build}
    out.append("\n### Horovod's build settings\n\n")
    if len(reasons) == 1:       # one shared reason: said once, the names listed
        out.append("These are %s. Rank 0 names those that are set, at `init()`, in one line.\n\n"
                   % _text(reasons.pop()))
        out.append(_names_paragraph(_names([n for n, _ in build]) + "."))
    else:
        out.append(_table(None, "", ("variable", "why"), [(n, v.text) for n, v in build]))
    return "".join(out)


TABLES = {"horovodrun-flags": flags_table, "horovod-variables": variables_table}


def render(page):
    """``page`` with each table replaced by the code's (ValueError if a marker is missing)."""
    for name, make in TABLES.items():
        start, end = "<!-- generated: %s -->\n" % name, "<!-- end: %s -->" % name
        if start not in page or end not in page:
            raise ValueError("docs/migrating.md has no %r ... %r markers" % (start.strip(), end))
        head, rest = page.split(start, 1)
        _, tail = rest.split(end, 1)
        page = head + start + make() + end + tail
    return page


def main(argv=None):
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    with open(PAGE) as f:
        page = f.read()
    fresh = render(page)
    if check:
        if fresh != page:
            print("docs/migrating.md: its generated tables are stale; run python tools/migrating_tables.py")
            return 1
        return 0
    if fresh != page:
        with open(PAGE, "w") as f:
            f.write(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
