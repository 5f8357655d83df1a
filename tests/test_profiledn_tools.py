"""ProfileDNN and oneDNN's own tools: benchdnn reproducer lines and verbose_converter's breakdown CSV.

The expected benchdnn lines are written by hand from benchdnn's driver documentation
(oneDNN tests/benchdnn/doc/driver_{conv,matmul,reorder,eltwise,rnn,softmax,bnorm}.md and
knob_strides.md) in the form scripts/verbose_converter/src/benchdnn_generator.py writes
(`--DRIVER --reset --allow-enum-tags-only=0 --engine=cpu ...`), for logs captured on this
machine: `cpuopt bench --workload W --preset quick --steps 1 --warmup 1 --onednn-verbose`
with torch 2.13 / oneDNN 3.12 on a Xeon with AMX (fixtures onednn_312_rnn_quick.log, fp32;
onednn_312_transformer_bf16.log, --dtype bf16; onednn_312_cnn_bf16_channels_last.log,
--dtype bf16 --channels-last; onednn_312_cnn_two_steps.log, fp32 NCHW, captured earlier).
"""

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from cpuopt_helpers import cli, profiledn
from cpuopt_helpers.profiledn import benchdnn

LOGS = Path(__file__).parent / "fixtures" / "onednn"
HEAD = "--reset --allow-enum-tags-only=0 --engine=cpu"


def lines_of(name):
    return profiledn.benchdnn_lines(profiledn.parse_log(LOGS / name).exec)


def distinct_exec_fields(name):
    """Distinct executed primitives counted straight from the text: every field but the time."""
    return {tuple(line.split(",")[4:-1]) for line in (LOGS / name).read_text().splitlines()
            if ",primitive,exec," in line}


def test_rnn_log_gives_rnn_and_strided_reorder_lines():
    lines, skipped = lines_of("onednn_312_rnn_quick.log")
    assert skipped == {} and len(lines) == len(distinct_exec_fields("onednn_312_rnn_quick.log")) == 7
    shape = "l1t32mb16sic128slc64dhc128dic128"
    # driver_rnn.md: --prop FWD_D / BWD_DW, --alg, --direction, --cfg, --tag=src:wei:dst, --trivial-strides
    assert (f"--rnn {HEAD} --prop=FWD_D --alg=VANILLA_LSTM --direction=left2right --cfg=f32 --tag=abc:any:abc "
            f"--trivial-strides=true --attr-scratchpad=user {shape}") in lines
    assert (f"--rnn {HEAD} --prop=BWD_DW --alg=VANILLA_LSTM --direction=left2right --cfg=f32 --tag=abc:any:abc "
            f"--trivial-strides=true --attr-scratchpad=user {shape}") in lines
    # knob_strides.md: a plain layout with strides is given as --strides=SRC:DST, not as a tag
    assert (f"--reorder {HEAD} --sdt=f32 --ddt=f32 --dtag=abdec --strides=33792x33792x528x128x1: "
            "--attr-scratchpad=user 1x1x64x4x128") in lines
    assert (f"--reorder {HEAD} --sdt=f32 --ddt=f32 --stag=abcd --dtag=abcd --attr-scratchpad=user 1x1x4x128") in lines


def test_bf16_transformer_log_gives_matmul_and_eltwise_lines():
    lines, skipped = lines_of("onednn_312_transformer_bf16.log")
    assert skipped == {} and len(lines) == len(distinct_exec_fields("onednn_312_transformer_bf16.log")) == 17
    assert sum(line.startswith("--matmul ") for line in lines) == 15
    # driver_matmul.md: --dt=src:wei:dst, --stag/--wtag/--dtag; knobs_attr.md: --attr-post-ops=sum
    assert (f"--matmul {HEAD} --dt=bf16:bf16:bf16 --stag=ab --wtag=ba --dtag=ab --attr-post-ops=sum "
            "--attr-scratchpad=user 256x64:64x1000") in lines
    assert (f"--matmul {HEAD} --dt=bf16:bf16:bf16 --stag=ba --wtag=ab --dtag=ab --attr-scratchpad=user "
            "1000x256:256x64") in lines
    # driver_eltwise.md: --dir, --alg, --alpha, --beta, --dt, --tag
    for direction in ("FWD_D", "BWD_D"):
        assert (f"--eltwise {HEAD} --dir={direction} --alg=eltwise_gelu_erf --alpha=0 --beta=0 --dt=bf16 --tag=abc "
                "--attr-scratchpad=user 8x32x256") in lines


