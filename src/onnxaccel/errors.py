"""One exception hierarchy. Every error carries a message (what and where) and a hint (how to fix).

The CLI prints both and exits with ``exit_code``; a traceback appears only with ``--debug``.
"""

from __future__ import annotations

from onnxaccel.install import install_command


class OnnxAccelError(Exception):
    """Base of every error onnxaccel raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, *, details: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: Raw text from the underlying library (e.g. ONNX Runtime's own error), kept verbatim.
        self.details = details

    def __str__(self) -> str:
        text = self.message
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text

    def to_dict(self) -> dict:
        """JSON-ready form of the error (type, message, hint), as ``--json`` commands print it."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
        }


class UsageError(OnnxAccelError):
    """The command line or an argument is malformed (exit status 2)."""

    exit_code = 2


class MissingDependencyError(OnnxAccelError):
    """An optional library is not installed; the hint names the extra that brings it."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the Python package '{package}', which is not installed.",
            install_command(extra),
        )
        self.package = package
        self.extra = extra


class ModelError(OnnxAccelError):
    """The model cannot be used as given."""


class ModelNotFoundError(ModelError):
    """The model file or zoo name does not exist."""
    pass


class ModelFormatError(ModelError):
    """Not ONNX, a corrupt protobuf, or a graph the ONNX checker rejects."""


class ModelVersionError(ModelError):
    """IR version or opset newer than the installed runtime reads."""


class ShapeError(OnnxAccelError):
    """A shape binding is malformed, or a symbolic dimension is left unbound."""

    exit_code = 2


class InputError(OnnxAccelError):
    """A user-supplied input has the wrong name, shape, dtype or file format."""

    exit_code = 2


class TargetError(OnnxAccelError):
    """The target string or precision is invalid, or the target cannot run on this installation."""

    exit_code = 2


class ProviderOptionError(TargetError):
    """A provider option key or value that the provider does not accept."""


class ProviderUnavailableError(OnnxAccelError):
    """The execution provider is not built into the installed runtime, or failed to load."""


class PlacementError(OnnxAccelError):
    """Nodes fell back to another provider than requested, and ``strict`` was asked for."""


class InferenceError(OnnxAccelError):
    """The runtime failed while running the model."""


class ArtifactError(OnnxAccelError):
    """An artifacts directory (``onnxaccel compile -o DIR``, used read-only through ``ONNXACCEL_ARTIFACTS``)
    cannot serve this start: not one, unreadable, or damaged. Never answered by compiling instead."""


class ArtifactMismatchError(ArtifactError):
    """The directory holds the artifact this start needs, made under other runtime versions or hardware.
    ``differences``: (field, value here, value in the manifest) for every key field that differs."""

    def __init__(self, message: str, hint: str | None = None, *, differences: list[tuple[str, str, str]] = (),
                 details: str | None = None):
        super().__init__(message, hint, details=details)
        self.differences = list(differences)


class ArtifactMissingError(ArtifactError):
    """The directory holds no artifact for what this start compiles (another model, target, precision or shape)."""
