"""``bleedwatch tap``: an OpenAI-compatible reverse proxy that fingerprints what it forwards."""

from service.tap.proxy import Tap, create_tap
from service.tap.settings import TapSettings

__all__ = ["Tap", "TapSettings", "create_tap"]
