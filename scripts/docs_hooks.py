"""mkdocs hooks of the manual (``mkdocs.yml``: ``hooks:``): the reference pages generated from the code.

A page that holds a marker line gets it replaced, at build time, by what the code says now:

* ``<!-- generated: cli -->`` (``docs/reference/cli.md``): every console script of ``pyproject.toml``'s
  ``[project.scripts]`` (and the subcommands ``recallm-grpo plot``, ``recallm-rlm train``) run with
  ``--help``, offline, each in its own interpreter;
* ``<!-- generated: config-files -->`` (``docs/reference/config.md``): each command's primary config and
  every option of its config groups, with the header comment the YAML file opens with;
* ``<!-- generated: config-schemas -->``: every config section's schema (the settings dataclasses read by
  ``recallm.config.typed``) as a table of keys: type, default, range or choices and the field's doc.

Nothing is copied by hand into the Markdown, so the pages cannot drift from the code. The same functions
are what ``tests/integration/test_docs.py`` checks against (every command and schema is on the page).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import logging
import re
import subprocess
import sys
import textwrap
import tomllib
import typing
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: subcommands whose --help is not the parent's
SUBCOMMANDS = (("recallm-grpo", "plot"), ("recallm-rlm", "train"))

#: (where the section sits in a composed config, the schema) of every config section a command reads;
#: the nested dataclasses of a schema are listed under it (``recallm.config.typed`` reads them the same way)
SCHEMAS: tuple[tuple[str, str, str], ...] = (
    ("recallm-data", "the top-level keys of configs/data.yaml", "data_gen.generate:DataRun"),
    ("recallm-data", "data (configs/data/*.yaml, a mixture)", "data_gen.generate:Mixture"),
    ("recallm-data", "data.train.entries[i]", "data_gen.generate:TrainEntry"),
    ("recallm-annotate", "the top-level keys of configs/annotate.yaml", "data_gen.annotate:AnnotateSettings"),
    ("recallm-sft", "the top-level keys of configs/sft.yaml", "recallm.sft.settings:SFTRun"),
    ("recallm-sft", "sft (configs/sft/*.yaml, a recipe)", "recallm.sft.settings:SFTRecipe"),
    ("recallm-grpo", "recallm (configs/grpo.yaml; every other key is verl's)", "recallm.grpo.settings:GRPOSettings"),
    ("recallm-grpo", "actor_rollout_ref.rollout.engine_kwargs.hf_cpu (the CPU rollout)",
     "recallm.grpo.cpu.hf_generate:HFCPUSettings"),
    ("reward", "reward / recallm.reward (configs/reward/*.yaml)", "rewards.config:RewardConfig"),
    ("reward", "reward.categories.<category>", "rewards.config:CategoryReward"),
    ("reward", "reward.data_sources.<data_source>", "rewards.config:DataSourceOverride"),
    ("recallm-eval", "the top-level keys of configs/eval.yaml", "recallm.eval.app:EvalRun"),
    ("recallm-eval", "backend", "recallm.eval.backends:BackendSettings"),
    ("recallm-eval", "eval (configs/eval/*.yaml, a suite)", "recallm.eval.benchmarks:SuiteSettings"),
    ("recallm-eval", "eval.generation", "recallm.eval.types:GenerationSettings"),
    ("recallm-eval", "eval.judge", "recallm.clients:EndpointConfig"),
    ("recallm-eval", "eval.benchmarks.lost_in_thought", "recallm.eval.benchmarks.lost_in_thought:LostInThoughtOptions"),
    ("recallm-eval", "eval.benchmarks.in_domain", "recallm.eval.benchmarks.in_domain:InDomainOptions"),
    ("recallm-eval", "eval.benchmarks.ruler", "recallm.eval.benchmarks.ruler:RulerOptions"),
    ("recallm-eval", "eval.benchmarks.helmet", "recallm.eval.benchmarks.helmet.benchmark:HelmetOptions"),
    ("recallm-eval", "eval.benchmarks.synthetic", "recallm.eval.benchmarks.synthetic:SyntheticOptions"),
    ("recallm-pipeline", "the top-level keys of configs/pipeline.yaml", "recallm.pipeline:PipelineRun"),
    ("recallm-pipeline", "experiment (configs/experiment/*.yaml)", "recallm.pipeline:Experiment"),
    ("recallm-rlm", "the top-level keys of configs/rlm.yaml", "recallm.rlm.settings:RLMRun"),
    ("recallm-rlm", "root, sub (and backend.rlm.root / .sub)", "recallm.rlm.models:ModelSection"),
    ("recallm-rlm", "rlm", "recallm.rlm.runner:RLMSettings"),
    ("recallm-rlm", "subcalls", "recallm.rlm.subcalls:SubCallSettings"),
    ("recallm-rlm", "sandbox", "recallm.rlm.sandbox:SandboxLimits"),
    ("recallm-rlm", "budget", "recallm.rlm.budget:BudgetLimits"),
    ("recallm-rlm", "tasks", "recallm.rlm.tasks:TaskRun"),
    ("recallm-rlm", "sft_data", "recallm.rlm.sft_data:SFTDataSettings"),
    ("recallm-eval", "backend.rlm (backend.name=rlm)", "recallm.rlm.eval_backend:RLMBackendSection"),
    ("recallm-rlm train", "recallm.rlm (configs/rlm_train.yaml)", "recallm.rlm.train:RLMTrainSettings"),
)


# ---------------------------------------------------------------------------------------------- commands
def console_scripts() -> list[tuple[str, str]]:
    """``(name, "module:function")`` of ``[project.scripts]``, in the file's order."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return list(scripts.items())


