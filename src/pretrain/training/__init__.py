"""Training: the Lightning data module and model module, the token-weighted update, run and compare."""
