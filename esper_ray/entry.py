"""The `esper-ray` console script: cli.main, with a Ctrl-C while the command line module itself loads ending in
one line and exit 130 as everywhere else (cli.main handles those that come later)."""

from __future__ import annotations

import sys

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended


def main() -> int:
    try:
        from esper_ray.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:  # before cli.main's own handler was in place (its imports, parsing the arguments)
        print("esper-ray: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
