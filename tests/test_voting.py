import math

from corp.evaluate.voting import majority_vote, pass_at_k


def test_majority_vote_drops_empty_and_breaks_ties_by_rank():
    assert majority_vote(["3", None, "4", "4", ""]) == "4"
    assert majority_vote(["5", "6", "6", "5"]) == "5", "tie goes to the higher-ranked voter"
    assert majority_vote([None, ""]) is None


def test_pass_at_k_closed_form():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (64, 1, 8), (5, 0, 2), (5, 5, 5), (20, 19, 2)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert abs(pass_at_k(n, c, k) - exact) < 1e-12
