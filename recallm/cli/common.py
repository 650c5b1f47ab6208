"""The one way a Hydra command of the project reads its command line: ``hydra_command``.

    main = hydra_command("pipeline", run, check=check, flags={"--status": "which jobs are done"})

What every such command does, in this order:

1. ``SUBCOMMAND ARGS...`` for a word in ``subcommands`` hands the rest of the line to that function
   (things that are not a run of this config: ``recallm-grpo plot``, ``recallm-rlm train``).
2. A first word in ``modes`` becomes the override ``mode=WORD`` (``recallm-rlm show``); ``positional``
   names the setting a mode's next bare word sets (``recallm-rlm show PATH`` -> ``trajectory=PATH``).
3. The command's own ``flags`` (``--status``) are taken off the line and passed to ``run`` as
   keyword arguments (``status=True``); they are not settings.
4. The overrides are composed the way Hydra will and checked (``recallm.config.check_overrides``:
   the type of each override against the default it replaces, settings nothing reads), then the
   command's own ``check(cfg)`` (required values, ranges, kinds of path). A mistake is one
   ``error: ...`` line on stderr and exit code 2 — before Hydra creates its output directory, so
   nothing at all is written. Lines with Hydra's own flags (``--help``, ``--cfg``, ``-m``, ...) go
   to Hydra unchecked.
5. Hydra's run of the job (its output directory, ``.hydra/`` files, logging) calls ``run(cfg, **flags)``
   with the config step 4 composed and checked — the one composition of the command (a line with Hydra's
   own flags, ``--cfg``, ``--help``, is Hydra's own ``main``); or, with ``hydra_run=False``,
   ``run(cfg, **flags)`` is called directly with that config, no output directory (``recallm-grpo``
   and ``recallm-rlm train``, which hand it to verl's own trainer; Hydra's own flags are not theirs).
   A non-zero integer from ``run`` is the exit code.

The config tree is ``recallm.paths.CONFIG_DIR`` (the source checkout's ``configs/`` or the copy a
wheel carries). Commands that take no config tree use ``argparse`` and say why in their module doc.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from recallm.errors import EXIT_USAGE, cli_errors

__all__ = ["hydra_command", "precheck"]


@cli_errors
def precheck(
    config_name: str,
    argv: Sequence[str],
    check: Callable[[Any], None] | None = None,
    *,
    open_keys: Sequence[str] = (),
    closed: Callable[[str], bool] | None = None,
    job_name: str | None = None,
) -> Any:
    """Check a command line (module doc, step 4); returns the composed config. With ``job_name``, the
    config keeps its ``hydra`` node, as Hydra's run composes it for that job (``check`` sees it without)."""
    from omegaconf import open_dict

    from recallm.config import check_overrides

    cfg = check_overrides(config_name, argv, open_keys=open_keys, closed=closed, job_name=job_name,
                          keep_hydra=job_name is not None)  # fmt: skip
    if check is not None:
        task = cfg
        if job_name is not None:
            task = cfg.copy()
            with open_dict(task):
                task.pop("hydra", None)
        check(task)
    return cfg


def _quote(value: str) -> str:
    if re.fullmatch(r"[\w./~:+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def rewrite_argv(
    argv: Sequence[str], modes: Sequence[str] = (), positional: Mapping[str, str] | None = None
) -> list[str]:
    """``MODE [VALUE] overrides...`` -> ``mode=MODE [KEY=VALUE] overrides...`` (module doc, step 2)."""
    args = list(argv)
    if args and args[0] in modes:
        mode = args.pop(0)
        key = (positional or {}).get(mode)
        if key and args and "=" not in args[0] and not args[0].startswith("-"):
            args[0] = f"{key}={_quote(args[0])}"
        args.insert(0, f"mode={mode}")
    return args


def hydra_command(
    config_name: str,
    run: Callable[..., Any],
    *,
    check: Callable[[Any], None] | None = None,
    open_keys: Sequence[str] = (),
    closed: Callable[[str], bool] | None = None,
    flags: Mapping[str, str] | None = None,
    modes: Sequence[str] = (),
    positional: Mapping[str, str] | None = None,
    subcommands: Mapping[str, Callable[[list[str]], int]] | None = None,
    quiet: Sequence[str] = ("transformers",),
    quiet_level: int = logging.WARNING,
    hydra_run: bool = True,
) -> Callable[[list[str] | None], int | None]:
    """The ``main`` of a console script that runs ``configs/<config_name>.yaml`` (module doc).

    ``flags``: the command's own ``--flag``s (name -> help), passed to ``run`` as booleans;
    ``quiet``: loggers turned down to ``quiet_level`` while it runs."""
    flags = dict(flags or {})
    command = sys._getframe(1).f_globals.get("__name__", run.__module__)  # the recallm.cli module defining main

    def main(argv: list[str] | None = None) -> int | None:
        from recallm.cli.schemas import register

        register()  # the config schemas the shipped YAML puts under its sections
        args = list(sys.argv[1:] if argv is None else argv)
        if subcommands and args[:1] and args[0] in subcommands:
            return _exit(subcommands[args[0]](args[1:]))
        args = rewrite_argv(args, modes, positional)
        given = {name[2:].replace("-", "_"): name in args for name in flags}
        args = [a for a in args if a not in flags]
        if not hydra_run:  # the composed and checked config is what runs: composed once
            return _exit(run(precheck(config_name, args, check, open_keys=open_keys, closed=closed), **given))
        if any(arg.startswith("-") for arg in args):  # Hydra's own flags: Hydra's own run
            return _run_hydra(config_name, args, run, given, quiet, quiet_level, command)
        job = _job_name(run)
        cfg = precheck(config_name, args, check, open_keys=open_keys, closed=closed, job_name=job)
        return _run_composed(cfg, job, run, given, quiet, quiet_level)

    main.__doc__ = f"recallm command on configs/{config_name}.yaml" + "".join(
        f"; {name}: {text}" for name, text in flags.items()
    )
    return main


