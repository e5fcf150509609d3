"""The cost model's own error: cost_models imports nothing of the project.

The CLI boundary treats `SpecError` like the planner's `InvalidInput`:
one sentence, exit code 2.
"""


class SpecError(ValueError):
    """A hardware spec (preset or user file) is malformed; the message names the field."""

    exit_code = 2
