"""Behaviour kept through restructuring: a whole ladder climbed by a made-up runner gives the
rungs, order and verdicts recorded before (tests/golden_ladder.py says how it was recorded)."""

import json
import os
from pathlib import Path

from tests.golden_ladder import climb

GOLDEN = Path(__file__).parent / "fixtures" / "golden_ladder.json"


def set_fields(rungs: list[dict]) -> list[dict]:
    """The rungs with each config's fields at their defaults left out: a field added later, at its
    default, changes no configuration (as RunConfig.config_hash holds)."""
    from cpuopt_helpers.config import RunConfig

    default = RunConfig().to_dict()
    return [dict(r, config={k: v for k, v in r["config"].items() if k in ("workload", "preset") or v != default.get(k)})
            for r in rungs]


def test_the_golden_ladder_is_climbed_again_exactly(tmp_path):
    got = climb(tmp_path)
    if os.environ.get("CPUOPT_RECORD_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got["decisions"] == want["decisions"]
    assert [r["step"] for r in got["rungs"]] == [r["step"] for r in want["rungs"]]
    assert set_fields(got["rungs"]) == set_fields(want["rungs"])
    assert (got["runs"], got["calls_digest"]) == (want["runs"], want["calls_digest"])
    # the climb decides something: a rung that pays is handed on, and one that does not is kept
    verdicts = {d["stage"]: d["verdict"] for d in want["decisions"]}
    assert verdicts["allocator"] == "faster" and verdicts["multi-instance"] != "faster"
