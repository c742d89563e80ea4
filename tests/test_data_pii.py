"""PII redaction: what is replaced, what code and arithmetic keep."""

from __future__ import annotations

import pytest

from groundup.data.curate_config import PIIConfig
from groundup.data.pii import PIIRedactor


@pytest.mark.parametrize("text, expected, counts", [
    ("write to jane.doe+news@mail.example.com today", "write to <EMAIL> today", {"email": 1}),
    ("Guido <guido@python.org>", "Guido <<EMAIL>>", {"email": 1}),
    ("the resolver at 8.8.8.8, then 1.1.1.1.", "the resolver at <IP_ADDRESS>, then <IP_ADDRESS>.", {"ip": 2}),
    ("v6 2606:4700:4700::1111 is public", "v6 <IP_ADDRESS> is public", {"ip": 1}),
    ("full 2001:4860:4860:0:0:0:0:8888 form", "full <IP_ADDRESS> form", {"ip": 1}),
    ("call (555) 123-4567 now", "call <PHONE> now", {"phone": 1}),
    ("call 555-123-4567 or 555.123.4567", "call <PHONE> or <PHONE>", {"phone": 2}),
    ("call +1 555 123 4567.", "call <PHONE>.", {"phone": 1}),
    ("London +44 20 7946 0958", "London <PHONE>", {"phone": 1}),
])
def test_redacts(text, expected, counts):
    assert PIIRedactor().redact(text) == (expected, counts)


@pytest.mark.parametrize("text", [
    "x = a[1::2] + b[::3]; d = {1:2}",  # slices and dict literals are not IPv6
    "std::io::Result and ab::cd:ef",  # C++ / Rust paths parse as IPv6 but hold no digit
    "What is 842 - 317? 842 - 317 = 525.",  # arithmetic is not a phone number
    "version 1.2.3.4.5 and 2024-11-22 and 12:30:45",  # versions, dates and times
    "localhost 127.0.0.1, lan 192.168.1.10, link-local fe80::1:2:3",  # non-public addresses (datatrove's rule)
    "@property\ndef f(self): return a@b.T",  # decorators and matrix products
])
def test_keeps_code_and_arithmetic(text):
    assert PIIRedactor().redact(text) == (text, {})


def test_private_addresses_can_be_redacted_too_and_kinds_switched_off():
    text = "ping 192.168.1.10 or mail a@b.org"
    assert PIIRedactor(PIIConfig(public_ips_only=False)).redact(text)[0] == "ping <IP_ADDRESS> or mail <EMAIL>"
    assert PIIRedactor(PIIConfig(email=False, public_ips_only=False)).redact(text) == (
        "ping <IP_ADDRESS> or mail a@b.org", {"ip": 1})
