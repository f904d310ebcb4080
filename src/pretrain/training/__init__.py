"""Training: the one `train(cfg)` (run.py), its start-up checks, the Lightning data module and model
module, the token-weighted update, loggers and the batch recorder."""
