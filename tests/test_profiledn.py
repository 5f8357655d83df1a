"""ProfileDNN: the parser on every log format, breakdowns, comparison and replay."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cpuopt_helpers import profiledn
from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn import replay
from cpuopt_helpers.profiledn.breakdown import reorder_roles
from cpuopt_helpers.profiledn.parse import parse_conv, parse_dims

LOGS = Path(__file__).parent / "fixtures" / "onednn"


def parse(name):
    return profiledn.parse_log(LOGS / name)


def test_mkldnn_0x_format():
    p = parse("mkldnn_0x.log")
    assert p.counts["exec"] == 3 and p.counts["malformed"] == 0
    conv = p.exec.iloc[0]
    assert (conv.kind, conv.isa, conv.direction, conv.src_layout) == ("convolution", "avx2", "forward", "nChw8c")
    assert p.exec.iloc[1].data_type == "f32" and p.exec.iloc[1].dst_layout == "nChw8c"
    assert list(p.exec.direction) == ["forward", "none", "backward_weights"]
    assert p.info["version"].startswith("Intel MKL-DNN v0.21")


def test_dnnl_1x_format_without_template():
    p = parse("dnnl_1x.log")
    assert list(p.exec.kind) == ["convolution", "convolution", "batch_normalization"]
    assert list(p.exec.direction) == ["forward", "backward_data", "backward_data"]
    assert p.exec.iloc[0].data_types == "src:f32 wei:f32 bia:f32 dst:f32"
    assert p.exec.iloc[1].data_types == "src:f32 wei:f32 dst:f32"  # an undef bias is left out
    assert p.exec.time_ms.sum() == pytest.approx(0.0649414 + 0.05 + 0.02)
    assert p.info["isa"] == "Intel AVX-512 with Intel DL Boost"


def test_onednn_2x_with_timestamps_and_prim_template():
    p = parse("onednn_2x_timestamps.log")
    assert p.info["nthr"] == 56 and p.info["template"][0] == "engine"
    assert p.exec.timestamp.tolist() == [1679000000000.125, 1679000000001.25, 1679000000001.5]
    ip = p.exec.iloc[1]
    assert (ip.kind, ip.direction, ip.data_type, ip.isa) == ("inner_product", "backward_weights", "bf16", "avx512_core_bf16")
    assert "AVX512DQ" in p.info["isa"]  # commas inside the ISA line survive


def test_onednn_3x_graph_create_program_output_and_truncated_line():
    p = parse("onednn_33_graph.log")
    assert p.counts == {"exec": 4, "create": 1, "info": 5, "other": 1, "malformed": 1, "lines": 12}
    assert list(p.exec.kind) == ["matmul", "eltwise", "graph:sdp", "softmax"]
    assert p.exec.iloc[2].problem == "MatMul;Divide;Add;SoftMax;MatMul" and p.exec.iloc[2].api == "graph"
    assert p.creates.iloc[0].operation == "create:cache_miss" and p.creates.iloc[0].kind == "matmul"
    assert "pooling" in p.malformed_examples[0]


def test_onednn_312_v1_format_from_torch():
    p = parse("onednn_312_cnn_two_steps.log")
    assert p.counts["malformed"] == 0 and p.counts["exec"] == 132
    assert p.info["version"] == "oneDNN v3.12.0" and p.info["nthr"] == 2
    assert p.info["template"][-1] == "exec_time"
    conv = p.exec[p.exec.kind == "convolution"]
    assert set(conv.direction) == {"forward", "backward_data", "backward_weights"}
    assert set(conv.data_type) == {"f32"}
    ts = parse("onednn_312_cnn_channels_last_timestamps.log")
    assert ts.exec.timestamp.notna().all() and ts.exec.timestamp.is_monotonic_increasing
    assert "acdb" in set(ts.exec[ts.exec.kind == "convolution"].src_layout)


def test_onednn_32_v0_marker_with_timestamps_and_templates():
    """oneDNN 3.1-3.2 builds print a `v0` marker: the format of the 'Enable ONEDNN_VERBOSE with
    timestamps' example of oneDNN's Verbose Mode guide (output of oneDNN v3.2.0, the revision that
    documents 'verbose mode version: v0 or v1'); the fixture's lines are written in that format,
    with its 3.1-3.2 descriptors (src_f32:a:blocked:aBcd16b::f0), create lines and a graph line."""
    p = parse("onednn_32_v0_timestamps.log")
    assert p.counts == {"exec": 5, "create": 2, "info": 7, "other": 0, "malformed": 0, "lines": 14}
    assert list(p.exec.kind) == ["reorder", "reorder", "convolution", "reorder", "graph:convolution_post_ops"]
    assert p.exec.timestamp.tolist()[:2] == [1700000000102.0, 1700000000102.25]
    assert p.exec.time_ms.sum() == pytest.approx(0.11 + 0.09 + 0.75 + 0.125 + 0.5)
    conv = p.exec.iloc[2]
    assert (conv.direction, conv.data_types, conv.src_layout, conv.wei_layout) == (
        "forward", "src:f32 wei:f32 bia:f32 dst:f32", "aBcd16b", "ABcd16b16a")
    assert p.info["version"] == "oneDNN v3.2.0" and p.info["nthr"] == 8 and p.info["template"][-1] == "exec_time"
    assert list(p.creates.operation) == ["create:cache_miss"] * 2 and p.creates.iloc[0].kind == "convolution"


def test_onednn_graph_verbose_prefix_with_compile_lines():
    """oneDNN Graph's own prefix (ONEDNN_GRAPH_VERBOSE, before 3.3 merged it into onednn_verbose):
    the format documented by oneDNN Graph's Verbose Mode guide (dev_guide_verbose_mode, oneDNN Graph
    v0.5: marker, compile:cache_miss|exec, engine, partition id, partition kind, op names, data formats,
    logical tensors, fpmath mode, backend, time) and shown for oneDNN v3.2 in oneDNN's RFC
    'Unify Primitive and Graph API Verbose'; the fixture's lines are written in that format, mixed
    with a primitive line of the same run."""
    p = parse("onednn_graph_32.log")
    assert p.counts == {"exec": 4, "create": 2, "info": 7, "other": 0, "malformed": 0, "lines": 13}
    assert list(p.exec.kind) == ["graph:matmul_post_ops", "graph:convolution_post_ops", "reorder",
                                 "graph:matmul_post_ops"]
    assert list(p.exec.api) == ["graph", "graph", "primitive", "graph"]
    assert p.exec.iloc[1].problem == "CONV_0;BIAS_ADD_1;RELU_2" and p.exec.iloc[1].impl == "dnnl_backend"
    assert p.exec.time_ms.sum() == pytest.approx(0.25 + 1.5 + 0.2 + 0.375)
    assert list(p.creates.operation) == ["compile:cache_miss"] * 2
    assert list(p.creates.kind) == ["graph:matmul_post_ops", "graph:convolution_post_ops"]
    assert p.creates.time_ms.sum() == pytest.approx(12.5 + 30.75)
    assert p.info["version"] == "oneDNN v3.2.0" and p.info["nthr"] == 16
    kinds = profiledn.breakdown(p.exec, "kind")
    assert kinds.loc["graph:convolution_post_ops", "share"] == pytest.approx(1.5 / 2.325)


def test_program_output_glued_to_a_line_and_garbage_never_crash():
    text = ("step 1 onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 "
            "dst:f32::blocked:acdb::f0,,,2x3x4x5,0.5\n"
            "\x00\x01binary junk,,,\n"
            "onednn_verbose,v1,primitive,exec\n"
            "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src,,,2x3,notanumber\n"
            "onednn_verbose,v1,primitive,exec,cpu,conv")
    p = profiledn.parse_log(text)
    assert p.counts["exec"] == 1 and p.counts["other"] == 1 and p.counts["malformed"] == 3
    assert p.exec.iloc[0].time_ms == 0.5


def test_a_repeated_line_is_parsed_once_and_reads_the_same_as_a_fresh_parse():
    line = ("onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 "
            "dst:f32::blocked:acdb::f0,,,2x3x4x5,{}\n")
    text = line.format("0.5") + line.format("1.5") + line.format("oops") + "other\n" + line.format("2")
    p = profiledn.parse_log(text)
    assert p.counts["exec"] == 3 and p.counts["malformed"] == 1 and p.counts["other"] == 1
    assert list(p.exec.time_ms) == [0.5, 1.5, 2.0] and list(p.exec.line) == [1, 2, 5]
    alone = profiledn.parse_log(line.format("2"))  # the same line in a log of its own
    assert p.exec.drop(columns=["line", "time_ms"]).iloc[2].equals(alone.exec.drop(columns=["line", "time_ms"]).iloc[0])
    # a template read after a line changes what the same line means: it is parsed again
    swapped = ("onednn_verbose,v1,info,template:operation,engine,primitive,implementation,prop_kind,"
               "memory_descriptors,attributes,auxiliary,problem_desc,exec_time\n")
    reordered = line.replace("reorder,jit:uni", "jit:uni,reorder")
    q = profiledn.parse_log(reordered.format("1") + swapped.replace("primitive,implementation", "implementation,primitive")
                            + reordered.format("1"))
    assert list(q.exec.kind) == ["jit:uni", "reorder"] and list(q.exec.impl) == ["reorder", "jit:uni"]


def test_missing_file_is_a_clear_error():
    with pytest.raises(CpuoptError, match="does not exist"):
        profiledn.parse_log("/nonexistent/onednn.log")


def test_breakdowns_shares_and_per_step():
    df = parse("onednn_312_cnn_two_steps.log").exec
    kinds = profiledn.breakdown(df, "kind", steps=2)
    assert kinds["share"].sum() == pytest.approx(1.0)
    assert kinds["calls"].sum() == 132 and kinds.loc["convolution", "calls_per_step"] == 17
    both = profiledn.breakdown(df, "kind_direction")
    assert both.loc[("convolution", "backward_weights"), "calls"] == 12
    assert profiledn.breakdown(df, "shape").index.nlevels == 3
    with pytest.raises(CpuoptError, match="unknown breakdown"):
        profiledn.breakdown(df, "colour")
    total, directions, reorders = profiledn.findings(df, steps=2, label="cnn")  # no reference kernel ran
    assert (total.workload, total.stage, total.kind) == ("cnn", "profiling", "log total")
    assert total.values["executions"] == 132 and total.values["steps"] == 2
    assert [k for k, _ in total.values["kinds"]] == ["reorder", "convolution"]
    assert total.sentence.startswith("cnn: 132 primitive executions took 43.9 ms (22.0 ms per step over 2 steps); ")
    assert [d for d, _, _ in directions.values["directions"]] == ["none", "forward", "backward_weights", "backward_data"]
    assert reorders.kind == "log reorders" and reorders.values["calls"] == 98 and reorders.values["share"] > 0.1
    ref = profiledn.findings(parse("onednn_312_rnn_quick.log").exec)[-1]
    assert (ref.kind, ref.values["executions"], ref.values["kinds"]) == ("log reference kernels", 2, ["rnn"])
    assert [f.kind for f in profiledn.findings(df.iloc[:0])] == ["log empty"]


def test_compare_finds_counts_and_kernels_in_one_run_only():
    a = parse("onednn_312_cnn_two_steps.log").exec
    b = a[~((a.kind == "convolution") & (a.direction == "backward_weights"))].copy()
    b = pd.concat([b, b[b.kind == "reorder"].head(5)])
    table = profiledn.compare(a, b, labels=("ref", "mine"))
    assert table.loc[("convolution", "backward_weights"), "calls_ref"] == 12
    assert table.loc[("convolution", "backward_weights"), "calls_mine"] == 0
    found = profiledn.compare_findings(a, b, labels=("ref", "mine"), workload="cnn")
    assert {f.workload for f in found} == {"cnn"} and {f.stage for f in found} == {"profiling"}
    said = lambda kind: [f.values for f in found if f.kind == kind]  # noqa: E731
    assert said("logs one run only") == [{"primitive": "convolution", "direction": "backward_weights",
                                          "only_in": "ref", "calls": 12}]
    assert said("logs calls") == [{"primitive": "reorder", "direction": "none", "calls": [98, 103]}]
    assert said("logs distinct primitives") == [{"labels": ["ref", "mine"], "distinct": [36, 31], "both": 31}]
    assert said("logs onednn time")[0]["per_step"] is False
    assert "backward weights convolution runs only in ref (12 calls)." in [f.sentence for f in found]
    assert "logs heaviest implementation" not in {f.kind for f in profiledn.compare_findings(a, a)}
    ref = a.assign(impl=a["impl"].where(a.kind != "convolution", "ref:any"))  # as bf16 without a fast path runs
    top = profiledn.breakdown(a, "impl").index[0]
    changed = [f for f in profiledn.compare_findings(a, ref, labels=("fp32", "bf16"), steps=(2, 2), stage="precision")
               if f.kind == "logs heaviest implementation"]
    assert [(f.stage, f.values["implementations"]) for f in changed] == [("precision", [" ".join(top),
                                                                                      "convolution ref:any"])]
    assert [f.sentence for f in changed] == [f"The heaviest implementation changed: {' '.join(top)} (37% of oneDNN "
                                             "time) in fp32, convolution ref:any (37%) in bf16."]


def test_reorders_are_told_apart_by_the_tensor_they_move():
    a = parse("onednn_312_cnn_two_steps.log").exec  # NCHW fp32: activations into and out of aBcd16b, and weights
    assert reorder_roles(a) == {"weights": [34, pytest.approx(12.39, abs=0.01)],
                                "activations": [64, pytest.approx(15.17, abs=0.01)], "other": [0, 0.0]}
    grouped = pd.DataFrame({"kind": ["convolution", "reorder", "reorder", "reorder", "reorder"],
                            "problem": ["mb2_g32ic64oc64_ih14kh3ph1", "32x2x2x3x3", "2x64x14x14", "64", "7x7"],
                            "time_ms": [5.0, 1.0, 2.0, 0.5, 0.25]})
    assert reorder_roles(grouped) == {"weights": [2, 1.5], "activations": [1, 2.0], "other": [1, 0.25]}
    said = {f.kind: f.sentence for f in profiledn.findings(a, steps=2, label="cnn")}["log reorders"]
    assert said.startswith("cnn: Reorders (layout conversions, no useful compute) take 63% of oneDNN time in 49 "
                           "calls a step (activations 35%, weights 28%); a consistent layout (channels-last")
    found = {f.kind: f.sentence for f in profiledn.findings(a, steps=None, label="cnn")}
    assert "in 98 calls in the log (" in found["log reorders"]  # steps unknown: the log's total, said so
    directions = {f.kind: f.sentence for f in profiledn.findings(a, steps=2)}["log directions"]
    assert "no direction (reorders, sums, concatenations) " in directions and " calls a step)" in directions
    channels_last = parse("onednn_312_cnn_channels_last_timestamps.log").exec  # the activations' reorders are gone
    said = {f.kind: f.sentence for f in profiledn.findings(channels_last, steps=2)}["log reorders"]
    assert "(weights 45%); most move weights" in said and "weight prepacking" in said


def test_parse_conv_descriptor_with_benchdnn_defaults():
    p = parse_conv("mb4_ic3oc16_ih32oh16kh7sh2dh0ph3_iw32ow16kw7sw2dw0pw3")
    assert (p["mb"], p["ic"], p["oc"], p["oh"], p["ow"], p["g"], p["kw"]) == (4, 3, 16, 16, 16, 1, 7)
    short = parse_conv("mb2_g32ic64oc64_ih14kh3ph1")  # square, stride 1, output computed
    assert (short["iw"], short["oh"], short["ow"], short["g"]) == (14, 14, 14, 32)
    assert parse_conv("mb2_ic4oc4_ih8oh9kh3ph1") is None  # asymmetric padding
    assert parse_dims("2x3:3x4") == [[2, 3], [3, 4]]


def test_projection_arithmetic():
    prims = pd.DataFrame({"kind": ["convolution", "rnn"], "calls": [10, 2], "time_ms": [20.0, 8.0],
                          "mean_ms": [2.0, 4.0]})
    replays = [{"replayed": True, "replay_ms": 1.0, "note": ""},
               {"replayed": False, "replay_ms": None, "note": "rnn is not replayed"}]
    proj = replay.projection(prims, replays, steps=2, step_ms=20.0)
    # (10 x 1.0 replayed + 8.0 logged) / 2 steps = 9 ms per step, against a 20 ms step
    assert proj["kernel_ms_per_step"] == pytest.approx(9.0)
    assert proj["efficiency"] == pytest.approx(0.45)
    assert proj["not_replayed_kinds"] == ["rnn"] and proj["not_replayed_ms_per_step"] == pytest.approx(4.0)
    kernels, efficiency, missing = replay.projection_findings(proj)
    assert (kernels.kind, kernels.values) == ("projection kernels", {"kernel_ms_per_step": 9.0, "replayed": 1,
                                                                     "not_replayed": 1})
    assert efficiency.kind == "projection efficiency" and efficiency.values == {
        "step_ms": 20.0, "efficiency": pytest.approx(0.45), "agreement": None}
    assert efficiency.sentence.startswith("measured step 20.0 ms; efficiency ratio 45% (oneDNN's kernels, replayed "
                                          "alone where they can be, take that share of it): the other 55% is time "
                                          "they do not account for, spent outside oneDNN")
    assert "or in its kernels running slower in the step than alone" in efficiency.sentence
    assert missing.values == {"kinds": ["rnn"], "ms_per_step": 4.0}
    strayed = Finding("", "profiledn", "projection efficiency",
                      {"step_ms": 829.0, "efficiency": 0.97, "agreement": 1.33})
    assert strayed.sentence.endswith(": not to be read as a share of the step, since the same primitives took 33% more "
                                     "time replayed than logged (the line above), more than 10% apart; the logged "
                                     "share of the step in oneDNN is the safer figure.")
    close = Finding("", "profiledn", "projection efficiency", {"step_ms": 829.0, "efficiency": 0.71, "agreement": 1.04})
    assert "(oneDNN's kernels, replayed alone where they can be, take that share of it)" in close.sentence
    every = Finding("", "profiledn", "projection kernels",
                    {"kernel_ms_per_step": 9.0, "replayed": 3, "not_replayed": 0})
    assert every.sentence.endswith("(3 distinct primitives replayed, every one of the log's).")


CONV = ("onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32:a:blocked:abcd::f0 "
        "wei:f32:a:blocked:Acdb16a::f0 bia:undef::undef::: dst:f32:a:blocked:aBcd16b::f0,attr-scratchpad:user,"
        "alg:convolution_direct,mb4_ic3oc16_ih32oh16kh7sh2dh0ph3_iw32ow16kw7sw2dw0pw3,{}")
REORDER = ("onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 "
           "dst:f32::blocked:Acdb16a::f0,attr-scratchpad:user,,16x3x7x7,{}")


def test_the_replayed_primitive_is_read_from_the_replays_own_log_apart_from_what_the_call_adds():
    row = next(profiledn.distinct_primitives(profiledn.parse_log(CONV.format(9.0) + "\n").exec).itertuples())
    # the PyTorch call ran a weight reorder before each convolution; the first convolution is creation-slow
    text = "\n".join(line for t in (50.0, 4.0, 2.0, 3.0) for line in (REORDER.format(0.5), CONV.format(t)))
    kernel, added_per_call, others = replay.kernel_time(row, text, repeats=3, calls=4)
    assert kernel == 3.0 and others == 4 and added_per_call == pytest.approx(0.5)
    assert replay.kernel_time(row, REORDER.format(0.5), repeats=3, calls=1) == (None, pytest.approx(0.5), 1)
    assert replay.kernel_time(row, "", repeats=3, calls=1) == (None, 0.0, 0)


def test_the_projection_reports_replay_against_log_like_for_like():
    prims = pd.DataFrame({"kind": ["convolution", "reorder"], "calls": [10, 4], "time_ms": [20.0, 4.0],
                          "mean_ms": [2.0, 1.0]})
    replays = [{"replayed": True, "replay_ms": 3.0, "kernel_replay_ms": 2.2, "added_ms": 0.6, "note": ""},
               {"replayed": True, "replay_ms": 0.5, "kernel_replay_ms": None, "added_ms": 0.0,
                "note": "replayed as a same-size copy"}]
    proj = replay.projection(prims, replays, steps=2, step_ms=20.0)
    # the convolution at its own replayed time (2.2 ms, not the call's 3.0), the copy at its wall time
    assert proj["kernel_ms_per_step"] == pytest.approx((10 * 2.2 + 4 * 0.5) / 2)
    assert proj["agreement"] == pytest.approx(1.1) and proj["alike"] == 1
    assert proj["call_replayed_ms_per_step"] == pytest.approx((30 + 2) / 2)
    assert list(proj["table"]["replay_over_logged"].round(2).fillna(-1)) == [1.1, -1]
    against = next(f for f in replay.projection_findings(proj, "cnn") if f.kind == "projection against log")
    assert against.workload == "cnn" and against.values["alike"] == 1
    assert against.values["agreement"] == pytest.approx(1.1)


@pytest.mark.slow
def test_replay_runs_every_conv_direction_in_a_pinned_process():
    results = replay.replay_log(str(LOGS / "onednn_312_cnn_two_steps.log"), threads=1, cores=[0], repeats=2)
    prims = profiledn.distinct_primitives(parse("onednn_312_cnn_two_steps.log").exec)
    assert len(results) == len(prims)
    conv = [r for r, k in zip(results, prims.kind) if k == "convolution"]
    assert conv and all(r["replayed"] and r["replay_ms"] > 0 for r in conv)
    # each convolution is also found in the replay's own log, and takes no longer there than the whole call
    assert all(r["kernel_replay_ms"] is not None and 0 < r["kernel_replay_ms"] <= r["replay_ms"] * 1.5 for r in conv)


def test_cli_profile_json_and_bad_logs(tmp_path, capsys):
    from cpuopt_helpers import cli  # in-process: `python -m cpuopt_helpers` is this main (tests/test_cli.py)

    log = LOGS / "onednn_312_cnn_two_steps.log"
    code = cli.main(["profile", str(log), "--by", "direction", "--steps", "2", "--json",
                     "--csv", str(tmp_path / "t.csv")])
    out, err = capsys.readouterr()
    assert code == 0, err
    out = json.loads(out)
    assert {r["direction"] for r in out["breakdown"]} == {"forward", "backward_data", "backward_weights", "none"}
    assert out["exec_lines"] == 132 and out["total_ms"] == pytest.approx(sum(r["time_ms"] for r in out["breakdown"]))
    assert out["findings"][0].startswith("132 primitive executions took ")  # the findings' sentences
    assert pd.read_csv(tmp_path / "t.csv")["ncalls"].sum() == 132  # verbose_converter's breakdown
    (tmp_path / "junk.log").write_text("just program output\n")
    (tmp_path / "random.log").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "logs").mkdir()
    for args in (["/nonexistent.log"], [str(tmp_path / "junk.log")], [str(log), "--project"], [str(log), "--by", "x"],
                 [str(tmp_path / "logs")], [str(log), "--compare", str(tmp_path / "random.log")],
                 [str(log), "--compare", str(tmp_path / "logs")], [str(log), "--csv", str(tmp_path / "no" / "t.csv")]):
        code = cli.main(["profile", *args])
        captured = capsys.readouterr()
        assert code == 2 and len(captured.err.strip().splitlines()) == 1 and not captured.out, (args, captured)
    code = cli.main(["profile", str(tmp_path / "logs")])
    assert "is a folder, not a log" in capsys.readouterr().err
    cli.main(["profile", str(log), "--compare", str(tmp_path / "random.log")])
    assert "random.log holds no oneDNN primitive" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_captures_the_timed_steps_only(tmp_path):
    log = tmp_path / "cnn.log"
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers", "bench", "--steps", "3", "--warmup", "2",
                           "--onednn-verbose", str(log), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["onednn_logs"] == [str(log)] and r["onednn_log_steps"] == 3
    assert replay.log_meta(str(log))["steps"] == 3  # recorded beside the log
    p = profiledn.parse_log(log)
    # every forward convolution of the model runs once per step: 3 timed steps, no warm-up
    per_step = parse("onednn_312_cnn_two_steps.log").exec
    fwd_per_step = ((per_step.kind == "convolution") & (per_step.direction == "forward")).sum() / 2
    assert ((p.exec.kind == "convolution") & (p.exec.direction == "forward")).sum() == 3 * fwd_per_step
    # the logged primitives ran inside the timed window: a share of it, however busy the machine
    inst = r["instances"][0]
    logged_s = p.exec["time_ms"].sum() / 1e3
    assert 0 < logged_s <= inst["timed_end"] - inst["timed_start"]


def test_real_log_total_equals_an_independent_sum_of_last_fields():
    path = Path(__file__).resolve().parents[1] / "data" / "onednn_logs" / "cnn_quick_nchw.log"
    independent = sum(float(line.rsplit(",", 1)[1]) for line in path.read_text().splitlines() if ",exec," in line)
    calls = sum(1 for line in path.read_text().splitlines() if ",exec," in line)
    p = profiledn.parse_log(path)
    assert p.exec.time_ms.sum() == pytest.approx(independent, rel=1e-12)
    assert len(p.exec) == calls and p.counts["malformed"] == 0


def write_trace(path, spans, steps, ops):
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "tid": 1, "ts": ts, "dur": dur} for n, ts, dur in spans]
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep", "tid": 1, "ts": 0, "dur": 10})
    Path(path).write_text(json.dumps({"traceEvents": events}))
    Path(f"{path}.ops.json").write_text(json.dumps({"steps": steps, "ops": ops}))


def test_trace_summary_fragmentation_and_onednn_share(tmp_path):
    from cpuopt_helpers.profiledn import trace

    # two steps; each: a convolution (with a nested mkldnn call) and two short elementwise ops
    spans = []
    for step in range(2):
        t0 = step * 1000.0
        spans += [("aten::conv2d", t0, 500.0), ("aten::mkldnn_convolution", t0 + 10, 480.0),
                  ("aten::relu", t0 + 600, 5.0), ("aten::add_", t0 + 700, 5.0)]
    ops = [{"name": "aten::mkldnn_convolution", "count": 2, "self_cpu_ms": 0.96, "cpu_total_ms": 0.96},
           {"name": "aten::conv2d", "count": 2, "self_cpu_ms": 0.04, "cpu_total_ms": 1.0},
           {"name": "aten::relu", "count": 2, "self_cpu_ms": 0.01, "cpu_total_ms": 0.01},
           {"name": "aten::add_", "count": 2, "self_cpu_ms": 0.01, "cpu_total_ms": 0.01}]
    path = tmp_path / "t.json"
    write_trace(path, spans, 2, ops)
    s = trace.summarize_trace(path)
    assert s["steps"] == 2 and s["ops_per_step"] == 4 and s["top_level_per_step"] == 3
    assert s["wall_ms_per_step"] == pytest.approx(1.705 / 2)
    assert s["median_top_level_us"] == 5.0
    assert s["outside_onednn_share"] == pytest.approx(0.06 / 1.02)
    assert s["top_ops"].iloc[0]["name"] == "aten::mkldnn_convolution"
    top, outside, spans = trace.trace_findings(s, "cnn")  # 4.7 spans a ms, median 242 µs: not fragmented
    assert [name for name, _ in top.values["operators"]] == ["aten::mkldnn_convolution", "aten::conv2d", "aten::relu"]
    assert outside.values["share"] == pytest.approx(0.06 / 1.02) and spans.values["ops_per_step"] == 4
    assert spans.sentence == "cnn: 4 operator spans per step (4.7 per ms), median 242 µs; 50% are shorter than 10 µs."
    fragmented = trace.trace_findings(dict(s, median_span_us=8.0, loss={
        "loss_forward_ms": 1.0, "loss_backward_ms": 2.0, "backward_ms": 20.0, "loss_backward_share": 0.1}))
    assert [f.kind for f in fragmented[3:]] == ["trace fragmented", "trace loss"]
    assert fragmented[4].values["loss_backward_share"] == 0.1
    with pytest.raises(CpuoptError, match="cannot read trace"):
        trace.summarize_trace(tmp_path / "missing.json")


def test_compiled_graphs_are_summed_under_a_readable_name():
    """torch.compile names a span per graph hash and per frame: the top operators say what they are."""
    import pandas as pd

    from cpuopt_helpers.profiledn import trace

    ops = pd.DataFrame([{"name": "## Call CompiledFxGraph fl3jqhws4fmx ##", "count": 2, "self_cpu_ms": 3.0},
                        {"name": "aten::convolution_backward", "count": 4, "self_cpu_ms": 5.0},
                        {"name": "## Call CompiledFxGraph ab12 ##", "count": 2, "self_cpu_ms": 4.0},
                        {"name": "Torch-Compiled Region: 0/1", "count": 2, "self_cpu_ms": 0.5}])
    named = trace.readable_operators(ops)
    assert list(named["name"]) == ["compiled graphs (Inductor's generated kernels)", "aten::convolution_backward",
                                   "compiled regions (Dynamo's entry and guards)"]
    assert list(named["self_cpu_ms"]) == [7.0, 5.0, 0.5] and list(named["count"]) == [4, 4, 2]


def test_projection_above_one_is_worded_as_kernel_bound():
    prims = pd.DataFrame({"kind": ["convolution"], "calls": [10], "time_ms": [20.0], "mean_ms": [2.0]})
    proj = replay.projection(prims, [{"replayed": True, "replay_ms": 3.0, "note": ""}], steps=1, step_ms=25.0)
    assert proj["efficiency"] == pytest.approx(1.2)
    efficiency = next(f for f in replay.projection_findings(proj) if f.kind == "projection efficiency")
    assert efficiency.values["efficiency"] == pytest.approx(1.2) and "the step is kernel-bound" in efficiency.sentence


def test_the_loss_backward_is_found_in_a_trace_by_autograd_sequence_numbers(tmp_path):
    """A cheap loss on a heavy model takes a small share of backward, a heavy loss on a cheap
    model a large one; a trace without the worker's loss span says nothing."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from cpuopt_helpers.profiledn.trace import LOSS_SPAN, loss_backward
    from cpuopt_helpers.worker import LOSS_SPAN as WORKER_SPAN

    assert LOSS_SPAN == WORKER_SPAN

    def share(width: int, loss_repeats: int, span: bool = True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 64))
        x, t = torch.randn(128, 32), (torch.rand(128, 64) > 0.9).float()
        path = tmp_path / f"{width}_{loss_repeats}_{span}.json"
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                y = model(x)
                with record_function(LOSS_SPAN if span else "other"):
                    loss = sum(torch.nn.functional.binary_cross_entropy_with_logits(y * (1 + i), t)
                               for i in range(loss_repeats))
                loss.backward()
        prof.export_chrome_trace(str(path))
        return loss_backward(path, 2)

    light, heavy = share(2048, 1), share(8, 40)
    assert 0 < light["loss_backward_share"] < heavy["loss_backward_share"] < 1
    assert heavy["loss_backward_ms"] <= heavy["backward_ms"] and light["loss_forward_ms"] > 0
    assert share(8, 1, span=False) is None


