"""`recallm-decoding-demo`: constrained recall on the tiny default model, in a minute (`make demo` is another thing:
the whole tiny pipeline, data -> SFT -> GRPO -> eval, in about 11 minutes).

Builds the tiny model, adds the RecaLLM tokens, and generates on a synthetic key-value prompt
three ways: with spans forced open and the recall constraint on; with a span injected right
after the lookup key (showing the allowed set shrink step by step); and with the same forced
spans but no constraint. Every span is checked against its searchable context. The model is
untrained: the point is the guarantee, not the text. Exit status 1 if a constrained span is
not verbatim.
"""

from __future__ import annotations

import logging
import sys
import textwrap

import torch
from omegaconf import DictConfig

from recallm.cli.common import hydra_command
from recallm.config import check_value
from recallm.errors import RecallmError, cli_errors
from recallm.io import check_out_dir

log = logging.getLogger(__name__)


def _show_spans(tokenizer, ids: list[int], start_id: int, end_id: int, max_recall_tokens: int) -> tuple[int, int]:
    from recallm.recall import find_spans

    spans = find_spans(ids, start_id, end_id, max_recall_tokens=max_recall_tokens)
    ok = 0
    for i, span in enumerate(spans, 1):
        text = tokenizer.decode(list(span.tokens))
        context_text = tokenizer.decode(ids[: span.start])
        in_text = text in context_text
        ok += span.verbatim and in_text
        mark = "verbatim" if span.verbatim and in_text else "NOT verbatim"
        print(f"    span {i}: {text!r:40} {mark} (token-level {span.verbatim}, substring of context text {in_text})")
    if not spans:
        print("    (no spans)")
    return ok, len(spans)


def _generate(model, tokenizer, prompt: str, cfg: DictConfig, *, constrained: bool, seed: int) -> list[int]:
    """The prompt's ids and one sampled continuation (temperature 1, no top-k/top-p), spans forced
    open, the recall constraint on or off."""
    from recallm.generation import GenRequest, generate

    prompt_ids = tuple(tokenizer(prompt)["input_ids"])
    request = GenRequest(prompt_ids, cfg.generation.max_new_tokens, temperature=1.0, seed=seed)
    force = (cfg.generation.force_every, cfg.generation.force_length)
    (out,) = generate(model, [request], tokenizer=tokenizer, recall=constrained, force=force)
    return list(prompt_ids) + out.token_ids


@cli_errors
def run(cfg: DictConfig) -> int:
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401  (registers the model classes)
    from data_gen.toy_kv import toy_kv_example
    from recallm.recall import RecallMatcher
    from recallm.tiny import create_tiny_from_config
    from recallm.tokens import RecallTokenIds, load_tokenizer

    example = toy_kv_example(cfg.prompt.seed, cfg.prompt.n_pairs)  # validates the prompt settings first
    for key in ("max_new_tokens", "force_every", "force_length", "injected_steps"):
        if int(cfg.generation[key]) < 1:
            raise RecallmError(f"generation.{key} must be >= 1, got {cfg.generation[key]}")
    out_dir = Path(cfg.out_dir) / "tiny-recallm"
    print("RecaLLM decoding demo: constrained recall on the tiny default model")
    print("NOTE: the model is UNTRAINED (random weights): its text is noise. What this shows is the")
    print("      guarantee: every recall span is a verbatim copy of its searchable context. The full")
    print("      pipeline (data -> SFT -> GRPO -> eval) trains it.\n")
    create_tiny_from_config(cfg.model, out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    tokenizer = load_tokenizer(out_dir)
    ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    max_recall = model.config.max_recall_tokens
    print(
        f"model: {out_dir} ({type(model).__name__}, {n_params:,} parameters, {len(tokenizer)} tokens, "
        f"tied={model.config.tie_word_embeddings})"
    )
    print(
        f"recall tokens: <|start_recall|>={ids.start} <|end_recall|>={ids.end} "
        f"<think>={ids.think_start} </think>={ids.think_end}, max_recall_tokens={max_recall}\n"
    )

    prompt = tokenizer.apply_chat_template(example.messages, tokenize=False, add_generation_prompt=True)
    n_prompt = len(tokenizer(prompt)["input_ids"])
    print(f"prompt ({n_prompt} tokens, {cfg.prompt.n_pairs} key-value lines), tail:")
    print(textwrap.indent(prompt[-220:], "    | "))

    results = {}
    for constrained in (True, False):
        label = "constrained" if constrained else "UNconstrained (recall_constrained=False)"
        seq = _generate(model, tokenizer, prompt, cfg, constrained=constrained, seed=cfg.seed)
        print(
            f"[{label}] spans forced every {cfg.generation.force_every} tokens, "
            f"{cfg.generation.force_length} tokens long; generated:"
        )
        print(textwrap.indent(tokenizer.decode(seq[n_prompt:]), "    > "))
        results[constrained] = _show_spans(tokenizer, seq, ids.start, ids.end, max_recall)
        print()

    injected = prompt + f"The key is {example.key}. <|start_recall|>{example.key}:"
    enc = tokenizer(injected, return_tensors="pt")
    matcher = RecallMatcher(ids.start, ids.end, max_recall_tokens=max_recall)
    seq = enc["input_ids"][0].tolist()
    matcher.feed(seq)
    path, probe = [], RecallMatcher(ids.start, ids.end, max_recall_tokens=max_recall)
    probe.feed(seq)
    while len(path) < 4 and (allowed := probe.allowed_ids()) is not None and allowed.size == 2:
        path.append(int(allowed[allowed != ids.end][0]))  # exactly one way to go on besides ending
        probe.feed_one(path[-1])
    print(f"[injected] '...The key is {example.key}. <|start_recall|>{example.key}:' then greedy, constrained:")
    with torch.no_grad():
        for _ in range(cfg.generation.injected_steps):
            allowed = matcher.allowed_ids()
            if allowed is None:
                break
            logits = model(torch.tensor([seq])).logits[0, -1]  # the forward applies the recall mask
            token = int(torch.argmax(logits))
            names = [tokenizer.decode([int(t)]) for t in allowed[:6]]
            more = "" if allowed.size <= 6 else f" ... ({allowed.size} in all)"
            print(f"    allowed {names}{more} -> {tokenizer.decode([token])!r}")
            seq.append(token)
            matcher.feed_one(token)
    print(
        f"    the true value of key {example.key} is {example.value!r}; the context leaves the span one way "
        f"to go on besides ending it: {tokenizer.decode(path)!r}"
    )
    results["injected"] = _show_spans(tokenizer, seq, ids.start, ids.end, max_recall)

    c_ok, c_n = results[True]
    u_ok, u_n = results[False]
    i_ok, i_n = results["injected"]
    print(f"\nconstrained spans verbatim: {c_ok + i_ok}/{c_n + i_n}; unconstrained spans verbatim: {u_ok}/{u_n}")
    if c_ok + i_ok != c_n + i_n:
        print("FAILED: a constrained span is not verbatim", file=sys.stderr)
        return 1
    return 0


def check(cfg: DictConfig) -> None:
    """The command's settings, before anything is written (``recallm.cli.common``)."""
    check_out_dir(check_value(cfg, "out_dir", str), "out_dir")


main = hydra_command("decoding_demo", run, check=check, quiet_level=logging.ERROR)


if __name__ == "__main__":
    main()
