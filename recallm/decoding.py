"""The decoding steps under :func:`recallm.generation.generate`: per-request random streams, the
processing of one step's logits, and speculative decoding inside recall spans.

**Per-request random streams.** A sampled row draws one uniform number per generated token from a
stream of its own, :class:`RowStreams` (a ``torch.Generator`` seeded with the request's ``seed``; a
request without one draws from torch's default generator, the caller's stream), and takes the token
at that point of the processed distribution's cumulative sum (inverse-CDF sampling:
:func:`inverse_cdf`). A row's tokens are then a function of its prompt, its seed and the model alone:
not of the rows batched with it, their order, the batch size or when the request arrived (up to the
floating-point noise left padding leaves in a row's logits, which moves a token only if a draw lands
within that noise of a boundary of the cumulative sum). The draws are batched: one ``softmax`` and one
``cumsum`` over the batch, one number per row from its generator.

**The processing of a step** (:class:`Chain`) is one list, in vLLM's order: the recall mask,
repetition penalty, temperature, top-k, top-p, the log-prob recorders, the forced spans (a test and
demo aid), then the choice (greedy: the largest; sampled: the row's draw). ``Chain.hf_processors``
gives it to Hugging Face ``generate`` as logits processors (the choice made by :class:`RowSampler`
as a one-hot row that greedy search takes); ``Chain.choose`` runs it on any rows of a step.

**Speculative decoding inside recall spans** (:func:`decode`). Inside a span the matcher knows what
the context continues with: while every surviving occurrence of the span so far continues the same
way, the only tokens allowed are that continuation and the end token
(``RecallMatcher.continuation``). The decoder drafts that continuation (at most ``draft_tokens``
tokens) and verifies it in one forward pass over the row's last token and the draft; then at every
verified position, in order, it runs the same step as plain decoding (the recall mask of the matcher
fed the tokens accepted before it, the warpers, the log-prob, the choice) and keeps the draft token
while the step chose it. The first position where the step chose another token ends the row's step
with that token; when the whole draft is accepted the last position gives one token more. Every
generated token is therefore the token plain decoding picks at that position: greedy, the argmax of
the same processed logits; sampled, the inverse-CDF draw with the row's next uniform — the
speculative acceptance rule for a point-mass draft (a draft token ``d`` is kept with probability
``p(d)``, else the token is drawn from ``p`` without ``d``), coupled with plain decoding by using the
same uniform, so that outputs are the same tokens (not only the same distribution) and draws stay
reproducible: a row uses exactly one uniform per generated token, as in plain decoding. The logits
of a verified position come from one forward pass over several tokens rather than one token at a
time: equal up to floating-point noise.

Rows of a batch verify drafts of different lengths in one forward pass: every running row gets the
block's width, shorter rows' slots are masked out, and the slots of rejected draft tokens are masked
out of every later step (position ids count a row's real tokens only, as ``generate``'s do); the
key-value cache is cut back to the widest accepted run after each step. A wider block costs every
running row a slot per position, so the width is chosen per step (:func:`block_width`): the widest at
which the drafts' expected taken tokens — each row's running estimate of how often its draft tokens
are taken, compounding along the draft — reach :data:`WIDEN_COST` per added slot. Alone, a row drafts
its whole continuation; in a batch, a lone row's draft waits unless it is worth the batch's extra work.
The width changes which tokens are verified together, never which tokens are chosen. Models whose
cache has other than full-attention layers (sliding windows, linear attention) decode plainly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor, LogitsProcessorList

__all__ = ["RowStreams", "inverse_cdf", "RowSampler", "Chain", "decode", "block_width", "supports_speculation"]


class RowStreams:
    """One random stream per batch row: ``torch.Generator`` seeded with the row's seed, or torch's
    default generator (the caller's stream) for a row whose seed is ``None``."""

    def __init__(self, seeds: Sequence[int | None]) -> None:
        self.generators = [None if seed is None else torch.Generator().manual_seed(int(seed)) for seed in seeds]

    def next(self, rows: Sequence[int]) -> torch.Tensor:
        """The next uniform number in [0, 1) of each of ``rows`` (float64, on the CPU)."""
        return torch.tensor(
            [torch.rand((), dtype=torch.float64, generator=self.generators[b]).item() for b in rows],
            dtype=torch.float64,
        )


def inverse_cdf(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token of each row of ``scores`` (logits, ``-inf`` for excluded tokens) at ``uniforms`` (one
    per row) of the softmax's cumulative sum: a draw from the row's distribution."""
    probs = torch.softmax(scores.float(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    target = uniforms.to(cdf.device)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_max(scores.shape[-1] - 1)
    picked = probs.gather(1, tokens[:, None]).squeeze(1)
    for row in torch.nonzero(picked <= 0).flatten().tolist():  # the draw rounded up past the last token
        tokens[row] = torch.nonzero(probs[row] > 0).flatten()[-1]
    return tokens


class RowSampler(LogitsProcessor):
    """The choice of a sampled step inside Hugging Face ``generate``: each row draws its token from
    its own stream (:func:`inverse_cdf`) and gets a one-hot row, which greedy search then takes. The
    last processor of the list."""

    def __init__(self, streams: RowStreams) -> None:
        self.streams = streams

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = inverse_cdf(scores, self.streams.next(range(scores.shape[0])))
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, tokens[:, None].to(out.device), 0.0)
        return out


class LogProbRecorder(LogitsProcessor):
    """Records ``log_softmax`` of the scores it sees; the token chosen at a step is read from the
    next step's ``input_ids`` (and, for the last step, from the finished sequences)."""

    def __init__(self) -> None:
        self._previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self._previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """(B, steps) log-probs of the generated tokens."""
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, sequences[:, -1:]).squeeze(1))
            self._previous = None
        if not self.steps:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.steps, dim=1)


