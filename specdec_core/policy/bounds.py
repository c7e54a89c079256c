"""The draft lengths anyone may ask for: the engine, the app's slider, models.yaml and the API
all read these bounds; a verify step (the last token and its drafts) is one step of a decode path.
(Adaptive drafting moves k within MIN/MAX_DRAFT_LENGTH, or up to the k asked.)"""

from ..decoding.base import MAX_STEP_TOKENS

DRAFT_LENGTH_BOUNDS = (1, MAX_STEP_TOKENS - 1)
DEFAULT_DRAFT_LENGTH = 5
MIN_DRAFT_LENGTH = 2
MAX_DRAFT_LENGTH = 8
