"""`python -m modar ARGS` runs the bundled `modar` command-line tool, except
`python -m modar profile --backend torch ...`, the PyTorch profile, which is
Python (modar/_torch_profile.py: PyTorch is the user's, not the CLI's)."""

import sys

from ._torch_profile import main as torch_profile_main, wants_torch

if wants_torch(sys.argv[1:]):
    raise SystemExit(torch_profile_main(sys.argv[2:]))

from ._cli import main  # noqa: E402

raise SystemExit(main())