def help_text(name: str, entry: str, sub: str | None = None) -> str:
    """What ``NAME [SUB] --help`` prints, run in a fresh interpreter of this environment."""
    module, _, function = entry.partition(":")
    argv = [sub, "--help"] if sub else ["--help"]
    code = (
        f"import sys; sys.argv = [{name!r}] + {argv!r}; from {module} import {function} as main; "
        f"sys.exit(main({argv!r}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**_clean_env(), "COLUMNS": "100"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.rstrip() + "\n"


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "RECALLM_"))}


@cache
def cli_reference() -> str:
    """Markdown: one section per command (and subcommand) with its ``--help``."""
    scripts = dict(console_scripts())
    renamed = {name: new for name, entry in scripts.items() if (new := renamed_to(entry))}
    jobs = [(name, entry, None) for name, entry in scripts.items() if name not in renamed]
    jobs += [(name, scripts[name], sub) for name, sub in SUBCOMMANDS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = list(pool.map(lambda job: help_text(*job), jobs))
    out = []
    for (name, entry, sub), text in zip(jobs, texts, strict=True):
        title = f"{name} {sub}" if sub else name
        out += [f"## `{title}`", "", f"`{entry}`" + (f", subcommand `{sub}`" if sub else ""), "",
                "```text", text.rstrip(), "```", ""]  # fmt: skip
    if renamed:
        out += ["## Old names", "", "Kept for one release: each prints a one-line notice, then runs the new command "
                "(`MIGRATION.md`).", ""]  # fmt: skip
        out += [f"- `{old}`: now `{new}`" for old, new in renamed.items()]
        out.append("")
    return "\n".join(out)


def renamed_to(entry: str) -> str | None:
    """The new command's name when ``entry`` (``module:function``) is an old name kept as an alias — its module
    assigns ``function = alias("old", "new", ...)`` (``recallm.cli.renamed.alias``) — else None. Read from the
    source, not imported: the commands' modules load torch."""
    import importlib.util

    module, _, function = entry.partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == function for target in node.targets)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "alias"
            and len(node.value.args) >= 2
            and isinstance(node.value.args[1], ast.Constant)
        ):
            return str(node.value.args[1].value)
    return None


