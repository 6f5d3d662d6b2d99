"""Benchmark tables: the printer every benchmark uses, and their machine-readable form.

Contract: ``print_table(title, header, rows, key_columns=1)`` prints an aligned table (cells are
printed as given) and returns it as a dict: ``title``, ``columns``, ``key_columns`` (how many
leading columns name a row), ``rows`` (cells that read as numbers -- "12", "0.055", "0.83x",
"85%" -- become numbers, "-" becomes null, other cells stay text). ``write_json(path, tables)``
writes a list of such dicts as ``{"tables": [...]}`` (plus any extra fields, e.g. raw samples);
every benchmark's ``--json PATH`` (``add_json_arg``) does that on rank 0, and bench/ab.py reads
it. Imports nothing beyond the standard library (ab.py and launchers use it outside MPI jobs).
"""
import json


def cell_value(cell):
    """A printed cell as JSON: int or float for "12", "0.055", "0.83x", "85%"; None for "-";
    otherwise the text."""
    if cell is None or isinstance(cell, (int, float)):
        return cell
    text = str(cell).strip()
    if text == "-":
        return None
    number = text[:-1] if text.endswith(("x", "%")) else text
    for kind in (int, float):
        try:
            return kind(number)
        except ValueError:
            pass
    return text


def add_json_arg(parser):
    parser.add_argument("--json", metavar="PATH",
                        help="also write the printed tables to PATH as JSON (bench/ab.py reads it)")


def write_json(path, tables, **extra):
    """Write the tables ``print_table`` returned (and any ``extra`` JSON-able fields, e.g. raw
    samples) to ``path``; rank 0 only, like the printing."""
    with open(path, "w") as f:
        json.dump(dict(extra, tables=tables), f, indent=1)


def print_table(title, header, rows, key_columns=1):
    """Print a table; return it as a dict for ``write_json``. The first ``key_columns`` columns
    name a row (bench/ab.py matches rows of two runs by them)."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = "  ".join("%*s" % (w, h) for w, h in zip(widths, header))
    print("\n" + title)
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join("%*s" % (w, c) for w, c in zip(widths, r)))
    return {"title": title, "columns": list(header), "key_columns": key_columns,
            "rows": [[cell_value(c) for c in r] for r in rows]}
