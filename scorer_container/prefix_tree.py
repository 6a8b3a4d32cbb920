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

Sibling leaves (the option continuations of a likelihood probe, say) are decoded
together: one `llama_decode` carries all of them, each token tagged with its own
sequence, so each attends only to its parent's cells and its own. Two identical
continuations in one batch come out bit-identical; against its prompt evaluated alone,
a continuation's log-probabilities move by rounding only, because llama.cpp's CPU
kernels round differently for different batch shapes.
tests/integration/test_engine.py holds both.

The root starts with the state (a `Stem`: every prompt of a decision starts with the template's
head and the state). Its first tokens are decoded as pieces of their own, split where the
state ends, whether they are decoded or, when a tenant's earlier request saved them
(`state_cache.py`), restored from their saved cells: either way the cells hold the same
numbers, so a request answers the same whether its state was read now or before.
tests/integration/test_state_reuse.py holds that.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scorer_container.deadline import Deadline, never
from scorer_container.errors import ContextOverflow, EngineFailure, Overloaded
from scorer_container.llama import Batch, LlamaModel, ModelShare, WholeModel
from scorer_container.state_cache import common_prefix

log = logging.getLogger("scorer")
# llama.cpp sizes its output buffer by the most logits rows one decode asked for; with a
# 256k vocabulary each row is 1 MiB, so rows per decode are capped to keep memory flat.
MAX_LOGITS_ROWS_PER_DECODE = 32


@dataclass(frozen=True, eq=False)
class Sketch:
    """A whole logits row read as `dims` numbers: a count sketch (each vocabulary token
    adds its logit, with its sign, to its bucket). The logits are the output matrix times
    the final hidden state, so the sketch is a fixed random projection of that state:
    a compact representation of the text as the model read it, from a row the decode
    computed anyway. The buckets and signs come from the token id alone (splitmix64),
    never from a random generator whose stream could change between numpy versions."""

    buckets: np.ndarray
    signs: np.ndarray
    dims: int

    @classmethod
    def for_vocabulary(cls, n_vocab: int, dims: int) -> Sketch:
        mixed = _splitmix64(np.arange(n_vocab, dtype=np.uint64))
        buckets = (mixed % np.uint64(dims)).astype(np.intp)
        signs = np.where((mixed >> np.uint64(63)) == 1, -1.0, 1.0)
        # Scaled so that a bucket's value is of the size of one logit, whatever the vocabulary.
        return cls(buckets, signs / np.sqrt(n_vocab / dims), dims)

    def of(self, logits: np.ndarray) -> np.ndarray:
        return np.bincount(self.buckets, weights=self.signs * logits, minlength=self.dims)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class Read:
    """Log-probabilities of `candidates` for the token after `position` (0-based, in the
    sequence), or, when `candidates` is a Sketch, the sketch of that position's logits row."""

    position: int
    candidates: tuple[int, ...] | Sketch


@dataclass(frozen=True)
class Branch:
    tokens: tuple[int, ...]
    reads: tuple[Read, ...]
    # Branches with the same key whose leaves are siblings are decoded in one batch. The
    # caller gives one key to the continuations of one probe only: batching changes where
    # a leaf's cells sit in the cache, and so its last bits, so a probe's numbers must
    # never depend on which other probes share its request.
    batch_key: int | None = None


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
    batch_key: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class Stem:
    """The state's part of the tree (`tokens`: what every branch starts with up to the state's
    end, as far as the root runs): decoded in pieces of its own, so that its cells are the same
    numbers whether a fresh evaluation made them or they were `saved` (the cells of its first
    `matched` tokens, scorer_container.state_cache) and restored. `keep` receives the stem's
    cells once decoded, to serve the next question about the state."""

    tokens: tuple[int, ...]
    saved: bytes | None = None
    matched: int = 0
    keep: Callable[[tuple[int, ...], bytes], None] | None = None
    keep_limit: int | None = None  # cells larger than this are not saved (they could never be kept)


