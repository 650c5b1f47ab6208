"""Fit a task's draft to a target prompt length and render the final row.

Lengths are measured with the real tokenizer and chat template. To stay cheap (the benchmark
holds generation to a small multiple of one tokenisation pass) every distractor piece is
tokenised once, in batches, and the pieces are summed; the rendered prompt is then tokenised
once to record its actual length, and corrected (pieces added or dropped, a few rounds at
most) if it falls outside ``target ± tolerance``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from data_gen.base import Draft, Piece, Row, Task
from recallm.errors import RecallmError

__all__ = ["PromptRenderer", "build_row", "DraftTooLong", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = 0.02


class PromptRenderer:
    """Chat-template rendering and token counting for one tokenizer."""

    def __init__(self, tokenizer, system_prompt: str | None = None) -> None:
        """``system_prompt``: a literal text, a name of ``data_gen.system_prompts.SYSTEM_PROMPTS``
        (``reasoning``: the paper's reasoning-oriented prompt), or None."""
        from data_gen.system_prompts import resolve_system_prompt

        self.tokenizer = tokenizer
        self.system_prompt = resolve_system_prompt(system_prompt)

    def messages(self, content: str) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": content}]

    def render(self, content: str) -> tuple[str, int]:
        """(prompt text with the generation prompt, offset of ``content`` in it)."""
        text = self.tokenizer.apply_chat_template(self.messages(content), tokenize=False, add_generation_prompt=True)
        offset = text.rfind(content)
        if offset < 0:
            raise RecallmError("the chat template changes the user message text; cannot place gold evidence in it")
        return text, offset

    def _encode_offsets(self, text: str) -> list[int]:
        """Start offsets (characters) of the tokens of ``text``."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return [start for start, _ in backend.encode(text, add_special_tokens=False).offsets]
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [start for start, _ in enc["offset_mapping"]]

    def token_starts(self, text: str) -> np.ndarray:
        """Start offsets of the tokens of a rendered prompt (special tokens parsed from the text), ascending."""
        return np.asarray(self._encode_offsets(text), dtype=np.int64)

    def costs(self, texts: list[str], separator: str) -> list[int]:
        """Tokens each piece adds when the pieces are joined by ``separator`` (its trailing separator
        included), from one tokenisation of the joined text: a token belongs to the piece it starts in."""
        if not texts:
            return []
        starts = np.asarray(self._encode_offsets(separator.join(texts)), dtype=np.int64)
        ends = np.cumsum([len(t) + len(separator) for t in texts])
        upto = np.searchsorted(starts, ends, side="left")
        return np.diff(upto, prepend=0).tolist()

    def count(self, texts: list[str]) -> list[int]:
        """Token counts of pieces of text tokenised on their own (no special tokens added)."""
        if not texts:
            return []
        enc = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
        return [len(ids) for ids in enc["input_ids"]]

    def length(self, prompt_text: str) -> int:
        """Tokens of a rendered prompt (its special tokens are already in the text)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return len(backend.encode(prompt_text, add_special_tokens=False))
        return len(self.tokenizer(prompt_text, add_special_tokens=False, return_attention_mask=False)["input_ids"])


@dataclass
class _Layout:
    content: str
    offsets: list[tuple[int, int]]  # character interval of each piece in content


def _layout(draft: Draft, pieces: list[Piece]) -> _Layout:
    if draft.template is not None:
        before, after = draft.template.split("{context}", 1)
        head, tail = before + draft.header, draft.footer + after
    else:
        head = draft.instruction.strip() + "\n\n"
        if draft.question_position in ("beginning", "both"):
            head += draft.question.strip() + "\n\n"
        head += draft.header
        tail = draft.footer
        if draft.question_position in ("end", "both"):
            tail += "\n\n" + draft.question.strip()
    texts = [piece.text for piece in pieces]
    sep = draft.separator
    starts = list(accumulate((len(t) + len(sep) for t in texts[:-1]), initial=len(head)))[: len(texts)]
    offsets = [(a, a + len(t)) for a, t in zip(starts, texts, strict=True)]
    return _Layout(head + sep.join(texts) + tail, offsets)


def _place(draft: Draft, distractors: list[Piece], rng: random.Random) -> list[Piece]:
    if draft.keep_order:
        return list(distractors)
    pieces = list(distractors)
    for piece in draft.placed:  # each at a uniformly random position
        pieces.insert(rng.randint(0, len(pieces)), piece)
    return pieces


class DraftTooLong(RecallmError):
    """A natural-length draft came out longer than the target; draw another draft."""


def build_row(
    task: Task,
    draft: Draft,
    renderer: PromptRenderer,
    target_tokens: int,
    rng: random.Random,
    *,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Row:
    """Fit ``draft`` to ``target_tokens`` (within ``tolerance``) and render the row.

    A draft with ``fit_length=False`` (short problems, one whole document) is not fitted: every
    piece of its stream is used and ``target_tokens`` is an upper bound (``DraftTooLong`` if the
    prompt exceeds it; the caller draws another draft).
    """
    if not draft.fit_length:
        pieces = list(draft.distractors)
        updates = draft.finalize(pieces) if draft.finalize else {}
        layout = _layout(draft, pieces)
        prompt_text, content_at = renderer.render(layout.content)
        actual = renderer.length(prompt_text)
        if actual > target_tokens:
            raise DraftTooLong(f"task {task.name}: this draft has {actual} tokens, more than {target_tokens}")
        return _row(task, draft, renderer, pieces, layout, prompt_text, content_at, actual, actual, seed, updates)

    task.check_length(target_tokens)
    base = renderer.length(renderer.render(_layout(draft, _place(draft, [], random.Random(0))).content)[0])
    budget = target_tokens - base
    if budget < 0:
        raise RecallmError(
            f"task {task.name}: the prompt without distractors already has {base} tokens, more than the target "
            f"{target_tokens}"
        )
    sep = draft.separator
    stream = draft.distractors
    pending: list[tuple[Piece, int]] = []  # measured (exact cost) but not used
    exhausted = False

    def pull(n: int) -> list[Piece]:
        nonlocal exhausted
        out = []
        for _ in range(n):
            piece = next(stream, None)
            if piece is None:
                exhausted = True
                break
            out.append(piece)
        return out

    def measure(pieces: list[Piece]) -> None:
        if pieces:
            pending.extend(zip(pieces, renderer.costs([p.text for p in pieces], sep), strict=True))

    # a small measured sample sets the tokens-per-character rate; the bulk is only estimated here and
    # measured exactly by the one tokenisation of the rendered prompt below
    measure(pull(16))
    sample_chars = sum(len(p.text) + len(sep) for p, _ in pending)
    rate = sum(c for _, c in pending) / sample_chars if sample_chars else 1.0
    chosen: list[Piece] = []
    cost: dict[int, float] = {}  # id(piece) -> its cost (exact once measured)
    spent = 0.0
    spare: list[Piece] = []
    for piece, c in list(pending):
        if spent + c <= budget:
            pending.remove((piece, c))
            chosen.append(piece)
            cost[id(piece)] = c
            spent += c
    while spent < budget and not exhausted and not spare:
        for piece in pull(256):
            c = (len(piece.text) + len(sep)) * rate
            if spent + c > budget:
                spare.append(piece)
                continue
            chosen.append(piece)
            cost[id(piece)] = c
            spent += c

    def add(tokens_wanted: int) -> bool:
        """Add measured pieces worth at most ``tokens_wanted`` tokens; False if none could be added."""
        added = 0
        while added < tokens_wanted:
            if spare:
                measure(spare)
                spare.clear()
            if not pending:
                more = pull(max(8, int((tokens_wanted - added) / max(rate * 8, 1.0)) + 1))
                if not more:
                    break
                measure(more)
            kept = []
            for piece, c in pending:
                if added + c <= tokens_wanted:
                    chosen.append(piece)
                    cost[id(piece)] = c
                    added += c
                else:
                    kept.append((piece, c))
            pending[:] = kept
            if kept:  # what is left does not fit: a smaller piece may still come
                if exhausted or len(pending) >= 64:
                    break
                measure(pull(8))
        return added > 0

    placement_rng = random.Random(rng.random())
    for _ in range(4):  # render, measure exactly, correct
        pieces = _place(draft, chosen, random.Random(placement_rng.random()))
        updates = draft.finalize(pieces) if draft.finalize else {}
        layout = _layout(draft, pieces)
        prompt_text, content_at = renderer.render(layout.content)
        starts = renderer.token_starts(prompt_text)
        actual = len(starts)
        # exact cost of every piece: the tokens that start inside it (its separator included)
        bounds = np.asarray([content_at + a for a, _ in layout.offsets] + [content_at + len(layout.content)])
        counts = np.diff(np.searchsorted(starts, bounds, side="left"))
        for piece, n in zip(pieces, counts.tolist(), strict=True):
            cost[id(piece)] = n
        diff = target_tokens - actual
        if abs(diff) <= tolerance * target_tokens:
            break
        if diff > 0:
            if not add(diff):
                break
        else:
            excess = -diff
            while excess > 0 and chosen:
                i = placement_rng.randrange(len(chosen))
                excess -= cost[id(chosen[i])]
                pending.append((chosen[i], cost[id(chosen[i])]))
                del chosen[i]
    if actual < (1 - tolerance) * target_tokens and exhausted and not pending and not spare:
        raise RecallmError(
            f"task {task.name} cannot reach {target_tokens} tokens: its distractors ran out at {actual} tokens"
        )
    return _row(task, draft, renderer, pieces, layout, prompt_text, content_at, actual, target_tokens, seed, updates)


def _row(task, draft, renderer, pieces, layout, prompt_text, content_at, actual, target, seed, updates) -> Row:
    gold = []
    if draft.evidence:
        for piece, (start, end) in zip(pieces, layout.offsets, strict=True):
            if piece.gold:
                gold.append({"text": piece.text, "start": content_at + start, "end": content_at + end})
    answers = updates.get("answers", draft.answers)
    ground_truth = {"category": task.category, "answers": answers, **draft.ground_truth, **updates}
    if draft.evidence:
        ground_truth["gold"] = gold
    return Row(
        task=task.name,
        category=task.category,
        data_source=task.data_source,
        seed=seed,
        messages=renderer.messages(layout.content),
        prompt_text=prompt_text,
        prompt_tokens=actual,
        target_tokens=target,
        question=draft.question,
        answers=answers,
        gold=gold,
        augmentations=dict(draft.augmentations, question_position=draft.question_position),
        ground_truth=ground_truth,
        n_pieces=len(pieces),
        trace_info=draft.trace_info,
        instruction=draft.instruction.strip(),
    )
