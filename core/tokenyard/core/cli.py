"""`tokenyard <component> ...`: one console script in front of every `python -m tokenyard.<component>`."""

from __future__ import annotations

import argparse
import importlib
import sys


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one clear line on stderr and exit status 2 (not the usage block argparse prints)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


COMPONENTS = ("operator", "router", "autoscaler", "sim", "devcluster")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMPONENTS:
        if argv and argv[0] not in ("-h", "--help"):
            print(
                f"tokenyard: unknown component {argv[0]!r}; choose one of {', '.join(COMPONENTS)}",
                file=sys.stderr,
            )
            return 2
        print(f"usage: tokenyard {{{','.join(COMPONENTS)}}} [--help | ARGS...]")
        return 0
    module = importlib.import_module(f"tokenyard.{argv[0]}.__main__")
    sys.argv = [f"tokenyard {argv[0]}", *argv[1:]]
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
