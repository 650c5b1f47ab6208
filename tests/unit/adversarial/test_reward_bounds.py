"""The reward, fed hostile responses (issue 31): ``bytes`` is refused, not scored as its ``repr``;
many distinct spans over a long prompt are looked up in an index of the prompt built once, with
the same answer as a search of each (whose cost grew as spans x prompt length: 6.7 s for 30K
spans over 500K characters; ``bench/reward_spans.py`` measures the gain)."""

from __future__ import annotations

import json
import random
import string

import pytest

from recallm.errors import RecallmError

PROMPT = "Documents:\n[1] Paris is in France.\n[2] Lyon is in France.\nQuestion: ?\n"
GT = {"category": "single_hop_qa", "answers": ["Paris"], "gold": [{"text": "Paris is in France.", "start": 15, "end": 34}]}


@pytest.mark.parametrize("response", [b"Answer: Paris", bytearray(b"Answer: Paris"), 3, ["Answer: Paris"]])
def test_non_text_response_is_refused(response):
    from rewards import score_response

    with pytest.raises(RecallmError, match=r"the response must be text \(str\), got \w+"):
        score_response(response, GT, prompt_text=PROMPT)


def test_bytes_response_in_score_file_is_one_line(tmp_path):
    """A JSON file cannot hold bytes, but a list or a number in ``response`` is the same mistake."""
    from recallm.cli.score import score_file

    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"response": ["Answer: Paris"], "ground_truth": GT, "prompt_text": PROMPT}) + "\n")
    with pytest.raises(RecallmError, match=r"in\.jsonl:1: the response must be text"):
        score_file(rows, tmp_path / "out.jsonl", None)
    assert not (tmp_path / "out.jsonl").exists()


def _texts(rng: random.Random, prompt: str, n: int) -> list[str]:
    alphabet = string.ascii_lowercase[:6] + "é\u4e2d "
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:
            a = rng.randrange(0, len(prompt))
            out.append(prompt[a : a + rng.randint(1, 30)])
        elif kind < 0.7:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
        else:
            a = rng.randrange(0, len(prompt))
            s = list(prompt[a : a + rng.randint(9, 30)])
            if s:
                s[rng.randrange(len(s))] = rng.choice(alphabet)
            out.append("".join(s))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_indexed_lookup_agrees_with_direct_search(seed, monkeypatch):
    import rewards.recall as recall

    rng = random.Random(seed)
    alphabet = string.ascii_lowercase[:6] + "é\u4e2d "
    prompt = "".join(rng.choice(alphabet) for _ in range(5000)) + "a" * 300  # a periodic run too
    texts = _texts(rng, prompt, 3000) + ["a" * 200, "a" * 299 + "b", "a" * 400, ""]
    monkeypatch.setattr(recall, "_DIRECT", 10)
    monkeypatch.setattr(recall, "_CANDIDATES", 4 if seed % 2 else 64)
    assert recall.occurring(prompt, texts) == [t for t in dict.fromkeys(texts) if t in prompt]


def test_many_spans_use_the_index(monkeypatch):
    """Above ``_DIRECT`` distinct spans, no span is searched in the whole prompt unless its rarest
    k-gram is common (``_CANDIDATES``); the score is the same."""
    import rewards.recall as recall
    from rewards.recall import GoldPassage, recall_overlap_detail

    rng = random.Random(7)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) for _ in range(500)]
    prompt = " ".join(rng.choice(words) for _ in range(20000))
    gold = GoldPassage(prompt[5000:5100], 5000, 5100)
    spans = _texts(rng, prompt, 4000)
    built = []
    original = recall._PromptIndex.__init__

    def spy(self, text):
        built.append(len(text))
        original(self, text)

    monkeypatch.setattr(recall._PromptIndex, "__init__", spy)
    indexed = recall_overlap_detail(prompt, spans, [gold], tau=0.8)
    assert built == [len(prompt)]
    monkeypatch.setattr(recall, "_DIRECT", 10**9)
    assert recall_overlap_detail(prompt, spans, [gold], tau=0.8) == indexed
    assert built == [len(prompt)]
