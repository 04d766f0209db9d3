"""GGUF files read once: one parse per file, however many times transformers and sensprof ask.

gguf's reader decodes every metadata field on opening (the vocabulary is one field per token, item by item from a
memmap): ~5 s for the default model's file. transformers opens the file three times per load (config, weights,
tokenizer) and builds gguf's tensor-name map once per module of the model (397 times for a 30-layer Llama, ~9 s);
sensprof opens it again for the fingerprint's metadata and llama.cpp's numerics. Loading the default model took
~33 s, most of it these repeats (tests/test_gguf_files.py holds the behaviour; benchmarks/model_load.py the time).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections import OrderedDict

_READERS: OrderedDict = OrderedDict()
KEEP = 2  # readers kept open: the model being loaded and one other (a plan's model beside a profile's)


def read_gguf(path: str):
    """gguf's reader for `path`, parsed once while the file is unchanged (same size and modification time)."""
    from gguf.gguf_reader import GGUFReader  # the class itself, not gguf_reads_once's stand-in for it

    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    reader = _READERS.get(key)
    if reader is None:
        reader = GGUFReader(path)  # a damaged file raises here and is not remembered
        _READERS[key] = reader
        while len(_READERS) > KEEP:
            _READERS.popitem(last=False)
    _READERS.move_to_end(key)
    return reader


@contextlib.contextmanager
def gguf_reads_once():
    """Within: transformers' GGUF loading opens each file through read_gguf, builds each architecture's
    tensor-name map once (both are read-only to it) and decodes a file's metadata (config, tokenizer) once.
    Outside, gguf and transformers are as they were."""
    try:
        import gguf
    except ImportError:
        yield
        return
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    maps: dict = {}
    metadata: dict = {}
    try:
        from transformers import modeling_gguf_pytorch_utils as hf_gguf
    except ImportError:
        hf_gguf = None
    load_checkpoint = getattr(hf_gguf, "load_gguf_checkpoint", None)

    def open_once(path, mode="r"):
        return read_gguf(os.fspath(path)) if mode == "r" else reader_class(path, mode)

    def map_once(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    def metadata_once(path, return_tensors=False, *args, **kwargs):
        """The config and tokenizer parts (no tensors) decoded once per file; each caller gets its own copy."""
        if return_tensors or args or kwargs:
            return load_checkpoint(path, return_tensors, *args, **kwargs)
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in metadata:
            metadata[key] = load_checkpoint(path, return_tensors=False)
        return copy.deepcopy(metadata[key])

    gguf.GGUFReader, gguf.get_tensor_name_map = open_once, map_once
    if load_checkpoint is not None:
        hf_gguf.load_gguf_checkpoint = metadata_once
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
        if load_checkpoint is not None:
            hf_gguf.load_gguf_checkpoint = load_checkpoint
