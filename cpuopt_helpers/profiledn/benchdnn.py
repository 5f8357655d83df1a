"""oneDNN's own tools from a parsed log: benchdnn reproducer lines and verbose_converter's breakdown CSV.

``benchdnn_lines`` writes one benchdnn line per distinct executed primitive, as oneDNN's
``scripts/verbose_converter`` (``src/benchdnn_generator.py``) does; each line runs as
``benchdnn --mode=P <line>``:

    --DRIVER --reset --allow-enum-tags-only=0 --engine=cpu [--dir=|--prop=] [aux] [--bia_mask=]
             [data types] [tags] [flags] [--attr-*] PROBLEM

| kind (driver)              | aux field             | data types              | layouts                        |
|----------------------------|-----------------------|-------------------------|--------------------------------|
| convolution (conv), deconv | ``--alg=direct``      | ``--dt=S:W:D --bia-dt=`` | ``--stag= --wtag= --dtag=``   |
| inner_product (ip)         |                       | as conv                 | as conv                        |
| matmul                     | ``--bia_mask=``       | as conv                 | tags, ``--strides=`` if strided |
| reorder                    |                       | ``--sdt= --ddt=``       | as matmul                      |
| eltwise                    | ``--alg= --alpha= --beta=`` | ``--dt=``         | ``--tag=``                     |
| binary                     | ``--alg=add``         | ``--sdt=S0:S1 --ddt=``  | ``--stag=S0:S1 --dtag=``       |
| sum, concat                | concat ``--axis=``    | ``--sdt= --ddt=``       | ``--stag=S0:S1 --dtag=``       |
| pooling (pool)             | ``--alg=``            | ``--dt=S:D``            | ``--tag=``                     |
| batch_normalization (bnorm)| ``--flags=``          | ``--dt=``               | ``--tag=``                     |
| layer/group_normalization  | ``--flags=``          | ``--dt=S:D [--ss_dt=]`` | ``--tag=S:D [--stat_tag=]``    |
| softmax, reduction         | ``--alg= [--axis=]``  | ``--sdt= --ddt=``       | ``--stag= --dtag=``            |
| rnn                        | ``--alg= --direction=`` | ``--cfg=``            | ``--tag=S:W:D --trivial-strides=`` |
| resampling, prelu, shuffle, lrn | as the generator |                       |                                |

``--dir`` (rnn: ``--prop``) is the log's propagation kind (forward_training FWD_D,
forward_inference FWD_I, backward_data BWD_D, backward_weights BWD_W, backward BWD_DW);
``--attr-*`` are the log's attributes (post-ops, scales, zero points, scratchpad, fpmath).

One difference from the generator, as in benchdnn's own minimal reproducer lines: options
whose value is empty (``--attr-scales=``, ``--attr-zero-points=``, ``--strides=::``,
``--runtime_dims_masks=``) are benchdnn's defaults and are left out. Graph-API partitions
have no primitive driver and are skipped, as verbose_converter skips them.

``converter_breakdown`` writes the CSV of verbose_converter's breakdown generator
(``-g breakdown``, default keys): one row per distinct primitive, heaviest first.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from cpuopt_helpers.profiledn.parse import DTYPES, parse_md

DRIVERS = {
    "convolution": "conv", "deconvolution": "deconv", "inner_product": "ip", "matmul": "matmul",
    "reorder": "reorder", "eltwise": "eltwise", "binary": "binary", "sum": "sum", "concat": "concat",
    "pooling": "pool", "batch_normalization": "bnorm", "layer_normalization": "lnorm",
    "group_normalization": "gnorm", "softmax": "softmax", "reduction": "reduction", "resampling": "resampling",
    "prelu": "prelu", "shuffle": "shuffle", "lrn": "lrn", "rnn": "rnn",
}
DIRS = {"forward_training": "FWD_D", "forward_inference": "FWD_I", "backward_data": "BWD_D",
        "backward_weights": "BWD_W", "backward": "BWD_DW"}
ATTRS = ("post-ops", "scales", "zero-points", "precomputed-reductions", "scratchpad", "fpmath", "acc-mode",
         "rounding-mode", "deterministic")  # the generator's order
BREAKDOWN_KEYS = ["engine", "prim_kind", "impl", "prop_kind", "mds", "exts", "aux", "shapes"]
BREAKDOWN_STATS = ["ncalls", "time(ms)", "overall%", "agg_ncalls(avg)", "agg_time(ms)", "agg_overall%"]
RNN_ALGS = {"vanilla_rnn": "VANILLA_RNN", "vanilla_lstm": "VANILLA_LSTM", "vanilla_gru": "VANILLA_GRU",
            "vanilla_augru": "VANILLA_AUGRU", "lbr_gru": "LBR_GRU", "lbr_augru": "LBR_AUGRU"}
RNN_DIRECTIONS = {"unidirectional_left2right": "left2right", "unidirectional_right2left": "right2left",
                  "bidirectional_sum": "sum", "bidirectional_concat": "concat"}
RNN_ACTIVATIONS = {"eltwise_relu": "RELU", "eltwise_logistic": "LOGISTIC", "eltwise_tanh": "TANH"}


class MemoryDesc(NamedTuple):
    """One tensor of a verbose line: ``arg:dt:properties:format_kind:tag:strides:flags`` (3.x)."""

    arg: str
    dt: str
    props: str
    kind: str
    tag: str
    strides: str
    flags: str

    def __str__(self) -> str:  # the 3.x spelling, whatever version wrote the log
        return ":".join(self)

    @property
    def tag_or_any(self) -> str:
        """A tensor created with format ``any`` (property ``a``) is reproduced as ``any``."""
        return "any" if "a" in self.props else self.tag


def memory_descs(text: str) -> list[MemoryDesc]:
    """The memory descriptors of a verbose line, in every version's spelling."""
    out = []
    for token in text.split():
        parts = token.split(":")
        head = parts[0]
        if len(parts) > 1 and parts[1] in DTYPES:  # 3.3 on: src:f32:a:blocked:abcd::f0
            parts += [""] * (7 - len(parts))
            out.append(MemoryDesc(head, parts[1], parts[2], parts[3], parts[4], parts[5], ":".join(parts[6:])))
        elif "_" in head and head.rsplit("_", 1)[1] in DTYPES:
            arg, dt = head.rsplit("_", 1)
            if len(parts) >= 6:  # 3.1 - 3.2: src_f32:a:blocked:abcd::f0
                out.append(MemoryDesc(arg, dt, parts[1], parts[2], parts[3], parts[4], ":".join(parts[5:])))
            else:  # 1.x - 3.0: src_f32::blocked:abcd:f0
                parts += [""] * (5 - len(parts))
                out.append(MemoryDesc(arg, dt, parts[1], parts[2], parts[3], "", ":".join(parts[4:])))
        else:  # MKL-DNN 0.x: fsrc:nChw8c, or a reorder's in:f32_nchw
            arg, dt, tag = parse_md(token)
            arg = {"in": "src", "out": "dst"}.get(arg, arg)
            out.append(MemoryDesc(arg, dt or "f32", "", "blocked", tag, "", "f0"))
    return out


