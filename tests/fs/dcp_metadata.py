"""DCP's `.metadata` as torch's FileSystemWriter pickles it, for tests on torch 1.13.

torch 1.13 has no torch.distributed.checkpoint, so this registers stand-ins under the same
module and class names with the same dataclass fields (torch 2.x, torch/distributed/checkpoint/
metadata.py and filesystem.py): `pickle.dump(Metadata(...))` then writes the opcodes, globals
and BUILD states a real `.metadata` holds, and `pickle.load` reads one back.
"""
import dataclasses
import sys
import types
from typing import Any, Optional

import torch

_META = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"


def _module(name):
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
    return sys.modules[name]


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: torch.Size
    sizes: torch.Size


@dataclasses.dataclass
class TensorProperties:
    dtype: torch.dtype = torch.float32
    layout: torch.layout = torch.strided
    requires_grad: bool = False
    memory_format: torch.memory_format = torch.contiguous_format
    pin_memory: bool = False


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: torch.Size
    chunks: list


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Any = None


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Optional[torch.Size] = None
    index: Optional[int] = dataclasses.field(hash=False, compare=False, default=None)

    def __init__(self, fqn, offset=None, index=None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "offset", None if offset is None else torch.Size(offset))


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Optional[list] = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


for _cls in (ChunkStorageMetadata, TensorProperties, TensorStorageMetadata, BytesStorageMetadata,
             Metadata, MetadataIndex):
    _cls.__module__ = _META
    setattr(_module(_META), _cls.__name__, _cls)
_StorageInfo.__module__ = _FS
setattr(_module(_FS), "_StorageInfo", _StorageInfo)
for _parent in ("torch.distributed.checkpoint",):
    _module(_parent)


def make(items, tensors):
    """items: [(fqn, chunk offsets or None for bytes, file, offset, length)]; tensors: {fqn:
    (dtype, global size)}. Chunk sizes are not tracked (readers here slice by storage_data)."""
    sd_meta, storage = {}, {}
    for fqn, chunk, file, off, n in items:
        if chunk is None:
            sd_meta[fqn] = BytesStorageMetadata()
            key = MetadataIndex(fqn)
        else:
            dtype, size = tensors[fqn]
            m = sd_meta.setdefault(fqn, TensorStorageMetadata(TensorProperties(dtype),
                                                              torch.Size(size), []))
            m.chunks.append(ChunkStorageMetadata(torch.Size(chunk), torch.Size(size)))
            key = MetadataIndex(fqn, chunk, len(m.chunks) - 1)
        storage[key] = _StorageInfo(file, off, n)
    return Metadata(sd_meta, planner_data=None, storage_data=storage)


def items(metadata):
    """{MetadataIndex: (file, offset, length)} of a loaded Metadata."""
    return {k: (v.relative_path, v.offset, v.length) for k, v in metadata.storage_data.items()}
