"""A token bucket: `rate` tokens a second, at most `burst` saved up. The caller says what time it is, so the NAT's
reference semantics stay a function of their input (its packets' times) and the rest pass the monotonic clock."""

from __future__ import annotations


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), now

    def level(self, now: float) -> float:
        return min(float(self.burst), self.tokens + (now - self.at) * self.rate)

    def wait(self, now: float) -> float:
        """Seconds until one token is there (0: there is one now); takes nothing."""
        level = self.level(now)
        return 0.0 if level >= 1 else (1 - level) / self.rate

    def take(self, now: float) -> float:
        """Take a token: 0 if there was one, else the seconds until there is (nothing taken)."""
        self.tokens, self.at = self.level(now), now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
