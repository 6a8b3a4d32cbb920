"""Evaluate many prompts that share prefixes, each shared token once.

Callers hand in token sequences (one per prompt branch) and, for each, the positions
whose next-token log-probabilities they need and the candidate tokens to read there.
The sequences are merged into a radix tree (built from the tokens, so prefix + suffix
is always exactly the tokenization of the whole prompt, whatever the tokenizer does at
the seam). Each tree node is decoded once in its own llama.cpp sequence, which first
takes its parent's KV cells with `seq_cp` (the unified cache shares the cells, it does
not copy them). Nodes are packed into batches of up to `n_batch` tokens; logits are
requested only at read positions, and a leaf's cells are released as soon as its reads
are done, so memory is bounded by the tree's live paths, not by the request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scorer_container.errors import ContextOverflow
from scorer_container.llama_runtime import Batch, Runtime

# llama.cpp sizes its output buffer by the most logits rows one decode asked for; with a
# 256k vocabulary each row is 1 MiB, so rows per decode are capped to keep memory flat.
MAX_LOGITS_ROWS_PER_DECODE = 32


@dataclass(frozen=True)
class Read:
    """Log-probabilities of `candidates` for the token after `position` (0-based, in the sequence)."""

    position: int
    candidates: tuple[int, ...]


@dataclass(frozen=True)
class Branch:
    tokens: tuple[int, ...]
    reads: tuple[Read, ...]


@dataclass
class _Node:
    start: int
    tokens: list[int]
    parent: _Node | None
    children: list[_Node] = field(default_factory=list)
    # (position within the node, candidates, branch index, read index)
    reads: list[tuple[int, tuple[int, ...], int, int]] = field(default_factory=list)
    seq_id: int | None = None
    pending_children: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class TreeResult:
    # results[b][r]: log-probabilities (natural log, over the whole vocabulary) of the
    # candidates of read r of branch b.
    results: list[list[np.ndarray]]
    evaluated_tokens: int


def build_tree(branches: Sequence[Branch]) -> _Node:
    """Merge the branches into a radix tree; the root covers their common prefix (maybe empty)."""
    root = _Node(start=0, tokens=[], parent=None)
    _grow(root, list(range(len(branches))), branches)
    for b, branch in enumerate(branches):
        for r, read in enumerate(branch.reads):
            if not 0 <= read.position < len(branch.tokens):
                raise ValueError(f"read at {read.position} outside a branch of {len(branch.tokens)} tokens")
            node = _node_at(root, branch.tokens, read.position)
            node.reads.append((read.position - node.start, read.candidates, b, r))
    return root


def _grow(node: _Node, members: list[int], branches: Sequence[Branch]) -> None:
    depth = node.start
    first = branches[members[0]].tokens
    end = len(first)
    for m in members[1:]:
        other = branches[m].tokens
        limit = min(end, len(other))
        i = depth
        while i < limit and other[i] == first[i]:
            i += 1
        end = i
    node.tokens = list(first[depth:end])
    groups: dict[int, list[int]] = {}
    for m in members:
        tokens = branches[m].tokens
        if len(tokens) > end:
            groups.setdefault(tokens[end], []).append(m)
    for group in groups.values():
        child = _Node(start=end, tokens=[], parent=node)
        node.children.append(child)
        _grow(child, group, branches)


def _node_at(root: _Node, tokens: Sequence[int], position: int) -> _Node:
    node = root
    while position >= node.end:
        next_token = tokens[node.end]
        node = next(c for c in node.children if c.tokens and c.tokens[0] == next_token)
    return node


def longest_path(root: _Node) -> int:
    stack = [root]
    longest = 0
    while stack:
        node = stack.pop()
        longest = max(longest, node.end)
        stack.extend(node.children)
    return longest


def evaluate(runtime: Runtime, branches: Sequence[Branch]) -> TreeResult:
    """Decode the tree of `branches` and return every read. The KV cache is cleared first and after."""
    results: list[list[np.ndarray]] = [[np.empty(0)] * len(b.reads) for b in branches]
    if not branches:
        return TreeResult(results, 0)
    root = build_tree(branches)
    # A decode may place tokens in cells freed out of order; keep one micro-batch of slack.
    capacity = runtime.n_ctx - min(runtime.settings.n_ubatch, runtime.n_batch)
    if longest_path(root) > capacity:
        raise ContextOverflow(
            f"the prompt needs {longest_path(root)} tokens of context; this model serves at most {capacity}"
        )
    runtime.clear()
    try:
        evaluated = _run(runtime, root, results)
    finally:
        runtime.clear()
    return TreeResult(results, evaluated)


def _run(runtime: Runtime, root: _Node, results: list[list[np.ndarray]]) -> int:
    free_seqs = deque(range(runtime.n_seq_max))
    evaluated = 0

    def release(node: _Node | None) -> None:
        while node is not None:
            if node.seq_id is not None:
                runtime.drop_sequence(node.seq_id)
                free_seqs.append(node.seq_id)
                node.seq_id = None
            parent = node.parent
            if parent is None:
                return
            parent.pending_children -= 1
            if parent.pending_children > 0:
                return
            node = parent

    # Depth first, so that live sequences are one root-to-leaf path plus the
    # siblings' common ancestors: memory is bounded by the deepest path.
    ready: list[_Node] = [root] if root.tokens else list(reversed(root.children))
    root.pending_children = len(root.children)
    while ready:
        node = ready.pop()
        if not free_seqs:
            raise ContextOverflow("the request branches deeper than this model's parallel sequences allow")
        node.seq_id = free_seqs.popleft()
        parent = node.parent
        if parent is not None and parent.seq_id is not None:
            runtime.copy_sequence(parent.seq_id, node.seq_id)
        _decode_node(runtime, node, results)
        evaluated += len(node.tokens)
        if node.children:
            node.pending_children = len(node.children)
            ready.extend(reversed(node.children))
        else:
            release(node)
    return evaluated


def _decode_node(runtime: Runtime, node: _Node, results: list[list[np.ndarray]]) -> None:
    """Decode one node's tokens in its own sequence.

    One sequence per `llama_decode` on purpose: with a unified KV cache, llama.cpp gives
    wrong logits to the second of two sequences decoded in the same batch (identical
    suffixes in two sequences came out up to 0.3 apart; upstream issue
    ggml-org/llama.cpp#24962). Decoding them one after another is exact and measured
    within a few percent of one batched decode.
    """
    reads_at: dict[int, list[tuple[tuple[int, ...], int, int]]] = {}
    for local, candidates, b, r in node.reads:
        reads_at.setdefault(local, []).append((candidates, b, r))
    batch = Batch.empty()
    pending: list[tuple[int, tuple[int, ...], int, int]] = []
    rows = 0

    def flush() -> None:
        nonlocal rows
        runtime.decode(batch)
        for index, candidates, b, r in pending:
            results[b][r] = _log_probs(runtime.logits(index), candidates)
        batch.tokens.clear()
        batch.positions.clear()
        batch.seq_ids.clear()
        batch.wants_logits.clear()
        pending.clear()
        rows = 0

    for i, token in enumerate(node.tokens):
        wanted = reads_at.get(i)
        if len(batch) >= runtime.n_batch or (wanted and rows >= MAX_LOGITS_ROWS_PER_DECODE):
            flush()
        index = batch.add(token, node.start + i, node.seq_id, bool(wanted))
        if wanted:
            rows += 1
            pending.extend((index, candidates, b, r) for candidates, b, r in wanted)
    if len(batch):
        flush()


def _log_probs(logits: np.ndarray, candidates: tuple[int, ...]) -> np.ndarray:
    row = logits.astype(np.float64)
    peak = row.max()
    log_norm = peak + np.log(np.exp(row - peak).sum())
    return row[list(candidates)] - log_norm