@dataclass
class TreeResult:
    # results[b][r]: log-probabilities (natural log, over the whole vocabulary) of the
    # candidates of read r of branch b.
    results: list[list[np.ndarray]]
    evaluated_tokens: int
    cached_tokens: int = 0  # the stem's tokens restored, not decoded


def build_tree(branches: Sequence[Branch]) -> _Node:
    """Merge the branches into a radix tree; the root covers their common prefix (maybe empty)."""
    root = _Node(start=0, tokens=[], parent=None)
    _grow(root, list(range(len(branches))), branches)
    keys: dict[int, set[int | None]] = {}
    leaves: dict[int, _Node] = {}
    for branch in branches:
        if branch.tokens:
            leaf = _node_at(root, branch.tokens, len(branch.tokens) - 1)
            if not leaf.children:
                keys.setdefault(id(leaf), set()).add(branch.batch_key)
                leaves[id(leaf)] = leaf
    for key, leaf in leaves.items():
        # Identical branches share a leaf: it batches only if they all agree.
        leaf.batch_key = next(iter(keys[key])) if len(keys[key]) == 1 else None
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


def context_capacity(llama: LlamaModel) -> int:
    """The longest path a tree may have: a decode may place tokens in cells freed out of
    order, and a batch of sibling leaves lives beside the path, so one micro-batch of
    the context stays in reserve."""
    return llama.n_ctx - _reserve(llama)


def cells_for(llama: LlamaModel, tokens: int) -> int:
    """The KV cells a tree of `tokens` decoded tokens holds at most: a cell a token, never more
    than one job's context (a path within the capacity, and the reserve beside it)."""
    return min(llama.n_ctx, tokens + _reserve(llama))


def _reserve(llama: LlamaModel) -> int:
    return min(llama.settings.n_ubatch, llama.n_batch)


def longest_path(root: _Node) -> int:
    stack = [root]
    longest = 0
    while stack:
        node = stack.pop()
        longest = max(longest, node.end)
        stack.extend(node.children)
    return longest


def evaluate(llama: LlamaModel, branches: Sequence[Branch], deadline: Deadline | None = None,
             share: ModelShare | None = None, stem: Stem | None = None) -> TreeResult:
    """Decode the tree of `branches` in the sequences of `share` (the whole model when None) and
    return every read. Each decode is one turn at the model (`share.step()`), a node's tokens
    decoded in pieces of `share.step_tokens`; the share's sequences are freed after, however the
    evaluation ends, and the other jobs' cells are never touched.

    `deadline` is checked before every decode: when it passes (or the caller leaves) the
    evaluation stops there with DeadlineExceeded. With a `stem`, the root's first tokens are
    restored from its saved cells where it has them, and its cells are kept once decoded.
    """
    results: list[list[np.ndarray]] = [[np.empty(0)] * len(b.reads) for b in branches]
    if not branches:
        return TreeResult(results, 0)
    root = build_tree(branches)
    capacity = context_capacity(llama)
    if longest_path(root) > capacity:
        raise ContextOverflow(
            f"the prompt needs {longest_path(root)} tokens of context; this model serves at most {capacity}"
        )
    share = share or WholeModel(llama)
    try:
        evaluated, cached = _run(llama, share, root, results, deadline or never(), stem)
    finally:
        with llama.lock:
            llama.drop_sequences(share.seqs)
    return TreeResult(results, evaluated, cached)


