"""The read-only web viewer of the call log (`session-store serve`)."""

from .app import check_bind, create_app, is_loopback

__all__ = ["create_app", "check_bind", "is_loopback"]
