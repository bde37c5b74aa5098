"""Shared fixtures: a clean environment for HTTP tests and the local OpenAI-compatible stub server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai_stub_server import OpenAIStubServer

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strip proxy settings so a developer's shell cannot reroute loopback requests."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def stub_server() -> Iterator[OpenAIStubServer]:
    """A fresh scripted server on 127.0.0.1 (see tests/openai_stub_server.py)."""
    with OpenAIStubServer() as server:
        yield server