def _run(llama: LlamaModel, share: ModelShare, root: _Node, results: list[list[np.ndarray]], deadline: Deadline,
         stem: Stem | None) -> tuple[int, int]:
    """(tokens decoded, tokens restored) of the tree."""
    free_seqs = deque(share.seqs)
    evaluated = cached = 0
    step_tokens = max(1, share.step_tokens)

    def release(node: _Node | None) -> None:
        while node is not None:
            if node.seq_id is not None:
                with llama.lock:  # dropping cells needs the context, not a turn
                    llama.drop_sequence(node.seq_id)
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
        leaves = _batched_leaves(llama, share, node, ready, free_seqs, results, deadline, step_tokens)
        if leaves:
            for leaf in leaves:
                evaluated += len(leaf.tokens)
                release(leaf)
            continue
        if not free_seqs:
            raise ContextOverflow("the request branches deeper than this model's parallel sequences allow")
        node.seq_id = free_seqs.popleft()
        parent = node.parent
        if parent is not None and parent.seq_id is not None:
            with llama.lock:
                llama.copy_sequence(parent.seq_id, node.seq_id)
        if node is root and stem is not None:
            cached = _decode_stem(llama, share, root, stem, results, deadline, step_tokens)
        else:
            _decode_node(llama, share, node, results, deadline, step_tokens)
        evaluated += len(node.tokens) - (cached if node is root else 0)
        if node.children:
            node.pending_children = len(node.children)
            ready.extend(reversed(node.children))
        else:
            release(node)
    return evaluated, cached


def _decode_stem(llama: LlamaModel, share: ModelShare, root: _Node, stem: Stem, results: list[list[np.ndarray]],
                 deadline: Deadline, step_tokens: int) -> int:
    """Decode the root with its stem first: restored from the saved cells as far as they match
    (a turn: a few milliseconds), the rest of the stem decoded, its cells kept, then the rest of
    the root; how many tokens were restored. A restore llama.cpp finds no room for (it places
    the saved cells in one run of free cells, then cuts them to the shared part) is 503: the
    request was admitted for the work left after it, and decoding the state instead could take
    twice that; on a retry the context is less crowded."""
    boundary = common_prefix(stem.tokens, root.tokens)
    matched = min(stem.matched, boundary) if stem.saved is not None else 0
    if matched:
        try:
            with share.step():
                llama.restore_sequence(stem.saved, root.seq_id, keep=matched)
        except EngineFailure:
            raise Overloaded("the model's memory is too crowded to restore this state now; retry later", 1) from None
    if matched < boundary:
        _decode_node(llama, share, root, results, deadline, step_tokens, first=matched, last=boundary)
        if stem.keep is not None:
            _keep(llama, share, root, stem, boundary)
    if boundary < len(root.tokens):
        _decode_node(llama, share, root, results, deadline, step_tokens, first=boundary)
    return matched


def _keep(llama: LlamaModel, share: ModelShare, root: _Node, stem: Stem, boundary: int) -> None:
    """Save the stem's cells for the next request (a turn: milliseconds); a failure to save costs
    the next request its head start, never this one its answer."""
    try:
        with share.step():
            saved = llama.save_sequence(root.seq_id, stem.keep_limit)
    except EngineFailure:
        log.warning("a state's cells could not be saved for reuse", exc_info=True)
        return
    if saved is not None:
        stem.keep(tuple(root.tokens[:boundary]), saved)


