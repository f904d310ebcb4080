"""source=fineweb: FineWeb sample-10BT's parquet files at a pinned revision, streamed from the hub
through its fsspec filesystem; a file's footer is read only when the stream reaches it."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from ...errors import ConfigError, SourceError
from .base import Document, Part, PartSizes, SourceConfig
from .parquet import parquet_parts, read_parquet

_OFFLINE_HINT = (
    "use source=local source.files='[...]' for your own parquet/jsonl files, "
    "or source=pydocs for the embedded offline corpus"
)
_TRUE = {"1", "true", "yes"}


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def check_hub(path: str) -> None:
    """Fail with what to do instead when the hub is switched off or out of reach."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in _TRUE or (
        os.environ.get("HF_DATASETS_OFFLINE", "0").lower() in _TRUE
    ):
        raise SourceError(
            f"source=fineweb needs the Hugging Face hub, but HF_HUB_OFFLINE is set; {_OFFLINE_HINT}"
        )
    if not hub_reachable():
        raise SourceError(
            f"source=fineweb: huggingface.co cannot be reached from this machine; {_OFFLINE_HINT}"
        )


@functools.lru_cache(maxsize=1)
def hub_filesystem():
    from huggingface_hub import HfFileSystem

    return HfFileSystem()


@dataclass
class FineWebConfig(SourceConfig):
    path: str | None = None
    """source=fineweb: the hub dataset"""
    config_name: str | None = None
    """source=fineweb: the dataset config (sample-10BT)"""
    revision: str | None = None
    """source=fineweb: the pinned dataset revision (commit)"""
    data_dir: str | None = None
    """source=fineweb: the folder of the config's parquet files"""

    for_kind = "fineweb"


@dataclass(frozen=True)
class FineWebSource:
    """The config's parquet files at `revision`, in file-name order (the order `datasets` streams)."""

    path: str
    config_name: str
    data_dir: str
    revision: str
    sizes: PartSizes = field(default_factory=PartSizes)

    name: ClassVar[str] = "fineweb"
    config_class: ClassVar[type[SourceConfig]] = FineWebConfig
    test_variants: ClassVar[dict[str, tuple[str, ...]]] = {"fineweb": ()}  # conf/source/fineweb.yaml pins it

    @property
    def kind(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, source, sizes: PartSizes) -> FineWebSource:
        """The hub coordinates (conf/source/fineweb.yaml pins them): all four are needed."""
        settings = {
            "path": source.path,
            "config_name": source.config_name,
            "data_dir": source.data_dir,
            "revision": source.revision,
        }
        unset = [f"source.{key}" for key, value in settings.items() if not value]
        if unset:
            raise ConfigError(f"source=fineweb needs {', '.join(unset)} (conf/source/fineweb.yaml sets them)")
        return cls(**{key: str(value) for key, value in settings.items()}, sizes=sizes)

    def identity(self) -> dict:
        return {
            "kind": "fineweb",
            "path": self.path,
            "config_name": self.config_name,
            "data_dir": self.data_dir,
            "revision": self.revision,
        }

    def parts(self) -> Iterator[Part]:
        check_hub(self.path)
        folder = f"datasets/{self.path}@{self.revision}/{self.data_dir.strip('/')}"
        fs = hub_filesystem()
        files = sorted(f for f in fs.ls(folder, detail=False) if str(f).endswith(".parquet"))
        if not files:
            raise SourceError(f"source=fineweb: no parquet files in {folder}; check source.data_dir")
        for name in files:
            yield from parquet_parts(str(name), self.sizes.parquet_rows, filesystem=fs)

    def read(self, part: Part) -> Iterator[Document]:
        return read_parquet(part, hub_filesystem())

    def describe(self) -> str:
        return f"source=fineweb ({self.path} {self.config_name} @ {self.revision[:12]})"

    def is_small(self) -> bool:
        return False