def test_the_papers_comparisons_are_planned_or_left_out_with_the_reason():
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.profiledn import capture
    from cpuopt_helpers.stages import profiling

    cnn = capture.Profile("cnn", RunConfig.for_preset("cnn", "quick"), {}, {}, "cnn.log", parsed=object(), projection=None)
    asked = {"channels-last": ["cnn"], "IPEX": ["cnn"], "bf16": ["cnn", "rnn"]}
    built = {"available": True, "torch": "2.8.0", "ipex": "2.8.0"}
    pairs = profiling.variant_pairs([cnn], asked, built, {"accelerated": True, "reason": "avx512_bf16"})
    planned = {p["variant"]: p for p in pairs if "skip" not in p}
    assert planned["channels-last"]["base"] is cnn and planned["channels-last"]["other"].channels_last
    ipex = planned["IPEX"]  # both arms in the IPEX runtime: one oneDNN build
    assert (ipex["base"].runtime, ipex["base"].ipex, ipex["other"].runtime, ipex["other"].ipex) == ("ipex", False, "ipex", True)
    assert planned["bf16"]["other"].dtype == "bf16" and planned["bf16"]["note"].startswith("bf16 has a fast path")
    assert [p["skip"] for p in pairs if "skip" in p] == ["rnn: not compared (bf16): it was not profiled above"]
    missing = profiling.variant_pairs([cnn], asked, {"available": False, "reason": "IPEX=0"}, {"accelerated": False})
    assert "cnn: not compared with IPEX: IPEX=0" in [p.get("skip") for p in missing]
    slow = next(p for p in missing if p["variant"] == "bf16")  # no fast path: its kernels seen over a few steps
    assert "no fast path" in slow["note"] and planned["bf16"]["other"].steps == cnn.config.steps
    assert (slow["other"].steps, slow["other"].warmup, slow["repeats"]) == (
        min(cnn.config.steps, profiling.SLOW_BF16_STEPS), 1, profiling.SLOW_BF16_REPEATS)
    unasked = profiling.variant_pairs([cnn], asked, built, {"accelerated": False, "reason": "AVX2 only"}, slow_bf16=False)
    assert "cnn: not compared in bf16: this CPU has no bf16 fast path (AVX2 only)" in unasked[-2]["skip"]
    fast = profiling.variant_pairs([cnn], asked, built, {"accelerated": True, "reason": "AMX"}, slow_bf16=False)
    assert [p["variant"] for p in fast if "skip" not in p] == ["channels-last", "IPEX", "bf16"]  # a fast path: profiled
    none = profiling.variant_pairs([cnn], dict(asked, IPEX=[]), built, {"accelerated": True, "reason": "AMX"})
    assert [p["skip"] for p in none if p["variant"] == "IPEX"] == [
        "IPEX: not compared in this run (COMPARE_IPEX names no workload; papermill's -p COMPARE_IPEX cnn asks for it)"]
    with pytest.raises(CpuoptError, match="unknown comparison"):
        profiling.variant_pairs([cnn], {"fp16": ["cnn"]}, built, {})


