"""``python -m hvlite.runner``: the same as the ``hvlrun`` console script."""

from .launch import run

if __name__ == "__main__":
    run()
