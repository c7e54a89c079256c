"""Errors that reach the user as one line saying what to do (the CLI, the app and the API show
str(error) and nothing else). Defined at the bottom layer so every layer can raise them."""


class LoadError(RuntimeError):
    """A model (or a drafter's weights) could not be loaded. str(error) is one line saying what to do."""


class DeviceBusy(RuntimeError):
    """The device stayed busy with another generation for too long; str(error) says to retry."""


class QueueFull(DeviceBusy):
    """Too many generations already wait for the device; str(error) says to retry later."""


class PromptTooLong(ValueError):
    """A prompt of `tokens` tokens that the model can't read (it reads fewer than `limit`).
    The app and the API say it in their own words; str(error) is the engine's one line."""

    def __init__(self, tokens: int, limit: int) -> None:
        self.tokens, self.limit = tokens, limit
        super().__init__(f"prompt is {tokens} tokens but the model reads at most {limit}: "
                         "shorten it or clear the chat history")
