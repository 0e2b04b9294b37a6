"""What every benchmark JSON says about what it measured: the measured wheel's own commit and dirty
flag (written into it by its build: stridedfa.info()["build"]), not the checkout the script was
launched from -- that one too, as launched_from_commit, when STRIDEDFA_COMMIT names it -- and when
(UTC)."""

from __future__ import annotations

import json
import os
import time


def measured_build(sfa) -> dict:
    """{"commit", "dirty"[, "launched_from_commit"]} of the imported stridedfa."""
    build = sfa.info().get("build", {})
    facts = {"commit": build.get("commit"), "dirty": build.get("dirty")}
    if os.environ.get("STRIDEDFA_COMMIT"):
        facts["launched_from_commit"] = os.environ["STRIDEDFA_COMMIT"]
    return facts


def provenance(sfa) -> dict:
    """measured_build plus the time of the run, as one JSON object."""
    return {**measured_build(sfa), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def save(out_dir: str, name: str, data: dict, table: str, indent: int = 2) -> None:
    """``out_dir/name.json`` (the record) and ``out_dir/name.md`` (its table), and the table printed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=indent)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table)
    print(table)