@dataclass
class Chain:
    """The processing of one decoding step, in vLLM's order (see the module doc). ``recall``: a
    ``RecallLogitsProcessor``; ``penalty``: a repetition penalty; ``temperature``; ``truncation``: top-k
    and top-p; ``force``: a ``ForceRecallSpans``; ``streams``: the rows' random streams (``None``:
    greedy). ``log_probs``: record the processed log-prob of every chosen token (a forced token that
    top-k/top-p excluded gets its log-prob before them)."""

    recall: LogitsProcessor | None = None
    penalty: LogitsProcessor | None = None
    temperature: LogitsProcessor | None = None
    truncation: list[LogitsProcessor] = field(default_factory=list)
    force: LogitsProcessor | None = None
    streams: RowStreams | None = None
    log_probs: bool = False

    @property
    def keeps_untruncated(self) -> bool:
        return self.log_probs and self.force is not None and bool(self.truncation)

    def hf_processors(self) -> tuple[LogitsProcessorList, LogProbRecorder | None, LogProbRecorder | None]:
        """The chain as ``generate``'s logits processors, with the log-prob recorders (the one after
        top-k/top-p, and the one before them or ``None``)."""
        processors = LogitsProcessorList(p for p in (self.recall, self.penalty, self.temperature) if p is not None)
        truncated = LogProbRecorder() if self.keeps_untruncated else None
        if truncated is not None:
            processors.append(truncated)
        processors.extend(self.truncation)
        recorder = LogProbRecorder() if self.log_probs else None
        if recorder is not None:
            processors.append(recorder)
        if self.force is not None:
            processors.append(self.force)
        if self.streams is not None:
            processors.append(RowSampler(self.streams))
        return processors, recorder, truncated

    def choose(
        self, rows: list[int], scores: torch.Tensor, sequences: torch.LongTensor | None = None
    ) -> tuple[list[int], list[float] | None]:
        """One step of ``rows`` (their matchers and forced-span states as they stand): the tokens chosen
        from ``scores`` (one row of logits each) and, with ``log_probs``, their processed log-probs.
        ``sequences``: the rows' token ids so far (for the repetition penalty only)."""
        scores = scores.float()
        if self.recall is not None:
            scores = self.recall.mask_rows(scores, rows)
        ids = sequences if sequences is not None else torch.zeros((len(rows), 1), dtype=torch.long)
        if self.penalty is not None:
            scores = self.penalty(ids.to(scores.device), scores)
        if self.temperature is not None:
            scores = self.temperature(ids, scores)
        before = scores if self.keeps_untruncated else None
        for warper in self.truncation:
            scores = warper(ids, scores)
        lps = torch.log_softmax(scores, dim=-1) if self.log_probs else None
        if self.force is not None:
            forced = [(i, tok) for i, b in enumerate(rows) if (tok := self.force.forced(b)) is not None]
            if forced:
                scores = scores.clone()
                for i, tok in forced:
                    scores[i] = float("-inf")
                    scores[i, tok] = 0.0
        if self.streams is None:
            tokens = torch.argmax(scores, dim=-1)
        else:
            tokens = inverse_cdf(scores, self.streams.next(rows))
        chosen = tokens.tolist()
        if lps is None:
            return chosen, None
        picked = lps.gather(1, tokens[:, None].to(lps.device)).squeeze(1)
        if before is not None:
            untruncated = torch.log_softmax(before, dim=-1).gather(1, tokens[:, None].to(lps.device)).squeeze(1)
            picked = torch.where(torch.isfinite(picked), picked, untruncated)
        return chosen, picked.tolist()

    def observe(self, row: int, token: int) -> None:
        """``token`` was generated in ``row``: advance its matcher and forced-span state."""
        if self.recall is not None:
            self.recall.matchers[row].feed_one(token)
        if self.force is not None:
            self.force.observe(row, token)


