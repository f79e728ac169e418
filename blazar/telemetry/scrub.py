"""PII and secret scrubbing: pure functions from text to text, no I/O.

Applied to the audit log (prompts, answers, error messages), the daemon log (a
``logging.Filter``) and whatever a trace exporter writes. What it replaces:

- API keys and bearer tokens: ``Bearer …``, ``x-api-key: …``, ``sk-…``, ``blz-…``
- e-mail addresses
- card numbers: 13 to 19 digits (spaces or dashes between groups allowed) that pass
  the Luhn check — a long number that fails it is left alone
- IP addresses, v4 and v6 (validated by ``ipaddress``); loopback and unspecified
  addresses are kept, since they identify nobody and the daemon's own log names them
- phone numbers: international ``+`` numbers, and the grouped ``(555) 123-4567`` /
  ``555-123-4567`` shapes

Each match becomes a bracketed tag (``[email]``, ``[card]``, ``[ip]``, ``[phone]``,
``[secret]``), so a reader can still tell what stood there. Version numbers, dates,
times and model names (``qwen2.5:7b``) are shapes it deliberately does not match.
"""

from __future__ import annotations

import ipaddress
import logging
import re

__all__ = ["ScrubFilter", "luhn_ok", "scrub"]

_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{4,}")
_HEADER_KEY = re.compile(
    r"(?i)\b(x-api-key|api[_-]?key|authorization)"  # the name, then its separator
    r"""(["']?\s*[:=]\s*["']?)(?!bearer\b|\[secret\])[^\s"',;}]+"""
)
_PREFIXED_KEY = re.compile(r"(?<![A-Za-z0-9])(?:sk|blz|sk-ant|pk|rk)-[A-Za-z0-9_-]{16,}")
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_CARD = re.compile(r"(?<![\d.-])\d(?:[ -]?\d){12,18}(?!\d|[.-]\d)")
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?=[0-9A-Fa-f:]*::|(?:[0-9A-Fa-f]{1,4}:){7})[0-9A-Fa-f:]{2,39}(?![\w:])")
_DIGIT_RUN = re.compile(r"\d[\d ().+-]{5,}\d")
"""Seven digits or more with only separators between them: what a card or a phone needs."""
_PHONE = re.compile(
    r"(?<![\w+.-])(?:"
    r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"  # +44 20 7946 0958, +1-555-123-4567
    r"|\(\d{3}\)\s?\d{3}[ .-]\d{4}"  # (555) 123-4567
    r"|\d{3}[ .-]\d{3}[ .-]\d{4}"  # 555-123-4567, 555.123.4567
    r")(?!\w|[.-]\d)"
)


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a string of digits (what card numbers carry)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card(m: re.Match[str]) -> str:
    digits = m.group(0).replace(" ", "").replace("-", "")
    return "[card]" if 13 <= len(digits) <= 19 and luhn_ok(digits) else m.group(0)


def _ip(m: re.Match[str]) -> str:
    text = m.group(0)
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return text
    return text if addr.is_loopback or addr.is_unspecified else "[ip]"


def _phone(m: re.Match[str]) -> str:
    digits = sum(ch.isdigit() for ch in m.group(0))
    return "[phone]" if 7 <= digits <= 15 else m.group(0)


def scrub(text: str) -> str:
    """``text`` with secrets and personal data replaced by tags; unchanged when there is none."""
    if not text:
        return text
    # Each pattern runs only where the cheap test of what it needs passes: most log lines
    # hold none of it, and then cost a few substring searches.
    lowered = text.lower()
    if "bearer" in lowered:
        text = _BEARER.sub(r"\1 [secret]", text)
    if "key" in lowered or "authorization" in lowered:
        text = _HEADER_KEY.sub(r"\1\2[secret]", text)
    if "-" in text:
        text = _PREFIXED_KEY.sub("[secret]", text)
    if "@" in text:
        text = _EMAIL.sub("[email]", text)
    if "." in text:
        text = _IPV4.sub(_ip, text)
    if text.count(":") >= 2:
        text = _IPV6.sub(_ip, text)
    if _DIGIT_RUN.search(text):
        text = _CARD.sub(_card, text)
        text = _PHONE.sub(_phone, text)
    return text


class ScrubFilter(logging.Filter):
    """Scrubs each log record's message (and its traceback) before any handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True