def test_bf16_channels_last_cnn_log_gives_conv_lines_for_every_direction():
    lines, _ = lines_of("onednn_312_cnn_bf16_channels_last.log")
    assert len(lines) == len(distinct_exec_fields("onednn_312_cnn_bf16_channels_last.log"))
    shape = "mb16_ic16oc32_ih8oh4kh3sh2dh0ph1_iw8ow4kw3sw2dw0pw1"
    # driver_conv.md: --dir, --alg, --dt=src:wei:dst, --bia-dt (undef: no bias), --stag/--wtag/--dtag;
    # weights created with format `any` (property `a`) are reproduced as --wtag=any
    for direction in ("FWD_D", "BWD_D", "BWD_W"):
        assert (f"--conv {HEAD} --dir={direction} --alg=direct --dt=bf16:bf16:bf16 --bia-dt=undef --stag=acdb "
                f"--wtag=any --dtag=acdb --attr-scratchpad=user {shape}") in lines
    assert (f"--reorder {HEAD} --sdt=bf16 --ddt=bf16 --stag=ABcd16b16a2b --dtag=abcd --attr-scratchpad=user "
            "16x16x3x3") in lines


def test_fp32_nchw_cnn_log_and_older_formats():
    lines, _ = lines_of("onednn_312_cnn_two_steps.log")
    assert (f"--conv {HEAD} --dir=FWD_D --alg=direct --dt=f32:f32:f32 --bia-dt=undef --stag=any --wtag=any "
            "--dtag=any --attr-scratchpad=user mb4_ic3oc16_ih32oh16kh7sh2dh0ph3_iw32ow16kw7sw2dw0pw3") == lines[1]
    assert lines[0] == f"--reorder {HEAD} --sdt=f32 --ddt=f32 --stag=abcd --dtag=Acdb16a --attr-scratchpad=user 16x3x7x7"
    # a 3.2 log (v0 marker, src_f32:... descriptors) with a bias: --bia-dt=f32
    lines, skipped = lines_of("onednn_32_v0_timestamps.log")
    assert (f"--conv {HEAD} --dir=FWD_D --alg=direct --dt=f32:f32:f32 --bia-dt=f32 --stag=any --wtag=any "
            "--dtag=any mb8_ic32oc64_ih14oh14kh3sh1dh0ph1_iw14ow14kw3sw1dw0pw1") in lines
    assert skipped == {"graph:convolution_post_ops": 1}  # graph partitions have no primitive driver
    # DNNL 1.3 (the verbose docs' example): driver_bnorm.md --dir=BWD_DW --flags=S
    lines, _ = lines_of("dnnl_1x.log")
    assert lines[2] == f"--bnorm {HEAD} --dir=BWD_DW --flags=S --dt=f32 --tag=aBcd16b mb2ic16ih7iw7"
    # driver_softmax.md: --alg, --axis, --sdt/--ddt, --stag/--dtag
    lines, _ = lines_of("onednn_33_graph.log")
    assert f"--softmax {HEAD} --dir=FWD_D --alg=softmax_accurate --axis=1 --sdt=f32 --ddt=f32 --stag=ab --dtag=ab 4x10" \
        in lines


def test_other_drivers_from_verbose_fields():
    line = benchdnn.benchdnn_line  # api, engine, kind, prop, mds, attrs, aux, problem
    mds = "src:f32::blocked:abcd::f0 src:f32::blocked:abcd::f0 dst:f32::blocked:abcd::f0"
    assert line("primitive", "cpu", "binary", "undef", mds, "attr-scratchpad:user", "alg:binary_add",
                "2x16x4x4:2x16x4x4") == (f"--binary {HEAD} --alg=add --sdt=f32:f32 --ddt=f32 --stag=abcd:abcd "
                                         "--dtag=abcd --attr-scratchpad=user 2x16x4x4:2x16x4x4")
    assert line("primitive", "cpu", "sum", "undef", mds, "", "", "2x16x4x4:2x16x4x4") == \
        f"--sum {HEAD} --sdt=f32:f32 --ddt=f32 --stag=abcd:abcd --dtag=abcd 2x16x4x4:2x16x4x4"
    pool = "src:f32::blocked:acdb::f0 dst:f32::blocked:acdb::f0 ws:undef::undef:::"
    assert line("primitive", "cpu", "pooling", "forward_training", pool, "", "alg:pooling_max",
                "mb2ic16_ih8oh4kh2sh2ph0_iw8ow4kw2sw2pw0") == (
        f"--pool {HEAD} --dir=FWD_D --alg=pooling_max --dt=f32:f32 --tag=acdb mb2ic16_ih8oh4kh2sh2ph0_iw8ow4kw2sw2pw0")
    assert line("primitive", "cpu", "zero_pad", "undef", mds, "", "", "2") is None
    assert line("graph", "cpu", "graph:sdp", "", "", "", "", "MatMul;SoftMax") is None


