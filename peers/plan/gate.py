"""Passes share the ring; a re-plan has it to itself.

Passes of different conversations travel the ring at once (a member works on one while another is on the wire),
each holding a share of the gate. A re-plan closes the gate to new passes, waits for those in flight to come
back, and opens it again when the new plan is wired; new passes wait behind a waiting re-plan, so a steady flow of
passes cannot starve it (writer preference).
"""
from __future__ import annotations

from contextlib import asynccontextmanager

import trio


class PassGate:
    def __init__(self):
        self.passes = 0  # in flight now
        self.replanning = False
        self._idle, self._open = trio.Event(), trio.Event()
        self._idle.set()
        self._open.set()
        self._replans = trio.Lock()  # one re-plan at a time, first come first served

    @asynccontextmanager
    async def share(self):
        while self.replanning:
            await self._open.wait()
        self.passes += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            yield
        finally:
            self.passes -= 1
            if self.passes == 0:
                self._idle.set()

    @asynccontextmanager
    async def alone(self):
        async with self._replans:
            self.replanning = True
            if self._open.is_set():
                self._open = trio.Event()
            try:
                await self._idle.wait()
                yield
            finally:
                self.replanning = False
                self._open.set()
