"""The ``heavy`` mark as a pytest-xdist group (imported by ``tests/conftest.py``; see
docs/development/test-suite.md).

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``). A test marked
``heavy`` (a GRPO run with its Ray processes, DeepSpeed, SmolLM2: a few GiB and both cores each) joins
the xdist group ``heavy``, which one worker runs, one test at a time, so that two of them never run side
by side; the other worker runs the light tests meanwhile.

pytest-xdist 3.8 names a test's group by appending ``@<group>`` to its node id in the worker's
``pytest_collection_modifyitems`` (the id the controller schedules by), writing ``item._nodeid``; pytest
9.2 keeps the id in ``item._id`` instead, so xdist's own ``xdist_group`` marks group nothing there. This
hook appends the suffix itself, to whichever of the two the running pytest has."""

from __future__ import annotations

import pytest

GROUP = "heavy"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("heavy") is None or item.nodeid.endswith(f"@{GROUP}"):
            continue
        grouped = f"{item.nodeid}@{GROUP}"
        if hasattr(item, "_id"):  # pytest >= 9.2: a structured NodeId
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(grouped)
        else:
            item._nodeid = grouped