def made_profile(label, log, step_ms, projection=None, summary=None, steps=2):
    """A capture.Profile of a fixture log, as profile_workload makes one (no run): its logged
    run's timed window ``step_ms`` a step."""
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.profiledn import capture

    window = {"timed_start": 100.0, "timed_end": 100.0 + step_ms * steps / 1e3}
    return capture.Profile(label, RunConfig.for_preset("cnn", "quick").replace(steps=steps),
                           {"status": "ok", "step_ms": {"median": step_ms}},
                           {"status": "ok", "step_ms": {"median": step_ms}, "instances": [window]},
                           f"{log}", parse(log), projection, summary)


def test_a_logged_step_faster_than_the_plain_one_is_said_to_be_noise():
    """Verbose logging only adds work: a logged run 5% or more faster than the plain run says the
    noise of one run each outweighed it, and the efficiency ratio is as uncertain."""
    from cpuopt_helpers.profiledn import capture

    profile = made_profile("cnn", "onednn_312_cnn_two_steps.log", 40.0)
    assert "profile logged faster" not in [f.kind for f in capture.profiling_findings([profile])]
    profile.plain["step_ms"]["median"] = 42.0  # 5% slower than the logged run: within the margin
    assert "profile logged faster" not in [f.kind for f in capture.profiling_findings([profile])]
    profile.plain["step_ms"]["median"] = 50.0
    said = next(f for f in capture.profiling_findings([profile]) if f.kind == "profile logged faster")
    assert said.values == {"step_ms": 50.0, "traced_step_ms": 40.0}
    assert said.sentence.startswith("cnn: the logged run's step (40.0 ms) was faster than the plain run's (50.0 ms)")


