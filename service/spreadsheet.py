"""CSV cells a spreadsheet will not run as formulas (formula injection): tenant names, models and
notes come from gateways and responders, and an impact CSV or a findings export is opened in one.
The impact report (API and UI) and the responder CLI's ``--csv`` both write cells through here."""

from __future__ import annotations

# What a spreadsheet may read as the start of a formula: OWASP's list, a leading space (trimmed,
# then read), ";" (a separator in some locales' formula syntax), and the full-width forms.
FORMULA_START = frozenset("=+-@\t\r\n ;\uff1d\uff0b\uff0d\uff20")


def safe_cell(text: str) -> str:
    """The text, with a quote in front if a spreadsheet would read it as a formula."""
    return "'" + text if text[:1] in FORMULA_START else text
