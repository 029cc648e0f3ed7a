"""`python -m modar ARGS` runs the bundled `modar` command-line tool."""

from ._cli import main

raise SystemExit(main())
