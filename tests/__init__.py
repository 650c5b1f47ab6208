from pathlib import Path

#: the repository's root (the tiers live in tests/unit and tests/integration; shared helpers here)
REPO_ROOT = Path(__file__).resolve().parents[1]