def _fields(text: str) -> dict[str, str]:
    """``alg:eltwise_relu alpha:0`` (aux) or ``attr-scratchpad:user`` (attributes) -> a dict."""
    return dict(token.partition(":")[::2] for token in text.split())


def _opt(name: str, value: str | None) -> str:
    return f"--{name}={value}" if value else ""  # an empty value is benchdnn's default: left out


def _short_alg(aux: dict, kind: str) -> str | None:
    """``convolution_direct`` -> ``direct``: the algorithm without its primitive's prefix."""
    alg = aux.get("alg")
    return alg.split(kind, 1)[1][1:] if alg and kind in alg else alg


def _triplet_dts(md: dict, bias: bool = False) -> list[str]:
    dts = ":".join(md[a].dt for a in ("src", "wei", "dst") if a in md)
    return [_opt("dt", dts)] + ([f"--bia-dt={md['bia'].dt}"] if bias and "bia" in md else [])


def _triplet_tags(md: dict) -> list[str]:
    tags = []
    for arg in ("src", "wei", "dst"):
        if arg in md:  # weights with compensation flags are reproduced with `any`
            tag = "any" if arg == "wei" and md[arg].flags != "f0" else md[arg].tag_or_any
            tags.append(f"--{arg[0]}tag={tag}")
    return tags