#: a block is widened by a position only if the rows expect to take at least this many draft tokens for
#: every slot that adds (one slot per running row): a row's draft rides along in a batch whose other rows
#: have none only when it is worth the batch's extra work
WIDEN_COST = 0.25


def block_width(drafts: list[list[int]], rates: list[float], cost: float = WIDEN_COST) -> int:
    """The width of the next verification block (1 + the draft tokens each row may verify): the widest
    ``w`` at which the drafts' expected taken tokens (a row's ``rate`` per token, compounding along its
    draft) reach ``cost`` per added slot (``len(drafts) * (w - 1)`` slots)."""
    longest = max((len(d) for d in drafts), default=0)
    for width in range(longest + 1, 1, -1):
        expected = 0.0
        for draft, rate in zip(drafts, rates, strict=True):
            expected += sum(rate**i for i in range(1, min(len(draft), width - 1) + 1))
        if expected >= cost * len(drafts) * (width - 1):
            return width
    return 1


def _leading_match(tokens: list[int], draft: list[int]) -> int:
    n = 0
    while n < len(draft) and n < len(tokens) and tokens[n] == draft[n]:
        n += 1
    return n


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def supports_speculation(model) -> bool:
    """Whether :func:`decode` can verify drafts on ``model``: its key-value cache is full attention in
    every layer (masked-out slots and cutting the cache back are exact there)."""
    from transformers.cache_utils import DynamicLayer

    try:
        cache = _new_cache(model)
    except Exception:  # noqa: BLE001 - a model whose cache cannot be built here decodes plainly
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def decode(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.LongTensor,
    chain: Chain,
    *,
    budgets: list[int],
    eos: set[int],
    pad: int,
    draft_tokens: int,
    stops: list[Callable[[], bool]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    prompts: list[list[int]] | None = None,
) -> tuple[list[list[int]], list[list[float]] | None, list[int | None]]:
    """Decode a left-padded batch with drafts verified inside recall spans (see the module doc).

    Returns each row's generated ids (up to its first end-of-sequence token or its budget), their
    log-probs with ``chain.log_probs``, and for each row the number of tokens it had when its
    ``stops`` predicate (polled after every step) turned true (``None``: never). ``prompts``: the
    rows' prompt ids without padding (needed with a repetition penalty)."""
    B, width = input_ids.shape
    device = input_ids.device
    rows = list(range(B))
    generated: list[list[int]] = [[] for _ in rows]
    lps: list[list[float]] | None = [[] for _ in rows] if chain.log_probs else None
    done = [False] * B
    counted = [False] * B  # reported to progress as finished
    stopped_at: list[int | None] = [None] * B
    drafts: list[list[int]] = [[] for _ in rows]
    rates = [1.0] * B  # each row's estimated chance that a draft token is taken
    cache = _new_cache(model)
    mask = attention_mask.to(device=device, dtype=torch.long)
    real = mask.sum(dim=1)  # real tokens of each row in the cache and the block
    positions = (mask.cumsum(dim=1) - 1).masked_fill(mask == 0, 0)
    unmasked = hasattr(model, "recall_mask_in_forward")  # our chain masks: not the forward too

    def forward(ids, full_mask, pos, keep):
        kwargs = dict(input_ids=ids, attention_mask=full_mask, position_ids=pos, past_key_values=cache, use_cache=True)
        if keep:
            kwargs["logits_to_keep"] = keep
        if not unmasked:
            return model(**kwargs).logits
        with model.recall_mask_in_forward(False):
            return model(**kwargs).logits

    with torch.inference_mode():
        logits = forward(input_ids, mask, positions, 1)
        if chain.recall is not None:
            chain.recall.start(input_ids, logits.shape[-1])
        if chain.force is not None:
            chain.force.start(input_ids[:, -1].tolist())
        block_start = width - 1  # cache index of the block's first slot (the prompt's last here)
        while True:
            # verify: position j of a row's block gives the distribution after its draft's first j tokens
            active = [b for b in rows if not done[b]]
            new = [0] * B
            finished = 0
            j = 0
            while active:
                sequences = None
                if chain.penalty is not None:
                    sequences = torch.tensor([list(prompts[b]) + generated[b] for b in active], dtype=torch.long)
                tokens, token_lps = chain.choose(active, logits[active, j, :], sequences)
                verifying = []
                for i, b in enumerate(active):
                    token = tokens[i]
                    generated[b].append(token)
                    if lps is not None:
                        lps[b].append(token_lps[i])
                    new[b] += 1
                    chain.observe(b, token)
                    if token in eos or len(generated[b]) >= budgets[b]:
                        done[b] = True
                        finished += 1
                        counted[b] = True
                    elif j < len(drafts[b]) and token == drafts[b][j]:
                        verifying.append(b)
                active = verifying
                j += 1
            if stops is not None:
                for b in rows:
                    if not done[b] and stopped_at[b] is None and stops[b]():
                        stopped_at[b], done[b] = len(generated[b]), True
            if progress is not None:
                progress(sum(new), finished)
            running = [b for b in rows if not done[b]]
            if not running:
                break
            # the slots of this block that stay: the row's last token and its accepted draft tokens
            width_before = mask.shape[1]
            accepted = [new[b] - 1 if new[b] else 0 for b in rows]
            keep = 1 + max(accepted[b] for b in running)
            if block_start + keep < width_before:
                cache.crop(block_start + keep)
            mask = mask[:, : block_start + keep].clone()
            for b in rows:
                if new[b]:
                    first_rejected = block_start + 1 + accepted[b]
                    mask[b, first_rejected:] = 0  # rejected draft slots (and the block's padding)
            real = mask.sum(dim=1)
            for b in running:  # how often each row's drafts are taken (the block's width below uses it)
                if drafts[b]:
                    taken = _leading_match(generated[b][-new[b] :], drafts[b])
                    observed = 1.0 if taken == len(drafts[b]) else taken / (taken + 1)
                    rates[b] = 0.5 * rates[b] + 0.5 * observed
            # the next block: each running row's newest token, then its draft
            for b in rows:
                drafts[b] = []
                if not done[b] and chain.recall is not None and chain.recall.matchers[b].in_span:
                    room = budgets[b] - len(generated[b]) - 1
                    drafts[b] = chain.recall.matchers[b].continuation(min(draft_tokens, room))
            m = block_width([drafts[b] for b in running], [rates[b] for b in running])
            for b in running:
                del drafts[b][m - 1 :]
            block = torch.full((B, m), pad, dtype=torch.long)
            block_mask = torch.zeros((B, m), dtype=torch.long)
            for b in running:
                block[b, 0] = generated[b][-1]
                block[b, 1 : 1 + len(drafts[b])] = torch.tensor(drafts[b], dtype=torch.long)
                block_mask[b, : 1 + len(drafts[b])] = 1
            block, block_mask = block.to(device), block_mask.to(device)
            pos = real[:, None] + torch.arange(m, device=device)[None, :]
            block_start = mask.shape[1]
            mask = torch.cat([mask, block_mask], dim=1)
            logits = forward(block, mask, pos, 0)
    if progress is not None:
        left = sum(1 for b in rows if not counted[b])
        if left:
            progress(0, left)
    return generated, lps, stopped_at
