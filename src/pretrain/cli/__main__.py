"""`python -m pretrain.cli ...` runs the `pretrain` command (as before 0.2, when cli was one module)."""

from . import main

raise SystemExit(main())
