"""Figures read what they say from their data."""


def test_the_settings_caption_says_how_many_rounds_its_intervals_rest_on():
    import math

    import pandas as pd

    from cpuopt_helpers.plots import rounds_note

    screened = pd.DataFrame({"ratio": [1.1], "ratio_low": [math.nan], "comparison": [{"n": 1}]})
    assert rounds_note(screened) == "no interval: screened only"
    mixed = pd.DataFrame({"ratio": [1.1, 0.9, 1.0], "ratio_low": [1.02, 0.85, math.nan],
                          "comparison": [{"n": 5}, {"n": 8}, {"n": 2}]})
    assert rounds_note(mixed) == "intervals from 5-8 rounds"
    assert rounds_note(mixed.iloc[:1]) == "intervals from 5 rounds"


def test_the_key_names_colours_only_where_a_verdict_colours_a_bar():
    import math

    import pandas as pd

    from cpuopt_helpers.plots import settings_key

    screened = pd.DataFrame({"ratio": [1.3, 0.9], "ratio_low": [math.nan] * 2, "verdict": ["screened, 1 round"] * 2})
    assert settings_key(screened) == "no interval: screened only"  # every bar grey: no colour key
    decided = pd.DataFrame({"ratio": [1.3], "ratio_low": [1.2], "verdict": ["faster"], "comparison": [{"n": 5}]})
    assert settings_key(decided) == "green faster, red slower, grey undecided or screened; intervals from 5 rounds"


def test_a_saved_figure_says_where_when_and_with_what_code_it_was_measured(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cpuopt_helpers import plots, system
    from cpuopt_helpers.provenance import own_commit

    monkeypatch.setenv("CPUOPT_BUILD", str(tmp_path))
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    path = plots.save_figure(fig, "t")
    said = [t.get_text() for t in fig.texts]
    assert path.stat().st_size > 1000 and len(said) == 1
    assert said[0].startswith(system.parse_cpu_model(system.read_cpuinfo()))
    assert f"cpuopt commit {own_commit()}" in said[0] and " · 20" in said[0]  # the day, as 2026-12-06
    plt.close(fig)


def test_caps_are_drawn_on_the_bars_with_an_interval_only():
    import math

    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from cpuopt_helpers import plots

    mixed = pd.DataFrame({"setting": ["a", "b", "c"], "ratio": [1.3, 1.1, 0.9], "ratio_low": [1.2, math.nan, math.nan],
                          "ratio_high": [1.4, math.nan, math.nan], "verdict": ["faster", "screened", "screened"],
                          "comparison": [{"n": 5}, None, None]})
    ax = plots.settings_figure({"cnn": mixed}, "t").axes[0]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1 and len(bars[0].lines[2][0].get_segments()) == 1  # one bar's interval, one line


def test_a_long_setting_is_wrapped_not_cut_mid_word():
    from cpuopt_helpers.plots import bar_label

    assert bar_label("dtype=bf16") == "dtype=bf16"
    assert bar_label("frozen stages' backward computed (the paper's unfixed build)") == \
        "frozen stages' backward computed (the\npaper's unfixed build)"
    assert bar_label("a " * 60).endswith("…") and bar_label("a " * 60).count("\n") == 1
