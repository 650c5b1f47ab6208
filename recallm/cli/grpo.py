"""`recallm-grpo`: GRPO on verl with masked rollouts (see ``recallm.grpo.app``).

recallm-grpo [--print-config] [key=value ...]       # Hydra overrides, any verl key included
"""

from __future__ import annotations

import sys

from recallm.errors import cli_errors


@cli_errors
def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from recallm.config import check_overrides
    from recallm.grpo.app import compose_config, describe, launch, prepare, validate

    args = list(sys.argv[1:] if argv is None else argv)
    print_only = "--print-config" in args
    args = [a for a in args if a != "--print-config"]
    # verl's own config gives the types; of the settings only ours (recallm.*) are a closed set
    check_overrides("grpo", args, closed=lambda key: key.split(".")[0] == "recallm")
    cfg = compose_config(args)
    env = prepare(cfg)
    validate(cfg)
    if print_only:
        print(OmegaConf.to_yaml(cfg))
        return 0
    print(describe(cfg), flush=True)
    launch(cfg, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