def profiles_and_comparisons():
    """Two profiles of fixture logs (a projection, a trace summary), one that failed, and the
    comparison of the first with its bf16 channels-last log."""
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.profiledn import capture

    prims = pd.DataFrame({"kind": ["convolution", "rnn"], "calls": [10, 2], "time_ms": [20.0, 8.0],
                          "mean_ms": [2.0, 4.0]})
    proj = replay.projection(prims, [{"replayed": True, "replay_ms": 1.0, "note": ""},
                                     {"replayed": False, "replay_ms": None, "note": ""}], steps=2, step_ms=40.0)
    summary = {"top_ops": pd.DataFrame({"name": ["aten::addmm", "aten::add_"], "share": [0.7, 0.3]}),
               "outside_onednn_share": 0.9, "ops_per_step": 400.0, "ops_per_ms": 30.0, "median_span_us": 12.0,
               "short_span_share": 0.4, "loss": None}
    cnn = made_profile("cnn", "onednn_312_cnn_two_steps.log", 40.0, proj)
    rnn = made_profile("rnn", "onednn_312_rnn_quick.log", 300.0, None, summary)
    failed = capture.Profile("transformer", RunConfig.for_preset("transformer", "quick"),
                             {"status": "failed", "reason": "killed\nby the OOM killer"}, {}, "t.log", None, None)
    bf16 = made_profile("cnn bf16", "onednn_312_cnn_bf16_channels_last.log", 30.0)
    return [cnn, rnn, failed], [capture.Comparison(cnn, bf16, ("fp32", "bf16"), "bf16 has a fast path here: amx")]


