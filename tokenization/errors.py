"""What can go wrong rendering or tokenizing a request locally.

TokenizationError
├── ChatRenderError   the request is one the engine refuses too (a 400 there)
├── NotRenderable     only the engine can render it (media parts, its own template)
└── TokenizerLoadError  the model's files are missing or unusable
"""

from __future__ import annotations


class TokenizationError(Exception):
    """Base of the package's errors."""


class ChatRenderError(TokenizationError, ValueError):
    """The messages, tools or template arguments are invalid, or the chat template refused
    them (`raise_exception`): vLLM answers such a request with a 400."""


class NotRenderable(TokenizationError):
    """The request needs what only the engine has (media, a request-supplied template):
    leave its tokenization to the engine."""


class TokenizerLoadError(TokenizationError):
    """A model's tokenizer files could not be loaded."""
