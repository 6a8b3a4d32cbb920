"""The only module that talks to llama.cpp (through llama-cpp-python's ctypes bindings).

It owns one model and one context with a unified KV cache, and offers what the engine
needs and nothing more: tokenize, decode a batch of tokens tagged with sequence ids
and positions (logits requested only where they are read), copy and drop sequences,
and read one logits row. llama.cpp contexts are not thread-safe: callers hold
`LlamaModel.lock` around every use.

Several jobs live in the context at once, each in sequences of its own (a `ModelShare`:
the scheduler's `Job`, or `WholeModel` for tools that own the machine), and take turns
at it one decode at a time; the cache holds `context_jobs` jobs' worth of cells, so a
running job never has to be evicted for another to start. `n_ctx` stays what one job
may use.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import llama_cpp
import numpy as np

from scorer_container.errors import EngineFailure, ModelFileError


@dataclass(frozen=True)
class LlamaSettings:
    n_ctx: int = 4096  # what one job may use; the cache holds `context_jobs` times as many cells
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0
    # Distinct branches that can live in the KV cache at once, every job's together.
    n_seq_max: int = 128
    # Jobs' worth of KV cells (n_ctx each) the cache holds: jobs of several tenants live in it
    # at once and take turns; each cell is memory the scorer holds from its start.
    context_jobs: int = 2
    # Off on purpose: faster, but a prefix-tree read then differs from evaluating the same
    # prompt alone (docs/operations/configuration.md has the figures).
    flash_attn: bool = False
    use_mmap: bool = True
    seed: int = 0


_LOG_SILENCER = None


def _silence_llama_logs() -> None:
    """llama.cpp prints every tensor at load time; route its log through a no-op."""
    global _LOG_SILENCER
    if _LOG_SILENCER is None:
        _LOG_SILENCER = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_LOG_SILENCER, ctypes.c_void_p(0))


@dataclass
class Batch:
    """Tokens for one `llama_decode`, each with its position, sequence and a logits flag."""

    tokens: list[int]
    positions: list[int]
    seq_ids: list[int]
    wants_logits: list[bool]

    @classmethod
    def empty(cls) -> Batch:
        return cls([], [], [], [])

    def add(self, token: int, position: int, seq_id: int, logits: bool) -> int:
        self.tokens.append(token)
        self.positions.append(position)
        self.seq_ids.append(seq_id)
        self.wants_logits.append(logits)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)


class LlamaModel:
    """One loaded GGUF model with one llama.cpp context."""

    def __init__(self, model_path: Path, settings: LlamaSettings) -> None:
        _silence_llama_logs()
        llama_cpp.llama_backend_init()
        self.settings = settings
        self.lock = threading.Lock()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = settings.n_gpu_layers
        model_params.use_mmap = settings.use_mmap
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), model_params)
        if not self._model:
            raise ModelFileError(f"llama.cpp could not load {model_path.name}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = settings.n_ctx * max(1, settings.context_jobs)
        ctx_params.n_batch = settings.n_batch
        ctx_params.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        ctx_params.n_seq_max = settings.n_seq_max
        # One cache shared by every sequence: a branch copied from the state's sequence
        # points at the same cells instead of copying them.
        ctx_params.kv_unified = True
        # Keep sliding-window layers whole, so branches never lose cells they still read.
        ctx_params.swa_full = True
        threads = settings.n_threads or _default_threads()
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = settings.n_threads_batch or threads
        ctx_params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self._ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise ModelFileError("llama.cpp could not create a context (n_ctx too large for memory?)")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.cells = llama_cpp.llama_n_ctx(self._ctx)  # every job's together
        self.n_ctx = min(settings.n_ctx, self.cells)  # what one job may use
        self.n_batch = settings.n_batch
        # The most tokens one turn at the model decodes (a prefill piece): the scorer sets it from
        # the rate it measures, so that a turn lasts about SCORER_STEP_S (scheduler.py).
        self.step_tokens = settings.n_batch
        self.n_seq_max = llama_cpp.llama_n_seq_max(self._ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._batch_capacity = 0
        self._batch: llama_cpp.llama_batch | None = None
        self._control_tokens: frozenset[str] | None = None

    # -- model facts -----------------------------------------------------------------

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def bos_token(self) -> int:
        return llama_cpp.llama_vocab_bos(self._vocab)

    @property
    def eos_token(self) -> int:
        return llama_cpp.llama_vocab_eos(self._vocab)

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def control_tokens(self) -> frozenset[str]:
        """The text of every control token (`<start_of_turn>`, `<|im_start|>`): what the
        tokenizer turns into a real turn marker when it reads it in text (see untrusted.py)."""
        if self._control_tokens is None:  # a scan of the whole vocabulary: once
            control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
            found = set()
            for token in range(self.n_vocab):
                if llama_cpp.llama_vocab_get_attr(self._vocab, token) & control:
                    text = llama_cpp.llama_vocab_get_text(self._vocab, token)
                    if text:
                        found.add(text.decode("utf-8", "replace"))
            self._control_tokens = frozenset(found)
        return self._control_tokens

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # -- text <-> tokens --------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        """Tokens of `text`; special tokens written in the text (`<|im_start|>`) are parsed."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos, True)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos, True)
        if n < 0:
            raise EngineFailure("tokenizer failed")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    # -- evaluation -------------------------------------------------------------------

    def _ensure_batch(self, n_tokens: int) -> llama_cpp.llama_batch:
        if self._batch is None or n_tokens > self._batch_capacity:
            if self._batch is not None:
                llama_cpp.llama_batch_free(self._batch)
            self._batch_capacity = max(n_tokens, self.n_batch)
            self._batch = llama_cpp.llama_batch_init(self._batch_capacity, 0, 1)
        return self._batch

    def decode(self, batch: Batch) -> None:
        """Evaluate one batch (at most n_batch tokens); logits rows follow the flags."""
        n = len(batch)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        raw = self._ensure_batch(n)
        raw.n_tokens = n
        for i in range(n):
            raw.token[i] = batch.tokens[i]
            raw.pos[i] = batch.positions[i]
            raw.n_seq_id[i] = 1
            raw.seq_id[i][0] = batch.seq_ids[i]
            raw.logits[i] = batch.wants_logits[i]
        status = llama_cpp.llama_decode(self._ctx, raw)
        if status != 0:
            # 1 = no KV slot; the engine sizes its work to avoid it, so any failure is ours.
            raise EngineFailure(f"llama_decode returned {status}")

    def prefill(self, tokens: list[int], before_each=None, rows: frozenset[int] = frozenset(), seq_id: int = 0) -> int:
        """Decode `tokens` as sequence `seq_id` in n_batch pieces, logits for the last token (and
        at `rows`); `before_each()` runs before every decode (a deadline check). Returns the
        last token's index in the last batch. The caller holds the model throughout."""
        last_index = 0
        for batch in prefill_pieces(tokens, self.n_batch, seq_id, rows):
            if before_each is not None:
                before_each()
            self.decode(batch)
            last_index = len(batch) - 1
        return last_index

    def logits(self, batch_index: int) -> np.ndarray:
        """The next-token logits for token `batch_index` of the last decoded batch (a copy)."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        if not ptr:
            raise EngineFailure("llama.cpp returned no logits for a position that asked for them")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def copy_sequence(self, source: int, target: int) -> None:
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, -1, -1)

    def drop_sequence(self, seq_id: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)

    def drop_sequences(self, seq_ids: Sequence[int]) -> None:
        """Free every cell of these sequences (a job's, when it ends): the others' stay."""
        for seq_id in seq_ids:
            llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)

    def save_sequence(self, seq_id: int, max_bytes: int | None = None) -> bytes | None:
        """The cells of sequence `seq_id` as llama.cpp saves them (scorer_container.state_cache);
        None, without copying anything, when they take more than `max_bytes`."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq_id)
        if max_bytes is not None and size > max_bytes:
            return None
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, seq_id)
        if written != size:
            raise EngineFailure(f"llama.cpp saved {written} of {size} bytes of a sequence")
        return bytes(buffer)

    def restore_sequence(self, data: bytes, seq_id: int, keep: int | None = None) -> None:
        """Load saved cells into the (empty) sequence `seq_id`, keeping its first `keep` positions
        only (the part a request shares with the saved state). EngineFailure when llama.cpp has
        no room for them: the caller evaluates afresh."""
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(data), seq_id) != len(data):
            llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            raise EngineFailure("llama.cpp could not restore a saved sequence")
        # A memory that cannot drop a sequence's tail (recurrent models) would keep stale cells:
        # refused, never answered from.
        if keep is not None and not llama_cpp.llama_memory_seq_rm(self._memory, seq_id, keep, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            raise EngineFailure("llama.cpp could not cut a restored sequence to its shared part")

    # -- sampling (chat) ----------------------------------------------------------------

    def sampler(self, temperature: float, top_p: float, top_k: int, seed: int) -> Sampler:
        return Sampler(self._ctx, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None


def prefill_pieces(tokens: Sequence[int], piece: int, seq_id: int, rows: frozenset[int] = frozenset()):
    """`tokens` as batches of at most `piece` tokens in one sequence, logits at the last and at `rows`."""
    for start in range(0, len(tokens), piece):
        batch = Batch.empty()
        for i, token in enumerate(tokens[start : start + piece]):
            position = start + i
            batch.add(token, position, seq_id, position == len(tokens) - 1 or position in rows)
        yield batch


class ModelShare(Protocol):
    """What one job holds of the model: sequences of its own, and turns at it one decode at a
    time (`step`: the decode and the reads of its logits happen inside one turn, since the next
    job's decode overwrites them)."""

    seqs: tuple[int, ...]

    @property
    def step_tokens(self) -> int: ...

    def step(self) -> AbstractContextManager[object]: ...


class WholeModel:
    """A job that owns the model: tools, tests and the measurements at load, which run alone."""

    def __init__(self, llama: LlamaModel) -> None:
        self.seqs = tuple(range(llama.n_seq_max))
        self._llama = llama

    @property
    def step_tokens(self) -> int:
        return self._llama.step_tokens

    def step(self) -> AbstractContextManager[object]:
        return self._llama.lock


class Sampler:
    """A llama.cpp sampler chain: greedy at temperature 0, else top-k, top-p, temperature, seeded draw."""

    def __init__(self, ctx: object, *, temperature: float, top_p: float, top_k: int, seed: int) -> None:
        self._ctx = ctx
        params = llama_cpp.llama_sampler_chain_default_params()
        self._chain = llama_cpp.llama_sampler_chain_init(params)
        if temperature <= 0:
            llama_cpp.llama_sampler_chain_add(self._chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                llama_cpp.llama_sampler_chain_add(self._chain, llama_cpp.llama_sampler_init_top_k(top_k))
            if 0 < top_p < 1:
                llama_cpp.llama_sampler_chain_add(self._chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
            llama_cpp.llama_sampler_chain_add(self._chain, llama_cpp.llama_sampler_init_temp(temperature))
            llama_cpp.llama_sampler_chain_add(self._chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, batch_index: int) -> int:
        token = llama_cpp.llama_sampler_sample(self._chain, self._ctx, batch_index)
        return int(token)

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def _default_threads() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
