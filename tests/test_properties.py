"""Property-based tests (hypothesis): the parsers, the command line and the configuration hold
for any input, not just the fixtures. Bounded (few examples, no deadline) so that `make
test-fast` stays quick; no worker process starts (the CLI runs with --dry-run)."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpuopt_helpers import cli, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn import parse_log

FIXTURES = Path(__file__).parent / "fixtures"
BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# real lines of every era the parser knows (mkldnn 0.x, dnnl 1.x, oneDNN 2.x-3.12, graph), to mix with noise
ERA_LINES = sorted({line for log in sorted((FIXTURES / "onednn").glob("*.log"))
                    for line in log.read_text(errors="replace").splitlines()[:40] if line.strip()})
noise = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e"
                                       "\x85\u2028\u2029"), max_size=80)
commaish = st.lists(st.sampled_from(["onednn_verbose", "dnnl_verbose", "mkldnn_verbose", "exec", "cpu", "create",
                                     "v1", "primitive", "convolution", "1.5", "-3", "", "src_f32::blocked:a:f0",
                                     "mb2_ic3oc4_ih8oh8kh3"]), max_size=12).map(",".join)


@BOUNDED
@given(st.lists(st.one_of(st.sampled_from(ERA_LINES), noise, commaish), max_size=40))
def test_the_log_parser_takes_any_mix_of_eras_and_noise_and_its_totals_add_up(lines):
    log = parse_log(io.StringIO("".join(f"{line}\n" for line in lines)))  # a stream of lines, as a file reads
    c = log.counts
    assert c["lines"] == len(lines)
    assert c["exec"] + c["create"] + c["info"] + c["other"] + c["malformed"] == c["lines"]
    assert len(log.exec) == c["exec"] and (log.exec.empty or (log.exec.time_ms >= 0).all())
    if not log.exec.empty:
        by_kind = log.exec.groupby("kind")["time_ms"].sum()
        assert abs(by_kind.sum() - log.exec["time_ms"].sum()) <= 1e-9 * max(1.0, log.exec["time_ms"].sum())


@BOUNDED
@given(st.sets(st.integers(min_value=0, max_value=1023), max_size=64))
def test_a_cpu_list_survives_the_kernels_syntax(cpus):
    assert system.parse_cpu_list(system.format_cpu_list(cpus)) == sorted(cpus)


@BOUNDED
@given(noise)
def test_topology_and_cgroup_parsers_read_or_refuse_any_text_in_one_line(text):
    for parse in (system.parse_cpu_list, system.parse_lscpu_parse):
        try:
            parse(text)
        except CpuoptError as exc:
            assert "\n" not in str(exc)
    assert system.parse_cpu_max(text) is None or system.parse_cpu_max(text) >= 0
    assert system.parse_cfs_quota(text, text) is None or system.parse_cfs_quota(text, text) > 0
    assert isinstance(system.parse_proc_cgroup(text), dict)


@BOUNDED
@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 127), st.integers(0, 3), st.integers(0, 7)),
                min_size=1, max_size=32, unique_by=lambda row: row[0]))
def test_lscpu_rows_are_read_back_as_written(rows):
    text = "# CPU,Core,Socket,Node\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n"
    cpus = system.parse_lscpu_parse(text)
    assert [(c.cpu, c.core, c.socket, c.node) for c in cpus] == sorted(rows)


configs = st.builds(
    RunConfig, workload=st.sampled_from(["cnn", "rnn", "transformer", "retinanet"]),
    preset=st.sampled_from(["quick", "standard", "full"]), steps=st.integers(1, 100), warmup=st.integers(0, 10),
    threads=st.none() | st.integers(1, 256), instances=st.integers(1, 8), mode=st.sampled_from(["independent", "ddp"]),
    allocator=st.sampled_from(["default", "jemalloc", "tcmalloc"]), omp_runtime=st.sampled_from(["gnu", "intel"]),
    dtype=st.sampled_from(["fp32", "bf16"]), channels_last=st.booleans(), seed=st.integers(0, 2**31),
    affinity=st.sampled_from(["compact", "scatter", "none"]), compile=st.sampled_from([None, "default", "max-autotune"]),
    env=st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), noise, max_size=3).map(
        lambda d: tuple(sorted(d.items()))),  # as the CLI builds them: one value a key
    options=st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True), noise, max_size=3).map(
        lambda d: tuple(sorted(d.items()))))


@BOUNDED
@given(configs)
def test_any_config_round_trips_through_json_and_keeps_its_hash(config):
    again = RunConfig.from_json(config.to_json())
    assert again == config and again.config_hash() == config.config_hash()
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))).config_hash() == config.config_hash()


FLAGS = ["--workload", "--preset", "--threads", "--instances", "--allocator", "--omp-runtime", "--kmp-blocktime",
         "--dtype", "--channels-last", "--affinity", "--compile", "--steps", "--warmup", "--batch-size", "--option",
         "--env", "--mode", "--oversubscribe", "--loader-workers", "--optimizer", "--optimizer-impl", "--runtime"]
VALUES = ["cnn", "nosuch", "quick", "huge", "0", "1", "2", "-1", "4096", "jemalloc", "hoard", "intel", "bf16", "fp8",
          "default", "zentorch", "x=1", "=", "lamb", "fused", "ddp", "scatter", ""]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["bench", "launch", "tune"]), st.lists(st.sampled_from(FLAGS) | st.sampled_from(VALUES),
                                                              max_size=8))
def test_any_options_give_a_plan_or_one_line_and_exit_2_never_a_traceback(command, words):
    tail = ["--", "python3", "-c", "pass"] if command == "launch" else []
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([command, "--dry-run", *words, *tail])
    assert "Traceback" not in err.getvalue()
    if code != 0:
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("cpuopt: error:"), (words, err.getvalue())
