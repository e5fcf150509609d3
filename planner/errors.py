"""One exception hierarchy for everything the user can get wrong or ask for in vain.

The CLI catches `HyperplanError` at its boundary, prints the message as one
line and exits with `exit_code`; nothing below the CLI prints or exits.
Messages quote the numbers ("needs 93.1 GiB, a device has 64 GiB") and say
what to do.
"""

from __future__ import annotations


class HyperplanError(Exception):
    """Base of every error the user should see as one sentence, not a traceback."""

    exit_code: int = 2


class InvalidInput(HyperplanError):
    """A file, name or option the user gave is wrong (missing, malformed, unknown)."""


class InvalidModel(InvalidInput):
    """The model file cannot be read as a usable ONNX graph."""


class UnboundDimension(InvalidModel):
    """A symbolic dimension has no value; the message names it and the flag to bind it."""

    def __init__(self, names: list[str] | tuple[str, ...], where: str = "", hint: str = "--batch / --seq-len") -> None:
        self.names = tuple(names)
        listed = ", ".join(repr(n) for n in self.names)
        flags = " ".join(f"--dim {n}=VALUE" for n in self.names)
        loc = f" ({where})" if where else ""
        super().__init__(f"symbolic dimension {listed}{loc} has no value; bind it with {flags}"
                         + (f" (or {hint})" if hint else ""))


class ExportRefused(InvalidInput):
    """A backend's format cannot express features of the plan; `what` names them ("activations offload (35%)")."""

    def __init__(self, message: str, what: str) -> None:
        self.what = what
        super().__init__(message)


class Infeasible(HyperplanError):
    """No strategy fits the request (usually memory); the message says by how much."""

    exit_code = 3


class SolverTimeout(HyperplanError):
    """The search or the layout solver stopped (--time-limit, or its work budget) before any strategy fit: nothing
    proven either way."""

    exit_code = 4