def _strided_tags(md: dict) -> list[str]:
    """Plain layouts with strides give ``--strides=``; the others a tag."""
    tags, strides = [], []
    for arg in ("src", "wei", "dst"):
        if arg not in md:
            continue
        tag = "any" if arg == "wei" and md[arg].flags != "f0" else md[arg].tag_or_any
        if tag != "any" and tag.islower() and md[arg].strides:
            strides.append(md[arg].strides)
        else:
            tags.append(f"--{arg[0]}tag={tag}")
            strides.append("")
    return tags + ([f"--strides={':'.join(strides)}"] if any(strides) else [])


def _common_dts(mds: list[MemoryDesc]) -> list[str]:
    """One type per argument letter: ``--sdt=f32 --ddt=bf16``."""
    dts: dict[str, str] = {}
    for m in mds:
        dts.setdefault(m.arg[0], m.dt)
    return [f"--{k}dt={v}" for k, v in dts.items()]


def _first_dt_tag(mds: list[MemoryDesc]) -> list[str]:
    dt = next((m.dt for m in mds if m.dt != "undef"), "")
    tag = next((m.tag for m in mds if m.tag), "")
    return [_opt("dt", dt), _opt("tag", tag)]


def _sources(mds: list[MemoryDesc]) -> tuple[list[MemoryDesc], list[MemoryDesc]]:
    """Sources (``src``, or ``src_0``, ``src_1``... as some versions name them) and the rest."""
    srcs = [m for m in mds if m.arg.rstrip("0123456789").rstrip("_") == "src"]
    return srcs, [m for m in mds if m not in srcs]


def _multi_source(mds: list[MemoryDesc], common_dt: bool = False) -> list[str]:
    srcs, others = _sources(mds)
    dts = _common_dts(mds) if common_dt else [_opt("sdt", ":".join(m.dt for m in srcs))] + [
        f"--{m.arg[0]}dt={m.dt}" for m in others if m.dt != "undef"]
    tags = [_opt("stag", ":".join(m.tag_or_any for m in srcs))] + [
        f"--{m.arg[0]}tag={m.tag_or_any}" for m in others if m.tag]
    return dts + tags


def _rnn(mds: list[MemoryDesc], aux: dict) -> list[str]:
    opts = [_opt("alg", RNN_ALGS.get(aux.get("alg", ""))),
            _opt("direction", RNN_DIRECTIONS.get(aux.get("direction", ""))),
            _opt("activation", RNN_ACTIVATIONS.get(aux.get("activation", ""))), _opt("flags", aux.get("flags"))]
    states = ("src_iter", "src_iter_c", "src_layer", "dst_iter", "dst_layer")
    md = {m.arg: m for m in mds}
    dts = {md[a].dt for a in states if a in md}
    shared = next(iter(dts)) if len(dts) == 1 else None
    if shared in ("f32", "f16"):
        cfg = shared
    elif shared == "bf16":  # the bias type is part of a bf16 configuration
        cfg = shared + (md["bias"].dt if "bias" in md and md["bias"].dt != shared else "")
    else:
        cfg = "".join(md[a].dt for a in states if a in md and not (a == "src_iter_c" and md[a].dt == "f16"))
    opts.append(_opt("cfg", cfg))
    layers = ("src_layer", "wei_layer", "dst_layer")
    if any("diff" in m.arg for m in mds):  # backward: the diff tensors carry the layouts
        layers = tuple(f"diff_{a}" for a in layers)
    opts.append("--tag=" + ":".join(m.tag_or_any for m in mds if m.arg in layers))
    opts += ["--with-projection=true" for m in mds if m.arg == "wei_proj" and m.tag != "undef"]
    opts += ["--with-peephole=true" for m in mds if m.arg == "wei_peephole" and m.tag != "undef"]
    strided = any(m.strides for m in mds if m.arg in ("src_iter", "src_layer"))
    return opts + [f"--trivial-strides={'false' if strided else 'true'}"]


