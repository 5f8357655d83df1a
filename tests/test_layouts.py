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