def test_converter_breakdown_csv_reads_back_like_verbose_converters():
    df = profiledn.parse_log(LOGS / "onednn_312_cnn_two_steps.log").exec
    text = profiledn.converter_breakdown(df)
    assert text.splitlines()[0] == ("engine,prim_kind,impl,prop_kind,mds,exts,aux,shapes,ncalls,time(ms),overall%,"
                                    "agg_ncalls(avg),agg_time(ms),agg_overall%")
    table = pd.read_csv(io.StringIO(text), keep_default_na=False)
    assert table["ncalls"].sum() == len(df) == 132
    assert table["time(ms)"].sum() == pytest.approx(df.time_ms.sum(), abs=0.01 * len(table))
    assert table["time(ms)"].is_monotonic_decreasing and table["agg_overall%"].iloc[-1] == 100.0
    first = df[df["problem"] == table["shapes"].iloc[0]]
    assert table["overall%"].iloc[0] == pytest.approx(100 * table["time(ms)"].iloc[0] / df.time_ms.sum(), abs=0.01)
    assert table["mds"].iloc[0] in set(first["mds"])  # 3.x descriptors are written as the log spells them
    assert table["agg_ncalls(avg)"].iloc[1] == pytest.approx(table["ncalls"].iloc[:2].mean(), abs=0.005)
    # older spellings are written in the 3.x form, as verbose_converter's IR prints them
    old = profiledn.converter_breakdown(profiledn.parse_log(LOGS / "dnnl_1x.log").exec)
    assert "src:f32::blocked:aBcd16b::f0 wei:f32::blocked:ABcd16b16a::f0 bia:f32::blocked:a::f0" in old


def test_cli_benchdnn_csv_and_json_fields(tmp_path, capsys):
    log = LOGS / "onednn_312_transformer_bf16.log"
    assert cli.main(["profile", str(log), "--benchdnn"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == lines_of("onednn_312_transformer_bf16.log")[0]  # the lines alone, ready for a file
    code = cli.main(["profile", str(log), "--benchdnn", str(tmp_path / "b.txt"), "--csv", str(tmp_path / "b.csv")])
    out = capsys.readouterr().out
    assert code == 0 and "17 benchdnn reproducer lines written" in out
    assert (tmp_path / "b.txt").read_text().splitlines() == lines_of("onednn_312_transformer_bf16.log")[0]
    assert pd.read_csv(tmp_path / "b.csv")["ncalls"].sum() == log.read_text().count(",primitive,exec,") == 31
    assert cli.main(["profile", str(LOGS / "onednn_graph_32.log"), "--json", "--benchdnn"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exec_lines"] == 4 and out["total_ms"] == pytest.approx(0.25 + 1.5 + 0.2 + 0.375)
    assert out["benchdnn"] == [f"--reorder {HEAD} --sdt=f32 --ddt=f32 --stag=abcd --dtag=acdb 32x64x28x28"]
    assert out["benchdnn_skipped"] == {"graph:matmul_post_ops": 1, "graph:convolution_post_ops": 1}


def test_the_parse_speed_benchmark_times_the_command_and_a_converter(tmp_path):
    """`make parse-speed` on a small log: the command end to end, parse_log alone, and a converter's breakdown."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "parse_speed.py"
    fake = tmp_path / "converter"
    fake.mkdir()
    (fake / "verbose_converter.py").write_text("import sys\nassert '-g' in sys.argv and 'breakdown' in sys.argv\n")
    done = subprocess.run([sys.executable, str(bench), "--lines", "2000", "--rounds", "1",
                           "--verbose-converter", str(fake)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["exec_rows"] == 2000
    assert set(out["median_s"]) == {"cpuopt profile --json", "parse_log alone", "verbose_converter breakdown",
                                    "verbose_converter breakdown -e exec"}
    assert len(out["ratio_over_cpuopt"]["verbose_converter breakdown"]) == 1
    missing = subprocess.run([sys.executable, str(bench), "--verbose-converter", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no verbose_converter.py" in missing.stderr
