"""The read-only web viewer of the call log (`session-store serve`)."""

from .app import create_app
from .security import check_bind, is_loopback

__all__ = ["create_app", "check_bind", "is_loopback"]