def _exit(code: Any) -> int | None:
    if isinstance(code, int) and not isinstance(code, bool) and code:
        sys.exit(code)
    return 0


def _help_header(command: str) -> list[str]:
    """Overrides that make ``--help`` open with the command's name and what it does (the first
    paragraph of its module's doc) instead of Hydra's "app is powered by Hydra"."""
    module = sys.modules.get(command)
    if command == "__main__":  # python -m recallm.cli.sft
        command = getattr(getattr(module, "__spec__", None), "name", None) or command
    prog = "recallm-" + command.rsplit(".", 1)[-1].replace("_", "-")
    about = " ".join(((module.__doc__ if module else None) or "").split("\n\n")[0].split()).replace("`", "")
    return [f"hydra.help.app_name={prog}", f"hydra.help.header={_quote(about or prog)}"]


def _job_name(run: Callable[..., Any]) -> str:
    """The name Hydra gives the job (its log file, ``hydra.job.name``): the module defining ``run``."""
    module = run.__module__
    if module == "__main__":  # python -m recallm.cli.sft
        module = getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None) or module
    return module.rsplit(".", 1)[-1]


def _run_composed(
    cfg: Any, job: str, run: Callable[..., Any], given: dict[str, bool], quiet: Sequence[str], level: int
) -> int | None:
    """Hydra's run of a job (its output directory, ``.hydra/`` files, logging, callbacks) on the config
    step 4 composed and checked, so the command composes it once: what ``hydra.main`` does after its own
    composition (``hydra._internal.hydra.Hydra.run``, Hydra 1.3)."""
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict

    from recallm.paths import CONFIG_DIR

    result: dict[str, Any] = {}

    def task(task_cfg) -> None:
        for name in quiet:
            logging.getLogger(name).setLevel(level)
        try:
            result["code"] = run(task_cfg, **given)
        except SystemExit as exc:
            if exc.code == EXIT_USAGE:  # refused: nothing written, not even Hydra's own run directory
                _remove_hydra_dir()
            raise

    with open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=job):
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=cfg.hydra.job.config_name)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        ret = run_job(task_function=task, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                      hydra_context=context)  # fmt: skip
        callbacks.on_run_end(config=cfg, config_name=cfg.hydra.job.config_name, job_return=ret)
        _ = ret.return_value  # the run's exception, if it raised one
    return _exit(result.get("code"))


def _remove_hydra_dir() -> None:
    """Remove this invocation's Hydra output directory (``.../hydra/<time stamp>``), then the
    directories above it that are left empty (``hydra/``, an ``out_dir`` Hydra created, ``outputs/``),
    up to the working directory."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, AttributeError):
        return
    for logger in (logging.getLogger(), *[logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]):
        for handler in list(getattr(logger, "handlers", [])):  # the job's log file, opened by Hydra
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).is_relative_to(out.resolve()):
                logger.removeHandler(handler)
                handler.close()
    shutil.rmtree(out, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in out.parents:
        if (
            parent.resolve() == cwd
            or cwd.is_relative_to(parent.resolve())
            or not parent.is_dir()
            or any(parent.iterdir())
        ):
            break
        parent.rmdir()


def _run_hydra(
    config_name: str,
    args: list[str],
    run: Callable[..., Any],
    given: dict[str, bool],
    quiet: Sequence[str],
    level: int,
    command: str,
) -> int | None:
    import hydra

    from recallm.paths import CONFIG_DIR

    result: dict[str, Any] = {}

    def task(cfg) -> None:
        for name in quiet:
            logging.getLogger(name).setLevel(level)
        try:
            result["code"] = run(cfg, **given)
        except SystemExit as exc:
            if exc.code == EXIT_USAGE:  # refused: nothing written, not even Hydra's own run directory
                _remove_hydra_dir()
            raise

    module = run.__module__  # Hydra names the job after the calling module (`sft`, `eval`, ...)
    if module == "__main__":  # python -m recallm.cli.sft
        module = getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None) or module
    task.__module__ = module
    if "--help" in args or "-h" in args:  # Hydra's help would name the app `app` ("app is powered by Hydra")
        args = [*args, *_help_header(command)]
    saved = sys.argv
    sys.argv = [saved[0], *args]
    try:
        hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")(task)()
    finally:
        sys.argv = saved
    return _exit(result.get("code"))
