"""How long-running library calls tell a front end what they are doing (the CLI draws Rich bars)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def stage(self, name: str, total: int) -> None:
        """A stage of `total` steps begins."""

    def step(self, description: str) -> None:
        """One step of the current stage is about to run."""

    def done(self) -> None:
        """The current stage finished."""


class Silent:
    def stage(self, name: str, total: int) -> None:
        pass

    def step(self, description: str) -> None:
        pass

    def done(self) -> None:
        pass
