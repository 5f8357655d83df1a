"""RunConfig validation, serialisation and hashing."""

import pytest

from cpuopt_helpers.config import RunConfig, validate
from cpuopt_helpers.errors import CpuoptError


def check(config, logical=8, physical=4):
    return validate(config, logical, physical)


def test_threads_default_to_physical_cores_per_instance():
    assert check(RunConfig()).threads == 4
    assert check(RunConfig(instances=2)).threads == 2
    assert check(RunConfig(instances=8)).threads == 1


@pytest.mark.parametrize("config,message", [
    (RunConfig(batch_size=0), "batch size must be a positive"),
    (RunConfig(batch_size=-3), "batch size must be a positive"),
    (RunConfig(steps=0), "steps must be a positive"),
    (RunConfig(warmup=-1), "warm-up"),
    (RunConfig(threads=64), "more than the 8 logical cores"),
    (RunConfig(threads=0), "threads must be at least 1"),
    (RunConfig(instances=0), "instances must be at least 1"),
    (RunConfig(instances=9), "this machine has 8"),
    (RunConfig(instances=3, threads=3), "3 instances x 3 threads = 9"),
    (RunConfig(allocator="hoard"), "unknown allocator 'hoard'"),
    (RunConfig(omp_runtime="llvm"), "unknown omp runtime"),
    (RunConfig(dtype="fp8"), "unknown dtype"),
    (RunConfig(mode="mpi"), "unknown mode 'mpi'"),
    (RunConfig(optimizer="lion"), "unknown optimizer 'lion'"),
    (RunConfig(optimizer_impl="triton"), "unknown optimizer implementation"),
    (RunConfig(batch_policy="fixed"), "unknown batch policy"),
    (RunConfig(compile="reduce-overhead"), "unknown compile mode"),
    (RunConfig(compile="default", warmup=0), "at least one warm-up step"),
    (RunConfig(ipex=True, runtime="ipex", compile="default"), "one at a time"),
    (RunConfig(mode="ddp", launcher="run_cpu"), "drop --launcher run_cpu"),
    (RunConfig(launcher="run_cpu", allocator="jemalloc", instances=2),
     "--launcher run_cpu decides instances, allocator itself .its defaults.: drop --instances --allocator"),
    (RunConfig(instances=2, batch_size=9, batch_policy="global"), "split evenly"),
    (RunConfig(preset="huge"), "unknown preset"),
    (RunConfig(workload="nosuch"), "unknown workload 'nosuch'"),
    (RunConfig(workload="no_such_module_xyz:build"), "cannot import 'no_such_module_xyz'"),
    (RunConfig(workload="json:no_such_function"), "has no function 'no_such_function'"),
    (RunConfig(instances=2, threads=1, cores=((0,), (0,))), "overlap"),
    (RunConfig(instances=2, threads=1, cores=((0,),)), "one set per instance"),
    (RunConfig(kmp_blocktime=-1), "KMP_BLOCKTIME"),
])
def test_bad_values_raise_one_clear_error(config, message):
    with pytest.raises(CpuoptError, match=message) as info:
        check(config)
    assert "\n" not in str(info.value)


def test_user_workload_that_fails_on_import(tmp_path, monkeypatch):
    (tmp_path / "broken_model.py").write_text("raise ImportError('needs a package you lack')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CpuoptError, match="importing 'broken_model' failed: ImportError"):
        check(RunConfig(workload="broken_model:build"))
    (tmp_path / "script_model.py").write_text("import sys\nsys.exit(3)\n")  # a training script, not a module
    with pytest.raises(CpuoptError, match="importing 'script_model' failed: SystemExit: 3; .* if __name__"):
        check(RunConfig(workload="script_model:build"))


def test_user_workload_spec_accepted():
    assert check(RunConfig(workload="tests.user_workloads:build")).workload == "tests.user_workloads:build"


def test_json_round_trip_and_stable_hash():
    config = RunConfig(workload="rnn", threads=2, instances=2, cores=((0, 1), (2, 3)), env=(("A", "1"),))
    again = RunConfig.from_json(config.to_json())
    assert again == config
    assert again.config_hash() == config.config_hash()
    assert config.replace(timeout_s=5).config_hash() == config.config_hash()  # the timeout measures nothing
    assert config.replace(allocator="jemalloc").config_hash() != config.config_hash()


def test_replace_never_mutates_and_accepts_dicts():
    base = RunConfig()
    changed = base.replace(env={"B": "2", "A": "1"}, cores=[[0, 1]])
    assert base.env == () and base.cores is None
    assert changed.env == (("A", "1"), ("B", "2")) and changed.cores == ((0, 1),)
    with pytest.raises(Exception):
        base.threads = 3  # frozen


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(CpuoptError, match="unknown RunConfig field"):
        RunConfig.from_dict({"workload": "cnn", "thread": 2})


def test_for_preset_and_label():
    c = RunConfig.for_preset("transformer", "standard", allocator="tcmalloc")
    assert (c.steps, c.warmup, c.allocator) == (6, 1, "tcmalloc")
    assert c.label().startswith("transformer[standard]") and "allocator=tcmalloc" in c.label()
    with pytest.raises(CpuoptError, match="unknown preset"):
        RunConfig.for_preset("cnn", "medium")


def test_a_label_leaves_out_where_a_cache_goes_but_names_every_setting_in_env():
    cached = RunConfig(workload="retinanet", compile="default", env=(("TORCHINDUCTOR_CACHE_DIR", "/tmp/x/inductor"),))
    assert "inductor" not in cached.label() and "env" not in cached.label() and "compile=default" in cached.label()
    both = cached.replace(env={"TORCHINDUCTOR_CACHE_DIR": "/tmp/x/inductor", "MALLOC_CONF": "narenas:1"})
    assert "MALLOC_CONF" in both.label() and "inductor" not in both.label()


def test_a_config_stored_with_the_old_retinanet_variable_loads_with_options():
    old = RunConfig(workload="retinanet").to_dict()
    old.pop("options")  # stored before the field existed
    old["env"] = {"CPUOPT_RETINANET": "focal=fast,frozen_bn=fused", "MALLOC_CONF": "x"}
    c = RunConfig.from_dict(old)
    assert dict(c.options) == {"focal": "fast", "frozen_bn": "fused"} and dict(c.env) == {"MALLOC_CONF": "x"}
    old["env"] = {"CPUOPT_RETINANET": ""}  # the old baseline: no variant at all
    assert RunConfig.from_dict(old) == RunConfig(workload="retinanet")


def test_options_and_env_given_as_dicts_are_kept_as_pairs():
    """own-model.md: `RunConfig(options={"width": "2048"})` sets a workload option, as --option does."""
    given = RunConfig(options={"width": 2048}, env={"B": "2", "A": "1"}, cores=[[0, 1]])
    assert given.options == (("width", "2048"),) and given.env == (("A", "1"), ("B", "2"))
    assert given.cores == ((0, 1),)
    assert given == RunConfig().replace(options={"width": "2048"}, env={"A": "1", "B": "2"}, cores=((0, 1),))
    assert given.config_hash() == RunConfig.from_dict(given.to_dict()).config_hash()
    assert "width=2048" in given.label()
