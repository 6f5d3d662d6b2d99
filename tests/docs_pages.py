"""Reading the documentation's pages for the checks of tests/test_docs.py (no Sphinx needed).

Contract:
  * :func:`pages` lists the Markdown files the checks read: every page of ``docs/``, the
    README and the files the site includes (``bench/README.md``), as paths relative to the
    repository root.
  * :func:`code_blocks` returns a page's fenced code blocks as :class:`Block`: the fence's info
    string (``python``, ``{literalinclude} ../examples/x.py``), its options (``:lines: 2-``),
    its text, its first line number, and the reason of a ``<!-- norun: reason -->`` comment on
    the line before it ("" when there is none).
  * :func:`inline_code` returns the backticked spans of a page outside its code blocks.
  * :func:`hvlrun_lines` returns the ``hvlrun`` commands of a block as argument lists (prompts,
    comments and line continuations handled as a shell would).
The conventions these follow are written in docs/development/docs.md.
"""
import glob
import os
import re
import shlex
from typing import List, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDED = ("bench/README.md",)        # files the site includes into a page of its own

_FENCE = re.compile(r"^(`{3,}|:{3,})(.*)$")
_NORUN = re.compile(r"^<!--\s*norun:\s*(.*?)\s*-->\s*$")
_OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")


class Block(NamedTuple):
    page: str          # relative to ROOT
    line: int          # 1-based line of the opening fence
    info: str          # what follows the fence
    options: dict      # a directive's :name: value lines
    text: str          # the content, options removed
    norun: str         # the reason given by a norun comment, "" if none

    @property
    def where(self) -> str:
        return "%s:%d" % (self.page, self.line)

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""


def pages() -> List[str]:
    found = sorted(os.path.relpath(p, ROOT) for p in
                   glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    found = [p for p in found if not p.startswith("docs/reference/api/")]
    return ["README.md", *INCLUDED, *found]


def read(page: str) -> str:
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def code_blocks(page: str) -> List[Block]:
    lines = read(page).split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).strip(), i
        body, i = [], i + 1
        while i < len(lines) and lines[i].rstrip() != fence:
            body.append(lines[i])
            i += 1
        i += 1
        options = {}
        while info.startswith("{") and body and _OPTION.match(body[0]):
            name, value = _OPTION.match(body.pop(0)).groups()
            options[name] = value
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        norun = _NORUN.match(previous)
        blocks.append(Block(page, start + 1, info, options, "\n".join(body),
                            norun.group(1) if norun else ""))
    return blocks


def prose(page: str) -> str:
    """The page without its code blocks (their lines blanked, so line numbers stay)."""
    lines = read(page).split("\n")
    for block in code_blocks(page):
        end = block.line + block.text.count("\n") + len(block.options) + 1
        for j in range(block.line - 1, min(end + 1, len(lines))):
            lines[j] = ""
    return "\n".join(lines)


def inline_code(page: str) -> List[str]:
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose(page))


def hvlrun_lines(block: Block) -> List[List[str]]:
    """The hvlrun commands of a shell block, each as its arguments (``hvlrun`` first)."""
    commands, pending = [], ""
    for line in block.text.split("\n"):
        line = re.sub(r"^\$ ", "", line.strip())
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        words = shlex.split(line, comments=True)
        if words and words[0] == "hvlrun":
            commands.append(words)
    return commands