def _batched_leaves(llama: LlamaModel, share: ModelShare, node: _Node, ready: list[_Node], free_seqs: deque[int],
                    results: list[list[np.ndarray]], deadline: Deadline, step_tokens: int) -> list[_Node]:
    """When `node` is a leaf that batches with its siblings next on the stack: decode them all in
    one turn, each in a sequence of its own copied from their parent, and return them (their
    sequences still held); else nothing is decoded and nothing returned."""
    if node.batch_key is None or node.children or node.parent is None:
        return []
    # Half the reserve: the group's cells beside the path, plus slack for the decode; and no
    # more than one turn's tokens.
    leaves = _sibling_leaves(node, ready, min(_reserve(llama) // 2, step_tokens), len(free_seqs))
    if len(leaves) < 2:
        return []  # nothing was taken from the stack
    for leaf in leaves:
        leaf.seq_id = free_seqs.popleft()
    with share.step():
        for leaf in leaves:
            if node.parent.seq_id is not None:
                llama.copy_sequence(node.parent.seq_id, leaf.seq_id)
        _decode_leaves(llama, leaves, results, deadline)
    return leaves


def _read_rows(node: _Node) -> int:
    return len({local for local, *_ in node.reads})


def _reads_by_position(node: _Node) -> dict[int, list[tuple[tuple[int, ...], int, int]]]:
    """(candidates, branch, read) wanted at each position of the node."""
    reads_at: dict[int, list[tuple[tuple[int, ...], int, int]]] = {}
    for local, candidates, b, r in node.reads:
        reads_at.setdefault(local, []).append((candidates, b, r))
    return reads_at


def _sibling_leaves(first: _Node, ready: list[_Node], max_tokens: int, free: int) -> list[_Node]:
    """`first` and the leaves after it on the stack that share its parent and fit one decode with it."""
    leaves = [first]
    tokens, rows = len(first.tokens), _read_rows(first)
    if tokens > max_tokens or rows > MAX_LOGITS_ROWS_PER_DECODE:
        return leaves
    while ready and len(leaves) < free:
        candidate = ready[-1]
        if candidate.parent is not first.parent or candidate.children or candidate.batch_key != first.batch_key:
            break
        if tokens + len(candidate.tokens) > max_tokens or rows + _read_rows(candidate) > MAX_LOGITS_ROWS_PER_DECODE:
            break
        leaves.append(ready.pop())
        tokens += len(candidate.tokens)
        rows += _read_rows(candidate)
    return leaves


def _decode_leaves(llama: LlamaModel, leaves: list[_Node], results: list[list[np.ndarray]], deadline: Deadline) -> None:
    """Decode sibling leaves in one batch, each in its own sequence (already copied from the parent)."""
    batch = Batch.empty()
    pending: list[tuple[int, tuple[int, ...], int, int]] = []
    for leaf in leaves:
        reads_at = _reads_by_position(leaf)
        for i, token in enumerate(leaf.tokens):
            wanted = reads_at.get(i)
            index = batch.add(token, leaf.start + i, leaf.seq_id, bool(wanted))
            if wanted:
                pending.extend((index, candidates, b, r) for candidates, b, r in wanted)
    deadline.check()
    llama.decode(batch)  # the caller holds the turn, and reads the rows inside it
    for index, candidates, b, r in pending:
        results[b][r] = read_row(llama.logits(index), candidates)


def _decode_node(llama: LlamaModel, share: ModelShare, node: _Node, results: list[list[np.ndarray]], deadline: Deadline,
                 step_tokens: int, first: int = 0, last: int | None = None) -> None:
    """Decode one node's tokens (those from `first` up to `last`) in its own sequence, in pieces
    of at most one turn's tokens (a turn each)."""
    reads_at = _reads_by_position(node)
    batch = Batch.empty()
    pending: list[tuple[int, tuple[int, ...], int, int]] = []
    rows = 0

    def flush() -> None:
        nonlocal rows
        deadline.check()
        with share.step():
            llama.decode(batch)
            logits = [(llama.logits(index), candidates, b, r) for index, candidates, b, r in pending]
        for row, candidates, b, r in logits:
            results[b][r] = read_row(row, candidates)
        batch.tokens.clear()
        batch.positions.clear()
        batch.seq_ids.clear()
        batch.wants_logits.clear()
        pending.clear()
        rows = 0

    for i in range(first, len(node.tokens) if last is None else last):
        token, wanted = node.tokens[i], reads_at.get(i)
        if len(batch) >= step_tokens or (wanted and rows >= MAX_LOGITS_ROWS_PER_DECODE):
            flush()
        index = batch.add(token, node.start + i, node.seq_id, bool(wanted))
        if wanted:
            rows += 1
            pending.extend((index, candidates, b, r) for candidates, b, r in wanted)
    if len(batch):
        flush()


def read_row(logits: np.ndarray, candidates: tuple[int, ...] | Sketch) -> np.ndarray:
    return candidates.of(logits) if isinstance(candidates, Sketch) else log_probs(logits, candidates)


def log_probs(logits: np.ndarray, candidates: tuple[int, ...]) -> np.ndarray:
    row = logits.astype(np.float64)
    peak = row.max()
    log_norm = peak + np.log(np.exp(row - peak).sum())
    return row[list(candidates)] - log_norm
