"""Saved sequences restored: the cells a state left answer the next question as a fresh
evaluation of the same tokens does, split at the same place (the real SmolLM2 model)."""

import numpy as np
import pytest

from scorer_container.llama import Batch

pytestmark = pytest.mark.model

STEP = "step {i}: the agent called tool_{t} with argument {a} and got ok. "


def transcript(llama, steps: int) -> list[int]:
    text = "".join(STEP.format(i=i, t=i % 7, a=i * 37 % 101) for i in range(steps))
    return llama.tokenize(text, add_bos=llama.adds_bos)


def decode(llama, tokens, seq, start=0) -> np.ndarray:
    """Decode `tokens` at positions from `start` in pieces of n_batch; the last token's logits."""
    for i in range(0, len(tokens), llama.n_batch):
        batch = Batch.empty()
        piece = tokens[i:i + llama.n_batch]
        for j, token in enumerate(piece):
            batch.add(token, start + i + j, seq, i + j == len(tokens) - 1)
        llama.decode(batch)
    return llama.logits(len(piece) - 1)


def test_a_restored_state_answers_exactly_as_a_fresh_one_split_at_the_same_place(smollm2_llama):
    llama = smollm2_llama
    state, question = transcript(llama, 30), llama.tokenize(" Did the agent finish? Answer:")
    with llama.lock:  # each path on an empty cache: the same cells in use, the same sums
        llama.clear()
        decode(llama, state, 1)
        saved = llama.save_sequence(1)
        llama.clear()
        decode(llama, state, 0)
        fresh = decode(llama, question, 0, len(state))
        llama.clear()
        llama.restore_sequence(saved, 2)
        reused = decode(llama, question, 2, len(state))
        llama.clear()
    assert len(saved) > 1000 * len(state) and np.array_equal(fresh, reused)


def test_a_longer_transcript_continues_from_the_part_it_shares(smollm2_llama):
    llama = smollm2_llama
    before, after = transcript(llama, 30), transcript(llama, 31)  # one tool call later
    shared = next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b) if before != after[
        :len(before)] else len(before)
    question = llama.tokenize(" Did the agent finish? Answer:")
    with llama.lock:
        llama.clear()
        decode(llama, before, 1)
        saved = llama.save_sequence(1)
        llama.clear()
        decode(llama, after[:shared], 0)  # the fresh path, split where the saved cells end
        decode(llama, after[shared:], 0, shared)
        fresh = decode(llama, question, 0, len(after))
        llama.clear()
        llama.restore_sequence(saved, 2, keep=shared)
        decode(llama, after[shared:], 2, shared)
        reused = decode(llama, question, 2, len(after))
        llama.clear()
    assert shared > 0.9 * len(before)
    assert np.array_equal(fresh, reused)

