"""The draft lengths anyone may ask for (the engine, the app's slider, models.yaml and the API
all read these bounds) and the gain drafting must promise; a verify step (the last token and its
drafts) is one step of a decode path. (Adaptive drafting moves k within MIN/MAX_DRAFT_LENGTH, or
up to the k asked.)"""

from ..decoding.base import MAX_STEP_TOKENS, MAX_TREE_NODES

DRAFT_LENGTH_BOUNDS = (1, MAX_STEP_TOKENS - 1)
TREE_NODES_BOUNDS = (0, MAX_TREE_NODES)  # the most draft tokens a round may verify as a tree; 0: chains only
DEFAULT_DRAFT_LENGTH = 5
MIN_DRAFT_LENGTH = 2
MAX_DRAFT_LENGTH = 8
# Drafting (a chain or a tree) must promise at least this speedup over a plain step: the
# estimates are noisy, and a marginal gain predicted from them is as likely a loss.
MIN_GAIN = 1.05
