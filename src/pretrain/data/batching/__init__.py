"""The run-time path, from a verified cache to the batches a model sees.

chunking.py cuts long documents into independent chunks; exchanges.py cuts task=sft's conversations at
whole exchanges. packing.py (with packing_kernels.py) plans packs. policies/ holds one module per data
policy. samplers.py orders, splits and resumes the epoch. batch.py gathers a PackedBatch. evaluation.py
builds validation batches. mixture.py and concat.py read several caches as one.
"""