def _driver_options(kind: str, mds: list[MemoryDesc], aux: dict) -> list[str]:
    """The driver's options between the direction and the attributes, in the generator's order."""
    md = {m.arg: m for m in mds}
    if kind in ("convolution", "deconvolution"):
        return [_opt("alg", _short_alg(aux, kind))] + _triplet_dts(md, bias=True) + _triplet_tags(md)
    if kind == "inner_product":
        return _triplet_dts(md, bias=True) + _triplet_tags(md)
    if kind == "matmul":
        mask = md["bia"].flags.partition("_")[2][4:] if "bia" in md and "_mask" in md["bia"].flags else ""
        return ([_opt("runtime_dims_masks", aux.get("runtime_dims_masks")), _opt("bia_mask", mask)]
                + _triplet_dts(md, bias=True) + _strided_tags(md))
    if kind == "reorder":
        return [_opt("runtime-dim-mask", aux.get("runtime-dim-mask"))] + _common_dts(mds) + _strided_tags(md)
    if kind == "eltwise":
        return [_opt("alg", aux.get("alg")), _opt("alpha", aux.get("alpha")),
                _opt("beta", aux.get("beta"))] + _first_dt_tag(mds)
    if kind == "binary":
        src0, src1, *_, dst = mds
        return [_opt("alg", _short_alg(aux, kind)), f"--sdt={src0.dt}:{src1.dt}", f"--ddt={dst.dt}",
                f"--stag={src0.tag_or_any}:{src1.tag_or_any}", f"--dtag={dst.tag_or_any}"]
    if kind == "sum":
        return _multi_source(mds)
    if kind == "concat":
        return [_opt("axis", aux.get("axis"))] + _multi_source(mds, common_dt=True)
    if kind == "pooling":
        return [_opt("alg", aux.get("alg"))] + _triplet_dts(md) + _first_dt_tag(mds)[1:]
    if kind == "batch_normalization":
        return [_opt("flags", aux.get("flags"))] + _first_dt_tag(mds)
    if kind in ("layer_normalization", "group_normalization"):
        opts = [_opt("flags", aux.get("flags"))] + _triplet_dts(md)
        scale = next((m for m in mds if "scale" in m.arg or "shift" in m.arg), None)
        if kind == "layer_normalization" and scale:
            opts.append(f"--ss_dt={scale.dt}")
        opts.append(_opt("tag", ":".join(md[a].tag_or_any for a in ("src", "wei", "dst") if a in md)))
        if kind == "layer_normalization" and "stats" in md:
            opts.append(f"--stat_tag={md['stats'].tag_or_any}")
        return opts
    if kind == "softmax":
        return [_opt("alg", aux.get("alg")), _opt("axis", aux.get("axis"))] + _common_dts(mds) + _triplet_tags(md)
    if kind == "reduction":
        return ([_opt("alg", _short_alg(aux, kind)), _opt("p", aux.get("p")), _opt("eps", aux.get("eps"))]
                + _common_dts(mds) + _triplet_tags(md))
    if kind == "resampling":
        return [_opt("alg", _short_alg(aux, kind))] + _common_dts(mds) + _first_dt_tag(mds)[1:]
    if kind == "prelu":
        data = next((m for m in mds if "data" in m.arg), None)
        wei = next((m for m in mds if "wei" in m.arg), None)
        return [f"--sdt={data.dt if data else ''}:{wei.dt if wei else ''}",
                f"--stag={data.tag_or_any if data else ''}:{wei.tag_or_any if wei else ''}"]
    if kind == "shuffle":
        return [_opt("axis", aux.get("axis")), _opt("group", aux.get("group"))] + _first_dt_tag(mds)
    if kind == "lrn":
        alg = {"across_channels": "ACROSS", "within_channel": "WITHIN"}.get(_short_alg(aux, kind) or "")
        return [_opt("alg", alg)] + _first_dt_tag(mds)
    if kind == "rnn":
        return _rnn(mds, aux)
    return []