# ------------------------------------------------------------------------------------------- config files
def header_comment(path: Path) -> str:
    """The comment lines a YAML file opens with (``# @package`` lines left out), as one paragraph each."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:]
        if text.strip().startswith("@package"):
            continue
        lines.append(text[1:] if text.startswith(" ") else text)
    return "\n".join(lines).strip()


def _groups(directory: Path) -> list[Path]:
    """Config group directories under ``directory`` (nested ones such as ``grpo/platform`` included)."""
    return sorted(p for p in directory.rglob("*") if p.is_dir() and any(p.glob("*.yaml")))


@cache
def config_files_reference() -> str:
    """Markdown: the primary configs (one per command) and every option of every config group."""
    configs = ROOT / "configs"
    out = ["## Primary configs", ""]
    for path in sorted(configs.glob("*.yaml")):
        out += [f"### `configs/{path.name}`", "", "```text", header_comment(path) or "(no header)", "```", ""]
    out += ["## Config groups", "",
            "A group's option is chosen with `group=option` on the command line (`sft=qwen2.5_7b`, "
            "`grpo/platform=cpu`).", ""]  # fmt: skip
    for group in _groups(configs):
        rel = group.relative_to(configs).as_posix()
        out += [f"### `{rel}`", ""]
        for path in sorted(group.glob("*.yaml")):
            out += [f"#### `{rel}={path.stem}`", "", "```text", header_comment(path) or "(no header)", "```", ""]
        others = sorted(p.name for p in group.iterdir() if p.is_file() and p.suffix != ".yaml")
        if others:
            out += ["Files the options point to: " + ", ".join(f"`{name}`" for name in others), ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ schemas
def _load(ref: str) -> type:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's doc: the string literal after it (an attribute docstring), else its trailing comment;
    inherited fields from the base classes' sources."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for i, node in enumerate(body):
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            name = node.target.id
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[name] = " ".join(nxt.value.value.split())
                continue
            line = lines[node.end_lineno - 1]  # type: ignore[operator]
            comment = _trailing_comment(line)
            if comment:
                docs[name] = comment
    return docs


def _trailing_comment(line: str) -> str:
    """The ``# comment`` at the end of a source line (outside strings), or ''."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i + 1 :].strip()
    return ""


def _type_name(tp: object) -> str:
    text = tp.__name__ if isinstance(tp, type) else str(tp)
    text = re.sub(r"\btyping\.", "", text)
    text = re.sub(r"\b(?:[a-z_]+\.)+([A-Z]\w*)", r"\1", text)  # module paths of classes
    return text.replace("NoneType", "None")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return "(section below)"
    else:
        return "required"
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def _range(f: dataclasses.Field) -> str:
    meta = dict(f.metadata)
    parts = []
    if "min" in meta and "max" in meta:
        parts.append(f"[{meta['min']}, {meta['max']}]")
    elif "min" in meta:
        parts.append(f">= {meta['min']}")
    elif "max" in meta:
        parts.append(f"<= {meta['max']}")
    if "choices" in meta:
        parts.append(" \\| ".join(str(c) for c in meta["choices"]))
    return ", ".join(parts)


def _class_doc(cls: type) -> str:
    """The class's own docstring (not the signature dataclasses writes when there is none)."""
    doc = " ".join((inspect.getdoc(cls) or "").split())
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def schema_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """``(key, type, default, range, doc)`` of every field, nested dataclass sections flattened."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints.get(f.name, f.type)
        key = f"{prefix}{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows.append((key, tp.__name__, "(section)", "", docs.get(f.name, _class_doc(tp))))
            rows += schema_rows(tp, key + ".")
            continue
        rows.append((key, _type_name(tp), _default(f), _range(f), docs.get(f.name, "")))
    return rows


@cache
def config_schemas_reference() -> str:
    """Markdown: a table per schema, in the order of ``SCHEMAS``."""
    out = []
    for command, where, ref in SCHEMAS:
        cls = _load(ref)
        doc = _class_doc(cls)
        out += [f"### `{where}`", "", f"{command} &middot; `{ref.replace(':', '.')}`", ""]
        if doc:
            out += [doc, ""]
        out += ["| key | type | default | range / choices | what it does |", "|---|---|---|---|---|"]
        for key, tp, default, rng, text in schema_rows(cls):
            out.append(f"| `{key}` | {_cell(tp)} | {_cell(default)} | {_cell(rng)} | {_cell(text)} |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------- hooks
class _GeneratedAllFilter:
    """``recallm.modeling`` adds its generated classes (``Recall<Base>ForCausalLM``, ...) to ``__all__`` when it
    is imported; griffe reads the source without importing it and warns about that one line, which --strict
    would turn into a failed build. Only that warning is dropped; every other one still fails the build."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "recallm.modeling.__all__" not in record.getMessage()


def on_startup(command, dirty) -> None:  # noqa: ARG001  (mkdocs' hook signature)
    logging.getLogger("mkdocs.plugins.griffe").addFilter(_GeneratedAllFilter())


GENERATORS = {
    "<!-- generated: cli -->": cli_reference,
    "<!-- generated: config-files -->": config_files_reference,
    "<!-- generated: config-schemas -->": config_schemas_reference,
}


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001  (mkdocs' hook signature)
    for marker, generate in GENERATORS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
