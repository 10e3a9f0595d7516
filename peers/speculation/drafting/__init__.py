"""Drafting: what proposes the tokens a ring pass verifies.

base (the drafter protocol), ngram (prompt lookup), model (a stand-alone draft model), feature_net (the feature
draft's network and its directory), feature (the drafter that reads the target's features), shipped (the drafts
shipped as package data), choose (which drafter a --draft spec names). Training a feature draft is peers/distill/.
"""
from peers.speculation.drafting.base import Drafter, common_prefix  # noqa: F401
from peers.speculation.drafting.choose import make_drafter  # noqa: F401
from peers.speculation.drafting.feature import FeatureDrafter  # noqa: F401
from peers.speculation.drafting.feature_net import is_distilled  # noqa: F401
from peers.speculation.drafting.model import ModelDrafter  # noqa: F401
from peers.speculation.drafting.ngram import NgramDrafter, followers, lookup  # noqa: F401
from peers.speculation.drafting.shipped import shipped_draft  # noqa: F401
