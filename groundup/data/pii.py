"""PII redaction: e-mail addresses, IPv4/IPv6 addresses and phone numbers become placeholders.

Like datatrove's PIIFormatter, only public IP addresses are redacted by default: 127.0.0.1,
10.0.0.1 or fe80::1 identify nobody and are common in code and documentation. The patterns are
written so that code and arithmetic survive: a slice `x[1::2]` is no IPv6 address (three groups at
least), `842 - 317` is no phone number (one separator character between groups, no spaces around
it), `a@b.T` is no e-mail address (a top-level domain has two letters or more).
"""

from __future__ import annotations

import ipaddress
import re

from groundup.data.curate_config import PIIConfig

_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
    r"[A-Za-z]{2,24}\b"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.\d)")
_H = r"[0-9A-Fa-f]{1,4}"
# Full form, or compressed with "::" and at least three groups in all (see the module docstring).
_IPV6 = re.compile(
    rf"(?<![\w:.])(?:(?:{_H}:){{7}}{_H}"
    rf"|(?:{_H}:){{2,6}}:(?:{_H}:){{0,4}}{_H}"
    rf"|(?:{_H}:){{1,5}}:(?:{_H}:){{1,4}}{_H}"
    rf"|(?:{_H}:){{3,7}}:"
    rf"|::(?:{_H}:){{2,6}}{_H})(?![\w:])"
)
# North American forms ((555) 123-4567, 555-123-4567, 555.123.4567, +1 555 123 4567) and
# international ones that start with "+" and a country code (+44 20 7946 0958).
_PHONE = re.compile(
    r"(?<![\w+.-])(?:"
    r"(?:\+?1[ .-]?)?(?:\(\d{3}\)\s?|\d{3}[.-])\d{3}[.-]\d{4}"
    r"|\+1 \d{3} \d{3} \d{4}"
    r"|\+(?:[2-9]\d{0,2})[ .-]?\(?\d{1,4}\)?(?:[ .-]?\d{2,4}){2,4}"
    r")(?![\w-]|\.\d)"
)


# Cheap tests that every match of the pattern above passes. Each starts with a literal character,
# which the regex engine finds with a fast scan; the full patterns, whose lookbehinds make them
# try every position, then run only on the few documents that pass.
_HINTS = {
    "email": re.compile(r"@[A-Za-z0-9-]+\."),
    "ipv4": re.compile(r"\.\d{1,3}\.\d{1,3}\.\d"),
    "ipv6": re.compile(r"::|:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:"),
    "phone": re.compile(r"[-.]\d{4}(?!\d)|\+\d|\) ?\d{3}"),
}


def _ip_ok(text: str, public_only: bool) -> bool:
    if not any(c.isdigit() for c in text):  # "ab::cd:ef" parses as IPv6 but is a C++ or Rust path
        return False
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return address.is_global or not public_only


class PIIRedactor:
    def __init__(self, cfg: PIIConfig | None = None):
        self.cfg = cfg or PIIConfig()
        self.placeholders = {"email": self.cfg.email_placeholder, "ip": self.cfg.ip_placeholder,
                             "phone": self.cfg.phone_placeholder}

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        """Return the redacted text and how many of each kind were replaced."""
        counts: dict[str, int] = {}

        def sub(kind: str, pattern: re.Pattern, text: str, check=None) -> str:
            def replace(m: re.Match) -> str:
                if check is not None and not check(m.group(0)):
                    return m.group(0)
                counts[kind] = counts.get(kind, 0) + 1
                return self.placeholders[kind]

            return pattern.sub(replace, text)

        cfg = self.cfg
        if cfg.email and _HINTS["email"].search(text):
            text = sub("email", _EMAIL, text)
        if cfg.ip and _HINTS["ipv4"].search(text):
            text = sub("ip", _IPV4, text, lambda s: _ip_ok(s, cfg.public_ips_only))
        if cfg.ip and _HINTS["ipv6"].search(text):
            text = sub("ip", _IPV6, text, lambda s: _ip_ok(s, cfg.public_ips_only))
        if cfg.phone and _HINTS["phone"].search(text):
            text = sub("phone", _PHONE, text)
        return text, counts
