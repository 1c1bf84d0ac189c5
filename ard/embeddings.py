"""Text embeddings for semantic search: one :class:`Embedder` behind ``ARD_EMBEDDER``.

The default, :class:`WordLlamaEmbedder`, is the static token-embedding model that the
``wordllama`` package ships inside its wheel (``l2_supercat``: 32,000 tokens, 256 dimensions,
float16, 16 MB): a text's vector is the mean of its tokens' vectors, so it runs on the CPU in
microseconds and needs nothing from the network. The weights and tokenizer are loaded from the
package's own files (wordllama's ``load()`` would fall back to a download for the tokenizer).
The model was trained with Matryoshka truncation: the first ``ARD_EMBEDDING_DIM`` dimensions
are a smaller model of their own. Measured on the 30-query set of the tests (semantic ranking
alone, the intended agent in the top 3 / MRR): 64 dimensions 30/30, 0.967; 128: 30/30, 0.967;
256: 30/30, 0.950. 128 is the default: the same relevance as 64 with twice the information, at
half the memory of 256.

Another embedder (a remote embedding service, say) plugs in as a class with ``name``, ``dim``
and ``embed(texts)`` named by ``ARD_EMBEDDER``; changing it re-embeds every document at the
next ``manage.py ard_reindex`` (documents remember the model that embedded them).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from django.conf import settings
from django.utils.module_loading import import_string

#: Characters of a document's text that are embedded (a static model averages tokens: the
#: name, description and skills come first and carry the meaning).
MAX_CHARS = 4000


class Embedder(Protocol):
    """What semantic search needs from a model."""

    name: str  # stored beside each vector: a different model means re-embedding
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """``len(texts) x dim`` float32 vectors of unit length (zero for an empty text)."""
        ...


class WordLlamaEmbedder:
    """WordLlama's bundled ``l2_supercat`` model, truncated to ``ARD_EMBEDDING_DIM``."""

    CONFIG = "l2_supercat"
    FULL_DIM = 256

    def __init__(self, dim: int | None = None) -> None:
        self.dim = int(dim or settings.ARD_EMBEDDING_DIM)
        if not 1 <= self.dim <= self.FULL_DIM:
            raise ValueError(f"WordLlama's {self.CONFIG} has at most {self.FULL_DIM} dimensions")
        self.name = f"wordllama-{self.CONFIG}-{self.dim}"
        self._lock = threading.Lock()  # a tokenizer is not to be shared across threads
        self._table: np.ndarray | None = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        """The weights and tokenizer, from the package's files (on first use: naming the
        model, as the indexer does on a registration's path, loads nothing)."""
        import wordllama
        from safetensors import safe_open
        from tokenizers import Tokenizer

        root = Path(wordllama.__file__).parent
        weights = root / "weights" / f"{self.CONFIG}_{self.FULL_DIM}.safetensors"
        with safe_open(str(weights), framework="np", device="cpu") as f:
            table = f.get_tensor("embedding.weight")
        tokenizer = Tokenizer.from_file(
            str(root / "tokenizers" / f"{self.CONFIG}_tokenizer_config.json")
        )
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self._table = np.ascontiguousarray(table[:, : self.dim], dtype=np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            if self._table is None:
                self._load()
            encodings = self._tokenizer.encode_batch(
                [t[:MAX_CHARS] for t in texts], add_special_tokens=False
            )
        table = self._table
        assert table is not None
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, enc in enumerate(encodings):
            if enc.ids:
                out[i] = table[enc.ids].mean(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


@lru_cache(maxsize=4)
def _embedder_for(path: str, dim: int) -> Embedder:
    return import_string(path)()


def get_embedder() -> Embedder | None:
    """The configured embedder, or None when semantic search is off (``ARD_SEMANTIC``)."""
    if not settings.ARD_SEMANTIC:
        return None
    return _embedder_for(settings.ARD_EMBEDDER, settings.ARD_EMBEDDING_DIM)


def document_text(fields: dict) -> str:
    """What is embedded of a search document: name, description, skills, tags, examples."""
    parts = [
        fields.get("name") or "",
        fields.get("description") or "",
        fields.get("skill_names") or "",
        fields.get("tags") or "",
        fields.get("skill_descriptions") or "",
        fields.get("examples") or "",
    ]
    return "\n".join(p for p in parts if p)[:MAX_CHARS]


def to_bytes(vector: np.ndarray) -> bytes:
    """A stored vector: float16 (half the bytes; the ranking does not tell the difference)."""
    return np.asarray(vector, dtype=np.float16).tobytes()


def from_bytes(raw: bytes | memoryview, dim: int) -> np.ndarray | None:
    """A stored vector back as float32, or None when it has another dimension."""
    data = np.frombuffer(bytes(raw), dtype=np.float16)
    return data.astype(np.float32) if data.size == dim else None