def test_the_answer_is_records_each_profiles_under_its_label():
    from cpuopt_helpers.profiledn import capture

    profiles, comparisons = profiles_and_comparisons()
    found = capture.answer(profiles, comparisons)
    assert {f.stage for f in found} == {"profiling"}
    failed, *coverage, outside = [f for f in found if f.kind in ("profile failed", "profile coverage",
                                                                 "profile outside onednn")]
    assert (failed.workload, failed.kind, failed.values) == ("transformer", "profile failed", {"reason": "killed"})
    assert [(f.workload, f.values["efficiency"]) for f in coverage] == [("cnn", pytest.approx(9.0 / 40.0)),
                                                                        ("rnn", None), ("cnn bf16", None)]
    assert (outside.kind, outside.values["profiles"]) == ("profile outside onednn", ["rnn", "cnn bf16"])
    assert [f.kind for f in found if f.workload == "rnn"] == [
        "profile coverage", "log total", "log directions", "log reorders", "log reference kernels",
        "trace top operators", "trace outside onednn", "trace spans", "trace fragmented"]
    head, note = [f for f in found if f.kind.startswith("profile comparison")]
    assert head.workload == "cnn" and head.values == {"labels": ["fp32", "bf16"], "step_ms": [40.0, 30.0]}
    assert head.sentence == ("cnn, fp32 vs bf16: measured step 40.0 ms vs 30.0 ms (the second's speed over the "
                             "first's: 1.33x, in one run each; the optimisation notebooks measure it with repeats).")
    first = coverage[0]
    assert first.sentence.startswith(f"cnn: oneDNN primitives take {first.values['coverage']:.0%} of the logged "
                                     "run's step (") and "; without the log the step took 40.0 ms" in first.sentence
    named = Finding("retinanet before", "case_study", "profile comparison",
                    {"labels": ["retinanet before", "retinanet after (the climb's top)"], "step_ms": [40.0, 30.0]})
    assert named.sentence.startswith("retinanet before vs retinanet after (the climb's top): measured step")  # once
    logs = Finding("", "profiledn", "logs onednn time",
                   {"labels": ["fp32", "bf16"], "ms": [40.0, 30.0], "per_step": True})
    assert logs.sentence.endswith(": bf16 spends 25% less time in oneDNN.")  # a time ratio in words, no "x"
    assert note.sentence == "bf16 has a fast path here: amx"
    per_profile = next(f for f in found if f.kind == "log total" and f.workload == "rnn")
    assert per_profile.sentence.startswith("rnn: 7 primitive executions took ")  # after its label, as a detail
    assert {f.stage for f in capture.answer(profiles, comparisons, stage="case_study")} == {"case_study"}
    # notebook 08 compares profiles it lists itself: each is covered once
    both = capture.answer(profiles + [comparisons[0].other], comparisons, stage="case_study")
    assert [f.workload for f in both if f.kind == "profile coverage"] == ["cnn", "rnn", "cnn bf16"]