def _attr_options(attrs: str) -> list[str]:
    """``attr-scratchpad:user attr-post-ops:sum`` -> ``--attr-post-ops=sum --attr-scratchpad=user``."""
    given = {name[len("attr-"):]: value for name, value in _fields(attrs).items() if name.startswith("attr-")}
    return [_opt(f"attr-{name}", given.get(name)) for name in ATTRS]


def benchdnn_line(api: str, engine: str, kind: str, prop: str, mds: str, attrs: str, aux: str,
                  problem: str) -> str | None:
    """One primitive of a verbose log as a benchdnn reproducer line; None for a kind benchdnn lacks."""
    if api != "primitive" or kind not in DRIVERS:
        return None
    descs = memory_descs(mds)
    if kind == "binary" and len(descs) < 3:
        return None
    aux_fields = _fields(aux)
    direction = DIRS.get(prop, "")
    opts = ["--reset", "--allow-enum-tags-only=0", f"--engine={engine or 'cpu'}",
            _opt("prop" if kind == "rnn" else "dir", direction)]
    opts += _driver_options(kind, descs, aux_fields) + _attr_options(attrs)
    shape = ":".join(problem.split(":", 2)[:2]) if kind == "binary" else problem
    return " ".join([f"--{DRIVERS[kind]}"] + [o for o in opts if o] + [shape])


def benchdnn_lines(df: pd.DataFrame) -> tuple[list[str], dict[str, int]]:
    """One benchdnn line per distinct executed primitive, in the order of first execution.

    Returns the lines and, per kind, how many distinct primitives have no benchdnn line
    (graph partitions, kinds benchdnn has no driver for)."""
    lines: dict[str, None] = {}  # a dict keeps the order and drops repeats
    skipped: dict[str, int] = {}
    cols = ["api", "engine", "kind", "prop", "mds", "attrs", "aux", "problem"]
    for row in df[cols].drop_duplicates().itertuples(index=False):
        line = benchdnn_line(*row)
        if line is None:
            skipped[row.kind] = skipped.get(row.kind, 0) + 1
        else:
            lines[line] = None
    return list(lines), skipped


def converter_breakdown(df: pd.DataFrame) -> str:
    """verbose_converter's breakdown (``-g breakdown``, default keys) of the executed primitives, as CSV text."""
    prims = df[df["api"] == "primitive"]
    header = ",".join(BREAKDOWN_KEYS + BREAKDOWN_STATS)
    if prims.empty:
        return header + "\n"
    keys = ["engine", "kind", "impl", "prop", "mds", "attrs", "aux", "problem"]
    table = (prims.groupby(keys, sort=False)["time_ms"].agg(ncalls="count", time_ms="sum")
             .reset_index().sort_values("time_ms", ascending=False, kind="stable"))
    total = table["time_ms"].sum()
    rows, agg_calls, agg_time = [header], 0.0, 0.0
    for n, r in enumerate(table.itertuples(index=False), 1):
        agg_calls += (r.ncalls - agg_calls) / n  # the generator's running mean of calls
        agg_time += r.time_ms
        mds = " ".join(map(str, memory_descs(r.mds)))
        share, agg_share = (r.time_ms / total, agg_time / total) if total else (1.0, 1.0)
        rows.append(",".join([r.engine, r.kind, r.impl, r.prop, mds, r.attrs, r.aux, r.problem, str(r.ncalls),
                              f"{r.time_ms:.2f}", f"{share * 100:.2f}", f"{agg_calls:.2f}", f"{agg_time:.2f}",
                              f"{agg_share * 100:.2f}"]))
    return "\n".join(rows) + "\n"
