"""`auto`: choose every round the drafting plan that maximizes expected committed tokens per second.

Inputs, all measured here and now: acceptance estimated online (acceptance.py), and the cost of each forward
(drafting/costs.py, viewed per sequence alone or as a batch share: costs.py). Candidate plans and their values are
in plans.py; the choice, back-offs and probes in policy.py. Plans depend only on this generation's outcomes and
the costs cached before it started (frozen during a generation), never on a round's own coins, so every round is
a lossless round and the output law is the target's.
"""
from multispec.drafting.auto.acceptance import Acceptance, ConfidenceRates, greedy_tree, to_tree
from multispec.drafting.auto.policy import AutoPolicy

__all__ = ["Acceptance", "AutoPolicy", "ConfidenceRates", "greedy_tree", "to_tree"]
