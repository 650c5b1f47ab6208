"""report.html (recallm.eval.html): one self-contained page with the report, its plots inlined and
example outputs whose recall spans are marked by verdict; opened in headless Chromium (selenium
driving Debian's chromedriver, offline), which must render it without a console error.

Without Chromium the browser test is skipped, with the reason, unless ``RECALLM_REQUIRE_CHROMIUM=1``
(.ci/run sets it where it installed them; ``scripts/system_deps.sh`` installs chromium and chromium-driver as root).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from recallm.eval.runner import summarize

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def rec(run_task, length, index, correct, output, flags, answer="x1"):
    return {
        "benchmark": "synthetic",
        "task": run_task,
        "example_id": f"synthetic/{run_task}/{length}/{index}",
        "length": length,
        "index": index,
        "prompt_tokens": length,
        "prompt_id": f"p{index}{length}{run_task}",
        "output": output,
        "output_tokens": 20,
        "finish_reason": "stop",
        "answer": answer,
        "score": float(correct),
        "correct": correct,
        "metrics": {"answer_similarity": 1.0 if correct else 0.2, "answer_in_prompt": 1.0, "key_in_output": 1.0},
        "gold": ["x1"],
        "spans": {"count": len(flags), "verbatim": sum(flags), "source": "tokens", "flags": flags},
        "followup": None,
    }


SPAN_OK = "Key 12: <|start_recall|>12: x1<|end_recall|> so x1.</think>\nAnswer: x1"
SPAN_BAD = "Key 13: <|start_recall|>13: <b>zz</b><|end_recall|> so <script>alert(1)</script>.</think>\nAnswer: zz"


def store(path, records, name):
    path.mkdir(parents=True)
    summary = summarize(records, (), {"name": name})
    summary["planned"] = len(records)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from recallm.eval.report import build_report

    root = tmp_path_factory.mktemp("html")
    recall = [
        rec("kv_retrieval", n, i, ok, SPAN_OK if ok else SPAN_BAD, [True] if ok else [False], "x1" if ok else "zz")
        for n in (256, 1024)
        for i, ok in enumerate([True, False, True])
    ]
    plain = [rec("kv_retrieval", n, i, i == 0, "It is x1.</think>\nAnswer: x1", []) for n in (256, 1024) for i in range(3)]
    runs = {"recall": store(root / "recall", recall, "recall"), "norecall": store(root / "norecall", plain, "norecall")}
    build_report(runs, root / "report", compare=[["recall", "norecall"]])
    return root / "report" / "report.html"


def test_the_page_holds_its_plots_and_marks_spans_by_verdict(report):
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert 'src="plots/' not in page and page.count('src="data:image/png;base64,') >= 3  # score, accuracy, usage
    assert '<span class="span verbatim" title="verbatim span">12: x1</span>' in page
    # a span that is not verbatim, with the model's markup escaped, and no script of the model's in the page
    assert '<span class="span not-verbatim" title="span not in its context">13: &lt;b&gt;zz&lt;/b&gt;</span>' in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "recall vs norecall" in page and "<table>" in page
    # examples: at the longest length, a right and a wrong output of the task, per run; the reference beside
    examples = page.split("<h2>Example outputs</h2>")[1]
    assert examples.count('<div class="example">') == 4
    assert "synthetic/kv_retrieval/1024/0" in examples and "synthetic/kv_retrieval/256/0" not in examples
    assert "reference: <code>x1</code>" in examples


def _chromium_or_skip():
    if CHROMIUM and os.path.exists(CHROMEDRIVER):
        try:
            import selenium  # noqa: F401
        except ImportError:
            reason = "selenium is not installed (pip install -e '.[dev]')"
        else:
            return
    else:
        reason = "headless Chromium is not installed (apt-get install chromium chromium-driver; scripts/system_deps.sh)"
    if os.environ.get("RECALLM_REQUIRE_CHROMIUM") == "1":
        pytest.fail(f"RECALLM_REQUIRE_CHROMIUM=1 but {reason}")
    pytest.skip(reason)


@pytest.mark.slow
def test_chromium_renders_the_page_without_console_errors(report, tmp_path):
    _chromium_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,2000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get(report.resolve().as_uri())
        assert driver.title == "RecaLLM evaluation report"
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]);"
        )
        assert len(images) >= 3 and all(done and w > 100 and h > 100 for done, w, h in images), images
        spans = driver.execute_script(
            "return ['verbatim', 'not-verbatim'].map(c => document.querySelectorAll('span.span.' + c).length);"
        )
        assert spans[0] >= 1 and spans[1] >= 1, spans
        colour = driver.execute_script(
            "return getComputedStyle(document.querySelector('span.span.verbatim')).backgroundColor;"
        )
        assert colour == "rgb(200, 240, 200)"  # the stylesheet applied
        errors = [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
        assert not errors, errors
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    finally:
        driver.quit()