def test_slow_kernels_names_the_heaviest_implementations():
    from cpuopt_helpers.stages import profiling

    slowest, = profiling.slow_kernels(parse("onednn_312_cnn_two_steps.log").exec, top=2, workload="cnn")
    assert (slowest.workload, slowest.stage, slowest.kind) == ("cnn", "profiling", "slowest kernels")
    assert [k[:2] for k in slowest.values["kernels"]] == [["convolution", "jit:avx512_core"], ["reorder", "jit:blk"]]
    assert slowest.sentence.startswith("Slowest kernels: convolution jit:avx512_core 37% (")
    none, = profiling.slow_kernels(parse("onednn_312_cnn_two_steps.log").exec.iloc[:0], stage="precision")
    assert (none.kind, none.stage, none.sentence) == ("no primitive ran", "precision", "No oneDNN primitive ran.")


def profiledn_findings() -> list:
    """A finding of every kind ProfileDNN makes (tests/test_wording.py stores and loads them back)."""
    from cpuopt_helpers.profiledn import account, capture, trace, wholestep
    from cpuopt_helpers.stages import profiling
    from tests.test_wholestep import CEIL, TRACE

    profiles, comparisons = profiles_and_comparisons()
    log = parse("onednn_312_cnn_two_steps.log").exec
    whole = wholestep.whole_step(TRACE, CEIL, steps=2, plain_step_ms=0.7)
    light = dict(whole, steps_known=False, timing="light trace", shaped_step_ms=3.0, above_ceiling_share=0.5)
    wide = dict(profiles[1].trace, loss={"loss_forward_ms": 1.0, "loss_backward_ms": 2.0, "backward_ms": 20.0,
                                         "loss_backward_share": 0.1})
    prims = pd.DataFrame({"kind": ["convolution"], "calls": [10], "time_ms": [20.0], "mean_ms": [2.0]})
    alike = replay.projection(prims, [{"replayed": True, "replay_ms": 3.0, "kernel_replay_ms": 2.2, "note": ""}],
                              steps=1, step_ms=25.0)
    noisy = made_profile("cnn", "onednn_312_cnn_two_steps.log", 40.0)
    noisy.plain["step_ms"]["median"] = 50.0  # the logged run faster than the plain one
    return (capture.answer(profiles, comparisons) + profiledn.findings(log.iloc[:0])
            + [f for f in capture.profiling_findings([noisy]) if f.kind == "profile logged faster"]
            + replay.projection_findings(alike, "cnn") + trace.trace_findings(wide, "rnn")
            + wholestep.wholestep_findings(whole, "fixture") + wholestep.wholestep_findings(light)
            + account.findings(account.phase_table(whole, CEIL), whole, "fixture")
            + profiledn.compare_findings(log, log.assign(time_ms=0.0), ("A", "B"), (2, 2))
            + profiling.slow_kernels(log) + profiling.slow_kernels(log.iloc[:0]))


