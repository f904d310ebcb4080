"""What the batches hold, measured: the composition audit (audit.py), inspect-data's statistics
(stats.py) and the unigram and bigram floors of the validation pairs (floors.py)."""
