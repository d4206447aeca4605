"""Primality, for Maglev's table sizes: the API checks them (controller) and the gateways build tables of them."""

from __future__ import annotations


def is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True