def test_a_time_of_nan_or_inf_is_a_malformed_line_not_a_time():
    line = ("dnnl_verbose,exec,cpu,convolution,jit:avx512_core,forward_training,src_f32::blocked:aBcd16b:f0 "
            "wei_f32::blocked:ABcd16b16a:f0 bia_f32::blocked:a:f0 dst_f32::blocked:aBcd16b:f0,,"
            "alg:convolution_direct,mb2_ic16oc16_ih7oh7kh5sh1dh0ph2_iw7ow7kw5sw1dw0pw2,")
    # the first line of a kind is parsed whole, a repeat takes the fast path: both refuse the time
    p = profiledn.parse_log([line + t for t in ("nan", "0.5", "inf", "nan", "-inf", "0.25")])
    assert p.counts["exec"] == 2 and p.counts["malformed"] == 4
    assert p.exec.time_ms.sum() == pytest.approx(0.75)


def test_the_record_beside_a_log_is_read_for_what_was_not_given_and_never_guessed_at(tmp_path):
    log = tmp_path / "a.log"
    meta = tmp_path / "a.log.meta.json"
    assert replay.log_meta(str(log), ("steps",)) == {}  # no record: the caller asks for --steps
    meta.write_text(json.dumps({"steps": 3, "threads": 0, "cores": [0, 1], "workload": "cnn"}))
    assert replay.log_meta(str(log), ("steps",)) == {"steps": 3, "cores": [0, 1], "workload": "cnn"}
    with pytest.raises(CpuoptError, match=r"a.log.meta.json is not what .* \(its threads\): give --threads yourself"):
        replay.log_meta(str(log), ("steps", "threads", "cores"))
    for junk in ("[1]", "null", "{not json"):
        meta.write_text(junk)
        assert replay.log_meta(str(log)) == {}  # nothing needed from it: a breakdown goes on
        with pytest.raises(CpuoptError, match=r"\(its steps\): give --steps yourself"):
            replay.log_meta(str(log), ("steps",))
