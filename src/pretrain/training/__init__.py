"""Training: the one `train(cfg)` (run.py), its start-up checks, the Lightning data module and model
module, the token-weighted update, loggers and the batch recorder."""

from . import lean_imports

lean_imports.install()  # before any module of this package imports Lightning
