"""Lemon scoring in the goodput simulator (sentinel/lab/goodput/lemons.py)."""

from sentinel.lab.goodput.lemons import LemonFleet, LemonPolicy, compare, replay


def test_lemon_scoring_cuts_lost_time_and_spares_the_innocent() -> None:
    """Same failures with and without scoring. With three lemons (20x the failure rate, half
    of all exclusions) scoring sends them to a deep repair and the job loses fewer hours;
    with no hardware evidence at all (every blame uncertain) it retires nobody."""
    seeds = list(range(40))
    lemons = compare(LemonFleet(), LemonPolicy(), seeds)
    assert lemons.lost_h_with < 0.9 * lemons.lost_h_without
    assert lemons.interruptions_with < lemons.interruptions_without
    assert lemons.retired_lemons >= 2.0
    uncertain = LemonFleet(lemons=0, hardware_share=0.0, uncertain_hit=0.3)
    for seed in seeds:
        assert replay(uncertain, LemonPolicy(), seed).retired == []
