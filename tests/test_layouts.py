"""Rank layouts of notebook 07 and the tuner: the paper's Table 2 on a 2x28-core Xeon, inside
NUMA nodes, planned on fixtures of other machines."""

from pathlib import Path

from cpuopt_helpers import planning, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.stages import multi_instance

FIX = Path(__file__).parent / "fixtures"


def read(name):
    return system.read_topology_file(str(FIX / name))[0]


TABLE2 = [(7, 1), (7, 2), (7, 4), (7, 8), (14, 1), (14, 2), (14, 4), (28, 1), (28, 2), (56, 1)]


def test_the_paper_table2_rows_on_a_2x28_xeon():
    xeon = read("lscpu_p_xeon_2s_smt.txt")
    assert multi_instance.layouts(xeon) == TABLE2
    assert multi_instance.layouts(56) == TABLE2  # what notebook 07 prints from the physical core count
    assert multi_instance.layouts(FIX / "lscpu_p_xeon_2s_smt.txt") == TABLE2  # a file of the server, on a laptop
    table2 = multi_instance.PAPER_TABLE2.stack()
    assert {t for t, _ in table2.index} == {7, 14, 28, 56}  # the rows the paper measured
    # every layout of ours the paper measured without SMT siblings (threads x ranks <= 56)
    assert {(t, n) for t, n in table2.index if t * n <= 56} == set(TABLE2)


def test_each_rank_stays_inside_one_socket_with_its_memory():
    plan = multi_instance.layout_plan(read("lscpu_p_xeon_2s_smt.txt")).set_index(["threads", "ranks"])
    assert plan.loc[(7, 8), "nodes"] == "0 | 0 | 0 | 0 | 1 | 1 | 1 | 1"
    assert plan.loc[(14, 4), "cores"] == "0-13 | 14-27 | 28-41 | 42-55"
    assert plan.loc[(28, 2), "nodes"] == "0 | 1" and plan.loc[(56, 1), "nodes"] == "0,1"
    assert all("," not in nodes for (t, _), nodes in plan["nodes"].items() if t <= 28)


def test_sub_numa_clustering_layouts_fill_nodes_then_sockets():
    snc = read("lscpu_p_xeon_2s_snc2.txt")  # 2 sockets x 2 nodes x 20 cores
    assert sorted({t for t, _ in multi_instance.layouts(snc)}) == [5, 10, 20, 40, 80]
    plan = multi_instance.layout_plan(snc).set_index(["threads", "ranks"])
    assert plan.loc[(20, 4), "nodes"] == "0 | 1 | 2 | 3" and plan.loc[(40, 2), "nodes"] == "0,1 | 2,3"


def test_small_and_odd_machines_keep_several_ranks():
    assert multi_instance.layouts(2) == [(1, 1), (1, 2), (2, 1)]  # this two-core machine, as before
    assert multi_instance.layouts(3) == [(1, 1), (1, 2), (1, 3), (3, 1)]
    assert multi_instance.layouts(6) == [(3, 1), (3, 2), (6, 1)]
    assert multi_instance.rank_threads(28, 2, 56) == [7, 14, 28, 56]


def test_a_layout_that_does_not_fit_a_node_is_left_out():
    # a cpuset that leaves 3 cores on node 0 and 4 on node 1: 4-thread ranks fit once, not twice
    cpus = system.parse_lscpu_parse("".join(f"{c},{c},{c // 4},{c // 4}\n" for c in range(8)))
    topo = system.restrict(cpus, cpuset=[1, 2, 3, 4, 5, 6, 7])
    pairs = multi_instance.layouts(topo)
    assert (3, 2) in pairs and (7, 1) in pairs and not planning.fits(topo, 2, 4)
    assert all(planning.fits(topo, n, t) for t, n in pairs)


def test_notebook_07_configs_use_the_machines_topology():
    xeon = read("lscpu_p_xeon_2s_smt.txt")
    facts = system.Facts(physical_cores=56, topology=xeon.to_dict())
    configs = multi_instance.configs(RunConfig.for_preset("cnn", "quick"), facts).configs
    ddp = {(c.threads, c.instances) for c in configs if c.mode == "ddp"}
    assert ddp == {(t, n) for t, n in TABLE2 if n > 1}
    assert all(c.cores is None for c in configs)  # the launcher places them, inside nodes


def test_ranks_stay_inside_one_l3_cache_where_the_whole_layout_fits_so():
    epyc = read("lscpu_p_epyc_32c_4ccx.txt")  # one socket, one node, 4 core complexes (L3) of 8 cores, SMT 2
    assert [len(cpus) for cpus in epyc.caches().values()] == [16, 16, 16, 16]
    assert 8 in {t for t, _ in multi_instance.layouts(epyc)}  # a rank a core complex
    assert multi_instance.rank_threads(32, 1, 32) == [1, 2, 4, 8, 16, 32]  # the node's halvings hold 8 already
    assert multi_instance.rank_threads(96, 1, 96, cache_cores=8) == [3, 6, 8, 12, 24, 48, 96]  # a 96-core node's do not

    def cores(instances, threads):
        return " | ".join(system.format_cpu_list(g) for g in planning.assign_cores(epyc, instances, threads))

    assert cores(4, 6) == "0-5 | 8-13 | 16-21 | 24-29"  # by node alone: 0-5 | 6-11 | 12-17 | 18-23
    assert cores(2, 4) == "0-3 | 8-11" and cores(4, 8) == "0-7 | 8-15 | 16-23 | 24-31"  # the emptiest cache first
    assert cores(8, 4) == "0-3 | 8-11 | 16-19 | 24-27 | 4-7 | 12-15 | 20-23 | 28-31"  # two to a cache
    assert cores(6, 5) == "0-4 | 5-9 | 10-14 | 15-19 | 20-24 | 25-29"  # 5 a cache leave 3: by node, as before
    assert cores(2, 12) == "0-11 | 12-23"
    assert cores(5, 8) == "0-7 | 8-15 | 16-23 | 24-31 | 32-39"  # every core before a sibling
    assert cores(4, 16) == "0-7,32-39 | 8-15,40-47 | 16-23,48-55 | 24-31,56-63"  # a cache with its siblings
    assert cores(3, 12) == "0-11 | 12-23 | 24-35"  # in the caches: 8 cores idle for siblings; by node instead
    assert cores(5, 7) == "0-6 | 7-13 | 14-20 | 21-27 | 28-34"  # 28-31 and the siblings 32-34
    assert planning.default_threads(epyc, 4) == 8
    snc = read("lscpu_p_xeon_2s_snc2.txt")  # one L3 a socket, across its two nodes: the nodes rule, as before
    assert len(snc.caches()) == 4 and " | ".join(
        system.format_cpu_list(g) for g in planning.assign_cores(snc, 4, 20)) == "0-19 | 20-39 | 40-59 | 60-79"
