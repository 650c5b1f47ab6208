"""recallm-eval end to end on the CPU: the HF backend (constrained and not), an OpenAI-compatible stub
server whose canned answers make every score known in advance, resume, one-line errors, the report."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket

import pytest

from recallm.errors import RecallmError

S, E = "<|start_recall|>", "<|end_recall|>"


# --------------------------------------------------------------------------- helpers


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name="eval", overrides=list(overrides))


def run_cli(*overrides):
    from recallm.cli.eval import run

    return run(compose("progress=false", *overrides))


def fail_cli(capsys, *overrides) -> str:
    """Run the CLI expecting a user error: exit code 2 and one `error: ...` line, no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_cli(*overrides)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def records(out_dir):
    return [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SMALL = (  # two benchmarks, a few short examples, 12 new tokens
    "benchmarks=[lost_in_thought,helmet_json_kv]",
    "eval.benchmarks.lost_in_thought.lengths=[512]",
    "eval.benchmarks.lost_in_thought.per_cell=1",
    "eval.benchmarks.helmet_json_kv.lengths=[512]",
    "eval.generation.max_new_tokens=12",
)


# --------------------------------------------------------------------------- HF backend


@pytest.fixture(scope="module")
def hf_runs(tiny_dir, tmp_path_factory):
    """The same small suite, constrained and unconstrained, spans forced open every 4 tokens."""
    root = tmp_path_factory.mktemp("eval-hf")
    out = {}
    for name, constrained in (("constrained", "true"), ("free", "false")):
        out[name] = (
            root / name,
            run_cli(
                f"model_path={tiny_dir}",
                f"out_dir={root / name}",
                f"run_name={name}",
                f"backend.recall_constrained={constrained}",
                "backend.force_recall_every=4",
                "backend.force_recall_length=6",
                "backend.batch_size=3",
                "report=false",
                *SMALL,
            ),
        )
    return out


@pytest.mark.slow
def test_hf_end_to_end_constrained_and_not(hf_runs):
    for name, (out_dir, summary) in hf_runs.items():
        recs = records(out_dir)
        assert summary["complete"] and summary["n_examples"] == summary["planned"] == 4 == len(recs)
        assert {r["example_id"] for r in recs} == {
            "lost_in_thought/retrieval/512/0",
            "lost_in_thought/reasoning_retrieval/512/0",
            "helmet_json_kv/json_kv/512/0",
            "helmet_json_kv/json_kv/512/1",
        }
        for r in recs:
            assert r["spans"]["source"] == "tokens" and r["spans"]["count"] >= 1  # forced open
            assert 1 <= r["output_tokens"] <= 12 and r["finish_reason"] in ("stop", "length")
            assert len(r["prompt_id"]) == 16
            if r["benchmark"] == "lost_in_thought":  # fitted (the retrieval prompt has no math problem)
                assert 350 < r["prompt_tokens"] <= 1.05 * 512
            else:  # HELMET keeps json_kv's 100 answer tokens free
                assert r["prompt_tokens"] <= 512 - 100
            assert r["score"] == 0.0  # an untrained model never closes its think block
        bench = summary["benchmarks"]["helmet_json_kv"]
        assert bench["by_length"]["512"]["all"]["n"] == 2 and bench["overall"]["recall_usage"] == 1.0
        assert set(summary["benchmarks"]["lost_in_thought"]["extra"]["by_length"]) == {"512"}
        assert summary["run"]["name"] == name and summary["run"]["recall_constrained"] == (name == "constrained")
        assert json.loads((out_dir / "summary.json").read_text()) == summary
    rate = {
        name: summary["benchmarks"]["helmet_json_kv"]["overall"]["span_verbatim_rate"]
        for name, (_, summary) in hf_runs.items()
    }
    assert rate["constrained"] == 1.0  # the guarantee
    assert rate["free"] < 1.0  # forced spans of an untrained model without the constraint


@pytest.mark.slow
def test_report_compares_runs(hf_runs, tmp_path):
    from recallm.eval.report import build_report

    report = build_report([str(hf_runs["constrained"][0]), str(hf_runs["free"][0])], tmp_path / "report")
    text = report.read_text()
    assert "| constrained |" in text and "| free |" in text
    assert "## helmet_json_kv" in text and "## Table 4: lost in thought" in text
    assert "| paper · Qwen2.5-7B-Instruct (Table 4) | 33.0 | 11.9 |" in text  # the paper's numbers beside the runs
    # the verbatim table: 100.0 for the constrained run
    spans = text.split("## Recall spans")[1]
    assert re.search(r"\| constrained \| 100\.0 \(\d+\) \| 100\.0 \(\d+\) \|", spans)  # (spans in parentheses)
    pngs = sorted(p.name for p in (tmp_path / "report" / "plots").glob("*.png"))
    for name in ("helmet_json_kv_score.png", "lost_in_thought.png", "lost_in_thought_recall_usage.png"):
        assert name in pngs
        assert (tmp_path / "report" / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{name}" in text
    named = build_report({"a": hf_runs["constrained"][0], "b": hf_runs["free"][0]}, tmp_path / "named")
    assert "| a |" in named.read_text()
    with pytest.raises(RecallmError, match="has no summary.json"):
        build_report([str(tmp_path)], tmp_path / "x")


@pytest.mark.slow
def test_report_mode_of_the_cli(hf_runs, tmp_path):
    runs = ",".join(str(hf_runs[n][0]) for n in ("constrained", "free"))
    report = run_cli("mode=report", f"runs=[{runs}]", f"report_dir={tmp_path}")
    assert report == tmp_path / "report.md" and "| free |" in report.read_text()


calls: list[dict] = []


def record_extension(*, model, tokenizer, cap):
    """A length-extension factory for the test: records what each generate call gets and caps it."""

    @contextlib.contextmanager
    def extension(*, input_ids, attention_mask, prompt_lengths, max_new_tokens):
        calls.append({"shape": tuple(input_ids.shape), "lengths": list(prompt_lengths), "max_new": max_new_tokens})
        yield {"max_new_tokens": cap}

    return extension


def test_length_extension_hook_wraps_generate(tiny_dir):
    from recallm.eval.backends import HFBackend
    from recallm.eval.types import GenerationSettings, TextRequest
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    backend = HFBackend(
        tiny_dir,
        tokenizer,
        length_extension="tests.integration.test_eval_run:record_extension",
        length_extension_kwargs={"cap": 3},
    )
    prompts = ["one two three four five six", "one two"]
    requests = [TextRequest(p, None, 10) for p in prompts]
    calls.clear()
    out = backend.generate(requests, GenerationSettings(max_new_tokens=10))
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert calls == [{"shape": (2, max(lengths)), "lengths": lengths, "max_new": 10}]
    assert all(g.n_tokens <= 3 for g in out)
    assert backend.describe()["length_extension"] == "record_extension"
    with pytest.raises(RecallmError, match="cannot import"):
        HFBackend(tiny_dir, tokenizer, length_extension="no_such_module:factory")


def test_sampled_outputs_do_not_depend_on_the_batch(tiny_dir):
    """Sampled evaluation: every request draws from its own seed (the runner's per-example seed), so an
    example's output is the same whatever batch size and batch-mates it has; another seed samples anew."""
    from recallm.eval.backends import HFBackend
    from recallm.eval.types import GenerationSettings, TextRequest
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    prompts = ["key 2 is bazo and key 3 is kelu", "one two three", "the value of key 7", "lomi rade sepa"]
    requests = [TextRequest(p, None, 12, seed=40 + i) for i, p in enumerate(prompts)]
    settings = GenerationSettings(max_new_tokens=12, temperature=1.0, top_p=0.9)
    texts = {}
    for batch_size in (4, 3, 1):
        backend = HFBackend(tiny_dir, tokenizer, batch_size=batch_size, force_recall_every=3, force_recall_length=4)
        texts[batch_size] = [g.text for g in backend.generate(requests, settings)]
    assert texts[4] == texts[3] == texts[1]
    again = backend.generate([TextRequest(prompts[0], None, 12, seed=99)], settings)[0].text
    assert again != texts[4][0]


# --------------------------------------------------------------------------- resume


class CountingBackend:
    """Wraps a backend: counts the examples it generates and can fail after some batches."""

    def __init__(self, inner, fail_after: int | None = None) -> None:
        self.inner, self.fail_after = inner, fail_after
        self.prompts: list[str] = []
        self.batches = 0

    def generate(self, requests, settings):
        main = [r for r in requests if not r.prefix]
        if main:
            if self.fail_after is not None and self.batches >= self.fail_after:
                raise RuntimeError("killed")
            self.batches += 1
            self.prompts += [r.prompt_text for r in main]
        return self.inner.generate(requests, settings)

    def close(self):
        pass


def test_the_bar_moves_per_example_with_tokens_per_second(tiny_dir, tmp_path, monkeypatch, caplog):
    """A backend that reports progress moves the bar as each example ends, not once per batch."""
    from data_gen.fit import PromptRenderer
    from recallm.eval import runner
    from recallm.eval.backends import Backend
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.eval.types import Generation
    from recallm.tokens import load_tokenizer

    class Reporting(Backend):
        name, reports_progress = "reporting", True

        def generate(self, requests, settings, *, progress=None):
            out = []
            for _ in requests:  # one example after the other, as rows of a batch end
                out.append(Generation("no answer", 3, "stop"))
                progress(3, 1)
            return out

    seen, at_batch_end = [], []
    batch, end_batch = runner._Progress.batch, runner._Progress.end_batch

    def spy_batch(self, size, *, examples=True):
        report = batch(self, size, examples=examples)

        def spy(tokens, finished):
            report(tokens, finished)
            seen.append((self.bar.n, self.tokens, self.bar.postfix))

        return spy

    def spy_end(self, size):
        at_batch_end.append(self.bar.n)
        end_batch(self, size)

    monkeypatch.setattr(runner._Progress, "batch", spy_batch)
    monkeypatch.setattr(runner._Progress, "end_batch", spy_end)
    suite = {"generation": {"max_new_tokens": 10}, "benchmarks": {"helmet_json_kv": {"lengths": [512], "per_cell": 4}}}
    caplog.set_level("INFO", logger="recallm.eval.runner")
    summary = runner.run_eval(
        make_benchmarks(suite), Reporting(), PromptRenderer(load_tokenizer(tiny_dir)), tmp_path, batch_size=4
    )
    assert summary["complete"] and summary["n_examples"] == 4
    assert [(n, tokens) for n, tokens, _ in seen] == [(1, 3), (2, 6), (3, 9), (4, 12)] and at_batch_end == [4]
    assert all("tokens/s" in postfix for _, _, postfix in seen)
    assert "generated 12 tokens" in caplog.text


@pytest.mark.slow
def test_resume_after_stop_and_crash_redoes_nothing(tiny_dir, tmp_path):
    from data_gen.fit import PromptRenderer
    from recallm.eval.backends import HFBackend
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.eval.runner import read_results, run_eval
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    renderer = PromptRenderer(tokenizer)
    suite = {
        "generation": {"max_new_tokens": 10},
        "benchmarks": {
            "helmet_json_kv": {"lengths": [512], "per_cell": 4},
            "lost_in_thought": {"lengths": [512], "per_cell": 1, "key_type": "toy", "value_type": "toy"},
        },
    }
    hf = HFBackend(tiny_dir, tokenizer, batch_size=2)
    fp = {"model": "tiny"}

    def go(out, backend, **kw):
        return run_eval(
            make_benchmarks(suite), backend, renderer, out, batch_size=2, fingerprint=fp, progress=False, **kw
        )

    whole = go(tmp_path / "whole", CountingBackend(hf))

    out = tmp_path / "pieces"
    first = CountingBackend(hf)
    part = go(out, first, limit=2)  # stopped after two examples
    assert not part["complete"] and part["n_examples"] == 2 and len(first.prompts) == 2
    crashing = CountingBackend(hf, fail_after=1)
    with pytest.raises(RuntimeError, match="killed"):
        go(out, crashing)  # one more batch, then the process dies
    assert len(read_results(out / "results.jsonl")) == 4
    with (out / "results.jsonl").open("a") as f:
        f.write('{"benchmark": "helmet_json_kv", "example_id": "helm')  # killed mid-write
    last = CountingBackend(hf)
    done = go(out, last)
    assert len(last.prompts) == 2  # only the two examples never finished
    assert (
        set(first.prompts + crashing.prompts + last.prompts)
        == set(first.prompts + crashing.prompts) | set(last.prompts)
        and len(set(first.prompts + crashing.prompts + last.prompts)) == 6
    )
    assert done["complete"] and done == whole
    assert records(out) == records(tmp_path / "whole")  # same lines, nothing twice, the partial line gone
    assert (out / "summary.json").read_text() == (tmp_path / "whole" / "summary.json").read_text()
    again = CountingBackend(hf)
    assert go(out, again) == whole and again.prompts == []  # nothing left to do

    with pytest.raises(RecallmError, match="another configuration .*differs in model"):
        run_eval(make_benchmarks(suite), hf, renderer, out, fingerprint={"model": "other"}, progress=False)
    redo = CountingBackend(hf)
    run_eval(
        make_benchmarks(suite), redo, renderer, out, fingerprint={"model": "other"}, overwrite=True, progress=False
    )
    assert len(redo.prompts) == 6
    (out / "results.jsonl").write_text('{"example_id": "x"}\nnot json\n')
    with pytest.raises(RecallmError, match=r"results.jsonl:2: not valid JSON"):
        read_results(out / "results.jsonl")


@pytest.mark.slow
def test_cli_resumes_and_refuses_other_settings(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    common = (f"model_path={tiny_dir}", f"out_dir={out}", "report=false", *SMALL)
    part = run_cli(*common, "limit=3")
    assert part["n_examples"] == 3 and not part["complete"]
    full = run_cli(*common)
    assert full["complete"] and len(records(out)) == 4
    err = fail_cli(capsys, *common, "eval.generation.max_new_tokens=13")
    assert "holds results of another configuration" in err and "max_new_tokens" in err
    assert run_cli(*common, "eval.generation.max_new_tokens=13", "overwrite=true")["complete"]


# --------------------------------------------------------------------------- OpenAI-compatible stub


def _solve(text: str) -> int:
    m = re.search(r"solve for x: (\d+)x \+ (\d+) - (\d+)x = (-?\d+)\.", text)
    if m:
        a, b, d, c = map(int, m.groups())
        return (c - b) // (a - d)
    a, b, c, sign, d = re.search(r"compute \((\d+) \+ (\d+)\) \* (\d+) ([+-]) (\d+)\.", text).groups()
    return (int(a) + int(b)) * int(c) + (int(d) if sign == "+" else -int(d))


def _entry(text: str, key: str) -> tuple[str, str]:
    """(the dictionary line of ``key``, its value) in a lines / CSV / JSON dictionary."""
    m = re.search(rf'(?m)^\s*((?:Key )?"?{key}"?(?:: |,)"?(\w+)"?)', text)  # (lines: "Key -3328: value")
    return m.group(1), m.group(2)


def is_good(prompt: str) -> bool:
    """Whether the stub model answers this user message right (about half of them)."""
    return hashlib.sha1(prompt.encode()).digest()[0] % 2 == 0


def canned(prompt: str) -> str:
    """The stub model: the right value for some prompts (``is_good``), a wrong one for the others."""
    good = is_good(prompt)
    if "Math problem:" in prompt:  # reasoning retrieval: always the right key, then a verbatim recall
        key = str(_solve(prompt))
        line, value = _entry(prompt, key)
        return f"So x = {key}. {S}{line}{E}</think>\nAnswer: {value if good else 'wrongvalue'}"
    m = re.search(r"Your key: (-?\d+)", prompt)
    if m:  # retrieval: a recall span that is not in the prompt
        _, value = _entry(prompt, m.group(1))
        return f"{S}this text is nowhere{E}</think>\nAnswer: {value if good else 'wrongvalue'}"
    asked = re.findall(r'Key: "([0-9a-f-]+)"', prompt)
    if asked:  # HELMET json_kv: the last key is the one asked (the others are demonstrations)
        value = re.search(rf'"{asked[-1]}": "([0-9a-f-]+)"', prompt).group(1)
        return f"Found it.</think>\nAnswer: {value if good else value[:8]}"
    return "I do not know.</think>\nAnswer: none"


def respond(path: str, body: dict) -> str:
    """The stub model behind the OpenAI-compatible stub server (``tests/openai_stub.py``)."""
    if path.endswith("/chat/completions"):
        return canned(body["messages"][-1]["content"])
    injected = re.search(r"Looking up key (-?\d+) in the dictionary: [^\n]*$", body["prompt"])
    if injected:  # a continuation after the lost-in-thought injection: always the right value
        return _entry(body["prompt"], injected.group(1))[1] + "\nThat is it."
    user = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", body["prompt"], re.DOTALL)  # api=completions
    return canned(user.group(1))


@pytest.fixture
def stub():
    from tests.openai_stub import OpenAIStub

    s = OpenAIStub(respond)
    yield s
    s.close()


def test_openai_backend_scores_are_exact(stub, tiny_dir, tmp_path):
    from data_gen.fit import PromptRenderer
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.tokens import load_tokenizer

    out = tmp_path / "served"
    overrides = (
        "benchmarks=[lost_in_thought,helmet_json_kv,ruler]",
        "eval.benchmarks.lost_in_thought.lengths=[512,1024]",
        "eval.benchmarks.lost_in_thought.per_cell=3",
        "eval.benchmarks.helmet_json_kv.lengths=[512]",
        "eval.benchmarks.helmet_json_kv.per_cell=6",
        "eval.benchmarks.ruler.tasks=[niah_single_1]",
        "eval.benchmarks.ruler.lengths=[512]",
    )
    summary = run_cli(
        f"model_path={tiny_dir}",
        "backend.name=openai",
        f"backend.base_url={stub.url}",
        "backend.served_model=stub",
        "backend.batch_size=4",
        f"out_dir={out}",
        *overrides,
    )
    # what the stub must have answered, from the same examples built again
    cfg = compose(*overrides)
    from omegaconf import OmegaConf

    benches = make_benchmarks(
        OmegaConf.to_container(cfg.eval, resolve=True), only=["lost_in_thought", "helmet_json_kv"]
    )
    renderer = PromptRenderer(load_tokenizer(tiny_dir))
    good: dict[str, list[bool]] = {}
    for bench in benches:
        for spec in bench.specs():
            example = bench.build(spec, renderer)
            good.setdefault(f"{spec.benchmark}/{spec.task}", []).append(is_good(example.messages[-1]["content"]))
    share = {k: sum(v) / len(v) for k, v in good.items()}
    assert 0 < share["helmet_json_kv/json_kv"] < 1 and len(good["lost_in_thought/retrieval"]) == 6

    b = summary["benchmarks"]
    assert b["helmet_json_kv"]["overall"]["score"] == pytest.approx(share["helmet_json_kv/json_kv"])
    lit = b["lost_in_thought"]["by_task"]
    assert lit["retrieval"]["score"] == pytest.approx(share["lost_in_thought/retrieval"])
    assert lit["reasoning_retrieval"]["score"] == pytest.approx(share["lost_in_thought/reasoning_retrieval"])
    assert lit["reasoning_retrieval"]["math"] == 1.0 and lit["reasoning_retrieval"]["injected"] == 1.0
    assert lit["reasoning_retrieval"]["accuracy_given_math"] == lit["reasoning_retrieval"]["score"]
    # text-level span checks: the reasoning outputs recall a dictionary line, the retrieval ones made-up text
    assert lit["reasoning_retrieval"]["span_verbatim_rate"] == 1.0 and lit["retrieval"]["span_verbatim_rate"] == 0.0
    assert lit["retrieval"]["recall_usage"] == 1.0 and b["helmet_json_kv"]["overall"]["recall_usage"] == 0.0
    assert b["ruler"]["overall"]["score"] == 0.0 and b["ruler"]["overall"]["n"] == 1
    table = b["lost_in_thought"]["extra"]["by_length"]["512"]
    assert table["math"] == 1.0 and table["injected"] == 1.0 and table["pairs"] == 3

    recs = {r["example_id"]: r for r in records(out)}
    rr = recs["lost_in_thought/reasoning_retrieval/512/0"]
    assert rr["spans"] == {"count": 1, "verbatim": 1, "source": "text", "flags": [True]}  # flags: each span verbatim or not
    prefix = rr["followup"]["prefix"]  # the output cut after the key, then the injection (lines format: "key: ")
    m = re.search(r"\nLooking up key (-?\d+) in the dictionary: (.*)$", prefix)
    assert m.group(2) == f"Key {m.group(1)}: " and rr["output"].startswith(prefix[: m.start()])
    assert prefix[: m.start()].endswith(m.group(1))
    assert rr["output_tokens"] == len(rr["output"].split())
    paths = [p for p, _ in stub.requests]
    assert paths.count("/v1/completions") == 6  # one injection per reasoning example (all have the right key)
    assert paths.count("/v1/chat/completions") == 6 + 6 + 6 + 1
    chat = next(body for p, body in stub.requests if p.endswith("/chat/completions"))
    assert chat["model"] == "stub" and chat["temperature"] == 0.0 and chat["max_tokens"] == 32
    assert (out / "report.md").is_file()

    # the same through text completions of the rendered prompts: the same scores
    stub.requests.clear()
    raw = run_cli(
        f"model_path={tiny_dir}",
        "backend.name=openai",
        f"backend.base_url={stub.url}",
        "backend.served_model=stub",
        "backend.api=completions",
        f"out_dir={tmp_path / 'raw'}",
        "report=false",
        *overrides,
    )
    assert raw["benchmarks"] == summary["benchmarks"]
    assert {p for p, _ in stub.requests} == {"/v1/completions"} and len(stub.requests) == 19 + 6
    assert stub.requests[0][1]["prompt"].startswith("<|im_start|>user\n")


def test_openai_server_down_is_one_line_naming_the_url(tiny_dir, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    err = fail_cli(
        capsys,
        f"model_path={tiny_dir}",
        "backend.name=openai",
        f"backend.base_url={url}",
        "backend.served_model=stub",
        f"out_dir={tmp_path}",
        *SMALL,
    )
    assert f"backend endpoint {url} is not reachable" in err
    assert not (tmp_path / "results.jsonl").exists()
    err = fail_cli(capsys, f"model_path={tiny_dir}", "backend.name=openai", f"out_dir={tmp_path}", *SMALL)
    assert "backend.served_model" in err


# --------------------------------------------------------------------------- errors before generation


@pytest.mark.slow
def test_cli_errors_come_before_any_generation(tiny_dir, tiny_base_dir, tmp_path, capsys):
    out = tmp_path / "out"
    helmet = "benchmarks=[helmet_json_kv]"
    in_domain = ("benchmarks=[in_domain]", f"eval.benchmarks.in_domain.data_dir={tmp_path}")
    cases = [
        ((f"model_path={tmp_path / 'nope'}", helmet), "model directory .*nope does not exist"),
        ((f"model_path={tiny_base_dir}", helmet), "has no recall tokens"),
        ((f"model_path={tiny_dir}", "benchmarks=[babilong]"), "unknown benchmark 'babilong'"),
        ((f"model_path={tiny_dir}", helmet, "eval.benchmarks.helmet_json_kv.lengths=[12k3]"), "bad length '12k3'"),
        (
            (f"model_path={tiny_dir}", helmet, "eval.benchmarks.helmet_json_kv.lengths=[65536]"),
            "bad length 65536: the model has 32768 positions",
        ),
        ((f"model_path={tiny_dir}", "eval.benchmarks.lost_in_thought.lengths=[64]"), "bad length 64"),
        ((f"model_path={tiny_dir}", helmet, "backend.name=tgi"), "unknown backend 'tgi'"),
        ((f"model_path={tiny_dir}", *in_domain, "eval.benchmarks.in_domain.lengths=[512]"), "no validation directory"),
        (
            (f"model_path={tiny_dir}", "benchmarks=[ruler]", "eval.benchmarks.ruler.lengths=[256]"),
            r"task ruler/\w+.*(more than the target|cannot reach a prompt of)",
        ),
    ]
    for overrides, pattern in cases:
        err = fail_cli(capsys, f"out_dir={out}", *overrides)
        assert re.search(pattern, err), (pattern, err)
        assert not (out / "results.jsonl").exists()
    (tmp_path / "val").mkdir()
    err = fail_cli(capsys, f"model_path={tiny_dir}", f"out_dir={out}", *in_domain)
    assert "holds no <category>_<length>.parquet files" in err
    (tmp_path / "val" / "retrieval_512.parquet").write_bytes(b"not parquet")
    err = fail_cli(
        capsys, f"model_path={tiny_dir}", f"out_dir={out}", *in_domain, "eval.benchmarks.in_domain.lengths=[1024]"
    )
    assert re.search(r"missing parquet .*val/<category>_1024.parquet", err)
    # the base model is fine without the constraint: only the constraint needs recall tokens
    summary = run_cli(
        f"model_path={tiny_base_dir}", "backend.recall_constrained=false", f"out_dir={out}", "report=false", *SMALL
    )
    assert summary["complete"] and all(r["spans"]["count"] == 0 for r in records(out))
