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
