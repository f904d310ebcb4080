"""Checkpoint files: the one loader and recorder (files.py: a .sha256 record compared first, then
`weights_only=True`) and FSDP's sharded layout (sharded.py)."""
