"""pretrain: config-driven GPT pretraining on a verified token cache with padding-free packed batches."""

__version__ = "0.1.0"
