"""The drafters' old home, kept so existing imports work: everything lives in peers/drafting/."""
from .drafting import (Drafter, FeatureDrafter, ModelDrafter, NgramDrafter, common_prefix, followers,  # noqa: F401
                       lookup, make_drafter)
from .drafting.model import check_same_tokenizer  # noqa: F401
